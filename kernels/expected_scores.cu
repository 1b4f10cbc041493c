// Expected-attention's scores on the GPU (ExpectedScoreBatch and the CPU reference
// cpu_expected_scores in engine/ops/expected_scores.h), in double precision. With Q = heads x
// group query heads, seven launches:
//   1. column means of each query head's rows (one thread per column, rows in order);
//   2. R mu (one thread per entry);
//   3. the covariance S = (q - mu)^T (q - mu) / count: 16 x 16 output tiles, the centred rows
//      staged in shared memory 16 at a time;
//   4-5. R S, then (R S) R^T (one thread per entry; skipped without use_covariance);
//   6. the expected logits: a block scores 8 keys (held in shared memory) against one query
//      head, each thread a strided share of the channels (k . R mu and the quadratic form
//      k^T S' k through the columns of S', read coalesced), reduced per key in shared memory;
//   7. per query head the logits' maximum and sum of exp(l - max) (block reductions);
//   8. per key the group's probabilities added head by head, as the CPU reference adds them,
//      times (p + epsilon) |v| with use_vnorm.
//
// The op's device interface (its arguments, buffers, upload, launch and download) comes first,
// then the kernels, then the backend's CudaBackend::expected_scores (kernels/cuda_backend.cuh).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/ops/backend.h"
#include "kernels/block_reduce.cuh"
#include "kernels/cuda_backend.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/per_head_copies.cuh"

namespace kvscope::cuda {

constexpr int kExpectedThreads = 128;
constexpr int kExpectedKeysPerBlock = 8;

struct ExpectedDeviceArgs {
  int heads = 0, group = 0, count = 0, d = 0, dv = 0;
  bool use_covariance = true, use_vnorm = true;
  double epsilon = 0;
  const float* keys = nullptr;       // [heads][count][d]
  const float* values = nullptr;     // [heads][count][dv], or null without use_vnorm
  const double* queries = nullptr;   // [heads * group][count][d]
  const double* rotation = nullptr;  // [d][d]
  double* mu = nullptr;              // [heads * group][d]
  double* mu_r = nullptr;            // [heads * group][d]
  double* cov = nullptr;             // [heads * group][d][d]
  double* tmp = nullptr;             // [heads * group][d][d]: R S
  double* cov_r = nullptr;           // [heads * group][d][d]
  double* logits = nullptr;          // [heads * group][count]
  double* stats = nullptr;           // [heads * group][2]: max, sum of exp(l - max)
  double* out = nullptr;             // [heads][count]
};

struct ExpectedWorkspace final : OpWorkspace {
  DeviceBuffer keys, values, queries, rotation, work, out;
  void release() override {
    keys.release();
    values.release();
    queries.release();
    rotation.release();
    work.release();
    out.release();
  }
};

// Dynamic shared memory of the logits launch (8 keys in double, and the per-key partial sums),
// or 0 when it exceeds the 48 KiB a block gets without opting in (the backend then declines).
size_t expected_scores_smem_bytes(int d);

// Checks `b` as the CPU reference does (check_expected_score_batch: std::invalid_argument),
// throws Cancelled when b.cancel is set, uploads.
ExpectedDeviceArgs upload_expected_batch(const ExpectedScoreBatch& b, ExpectedWorkspace& ws,
                                         cudaStream_t stream);

void launch_expected_scores(const ExpectedDeviceArgs& a, cudaStream_t stream);

void download_expected_scores(const ExpectedDeviceArgs& a, const ExpectedScoreBatch& b,
                              cudaStream_t stream);

}  // namespace kvscope::cuda

namespace kvscope::cuda {
namespace {

constexpr int kTile = 16;

// 1. grid (ceil(d / threads), heads * group).
__global__ void __launch_bounds__(kExpectedThreads) expected_mean_kernel(ExpectedDeviceArgs a) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x, hq = blockIdx.y;
  if (c >= a.d) return;
  const double* q = a.queries + static_cast<size_t>(hq) * a.count * a.d;
  double sum = 0.0;
  for (int t = 0; t < a.count; ++t) sum += q[static_cast<size_t>(t) * a.d + c];
  a.mu[static_cast<size_t>(hq) * a.d + c] = sum / static_cast<double>(a.count);
}

// 2. grid (ceil(d / threads), heads * group): mu_r = R mu.
__global__ void __launch_bounds__(kExpectedThreads)
    expected_rotate_mean_kernel(ExpectedDeviceArgs a) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x, hq = blockIdx.y;
  if (r >= a.d) return;
  const double* mu = a.mu + static_cast<size_t>(hq) * a.d;
  double sum = 0.0;
  for (int c = 0; c < a.d; ++c) sum += a.rotation[static_cast<size_t>(r) * a.d + c] * mu[c];
  a.mu_r[static_cast<size_t>(hq) * a.d + r] = sum;
}

