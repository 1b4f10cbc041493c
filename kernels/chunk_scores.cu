// Compactor's chunked non-causal attention on the GPU (ChunkScoreBatch and the CPU reference
// cpu_chunk_scores in engine/ops/chunk_scores.h), in double precision. Two launches:
//   1. row statistics: one block per (row, query head): the row's query in shared memory, each
//      thread the logits of its share of the row's chunk; the block's max and sum of
//      exp(l - max), with the press's padded keys (logit -1e-9) in the last, partial chunk;
//   2. columns: one thread per key, adding, head by head and row by row of its chunk in the CPU
//      reference's order, its probability from each row, then the padded rows' share.
//
// The op's device interface (its arguments, buffers, upload, launch and download) comes first,
// then the kernels, then the backend's CudaBackend::chunk_scores (kernels/cuda_backend.cuh).
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

constexpr int kChunkThreads = 128;

struct ChunkDeviceArgs {
  int heads = 0, group = 0, len = 0, d = 0, chunk = 0, pad = 0;
  const float* keys = nullptr;     // [heads][len][d]
  const float* queries = nullptr;  // [heads * group][len][d]
  double* row_top = nullptr;       // [heads * group][len]
  double* row_sum = nullptr;       // [heads * group][len]
  double* col = nullptr;           // [heads][len]
};

struct ChunkWorkspace final : OpWorkspace {
  DeviceBuffer keys, queries, stats, col;
  void release() override {
    keys.release();
    queries.release();
    stats.release();
    col.release();
  }
};

// Dynamic shared memory of the row-statistics launch (one query row in double), or 0 when it
// exceeds the 48 KiB a block gets without opting in (the backend then declines the shape).
size_t chunk_scores_smem_bytes(int d);

// Checks `b` as the CPU reference does (check_chunk_score_batch: std::invalid_argument), throws
// Cancelled when b.cancel is set, uploads.
ChunkDeviceArgs upload_chunk_batch(const ChunkScoreBatch& b, ChunkWorkspace& ws,
                                   cudaStream_t stream);

void launch_chunk_scores(const ChunkDeviceArgs& a, cudaStream_t stream);

void download_chunk_scores(const ChunkDeviceArgs& a, const ChunkScoreBatch& b, cudaStream_t stream);

}  // namespace kvscope::cuda

namespace kvscope::cuda {
namespace {

__device__ __forceinline__ double chunk_dot(const double* q, const float* k, int d) {
  double dot = 0.0;
  for (int c = 0; c < d; ++c) dot += q[c] * static_cast<double>(k[c]);
  return dot;
}

__device__ __forceinline__ double chunk_dot(const float* q, const float* k, int d) {
  double dot = 0.0;
  for (int c = 0; c < d; ++c) dot += static_cast<double>(q[c]) * static_cast<double>(k[c]);
  return dot;
}

// Launch 1: grid (len, heads * group).
__global__ void __launch_bounds__(kChunkThreads) chunk_row_stats_kernel(ChunkDeviceArgs a) {
  extern __shared__ double q_row[];  // [d]
  __shared__ double scratch[kChunkThreads];
  const int t = blockIdx.x, hq = blockIdx.y, kv = hq / a.group;
  const float* q = a.queries + (static_cast<size_t>(hq) * a.len + t) * a.d;
  for (int c = threadIdx.x; c < a.d; c += blockDim.x) q_row[c] = static_cast<double>(q[c]);
  __syncthreads();
  const int c0 = t / a.chunk * a.chunk, valid = min(a.len, c0 + a.chunk) - c0;
  const bool last = c0 + valid == a.len && a.pad > 0;
  const float* keys = a.keys + (static_cast<size_t>(kv) * a.len + c0) * a.d;
  double mx = -INFINITY;
  for (int j = threadIdx.x; j < valid; j += blockDim.x)
    mx = fmax(mx, chunk_dot(q_row, keys + static_cast<size_t>(j) * a.d, a.d));
  mx = block_reduce(mx, true, scratch);
  if (last) mx = fmax(mx, -1e-9);
  double z = 0.0;
  for (int j = threadIdx.x; j < valid; j += blockDim.x)
    z += exp(chunk_dot(q_row, keys + static_cast<size_t>(j) * a.d, a.d) - mx);
  z = block_reduce(z, false, scratch);
  if (threadIdx.x == 0) {
    if (last) z += a.pad * exp(-1e-9 - mx);
    a.row_top[static_cast<size_t>(hq) * a.len + t] = mx;
    a.row_sum[static_cast<size_t>(hq) * a.len + t] = z;
  }
}

// Launch 2: grid (ceil(len / threads), heads): one thread per key.
__global__ void __launch_bounds__(kChunkThreads) chunk_columns_kernel(ChunkDeviceArgs a) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y;
  if (j >= a.len) return;
  const int c0 = j / a.chunk * a.chunk, valid = min(a.len, c0 + a.chunk) - c0;
  const bool last = c0 + valid == a.len && a.pad > 0;
  const float* k = a.keys + (static_cast<size_t>(h) * a.len + j) * a.d;
  double acc = 0.0;
  for (int g = 0; g < a.group; ++g) {
    const size_t hq = static_cast<size_t>(h) * a.group + g;
    const float* q = a.queries + hq * a.len * a.d;
    for (int i = c0; i < c0 + valid; ++i)
      acc += exp(chunk_dot(q + static_cast<size_t>(i) * a.d, k, a.d) - a.row_top[hq * a.len + i]) /
             a.row_sum[hq * a.len + i];
    if (last) acc += a.pad * (1.0 / (valid + a.pad * exp(-1e-9)));
  }
  a.col[static_cast<size_t>(h) * a.len + j] = acc;
}

}  // namespace

