// BUZZ's streamed scores on the GPU (CacheScoreBatch and the CPU reference cpu_cache_scores in
// engine/ops/cache_scores.h): one segment of rows over the cache's keys, in double precision.
// The host gathers the cache's keys and their accumulated scores (a few hundred rows), and
// computes each row's count of visible keys and its scale exactly as the CPU reference does; for
// a named layer (CacheScoreBatch::layer_id) the keys and queries are its resident copies instead,
// read by position, and only the positions, counts, scales and scores cross per segment.
// Two launches:
//   1. row statistics: one block per (row, query head): the row's query in shared memory, each
//      thread the logits of its keys; the block's max, then 1 / (sum of exp(l - max) * G).
//   2. accumulation: one thread per key, the segment's query rows (all heads of the group)
//      staged in shared memory one row at a time; each thread adds, row by row in increasing
//      order and head by head, its key's probability from the rows that see it, to the key's
//      accumulated score (the CPU reference's order of additions).
//
// The op's device interface (its arguments, buffers, upload, launch and download) comes first,
// then the kernels, then the backend's CudaBackend::cache_scores (kernels/cuda_backend.cuh).
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
#include "kernels/resident_layers.cuh"

namespace kvscope::cuda {

constexpr int kCacheThreads = 128;

struct CacheScoreDeviceArgs {
  int d = 0, group = 0, keys = 0, row_begin = 0, rows = 0;
  // [keys][d] gathered, or with keys_by_pos every row by position (a resident layer's keys): key
  // j's row is key_pos[j].
  const float* key_rows = nullptr;
  bool keys_by_pos = false;
  const int* key_pos = nullptr;           // [keys] ascending positions
  const float* const* queries = nullptr;  // [group]: each head's row row_begin, [rows][d]
  const int* row_seen = nullptr;          // [rows]: keys visible to the row
  const double* row_scale = nullptr;      // [rows]
  double* row_max = nullptr;              // [group][rows]
  double* row_inv = nullptr;              // [group][rows]
  double* acc = nullptr;                  // [keys]: gathered, added to
};

struct CacheScoreWorkspace final : OpWorkspace {
  DeviceBuffer keys, pos, queries, table, rows, stats, acc;
  void release() override {
    keys.release();
    pos.release();
    queries.release();
    table.release();
    rows.release();
    stats.release();
    acc.release();
  }
};

// Dynamic shared memory the larger launch needs (the group's query rows of one step), or 0 when
// it exceeds the 48 KiB a block gets without opting in (the backend then declines the shape).
size_t cache_scores_smem_bytes(int d, int group);

class ResidentLayers;

// Checks `b` as the CPU reference does (check_cache_score_batch: std::invalid_argument), throws
// Cancelled when b.cancel is set, gathers and uploads. rows == 0 when there is nothing to run.
// With `resident` and a batch naming its layer (b.layer_id), the keys' and the group's queries'
// first n rows are that layer's resident copies (copied at their first use) and only the
// segment's positions, row counts, scales and scores cross; otherwise the cache's keys are
// gathered and the segment's query rows uploaded.
CacheScoreDeviceArgs upload_cache_score_batch(const CacheScoreBatch& b, CacheScoreWorkspace& ws,
                                              ResidentLayers* resident, cudaStream_t stream);

void launch_cache_scores(const CacheScoreDeviceArgs& a, cudaStream_t stream);

// Scatters the keys' accumulated scores back into b.acc.
void download_cache_scores(const CacheScoreDeviceArgs& a, const CacheScoreBatch& b,
                           cudaStream_t stream);

}  // namespace kvscope::cuda