// 3. grid (ceil(d / 16)^2, heads * group), 256 threads: entry (row, col) of S, thread
// (ty, tx) = (threadIdx.x / 16, threadIdx.x % 16) of the 16 x 16 tile blockIdx.x.
__global__ void __launch_bounds__(kTile* kTile) expected_cov_kernel(ExpectedDeviceArgs a) {
  __shared__ double qa[kTile][kTile + 1], qb[kTile][kTile + 1];  // [token][channel]
  const int hq = blockIdx.y, tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  const int tiles = (a.d + kTile - 1) / kTile;
  const int row0 = (blockIdx.x / tiles) * kTile, col0 = (blockIdx.x % tiles) * kTile;
  const double* q = a.queries + static_cast<size_t>(hq) * a.count * a.d;
  const double* mu = a.mu + static_cast<size_t>(hq) * a.d;
  double acc = 0.0;
  for (int t0 = 0; t0 < a.count; t0 += kTile) {
    const int t = t0 + ty;
    const int ca = row0 + tx, cb = col0 + tx;
    qa[ty][tx] = t < a.count && ca < a.d ? q[static_cast<size_t>(t) * a.d + ca] - mu[ca] : 0.0;
    qb[ty][tx] = t < a.count && cb < a.d ? q[static_cast<size_t>(t) * a.d + cb] - mu[cb] : 0.0;
    __syncthreads();
    for (int r = 0; r < kTile; ++r) acc += qa[r][ty] * qb[r][tx];
    __syncthreads();
  }
  const int row = row0 + ty, col = col0 + tx;
  if (row < a.d && col < a.d)
    a.cov[(static_cast<size_t>(hq) * a.d + row) * a.d + col] = acc / static_cast<double>(a.count);
}

// 4-5. grid (ceil(d * d / threads), heads * group): C = A B (transpose_b: A B^T); a stride of 0
// is the rotation, shared by every query head.
__global__ void __launch_bounds__(kExpectedThreads)
    expected_product_kernel(const double* A, size_t a_stride, const double* B, size_t b_stride,
                            bool transpose_b, double* C, int d) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x, hq = blockIdx.y;
  if (e >= d * d) return;
  const int r = e / d, c = e % d;
  const double* x = A + hq * a_stride + static_cast<size_t>(r) * d;
  const double* y = B + hq * b_stride;
  double sum = 0.0;
  for (int k = 0; k < d; ++k)
    sum += x[k] *
           (transpose_b ? y[static_cast<size_t>(c) * d + k] : y[static_cast<size_t>(k) * d + c]);
  C[hq * static_cast<size_t>(d) * d + e] = sum;
}

// 6. grid (ceil(count / 8), heads * group): the logits of 8 keys against one query head.
__global__ void __launch_bounds__(kExpectedThreads) expected_logits_kernel(ExpectedDeviceArgs a) {
  extern __shared__ double smem[];
  double* ks = smem;                                                       // [8][d]
  double* part = smem + static_cast<size_t>(kExpectedKeysPerBlock) * a.d;  // [2][8][threads]
  const int hq = blockIdx.y, kv = hq / a.group;
  const int j0 = blockIdx.x * kExpectedKeysPerBlock;
  const float* keys = a.keys + static_cast<size_t>(kv) * a.count * a.d;
  for (int e = threadIdx.x; e < kExpectedKeysPerBlock * a.d; e += blockDim.x) {
    const int j = j0 + e / a.d;
    ks[e] = j < a.count ? static_cast<double>(keys[static_cast<size_t>(j) * a.d + e % a.d]) : 0.0;
  }
  __syncthreads();
  const double* mu_r = a.mu_r + static_cast<size_t>(hq) * a.d;
  const double* cov_r = a.cov_r + static_cast<size_t>(hq) * a.d * a.d;
  double lin[kExpectedKeysPerBlock], quad[kExpectedKeysPerBlock];
  for (int kk = 0; kk < kExpectedKeysPerBlock; ++kk) lin[kk] = quad[kk] = 0.0;
  for (int c = threadIdx.x; c < a.d; c += blockDim.x) {
    const double m = mu_r[c];
    for (int kk = 0; kk < kExpectedKeysPerBlock; ++kk) lin[kk] += ks[kk * a.d + c] * m;
    if (a.use_covariance) {
      // y_c = (k S')_c = sum_b k_b S'_bc: column c of S', read across the block's threads.
      double y[kExpectedKeysPerBlock];
      for (int kk = 0; kk < kExpectedKeysPerBlock; ++kk) y[kk] = 0.0;
      for (int b = 0; b < a.d; ++b) {
        const double s = cov_r[static_cast<size_t>(b) * a.d + c];
        for (int kk = 0; kk < kExpectedKeysPerBlock; ++kk) y[kk] += ks[kk * a.d + b] * s;
      }
      for (int kk = 0; kk < kExpectedKeysPerBlock; ++kk) quad[kk] += y[kk] * ks[kk * a.d + c];
    }
  }
  for (int kk = 0; kk < kExpectedKeysPerBlock; ++kk) {
    part[kk * blockDim.x + threadIdx.x] = lin[kk];
    part[(kExpectedKeysPerBlock + kk) * blockDim.x + threadIdx.x] = quad[kk];
  }
  __syncthreads();
  if (threadIdx.x < kExpectedKeysPerBlock) {
    const int kk = threadIdx.x, j = j0 + kk;
    double l = 0.0, qf = 0.0;
    for (int t = 0; t < static_cast<int>(blockDim.x); ++t) {
      l += part[kk * blockDim.x + t];
      qf += part[(kExpectedKeysPerBlock + kk) * blockDim.x + t];
    }
    double logit = l / sqrt(static_cast<double>(a.d));
    if (a.use_covariance) logit += qf / static_cast<double>(a.d) / 2.0;
    if (j < a.count) a.logits[static_cast<size_t>(hq) * a.count + j] = logit;
  }
}

