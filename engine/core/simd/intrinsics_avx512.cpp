// The AVX-512 intrinsics kernels of the avx512 table (engine/core/simd.h, declared in
// engine/core/simd/intrinsics.h), compiled with -mavx512f -mavx2 -mfma and the build's
// -ffp-contract=off (CMakeLists.txt); the table's other intrinsics entries are the AVX2 ones
// (engine/core/simd/intrinsics_avx2.cpp). Moved here unchanged from engine/ops/walk_blocks_cpu.cpp.
// Only the entry points have external linkage (the ODR trap, engine/core/simd/kernels.inc).
#include <immintrin.h>

#include "engine/core/simd/intrinsics.h"

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*, which -Wmaybe-uninitialized flags
// (a known false positive).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace kvscope::simd::detail::avx512 {
namespace {

inline int imin(int a, int b) {
  return a < b ? a : b;
}

// [sum a, sum b, sum c, sum d] of four 4-lane accumulators.
inline __m256d reduce4(__m256d a, __m256d b, __m256d c, __m256d d) {
  const __m256d t0 = _mm256_hadd_pd(a, b), t1 = _mm256_hadd_pd(c, d);
  return _mm256_add_pd(_mm256_permute2f128_pd(t0, t1, 0x20), _mm256_permute2f128_pd(t0, t1, 0x31));
}

// Sum of the two 4-lane halves of an 8-lane vector.
inline __m256d halves(__m512d a) {
  return _mm256_add_pd(_mm512_castpd512_pd256(a),
                       _mm512_castpd512_pd256(_mm512_shuffle_f64x2(a, a, 0xEE)));
}

// The AVX2 kernel's exp (engine/core/simd/intrinsics_avx2.cpp) on 16 floats: the same operations in
// the same order, so every lane's bits are those of the 8-lane version (masks take the place of
// the compare vectors).
inline __m512 exp_f32(__m512 x) {
  const __m512 hi = _mm512_set1_ps(88.72283935546875f), lo = _mm512_set1_ps(-87.33654022216797f);
  const __mmask16 over = _mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ);
  const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  const __m512 xc = _mm512_max_ps(_mm512_min_ps(x, hi), lo);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i ni = _mm512_cvtps_epi32(n);
  const __m512i half = _mm512_srai_epi32(ni, 1);
  const __m512 s1 =
      _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(half, _mm512_set1_epi32(127)), 23));
  const __m512 s2 = _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_sub_epi32(ni, half), _mm512_set1_epi32(127)), 23));
  __m512 y = _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
  y = _mm512_mask_blend_ps(over, y, _mm512_set1_ps(__builtin_inff()));
  y = _mm512_maskz_mov_ps(static_cast<__mmask16>(~under), y);  // +0 below the range
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), y, x);
}

// The AVX2 kernel's rows for one group of 16 rows (rows 16m .. 16m + 15 all need j < 16m + 16:
// `nvec` = m + 1 vectors of 16): the same bits, half the instructions.
void kernel_rows_group(const float* gk, const float* gv, int g0, float* out, int ld, int r0, int r1,
                       int nvec, float temp, float sqrt_d, float beta, float eps, float bias,
                       char* tail_bad) {
  const __m512 vt = _mm512_set1_ps(temp), vs = _mm512_set1_ps(sqrt_d), vb = _mm512_set1_ps(beta);
  const __m512 ve = _mm512_set1_ps(eps), vbias = _mm512_set1_ps(bias);
  const __m512 big = _mm512_set1_ps(__FLT_MAX__);
  __mmask16 any_bad = 0;
  for (int v = 0; v < nvec; ++v) {
    const long j = 16L * v;
    for (int r = r0; r < r1; ++r) {
      const long at = static_cast<long>(r - g0) * ld + j;
      const __m512 arg =
          _mm512_sub_ps(_mm512_div_ps(_mm512_mul_ps(vt, _mm512_loadu_ps(gk + at)), vs), vb);
      const __m512 vterm = _mm512_add_ps(_mm512_add_ps(_mm512_loadu_ps(gv + at), ve), vbias);
      const __m512 k = _mm512_mul_ps(exp_f32(arg), vterm);
      _mm512_storeu_ps(out + static_cast<long>(r) * ld + j, k);
      any_bad |= _mm512_cmp_ps_mask(_mm512_abs_ps(k), big, _CMP_NLE_UQ);
    }
  }
  if (any_bad)
    for (int r = r0; r < r1; ++r)
      for (int l = 0; l <= r; ++l)
        if (!__builtin_isfinite(out[static_cast<long>(r) * ld + l])) tail_bad[l] = 1;
}

}  // namespace

// The AVX2 kernel's 2 x 4 tiles with 8-lane vectors (half the multiply-add count); x is dim8
// wide (a multiple of 8).
void walk_gram_f64(const double* x, int ibegin, int iend, int dim8, int ldg, double* g) {
  for (int i0 = ibegin; i0 < iend; i0 += 2) {
    const double* xi0 = x + static_cast<long>(i0) * dim8;
    const double* xi1 = xi0 + dim8;
    for (int j0 = 0; j0 <= i0 + 1; j0 += 4) {
      const double* xj = x + static_cast<long>(j0) * dim8;
      __m512d a00 = _mm512_setzero_pd(), a01 = _mm512_setzero_pd();
      __m512d a02 = _mm512_setzero_pd(), a03 = _mm512_setzero_pd();
      __m512d a10 = _mm512_setzero_pd(), a11 = _mm512_setzero_pd();
      __m512d a12 = _mm512_setzero_pd(), a13 = _mm512_setzero_pd();
      for (int c = 0; c < dim8; c += 8) {
        const __m512d u0 = _mm512_loadu_pd(xi0 + c), u1 = _mm512_loadu_pd(xi1 + c);
        __m512d v = _mm512_loadu_pd(xj + c);
        a00 = _mm512_fmadd_pd(u0, v, a00);
        a10 = _mm512_fmadd_pd(u1, v, a10);
        v = _mm512_loadu_pd(xj + dim8 + c);
        a01 = _mm512_fmadd_pd(u0, v, a01);
        a11 = _mm512_fmadd_pd(u1, v, a11);
        v = _mm512_loadu_pd(xj + 2 * dim8 + c);
        a02 = _mm512_fmadd_pd(u0, v, a02);
        a12 = _mm512_fmadd_pd(u1, v, a12);
        v = _mm512_loadu_pd(xj + 3 * dim8 + c);
        a03 = _mm512_fmadd_pd(u0, v, a03);
        a13 = _mm512_fmadd_pd(u1, v, a13);
      }
      _mm256_storeu_pd(g + static_cast<long>(i0 - ibegin) * ldg + j0,
                       reduce4(halves(a00), halves(a01), halves(a02), halves(a03)));
      _mm256_storeu_pd(g + static_cast<long>(i0 + 1 - ibegin) * ldg + j0,
                       reduce4(halves(a10), halves(a11), halves(a12), halves(a13)));
    }
  }
}

void walk_kernel_rows_f32(const float* gk, const float* gv, int p0, int p1, int ld, float temp,
                          float sqrt_d, float beta, float eps, float bias, float* out,
                          char* tail_bad) {
  for (int r0 = p0; r0 < p1; r0 = (r0 / 16 + 1) * 16)
    kernel_rows_group(gk, gv, p0, out, ld, r0, imin(p1, (r0 / 16 + 1) * 16), r0 / 16 + 1, temp,
                      sqrt_d, beta, eps, bias, tail_bad);
}

}  // namespace kvscope::simd::detail::avx512

#pragma GCC diagnostic pop
