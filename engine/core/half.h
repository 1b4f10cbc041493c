// IEEE half (F16) and bfloat16 (BF16) <-> float conversion, bit-exact and branch-light, so
// captures can be stored at half size and widened to float one layer at a time.
#pragma once

#include <cstdint>
#include <cstring>

namespace kvscope {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// BF16 is the top half of a float32, so widening is a shift.
inline float bf16_to_float(uint16_t h) {
  return bits_float(static_cast<uint32_t>(h) << 16);
}

// Round to nearest even; NaN stays NaN (quiet bit forced so truncation cannot make it Inf).
inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

inline float f16_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1Fu) return bits_float(sign | 0x7F800000u | (mantissa << 13));  // Inf/NaN
  if (exponent == 0) {
    // Zero or subnormal: value = mantissa * 2^-24, exact in float.
    float magnitude = static_cast<float>(mantissa) * (1.0f / 16777216.0f);
    return sign ? -magnitude : magnitude;
  }
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// Round to nearest even; values beyond the F16 range become +-Inf, tiny ones subnormal or zero.
inline uint16_t float_to_f16(float f) {
  uint32_t u = float_bits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t magnitude = u & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);   // NaN
  if (magnitude >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520: Inf
  if (magnitude < 0x38800000u) {
    // Below the smallest normal half (2^-14): subnormal result, rounded to nearest even.
    if (magnitude < 0x33000000u) return sign;  // below half the smallest subnormal (2^-25)
    uint32_t exponent = magnitude >> 23;
    uint32_t mantissa = (magnitude & 0x7FFFFFu) | 0x800000u;
    // value = mantissa * 2^(exponent - 150) = half_mantissa * 2^-24, so shift = 126 - exponent
    // (14 for 2^-15 up to 24 for 2^-25).
    uint32_t shift = 126u - exponent;
    uint32_t half_mantissa = mantissa >> shift;
    uint32_t remainder = mantissa & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1u);
    if (remainder > halfway || (remainder == halfway && (half_mantissa & 1u))) ++half_mantissa;
    return static_cast<uint16_t>(sign | half_mantissa);
  }
  // Normal: rebias exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
  uint32_t rebased = magnitude - 0x38000000u;
  uint32_t rounding = 0xFFFu + ((rebased >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rebased + rounding) >> 13));
}

}  // namespace kvscope