// 7. grid (heads * group).
__global__ void __launch_bounds__(kExpectedThreads)
    expected_softmax_stats_kernel(ExpectedDeviceArgs a) {
  __shared__ double scratch[kExpectedThreads];
  const int hq = blockIdx.x;
  const double* l = a.logits + static_cast<size_t>(hq) * a.count;
  double mx = -INFINITY;
  for (int j = threadIdx.x; j < a.count; j += blockDim.x) mx = fmax(mx, l[j]);
  mx = block_reduce(mx, true, scratch);
  double z = 0.0;
  for (int j = threadIdx.x; j < a.count; j += blockDim.x) z += exp(l[j] - mx);
  z = block_reduce(z, false, scratch);
  if (threadIdx.x == 0) {
    a.stats[2 * hq] = mx;
    a.stats[2 * hq + 1] = z;
  }
}

// 8. grid (ceil(count / threads), heads).
__global__ void __launch_bounds__(kExpectedThreads) expected_combine_kernel(ExpectedDeviceArgs a) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y;
  if (j >= a.count) return;
  double p = 0.0;
  for (int g = 0; g < a.group; ++g) {
    const int hq = h * a.group + g;
    p += exp(a.logits[static_cast<size_t>(hq) * a.count + j] - a.stats[2 * hq]) /
         a.stats[2 * hq + 1] / static_cast<double>(a.group);
  }
  if (a.use_vnorm) {
    const float* v = a.values + (static_cast<size_t>(h) * a.count + j) * a.dv;
    double ss = 0.0;
    for (int c = 0; c < a.dv; ++c) ss += static_cast<double>(v[c]) * static_cast<double>(v[c]);
    p = (p + a.epsilon) * sqrt(ss);
  }
  a.out[static_cast<size_t>(h) * a.count + j] = p;
}

}  // namespace

size_t expected_scores_smem_bytes(int d) {
  const size_t bytes = (static_cast<size_t>(kExpectedKeysPerBlock) * std::max(d, 1) +
                        2 * static_cast<size_t>(kExpectedKeysPerBlock) * kExpectedThreads) *
                       sizeof(double);
  return within_default_smem(bytes);
}