size_t chunk_scores_smem_bytes(int d) {
  const size_t bytes = static_cast<size_t>(std::max(d, 1)) * sizeof(double);
  return within_default_smem(bytes);
}

ChunkDeviceArgs upload_chunk_batch(const ChunkScoreBatch& b, ChunkWorkspace& ws,
                                   cudaStream_t stream) {
  check_chunk_score_batch(b);
  if (b.cancel && b.cancel->load(std::memory_order_relaxed)) throw Cancelled();
  if (chunk_scores_smem_bytes(b.d) == 0)
    throw Unsupported("key width d=" + std::to_string(b.d) +
                      " exceeds the CUDA chunked-attention kernel's shared-memory row");
  ChunkDeviceArgs a;
  a.heads = static_cast<int>(b.heads.size());
  a.group = b.group();
  a.len = b.len;
  a.d = b.d;
  a.chunk = b.chunk;
  a.pad = (b.chunk - b.len % b.chunk) % b.chunk;
  const size_t heads = a.heads, hq = heads * a.group, len = b.len, d = b.d;
  float* dk = ws.keys.reserve_as<float>(heads * len * d);
  float* dq = ws.queries.reserve_as<float>(hq * len * d);
  double* dstats = ws.stats.reserve_as<double>(2 * hq * len);
  double* dcol = ws.col.reserve_as<double>(heads * len);
  upload_per_head(dk, b.heads, len * d, &ChunkScoreHead::keys, stream);
  upload_group_queries(dq, b.heads, len * d, stream);
  a.keys = dk;
  a.queries = dq;
  a.row_top = dstats;
  a.row_sum = dstats + hq * len;
  a.col = dcol;
  return a;
}

void launch_chunk_scores(const ChunkDeviceArgs& a, cudaStream_t stream) {
  const dim3 rows(a.len, a.heads * a.group);
  chunk_row_stats_kernel<<<rows, kChunkThreads, chunk_scores_smem_bytes(a.d), stream>>>(a);
  KVS_CUDA_CHECK_LAUNCH("chunk_row_stats_kernel");
  const dim3 keys((a.len + kChunkThreads - 1) / kChunkThreads, a.heads);
  chunk_columns_kernel<<<keys, kChunkThreads, 0, stream>>>(a);
  KVS_CUDA_CHECK_LAUNCH("chunk_columns_kernel");
}

void download_chunk_scores(const ChunkDeviceArgs& a, const ChunkScoreBatch& b,
                           cudaStream_t stream) {
  download_per_head(a.col, b.heads, a.len, &ChunkScoreHead::col, stream);
}

// ---- the backend's op ---------------------------------------------------------------------

void CudaBackend::chunk_scores(const ChunkScoreBatch& b) {
  if (chunk_scores_smem_bytes(b.d) == 0)
    throw DeviceFailure("key width d=" + std::to_string(b.d) +
                        " exceeds the CUDA chunked-attention kernel's shared-memory row");
  guarded([&] {
    const ChunkDeviceArgs a =
        upload_chunk_batch(b, workspace<ChunkWorkspace>(Op::chunk_scores), stream_);
    launch([a, this] { launch_chunk_scores(a, stream_); });
    download_chunk_scores(a, b, stream_);
  });
}

}  // namespace kvscope::cuda
