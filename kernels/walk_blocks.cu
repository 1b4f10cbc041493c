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
//
// The op's device interface (its arguments, buffers, upload, launch and download) comes first,
// then the kernels, then the backend's CudaBackend::walk_blocks (kernels/cuda_backend.cuh).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "engine/core/random.h"
#include "engine/ops/backend.h"
#include "kernels/cuda_backend.cuh"
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
struct WalkWorkspace final : OpWorkspace {
  DeviceBuffer keys, values, offsets, heads, ids, sigma, p, partial, flags, acc, tail;
  void release() override {
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

namespace kvscope::cuda {
namespace {

constexpr int kTile = 8;                                            // 8x8 outputs per thread
constexpr int kTileRows = kWalkFastRows / kTile;                    // 16 tile rows
constexpr int kLowerTiles = kTileRows * (kTileRows + 1) / 2;        // 136 tiles with row >= col
constexpr int kTriangle = kWalkFastRows * (kWalkFastRows + 1) / 2;  // packed lower triangle
constexpr int kChunk = 16;                                          // feature dims staged per pass
// Staged features are read as float4 (8 rows = two 16-byte loads per operand); the +4 keeps rows
// 16-byte aligned and leaves the staging stores at most 2-way bank-conflicted.
constexpr int kStagePitch = kWalkFastRows + 4;
static_assert(kStagePitch % 4 == 0 && kTile == 8, "float4 reads of 8-row tile slices");

static_assert(kLowerTiles <= kWalkThreads, "one thread per lower-triangle tile");
static_assert(kWalkFastRows <= kWalkThreads, "one thread per walked row");

// Column-major packed lower triangle: column c holds rows c..kWalkFastRows-1, so at walk step i
// the threads t > i read consecutive words K(t, i) (no bank conflicts).
__device__ __forceinline__ int tri_index(int row, int col) {
  return col * kWalkFastRows - (col * (col - 1)) / 2 + (row - col);
}

// Tile number -> (tile row, tile col) with row >= col, row-major over the lower triangle.
__device__ __forceinline__ void lower_tile(int t, int* tr, int* tc) {
  int r = static_cast<int>((sqrtf(8.0f * static_cast<float>(t) + 1.0f) - 1.0f) * 0.5f);
  while (r * (r + 1) / 2 > t) --r;
  while ((r + 1) * (r + 2) / 2 <= t) ++r;
  *tr = r;
  *tc = t - r * (r + 1) / 2;
}

// acc[a][b] = <x_{tr*8+a}, x_{tc*8+b}> over all `dim` features of the block's rows (zero rows
// past `rows`). All threads must call it (it holds barriers); only `active` ones accumulate.
__device__ void gram_tile(const float* __restrict__ x, int rows, int dim, float* stage, bool active,
                          int tr, int tc, float acc[kTile][kTile]) {
#pragma unroll
  for (int a = 0; a < kTile; ++a)
#pragma unroll
    for (int b = 0; b < kTile; ++b) acc[a][b] = 0.0f;
  for (int c0 = 0; c0 < dim; c0 += kChunk) {
    const int width = min(kChunk, dim - c0);
    __syncthreads();  // the previous chunk has been consumed
    for (int e = threadIdx.x; e < kChunk * kWalkFastRows; e += blockDim.x) {
      const int row = e / kChunk, k = e % kChunk;
      float v = 0.0f;
      if (row < rows && k < width) v = x[static_cast<size_t>(row) * dim + c0 + k];
      stage[k * kStagePitch + row] = v;
    }
    __syncthreads();
    if (!active) continue;
    for (int k = 0; k < width; ++k) {
      const float4* s = reinterpret_cast<const float4*>(stage + k * kStagePitch);
      const float4 r0 = s[tr * 2], r1 = s[tr * 2 + 1], c0v = s[tc * 2], c1v = s[tc * 2 + 1];
      const float ra[kTile] = {r0.x, r0.y, r0.z, r0.w, r1.x, r1.y, r1.z, r1.w};
      const float cb[kTile] = {c0v.x, c0v.y, c0v.z, c0v.w, c1v.x, c1v.y, c1v.z, c1v.w};
#pragma unroll
      for (int a = 0; a < kTile; ++a)
#pragma unroll
        for (int b = 0; b < kTile; ++b) acc[a][b] = fmaf(ra[a], cb[b], acc[a][b]);
    }
  }
}

// Whether x is finite: x - x is 0 for finite x and NaN for inf or NaN (no fast-math here).
__device__ __forceinline__ bool finite_f32(float x) {
  return x - x == 0.0f;
}

// Builds the block's kernel matrix in `tri` from the keys' Gram tile in `acc`, then walks it.
// kF32: the authors' float32 semantics (WalkBatch::float32, mirrors walk_block_f32 in
// engine/methods/balancekv/balance_walk.cpp): K in float with IEEE overflow, diagonal included,
// rows with a non-finite K_tj for j >= t flagged in `tail_bad` (their p is NaN), sums in float,
// never a fallback. Otherwise KVScope's double walk: exponent and product in double, stored as
// float, strict lower triangle only; an exponent above kWalkMaxFloatExp (or not finite) sends the
// whole block to walk_exact_kernel (returns without walking).
template <bool kF32>
__device__ void walk_fast_block(const WalkDeviceArgs& a, int b, int off, int rows, int tid,
                                bool active, int tr, int tc, float acc[kTile][kTile], double u,
                                float* tri, float* stage, int* tail_bad, int* overflow,
                                double* sigma_s) {
  // Same expressions as the CPU references: float32 (temp * <k,k>) / sqrt(d) - beta; double
  // (temp / sqrt(d)) * <k,k> - beta.
  const float temp_f = static_cast<float>(a.temp);
  const float sqrt_d_f = static_cast<float>(sqrt(static_cast<double>(a.d)));
  const float beta_f = static_cast<float>(a.beta);
  const double scale = a.temp / sqrt(static_cast<double>(a.d));
  auto in_triangle = [&](int r, int c) { return r < rows && (kF32 ? c <= r : c < r); };
  if (active) {
#pragma unroll
    for (int i = 0; i < kTile; ++i)
#pragma unroll
      for (int j = 0; j < kTile; ++j) {
        const int r = tr * kTile + i, c = tc * kTile + j;
        if (in_triangle(r, c)) {
          if constexpr (kF32) {
            tri[tri_index(r, c)] = expf((temp_f * acc[i][j]) / sqrt_d_f - beta_f);
          } else {
            const double arg = scale * static_cast<double>(acc[i][j]) - a.beta;
            if (!(arg <= kWalkMaxFloatExp)) atomicOr(overflow, 1);  // also catches NaN
            tri[tri_index(r, c)] = static_cast<float>(exp(arg));
          }
        } else if (!kF32 && r == c && r < rows) {
          // The double walk never uses K_ii (it would only trip the overflow check for long
          // keys: |k|^2 / sqrt(d) is large for real heads).
          tri[tri_index(r, c)] = 0.0f;
        }
      }
  }
  gram_tile(a.values + static_cast<size_t>(off) * a.dv, rows, a.dv, stage, active, tr, tc, acc);
  if (active) {
    const float eps_f = static_cast<float>(a.value_eps), bias_f = static_cast<float>(a.value_bias);
#pragma unroll
    for (int i = 0; i < kTile; ++i)
#pragma unroll
      for (int j = 0; j < kTile; ++j) {
        const int r = tr * kTile + i, c = tc * kTile + j;
        if (!in_triangle(r, c)) continue;
        const int at = tri_index(r, c);
        if constexpr (kF32) {
          const float k = tri[at] * ((acc[i][j] + eps_f) + bias_f);
          tri[at] = k;
          // K_rc = K_cr with r >= c: row c's sum over the whole block sees it.
          if (!finite_f32(k)) atomicOr(&tail_bad[c], 1);
        } else {
          tri[at] = static_cast<float>(static_cast<double>(tri[at]) *
                                       (static_cast<double>(acc[i][j]) + a.value_bias));
        }
      }
  }
  __syncthreads();
  const bool exact = !kF32 && *overflow != 0;
  if (tid == 0) a.needs_exact[b] = exact ? 1 : 0;
  if (exact) return;  // uniform across the block: walk_exact_kernel redoes it in double

  // The walk. Thread t < rows owns row t: running = sum_{j<t} K_tj sigma_j (float32: in float,
  // NaN for a flagged row; double: in double), summed in the order j = 0, 1, ... as the CPU
  // does. One barrier per step.
  using Sum = std::conditional_t<kF32, float, double>;
  const Sum gamma = static_cast<Sum>(a.gamma);
  Sum running = 0;
  for (int i = 0; i < rows; ++i) {
    if (tid == i) {
      const Sum partial = kF32 && tail_bad[i] ? static_cast<Sum>(NAN) : running;
      const Sum p = static_cast<Sum>(0.5) - gamma * partial;
      const int s = kF32 ? walk_sign_f32(i, static_cast<float>(p), u) : walk_sign(i, p, u);
      sigma_s[i] = static_cast<double>(s);
      a.sigma[off + i] = static_cast<int8_t>(s);
      if (a.p) a.p[off + i] = static_cast<float>(p);
      if (a.partial) a.partial[off + i] = static_cast<float>(partial);
    }
    __syncthreads();
    if (tid > i && tid < rows) {
      if constexpr (kF32)
        running = fmaf(tri[tri_index(tid, i)], static_cast<float>(sigma_s[i]), running);
      else
        running = fma(static_cast<double>(tri[tri_index(tid, i)]), sigma_s[i], running);
    }
  }
}

// At most 96 registers so four blocks share an SM (more blocks hide the sequential walk's
// barrier latency; ptxas spills a few bytes outside the hot loops for it).
__global__ void __launch_bounds__(kWalkThreads, 4) walk_fast_kernel(WalkDeviceArgs a) {
  const int b = blockIdx.x;
  const int off = a.block_offset[b];
  const int rows = a.block_offset[b + 1] - off;
  const int tid = threadIdx.x;
  if (rows > kWalkFastRows) {
    if (tid == 0) a.needs_exact[b] = 1;
    return;
  }
  if (rows <= 0) {
    if (tid == 0) a.needs_exact[b] = 0;
    return;
  }

  __shared__ float tri[kTriangle];
  __shared__ __align__(16) float stage[kChunk * kStagePitch];
  __shared__ double sigma_s[kWalkFastRows];
  __shared__ int overflow;
  __shared__ int tail_bad[kWalkFastRows];  // float32: row t has a non-finite K_tj, j >= t
  if (tid == 0) overflow = 0;
  if (tid < kWalkFastRows) tail_bad[tid] = 0;

  // The step's uniform is drawn up front by the row's owner (Philox is stateless).
  double u = 0.0;
  if (tid < rows)
    u = counter_uniform(a.seed, kRandWalk, a.layer, a.block_head[b], a.round, a.block_id[b],
                        static_cast<uint32_t>(tid));

  int tr = 0, tc = 0;
  if (tid < kLowerTiles) lower_tile(tid, &tr, &tc);
  const bool active = tid < kLowerTiles && tr * kTile < rows;

  float acc[kTile][kTile];
  gram_tile(a.keys + static_cast<size_t>(off) * a.d, rows, a.d, stage, active, tr, tc, acc);
  if (a.float32)
    walk_fast_block<true>(a, b, off, rows, tid, active, tr, tc, acc, u, tri, stage, tail_bad,
                          &overflow, sigma_s);
  else
    walk_fast_block<false>(a, b, off, rows, tid, active, tr, tc, acc, u, tri, stage, tail_bad,
                           &overflow, sigma_s);
}

// K_tj of the float32 walk, computed as walk_fast_block<true> / the CPU do (float accumulation).
__device__ float kernel_f32(const WalkDeviceArgs& a, int off, int t, int j) {
  const float* kt = a.keys + static_cast<size_t>(off + t) * a.d;
  const float* kj = a.keys + static_cast<size_t>(off + j) * a.d;
  const float* vt = a.values + static_cast<size_t>(off + t) * a.dv;
  const float* vj = a.values + static_cast<size_t>(off + j) * a.dv;
  float kd = 0.0f, vd = 0.0f;
  for (int c = 0; c < a.d; ++c) kd = fmaf(kt[c], kj[c], kd);
  for (int c = 0; c < a.dv; ++c) vd = fmaf(vt[c], vj[c], vd);
  const float temp = static_cast<float>(a.temp);
  const float sqrt_d = static_cast<float>(sqrt(static_cast<double>(a.d)));
  return expf((temp * kd) / sqrt_d - static_cast<float>(a.beta)) *
         ((vd + static_cast<float>(a.value_eps)) + static_cast<float>(a.value_bias));
}

// The float32 walk of a block longer than kWalkFastRows: a pre-pass flags rows with a non-finite
// K_tj (j >= t), then the walk recomputes row i of K at every step, summing in float.
__device__ void walk_exact_f32(const WalkDeviceArgs& a, int b, int off, int rows, int tid) {
  float* running = reinterpret_cast<float*>(a.exact_acc + off);  // rows floats fit in rows doubles
  int* bad = a.tail_bad + off;
  for (int t = tid; t < rows; t += blockDim.x) {
    running[t] = 0.0f;
    int flag = 0;
    for (int j = t; j < rows && !flag; ++j) flag = !finite_f32(kernel_f32(a, off, t, j));
    bad[t] = flag;
  }
  __shared__ float sigma_i;
  const float gamma = static_cast<float>(a.gamma);
  __syncthreads();
  for (int i = 0; i < rows; ++i) {
    if (tid == 0) {
      const float partial = bad[i] ? static_cast<float>(NAN) : running[i];
      const float p = 0.5f - gamma * partial;
      const double u = counter_uniform(a.seed, kRandWalk, a.layer, a.block_head[b], a.round,
                                       a.block_id[b], static_cast<uint32_t>(i));
      const int s = walk_sign_f32(i, p, u);
      sigma_i = static_cast<float>(s);
      a.sigma[off + i] = static_cast<int8_t>(s);
      if (a.p) a.p[off + i] = p;
      if (a.partial) a.partial[off + i] = partial;
    }
    __syncthreads();
    const float s = sigma_i;
    for (int t = i + 1 + tid; t < rows; t += blockDim.x)
      running[t] = fmaf(kernel_f32(a, off, t, i), s, running[t]);
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kWalkThreads) walk_exact_kernel(WalkDeviceArgs a) {
  const int b = blockIdx.x;
  if (!a.needs_exact[b]) return;
  const int off = a.block_offset[b];
  const int rows = a.block_offset[b + 1] - off;
  const int tid = threadIdx.x;
  if (a.float32) {
    walk_exact_f32(a, b, off, rows, tid);
    return;
  }
  double* running = a.exact_acc + off;
  for (int t = tid; t < rows; t += blockDim.x) running[t] = 0.0;
  __shared__ double sigma_i;
  const double scale = a.temp / sqrt(static_cast<double>(a.d));
  __syncthreads();
  for (int i = 0; i < rows; ++i) {
    if (tid == 0) {
      const double sum = running[i];
      const double p = 0.5 - a.gamma * sum;
      const double u = counter_uniform(a.seed, kRandWalk, a.layer, a.block_head[b], a.round,
                                       a.block_id[b], static_cast<uint32_t>(i));
      const int s = walk_sign(i, p, u);
      sigma_i = static_cast<double>(s);
      a.sigma[off + i] = static_cast<int8_t>(s);
      if (a.p) a.p[off + i] = static_cast<float>(p);
      if (a.partial) a.partial[off + i] = static_cast<float>(sum);
    }
    __syncthreads();
    const double s = sigma_i;
    const float* ki = a.keys + static_cast<size_t>(off + i) * a.d;
    const float* vi = a.values + static_cast<size_t>(off + i) * a.dv;
    // Row i of K against every later row, one row per thread, all in double.
    for (int t = i + 1 + tid; t < rows; t += blockDim.x) {
      const float* kt = a.keys + static_cast<size_t>(off + t) * a.d;
      const float* vt = a.values + static_cast<size_t>(off + t) * a.dv;
      double kd = 0.0, vd = 0.0;
      for (int c = 0; c < a.d; ++c) kd += static_cast<double>(kt[c]) * ki[c];
      for (int c = 0; c < a.dv; ++c) vd += static_cast<double>(vt[c]) * vi[c];
      const double k = exp(scale * kd - a.beta) * (vd + a.value_bias);
      running[t] += k * s;
    }
    __syncthreads();  // running[i + 1] is complete before thread 0 reads it
  }
}

}  // namespace

WalkDeviceArgs upload_walk_batch(const WalkBatch& b, WalkWorkspace& ws, cudaStream_t stream) {
  WalkDeviceArgs a;
  if (b.num_blocks <= 0) return a;
  if (!b.keys || !b.values || !b.block_offset || !b.block_head || !b.block_id || !b.sigma)
    throw std::invalid_argument("cpu_walk_blocks: missing input or output array");
  if (b.d <= 0 || b.dv <= 0) throw std::invalid_argument("cpu_walk_blocks: d and dv must be > 0");
  if (b.block_offset[0] != 0)
    throw Unsupported("walk_blocks: the first block does not start at row 0");
  for (int i = 0; i < b.num_blocks; ++i)
    if (b.block_offset[i + 1] < b.block_offset[i])
      throw Unsupported("walk_blocks: block offsets decrease at block " + std::to_string(i));
  const size_t total = static_cast<size_t>(b.block_offset[b.num_blocks]);
  const size_t blocks = static_cast<size_t>(b.num_blocks);
  a.d = b.d;
  a.dv = b.dv;
  a.num_blocks = b.num_blocks;
  a.total_rows = static_cast<int>(total);
  a.seed = b.seed;
  a.layer = b.layer;
  a.round = b.round;
  a.gamma = b.gamma;
  a.temp = b.temp;
  a.beta = b.beta;
  a.value_bias = b.value_bias;
  a.float32 = b.float32;
  a.value_eps = b.value_eps;
  float* keys = ws.keys.reserve_as<float>(total * b.d);
  float* values = ws.values.reserve_as<float>(total * b.dv);
  int* offsets = ws.offsets.reserve_as<int>(blocks + 1);
  uint32_t* heads = ws.heads.reserve_as<uint32_t>(blocks);
  uint32_t* ids = ws.ids.reserve_as<uint32_t>(blocks);
  a.sigma = ws.sigma.reserve_as<int8_t>(total);
  a.p = b.p ? ws.p.reserve_as<float>(total) : nullptr;
  a.partial = b.partial ? ws.partial.reserve_as<float>(total) : nullptr;
  a.needs_exact = ws.flags.reserve_as<int>(blocks);
  a.exact_acc = ws.acc.reserve_as<double>(total);
  a.tail_bad = ws.tail.reserve_as<int>(total);
  KVS_CUDA_CHECK(
      cudaMemcpyAsync(keys, b.keys, total * b.d * sizeof(float), cudaMemcpyHostToDevice, stream));
  KVS_CUDA_CHECK(cudaMemcpyAsync(values, b.values, total * b.dv * sizeof(float),
                                 cudaMemcpyHostToDevice, stream));
  KVS_CUDA_CHECK(cudaMemcpyAsync(offsets, b.block_offset, (blocks + 1) * sizeof(int),
                                 cudaMemcpyHostToDevice, stream));
  KVS_CUDA_CHECK(cudaMemcpyAsync(heads, b.block_head, blocks * sizeof(uint32_t),
                                 cudaMemcpyHostToDevice, stream));
  KVS_CUDA_CHECK(
      cudaMemcpyAsync(ids, b.block_id, blocks * sizeof(uint32_t), cudaMemcpyHostToDevice, stream));
  a.keys = keys;
  a.values = values;
  a.block_offset = offsets;
  a.block_head = heads;
  a.block_id = ids;
  return a;
}

void download_walk_outputs(const WalkDeviceArgs& a, const WalkBatch& b, cudaStream_t stream) {
  const size_t total = static_cast<size_t>(a.total_rows);
  if (a.num_blocks > 0 && total > 0) {
    KVS_CUDA_CHECK(
        cudaMemcpyAsync(b.sigma, a.sigma, total * sizeof(int8_t), cudaMemcpyDeviceToHost, stream));
    if (b.p && a.p)
      KVS_CUDA_CHECK(
          cudaMemcpyAsync(b.p, a.p, total * sizeof(float), cudaMemcpyDeviceToHost, stream));
    if (b.partial && a.partial)
      KVS_CUDA_CHECK(cudaMemcpyAsync(b.partial, a.partial, total * sizeof(float),
                                     cudaMemcpyDeviceToHost, stream));
  }
  KVS_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void launch_walk_blocks(const WalkDeviceArgs& args, cudaStream_t stream) {
  if (args.num_blocks <= 0) return;
  walk_fast_kernel<<<args.num_blocks, kWalkThreads, 0, stream>>>(args);
  KVS_CUDA_CHECK_LAUNCH("walk_fast_kernel");
  walk_exact_kernel<<<args.num_blocks, kWalkThreads, 0, stream>>>(args);
  KVS_CUDA_CHECK_LAUNCH("walk_exact_kernel");
}

// ---- the backend's op ---------------------------------------------------------------------

void CudaBackend::walk_blocks(const WalkBatch& b) {
  guarded([&] {
    const WalkDeviceArgs a =
        upload_walk_batch(b, workspace<WalkWorkspace>(Op::walk_blocks), stream_);
    if (a.num_blocks == 0) return;
    launch([a, this] { launch_walk_blocks(a, stream_); });
    download_walk_outputs(a, b, stream_);
  });
}

}  // namespace kvscope::cuda