ExpectedDeviceArgs upload_expected_batch(const ExpectedScoreBatch& b, ExpectedWorkspace& ws,
                                         cudaStream_t stream) {
  check_expected_score_batch(b);
  if (b.cancel && b.cancel->load(std::memory_order_relaxed)) throw Cancelled();
  if (expected_scores_smem_bytes(b.d) == 0)
    throw Unsupported("key width d=" + std::to_string(b.d) +
                      " exceeds the CUDA expected-attention kernel's tiles");
  ExpectedDeviceArgs a;
  a.heads = static_cast<int>(b.heads.size());
  a.group = b.group();
  a.count = b.count;
  a.d = b.d;
  a.dv = b.dv;
  a.use_covariance = b.use_covariance;
  a.use_vnorm = b.use_vnorm;
  a.epsilon = b.epsilon;
  const size_t heads = a.heads, hq = static_cast<size_t>(a.heads) * a.group, count = b.count,
               d = b.d, dv = std::max(b.dv, 0);
  float* dk = ws.keys.reserve_as<float>(heads * count * d);
  float* dval = b.use_vnorm ? ws.values.reserve_as<float>(heads * count * dv) : nullptr;
  double* dq = ws.queries.reserve_as<double>(hq * count * d);
  double* drot = ws.rotation.reserve_as<double>(d * d);
  double* work = ws.work.reserve_as<double>(hq * (2 * d + 3 * d * d + count + 2));
  double* dout = ws.out.reserve_as<double>(heads * count);
  upload_per_head(dk, b.heads, count * d, &ExpectedScoreHead::keys, stream);
  if (dval) upload_per_head(dval, b.heads, count * dv, &ExpectedScoreHead::values, stream);
  upload_group_queries(dq, b.heads, count * d, stream);
  KVS_CUDA_CHECK(
      cudaMemcpyAsync(drot, b.rotation, d * d * sizeof(double), cudaMemcpyHostToDevice, stream));
  a.keys = dk;
  a.values = dval;
  a.queries = dq;
  a.rotation = drot;
  a.mu = work;
  a.mu_r = a.mu + hq * d;
  a.cov = a.mu_r + hq * d;
  a.tmp = a.cov + hq * d * d;
  a.cov_r = a.tmp + hq * d * d;
  a.logits = a.cov_r + hq * d * d;
  a.stats = a.logits + hq * count;
  a.out = dout;
  return a;
}

void launch_expected_scores(const ExpectedDeviceArgs& a, cudaStream_t stream) {
  const int hq = a.heads * a.group;
  const dim3 cols((a.d + kExpectedThreads - 1) / kExpectedThreads, hq);
  expected_mean_kernel<<<cols, kExpectedThreads, 0, stream>>>(a);
  KVS_CUDA_CHECK_LAUNCH("expected_mean_kernel");
  expected_rotate_mean_kernel<<<cols, kExpectedThreads, 0, stream>>>(a);
  KVS_CUDA_CHECK_LAUNCH("expected_rotate_mean_kernel");
  if (a.use_covariance) {
    const int tiles = (a.d + kTile - 1) / kTile;
    const dim3 tile_grid(tiles * tiles, hq);
    expected_cov_kernel<<<tile_grid, kTile * kTile, 0, stream>>>(a);
    KVS_CUDA_CHECK_LAUNCH("expected_cov_kernel");
    const size_t dd = static_cast<size_t>(a.d) * a.d;
    const dim3 entries(static_cast<unsigned>((dd + kExpectedThreads - 1) / kExpectedThreads), hq);
    expected_product_kernel<<<entries, kExpectedThreads, 0, stream>>>(a.rotation, 0, a.cov, dd,
                                                                      false, a.tmp, a.d);
    KVS_CUDA_CHECK_LAUNCH("expected_product_kernel");
    expected_product_kernel<<<entries, kExpectedThreads, 0, stream>>>(a.tmp, dd, a.rotation, 0,
                                                                      true, a.cov_r, a.d);
    KVS_CUDA_CHECK_LAUNCH("expected_product_kernel");
  }
  const dim3 key_blocks((a.count + kExpectedKeysPerBlock - 1) / kExpectedKeysPerBlock, hq);
  expected_logits_kernel<<<key_blocks, kExpectedThreads, expected_scores_smem_bytes(a.d), stream>>>(
      a);
  KVS_CUDA_CHECK_LAUNCH("expected_logits_kernel");
  expected_softmax_stats_kernel<<<hq, kExpectedThreads, 0, stream>>>(a);
  KVS_CUDA_CHECK_LAUNCH("expected_softmax_stats_kernel");
  const dim3 per_key((a.count + kExpectedThreads - 1) / kExpectedThreads, a.heads);
  expected_combine_kernel<<<per_key, kExpectedThreads, 0, stream>>>(a);
  KVS_CUDA_CHECK_LAUNCH("expected_combine_kernel");
}

void download_expected_scores(const ExpectedDeviceArgs& a, const ExpectedScoreBatch& b,
                              cudaStream_t stream) {
  download_per_head(a.out, b.heads, a.count, &ExpectedScoreHead::scores, stream);
}

// ---- the backend's op ---------------------------------------------------------------------

void CudaBackend::expected_scores(const ExpectedScoreBatch& b) {
  if (expected_scores_smem_bytes(b.d) == 0)
    throw DeviceFailure("key width d=" + std::to_string(b.d) +
                        " exceeds the CUDA expected-attention kernel's tiles");
  guarded([&] {
    const ExpectedDeviceArgs a =
        upload_expected_batch(b, workspace<ExpectedWorkspace>(Op::expected_scores), stream_);
    launch([a, this] { launch_expected_scores(a, stream_); });
    download_expected_scores(a, b, stream_);
  });
}

}  // namespace kvscope::cuda
