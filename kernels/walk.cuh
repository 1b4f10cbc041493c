// The practical BalanceKV self-balancing walk on the GPU (docs/balancekv.md section 1; WalkBatch
// and the CPU reference cpu_walk_blocks in engine/ops/walk_blocks.h): all blocks of all heads of
// one layer and round in one launch, one thread block per walk block, sequential over the steps
// inside a block.
//
// Two kernels:
//  * walk_fast_kernel handles blocks of at most kWalkFastRows rows (the default B = 128). The
//    block's threads first compute the lower triangle of its kernel matrix
//      K_ij = exp(temp <k_i,k_j>/sqrt(d) - beta) * (<v_i,v_j> + value_bias)
//    into shared memory (float, register-tiled Gram products), then walk: thread t owns row t and
//    keeps sum_{j<t} K_tj sigma_j in a double register; after step i's sign is broadcast through
//    shared memory every later row adds K_ti sigma_i. One barrier per step, no reductions.
//    With WalkBatch::float32 (the authors' semantics, BalanceKV's default) the same kernel keeps
//    everything in float32 with IEEE overflow: K (diagonal included) in float, a per-row flag
//    for a non-finite K_tj with j >= t (the authors' sum over the whole row makes p NaN there),
//    a float running sum, and sigma = +1 iff float(u) < p. No block falls back to double.
//  * walk_exact_kernel handles the rest: longer blocks, and blocks whose exponent
//    temp <k_i,k_j>/sqrt(d) - beta exceeds kWalkMaxFloatExp (the float matrix would overflow) or is
//    not finite. It recomputes the row K_{t,i} in double at every step from global memory (the
//    K row computed in parallel by the block's threads), exactly as the CPU reference does.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/core/random.h"
#include "engine/ops/backend.h"
#include "kernels/cuda_check.cuh"

namespace kvscope::cuda {

constexpr int kWalkFastRows = 128;
constexpr int kWalkThreads = 160;  // 136 lower-triangle 8x8 tiles of a 128x128 matrix, >= 128 rows
constexpr double kWalkMaxFloatExp = 80.0;  // exp(80) * |<v,v>| stays far below FLT_MAX

// The sign rule shared with the CPU reference (engine/methods/balancekv/balance_walk.cpp): the
// first element of a block is +1; after that sigma_i = +1 iff u_i < clip(p_i, 0, 1), u_i the step's
// Philox uniform.
KVS_HD int walk_sign(int step, double p, double u) {
  if (step == 0) return 1;
  const double clipped = p < 0.0 ? 0.0 : (p > 1.0 ? 1.0 : p);
  return u < clipped ? 1 : -1;
}

// The authors' float32 rule (WalkBatch::float32): sigma_i = +1 iff float(u_i) < p_i, no
// clipping; a NaN p (overflowed kernel row) gives -1.
KVS_HD int walk_sign_f32(int step, float p, double u) {
  if (step == 0) return 1;
  return static_cast<float>(u) < p ? 1 : -1;
}

// Device pointers and parameters of one walk launch (see WalkBatch in engine/ops/walk_blocks.h).
struct WalkDeviceArgs {
  int d = 0, dv = 0, num_blocks = 0, total_rows = 0;
  const float* keys = nullptr;
  const float* values = nullptr;
  const int* block_offset = nullptr;
  const uint32_t* block_head = nullptr;
  const uint32_t* block_id = nullptr;
  uint64_t seed = 0;
  uint32_t layer = 0, round = 0;
  double gamma = 4, temp = 1, beta = 0, value_bias = 0.025;
  bool float32 = false;  // the authors' float32 semantics (see WalkBatch)
  double value_eps = 0;
  int8_t* sigma = nullptr;
  float* p = nullptr;        // may be null
  float* partial = nullptr;  // may be null
  // Scratch: num_blocks flags, total_rows doubles (the exact path's running sums) and total_rows
  // flags (float32 on the exact path: row t has a non-finite K_tj for some j >= t).
  int* needs_exact = nullptr;
  double* exact_acc = nullptr;
  int* tail_bad = nullptr;
};

// Device copies of one WalkBatch, reused across calls.
struct WalkWorkspace {
  DeviceBuffer keys, values, offsets, heads, ids, sigma, p, partial, flags, acc, tail;
  void release() {
    tail.release();
    keys.release();
    values.release();
    offsets.release();
    heads.release();
    ids.release();
    sigma.release();
    p.release();
    partial.release();
    flags.release();
    acc.release();
  }
};

// Checks `b` as cpu_walk_blocks does (std::invalid_argument, same messages), and that its blocks
// tile rows [0, total) in order (anything else throws Unsupported: the CPU handles it), then
// uploads it. Returns args with num_blocks == 0 when there is nothing to walk.
WalkDeviceArgs upload_walk_batch(const WalkBatch& b, WalkWorkspace& ws, cudaStream_t stream);

// Copies sigma (and p / partial where the batch asks for them) back into the batch.
void download_walk_outputs(const WalkDeviceArgs& a, const WalkBatch& b, cudaStream_t stream);

// Enqueues both kernels on `stream`; throws CudaFailure when a launch is rejected.
void launch_walk_blocks(const WalkDeviceArgs& args, cudaStream_t stream);

}  // namespace kvscope::cuda
