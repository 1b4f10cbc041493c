// BUZZ's cache-score kernels; see cache_scores.cuh.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/error.h"
#include "kernels/block_reduce.cuh"
#include "kernels/cache_scores.cuh"

namespace kvscope::cuda {
namespace {

__device__ __forceinline__ double logit(const double* q, const float* k, int d, double scale) {
  double dot = 0.0;
  for (int c = 0; c < d; ++c) dot += q[c] * static_cast<double>(k[c]);
  return dot * scale;
}

// Launch 1: grid (rows, group).
__global__ void __launch_bounds__(kCacheThreads) cache_row_stats_kernel(CacheScoreDeviceArgs a) {
  extern __shared__ double q_row[];  // [d]
  __shared__ double scratch[kCacheThreads];
  const int row = blockIdx.x, h = blockIdx.y;
  const float* q = a.queries + (static_cast<size_t>(h) * a.rows + row) * a.d;
  for (int c = threadIdx.x; c < a.d; c += blockDim.x) q_row[c] = static_cast<double>(q[c]);
  __syncthreads();
  const int seen = a.row_seen[row];
  const double scale = a.row_scale[row];
  double mx = -INFINITY;
  for (int j = threadIdx.x; j < seen; j += blockDim.x)
    mx = fmax(mx, logit(q_row, a.key_rows + static_cast<size_t>(j) * a.d, a.d, scale));
  mx = block_reduce(mx, true, scratch);
  double z = 0.0;
  for (int j = threadIdx.x; j < seen; j += blockDim.x)
    z += exp(logit(q_row, a.key_rows + static_cast<size_t>(j) * a.d, a.d, scale) - mx);
  z = block_reduce(z, false, scratch);
  if (threadIdx.x == 0) {
    a.row_max[static_cast<size_t>(h) * a.rows + row] = mx;
    a.row_inv[static_cast<size_t>(h) * a.rows + row] = 1.0 / (z * static_cast<double>(a.group));
  }
}

// Launch 2: one thread per key.
__global__ void __launch_bounds__(kCacheThreads) cache_accumulate_kernel(CacheScoreDeviceArgs a) {
  extern __shared__ double q_rows[];  // [group][d]: the current row's queries
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  const bool mine = j < a.keys;
  const int pos = mine ? a.key_pos[j] : 0;
  double acc = mine ? a.acc[j] : 0.0;
  const float* k = a.key_rows + static_cast<size_t>(mine ? j : 0) * a.d;
  for (int row = 0; row < a.rows; ++row) {
    __syncthreads();  // the previous row's queries are no longer read
    for (int e = threadIdx.x; e < a.group * a.d; e += blockDim.x) {
      const int h = e / a.d, c = e % a.d;
      q_rows[e] = static_cast<double>(a.queries[(static_cast<size_t>(h) * a.rows + row) * a.d + c]);
    }
    __syncthreads();
    if (!mine || pos > a.row_begin + row) continue;  // causal: the row does not see the key
    const double scale = a.row_scale[row];
    for (int h = 0; h < a.group; ++h) {
      const size_t s = static_cast<size_t>(h) * a.rows + row;
      acc += exp(logit(q_rows + static_cast<size_t>(h) * a.d, k, a.d, scale) - a.row_max[s]) *
             a.row_inv[s];
    }
  }
  if (mine) a.acc[j] = acc;
}

}  // namespace

size_t cache_scores_smem_bytes(int d, int group) {
  const size_t bytes = static_cast<size_t>(std::max(d, 1)) * std::max(group, 1) * sizeof(double);
  return within_default_smem(bytes);
}

CacheScoreDeviceArgs upload_cache_score_batch(const CacheScoreBatch& b, CacheScoreWorkspace& ws,
                                              cudaStream_t stream) {
  check_cache_score_batch(b);
  if (b.cancel && b.cancel->load(std::memory_order_relaxed)) throw Cancelled();
  CacheScoreDeviceArgs a;
  if (b.row_begin == b.row_end) return a;
  if (cache_scores_smem_bytes(b.d, b.group()) == 0)
    throw Unsupported("key width d=" + std::to_string(b.d) + " with " + std::to_string(b.group()) +
                      " query heads per group exceeds the CUDA cache-score kernels' rows");
  a.d = b.d;
  a.group = b.group();
  a.keys = b.num_keys;
  a.row_begin = b.row_begin;
  a.rows = b.row_end - b.row_begin;
  const size_t d = b.d, keys = a.keys, rows = a.rows, group = a.group;
  // The cache's keys and scores, gathered; each row's visible keys and scale, as the CPU
  // reference computes them.
  std::vector<float> key_rows(keys * d);
  std::vector<double> acc(keys);
  for (size_t j = 0; j < keys; ++j) {
    std::copy_n(b.keys + static_cast<size_t>(b.key_ids[j]) * d, d, key_rows.begin() + j * d);
    acc[j] = b.acc[b.key_ids[j]];
  }
  std::vector<int> seen(rows);
  std::vector<double> scale(rows);
  const double inv_sqrt_d = 1.0 / std::sqrt(static_cast<double>(b.d));
  int s = 0;
  for (size_t r = 0; r < rows; ++r) {
    const int t = b.row_begin + static_cast<int>(r);
    while (s < b.num_keys && b.key_ids[s] <= t) ++s;
    seen[r] = s;
    scale[r] = inv_sqrt_d * (b.log_n ? std::log(static_cast<double>(s)) / std::log(512.0) : 1.0);
  }
  float* dk = ws.keys.reserve_as<float>(keys * d);
  int* dpos = ws.pos.reserve_as<int>(keys);
  float* dq = ws.queries.reserve_as<float>(group * rows * d);
  int* drows = ws.rows.reserve_as<int>(rows);
  double* dstats = ws.stats.reserve_as<double>(3 * group * rows + rows);
  double* dacc = ws.acc.reserve_as<double>(keys);
  KVS_CUDA_CHECK(cudaMemcpyAsync(dk, key_rows.data(), keys * d * sizeof(float),
                                 cudaMemcpyHostToDevice, stream));
  KVS_CUDA_CHECK(
      cudaMemcpyAsync(dpos, b.key_ids, keys * sizeof(int), cudaMemcpyHostToDevice, stream));
  for (size_t h = 0; h < group; ++h)
    KVS_CUDA_CHECK(cudaMemcpyAsync(dq + h * rows * d, b.queries[h] + b.row_begin * d,
                                   rows * d * sizeof(float), cudaMemcpyHostToDevice, stream));
  KVS_CUDA_CHECK(
      cudaMemcpyAsync(drows, seen.data(), rows * sizeof(int), cudaMemcpyHostToDevice, stream));
  KVS_CUDA_CHECK(
      cudaMemcpyAsync(dstats, scale.data(), rows * sizeof(double), cudaMemcpyHostToDevice, stream));
  KVS_CUDA_CHECK(
      cudaMemcpyAsync(dacc, acc.data(), keys * sizeof(double), cudaMemcpyHostToDevice, stream));
  // The host vectors go out of scope: wait for the copies.
  KVS_CUDA_CHECK(cudaStreamSynchronize(stream));
  a.key_rows = dk;
  a.key_pos = dpos;
  a.queries = dq;
  a.row_seen = drows;
  a.row_scale = dstats;
  a.row_max = dstats + rows;
  a.row_inv = dstats + rows + group * rows;
  a.acc = dacc;
  return a;
}

void launch_cache_scores(const CacheScoreDeviceArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  const dim3 stats_grid(a.rows, a.group);
  cache_row_stats_kernel<<<stats_grid, kCacheThreads, a.d * sizeof(double), stream>>>(a);
  KVS_CUDA_CHECK_LAUNCH("cache_row_stats_kernel");
  const int blocks = (a.keys + kCacheThreads - 1) / kCacheThreads;
  const size_t smem = cache_scores_smem_bytes(a.d, a.group);
  cache_accumulate_kernel<<<blocks, kCacheThreads, smem, stream>>>(a);
  KVS_CUDA_CHECK_LAUNCH("cache_accumulate_kernel");
}

void download_cache_scores(const CacheScoreDeviceArgs& a, const CacheScoreBatch& b,
                           cudaStream_t stream) {
  if (a.rows == 0) return;
  std::vector<double> acc(a.keys);
  KVS_CUDA_CHECK(cudaMemcpyAsync(acc.data(), a.acc, acc.size() * sizeof(double),
                                 cudaMemcpyDeviceToHost, stream));
  KVS_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (int j = 0; j < a.keys; ++j) b.acc[b.key_ids[j]] = acc[j];
}

}  // namespace kvscope::cuda
