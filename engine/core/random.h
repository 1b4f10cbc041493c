// Counter-based random numbers (Philox4x32-10) shared by the CPU path and the CUDA kernels, so
// one seed gives the same signs and selections on both backends. Header-only, host and device.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define KVS_HD __host__ __device__ __forceinline__
#else
#define KVS_HD inline
#endif

namespace kvscope {

// What a random draw is for; part of the counter so streams never collide.
enum RandomPurpose : uint32_t {
  kRandWalk = 1,         // BalanceKV sign draws
  kRandTopUp = 2,        // BalanceKV top-up sampling for non power-of-two ratios
  kRandUniform = 3,      // uniform baseline
  kRandSubGen = 4,       // SubGen reservoirs
  kRandRandomSigns = 5,  // random-sign reference in walk traces
  kRandMisc = 6,
  kRandSketch = 7,       // Gaussian sketches (compactor's leverage scores)
  kRandPromptSplit = 8,  // the tuning / held-out split of a capture set's prompts
};

struct Philox4 {
  uint32_t v[4];
};

KVS_HD uint32_t philox_mulhi(uint32_t a, uint32_t b, uint32_t* lo) {
  uint64_t p = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  *lo = static_cast<uint32_t>(p);
  return static_cast<uint32_t>(p >> 32);
}

KVS_HD Philox4 philox4x32(Philox4 ctr, uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; ++r) {
    uint32_t lo0, lo1;
    uint32_t hi0 = philox_mulhi(0xD2511F53u, ctr.v[0], &lo0);
    uint32_t hi1 = philox_mulhi(0xCD9E8D57u, ctr.v[2], &lo1);
    Philox4 next;
    next.v[0] = hi1 ^ ctr.v[1] ^ k0;
    next.v[1] = lo1;
    next.v[2] = hi0 ^ ctr.v[3] ^ k1;
    next.v[3] = lo0;
    ctr = next;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return ctr;
}

// A uniform double in [0, 1) for (seed; purpose, layer, head, round, block, step).
KVS_HD double counter_uniform(uint64_t seed, uint32_t purpose, uint32_t layer, uint32_t head,
                              uint32_t round, uint32_t block, uint32_t step) {
  Philox4 c;
  c.v[0] = step;
  c.v[1] = block;
  c.v[2] = (round & 0xFFFFu) | (head << 16);
  c.v[3] = (layer & 0xFFFFu) | (purpose << 16);
  Philox4 r = philox4x32(c, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  uint64_t bits = (static_cast<uint64_t>(r.v[0]) << 21) ^ static_cast<uint64_t>(r.v[1] >> 11);
  return static_cast<double>(bits & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
}

// Sequential generator over the same counter space, for CPU-only sampling (uniform baseline,
// reservoirs). Deterministic per (seed, purpose, layer, head).
class CounterRng {
 public:
  CounterRng(uint64_t seed, uint32_t purpose, uint32_t layer, uint32_t head)
      : seed_(seed), purpose_(purpose), layer_(layer), head_(head) {}
  double uniform() {
    uint64_t i = next_++;
    return counter_uniform(seed_, purpose_, layer_, head_, static_cast<uint32_t>(i >> 32),
                           0xFFFFFFFFu, static_cast<uint32_t>(i));
  }
  // Integer in [0, n).
  uint64_t below(uint64_t n) {
    uint64_t v = static_cast<uint64_t>(uniform() * static_cast<double>(n));
    return v < n ? v : n - 1;
  }

 private:
  uint64_t seed_;
  uint32_t purpose_, layer_, head_;
  uint64_t next_ = 0;
};

}  // namespace kvscope