namespace kvscope::cuda {
namespace {

// Key j's row.
__device__ __forceinline__ const float* key_row(const CacheScoreDeviceArgs& a, int j) {
  return a.key_rows + static_cast<size_t>(a.keys_by_pos ? a.key_pos[j] : j) * a.d;
}

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
  const float* q = a.queries[h] + static_cast<size_t>(row) * a.d;
  for (int c = threadIdx.x; c < a.d; c += blockDim.x) q_row[c] = static_cast<double>(q[c]);
  __syncthreads();
  const int seen = a.row_seen[row];
  const double scale = a.row_scale[row];
  double mx = -INFINITY;
  for (int j = threadIdx.x; j < seen; j += blockDim.x)
    mx = fmax(mx, logit(q_row, key_row(a, j), a.d, scale));
  mx = block_reduce(mx, true, scratch);
  double z = 0.0;
  for (int j = threadIdx.x; j < seen; j += blockDim.x)
    z += exp(logit(q_row, key_row(a, j), a.d, scale) - mx);
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
  const float* k = key_row(a, mine ? j : 0);
  for (int row = 0; row < a.rows; ++row) {
    __syncthreads();  // the previous row's queries are no longer read
    for (int e = threadIdx.x; e < a.group * a.d; e += blockDim.x) {
      const int h = e / a.d, c = e % a.d;
      q_rows[e] = static_cast<double>(a.queries[h][static_cast<size_t>(row) * a.d + c]);
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

// Launch 1's query row (launch 2's rows of the group are larger: the batch check uses those).
size_t cache_row_stats_smem_bytes(int d) {
  return within_default_smem(static_cast<size_t>(std::max(d, 1)) * sizeof(double));
}

size_t cache_scores_smem_bytes(int d, int group) {
  const size_t bytes = static_cast<size_t>(std::max(d, 1)) * std::max(group, 1) * sizeof(double);
  return within_default_smem(bytes);
}

CacheScoreDeviceArgs upload_cache_score_batch(const CacheScoreBatch& b, CacheScoreWorkspace& ws,
                                              ResidentLayers* resident, cudaStream_t stream) {
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
  // The keys and the group's queries: a named layer's first n rows stay resident (the segments
  // of a head, and later runs, share them); else the cache's keys are gathered and the segment's
  // query rows copied.
  const size_t layer_bytes = static_cast<size_t>(b.n) * d * sizeof(float);
  std::vector<const float*> table(group);
  std::vector<float> key_rows;
  if (resident && b.layer_id != 0 && resident->begin_call((1 + group) * layer_bytes)) {
    a.key_rows = static_cast<const float*>(
        resident->find_or_upload(b.layer_id, b.keys, layer_bytes, stream));
    a.keys_by_pos = true;
    for (size_t h = 0; h < group; ++h)
      table[h] = static_cast<const float*>(
                     resident->find_or_upload(b.layer_id, b.queries[h], layer_bytes, stream)) +
                 static_cast<size_t>(b.row_begin) * d;
  } else {
    key_rows.resize(keys * d);
    for (size_t j = 0; j < keys; ++j)
      std::copy_n(b.keys + static_cast<size_t>(b.key_ids[j]) * d, d, key_rows.begin() + j * d);
    float* dk = ws.keys.reserve_as<float>(keys * d);
    KVS_CUDA_CHECK(cudaMemcpyAsync(dk, key_rows.data(), keys * d * sizeof(float),
                                   cudaMemcpyHostToDevice, stream));
    a.key_rows = dk;
    float* dq = ws.queries.reserve_as<float>(group * rows * d);
    for (size_t h = 0; h < group; ++h) {
      table[h] = dq + h * rows * d;
      KVS_CUDA_CHECK(cudaMemcpyAsync(dq + h * rows * d, b.queries[h] + b.row_begin * d,
                                     rows * d * sizeof(float), cudaMemcpyHostToDevice, stream));
    }
  }
  // The cache's scores, gathered; each row's visible keys and scale, as the CPU reference
  // computes them.
  std::vector<double> acc(keys);
  for (size_t j = 0; j < keys; ++j) acc[j] = b.acc[b.key_ids[j]];
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
  int* dpos = ws.pos.reserve_as<int>(keys);
  const float** dtable = ws.table.reserve_as<const float*>(group);
  int* drows = ws.rows.reserve_as<int>(rows);
  double* dstats = ws.stats.reserve_as<double>(3 * group * rows + rows);
  double* dacc = ws.acc.reserve_as<double>(keys);
  KVS_CUDA_CHECK(
      cudaMemcpyAsync(dpos, b.key_ids, keys * sizeof(int), cudaMemcpyHostToDevice, stream));
  KVS_CUDA_CHECK(cudaMemcpyAsync(dtable, table.data(), group * sizeof(const float*),
                                 cudaMemcpyHostToDevice, stream));
  KVS_CUDA_CHECK(
      cudaMemcpyAsync(drows, seen.data(), rows * sizeof(int), cudaMemcpyHostToDevice, stream));
  KVS_CUDA_CHECK(
      cudaMemcpyAsync(dstats, scale.data(), rows * sizeof(double), cudaMemcpyHostToDevice, stream));
  KVS_CUDA_CHECK(
      cudaMemcpyAsync(dacc, acc.data(), keys * sizeof(double), cudaMemcpyHostToDevice, stream));
  // The host vectors go out of scope: wait for the copies.
  KVS_CUDA_CHECK(cudaStreamSynchronize(stream));
  a.key_pos = dpos;
  a.queries = dtable;
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
  cache_row_stats_kernel<<<stats_grid, kCacheThreads, cache_row_stats_smem_bytes(a.d), stream>>>(a);
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

// ---- the backend's op ---------------------------------------------------------------------

void CudaBackend::cache_scores(const CacheScoreBatch& b) {
  if (cache_scores_smem_bytes(b.d, b.group()) == 0)
    throw DeviceFailure("key width d=" + std::to_string(b.d) + " with " +
                        std::to_string(b.group()) +
                        " query heads per group exceeds the CUDA cache-score kernels' rows");
  guarded([&] {
    const CacheScoreDeviceArgs a = upload_cache_score_batch(
        b, workspace<CacheScoreWorkspace>(Op::cache_scores), &resident_, stream_);
    launch([a, this] { launch_cache_scores(a, stream_); });
    download_cache_scores(a, b, stream_);
  });
}

}  // namespace kvscope::cuda
