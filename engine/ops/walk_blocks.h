// The walk op (Backend::walk_blocks, engine/ops/backend.h): its batch type and its CPU reference,
// cpu_walk_blocks (engine/ops/walk_blocks_cpu.cpp). The CUDA kernel is kernels/walk_blocks.cu; both
// are compared on the cases of tests/op_cases.h (tests/test_cuda_parity.cpp).
#pragma once

#include <cstdint>

namespace kvscope {

// Many independent walk blocks (all blocks of all heads of a layer in one round). Rows of a block
// are contiguous; keys are already centred within the block and values already multiplied by the
// accumulated weights. The walk is sequential inside a block:
//   sigma_0 = +1; p_i = 1/2 - gamma * sum_{j<i} K_ij sigma_j; sigma_i = +1 w.p. clip(p_i, 0, 1)
//   K_ij = exp(temp <k_i,k_j>/sqrt(d) - beta) * (<v_i,v_j> + value_bias)
// The uniform for step i is counter_uniform(seed, kRandWalk, layer, block_head[b], round,
// block_id[b], i): identical on every backend.
// With `float32` set (the authors' semantics, BalanceKV's default) everything is float32 with
// IEEE overflow: K_ij = exp(temp <k_i,k_j>/sqrt(d) - beta) * ((<v_i,v_j> + value_eps) +
// value_bias), p_i = 1/2 - gamma * sum_j K_ij sigma_j over the WHOLE block with sigma_j = 0 for
// j >= i (so a non-finite K_ij anywhere in row i makes the sum NaN), sigma_i = +1 iff
// float(u_i) < p_i without clipping (NaN or -inf p: -1). Otherwise the double rule above.
struct WalkBatch {
  int d = 0, dv = 0;
  int num_blocks = 0;
  const float* keys = nullptr;           // total_rows x d
  const float* values = nullptr;         // total_rows x dv
  const int* block_offset = nullptr;     // num_blocks + 1 row offsets
  const uint32_t* block_head = nullptr;  // kv head of each block (RNG key)
  const uint32_t* block_id = nullptr;    // block index within its head's round (RNG key)
  uint64_t seed = 0;
  uint32_t layer = 0, round = 0;
  double gamma = 4, temp = 1, beta = 0, value_bias = 0.025;
  bool float32 = false;
  double value_eps = 0;  // the authors' 1e-8 (float32 only)
  // Outputs, total_rows each. partial/p may be null when not traced.
  int8_t* sigma = nullptr;
  float* p = nullptr;        // before clipping
  float* partial = nullptr;  // sum_{j<i} K_ij sigma_j
};

// The op and its sizes, for Backend::supports() (OpShape: engine/ops/backend.h).
struct OpShape;
OpShape op_shape(const WalkBatch& b);

// The CPU reference: every block walked in turn on the calling thread. Throws
// std::invalid_argument for a missing array or d, dv <= 0.
void cpu_walk_blocks(const WalkBatch& batch);

// The CPU walk op computes its block Gram matrices with the SIMD table's kernels
// (engine/core/simd.h: AVX2/AVX-512) when the table in use has them. Passing false forces the
// portable (Eigen) path, for tests that compare the two; returns the previous setting.
bool set_cpu_walk_simd(bool enabled);

// The float32 walk's block Gram as the CPU walk op computes it: g[i * ldg + j] = <x_i, x_j> for
// j <= i < rows (x row-major, `dim` wide; ldg >= rows), summed in float in feature order, with
// fused multiply-adds where the SIMD table in use has walk_gram_f32 (engine/core/simd.h: AVX2 and
// AVX-512, the order of the CUDA kernel), separate multiplies and adds otherwise. For tests.
void cpu_walk_gram_f32(const float* x, int rows, int dim, float* g, int ldg);

}  // namespace kvscope
