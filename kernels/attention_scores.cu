// The attention-score op on the GPU (ScoreBatch and the CPU reference cpu_attention_scores in
// engine/ops/attention_scores.h): the causal, group-averaged softmax probabilities of query rows
// [row_begin, row_end) reduced per key, for every kv head of the batch, in double precision.
// One kernel family for every score-ranking method; the methods differ only in the epilogue
// (ScoreReduce: the sum, or the mean over the rows that see the key, and the optional running
// sums at per-key stop rows).
//
// Three launches, all with double accumulation (logits <q,k>/sqrt(d) from float inputs in double,
// exp in double):
//   1. row statistics: one block per (tile of kScoreRowTile rows, query head); keys stream
//      through shared memory in tiles of kScoreKeyTile (one key per thread), each thread keeps an
//      online (max, sum of exp) per row, and the block combines them: the row's max and
//      1 / (sum * group), as the CPU reference normalises.
//   2. column sums: one block per (tile of kScoreKeyTile keys, chunk of rows, kv head); the key
//      tile stays in shared memory while the chunk's query rows (all heads of the group) stream
//      through it; each thread owns one key and adds, row by row in increasing order, the group's
//      mean probability (and, below the key's stop row, into the stopped sum). Rows before the
//      tile's first key are skipped (causal). Each chunk writes its partial sums.
//   3. finish: each key's partial sums over the chunks in order, then the epilogue.
// Kernel-launch sizes depend on the shapes only, so the figures are deterministic.
//
// The op's device interface (its arguments, buffers, upload, launch and download) comes first,
// then the kernels, then the backend's CudaBackend::attention_scores (kernels/cuda_backend.cuh).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/ops/backend.h"
#include "kernels/cuda_backend.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/resident_layers.cuh"

namespace kvscope::cuda {

constexpr int kScoreKeyTile = 128;   // keys per tile = threads per block of launches 1 and 2
constexpr int kScoreRowTile = 8;     // query rows staged together
constexpr int kScoreMinChunk = 64;   // rows per chunk of launch 2, at least
constexpr int kScoreMaxChunks = 16;  // chunks of launch 2, at most

struct ScoreDeviceArgs {
  int n = 0, d = 0, row_begin = 0, row_end = 0, rows = 0;  // rows = row_end - row_begin
  int heads = 0, group = 0;
  bool mean_seen = false;  // ScoreReduce::mean_seen
  int chunks = 0, chunk_rows = 0;
  double scale = 0;  // 1 / sqrt(d)
  // Device pointer tables: each head's rows, in the call's workspace or resident
  // (kernels/resident_layers.cuh).
  const float* const* keys = nullptr;     // [heads] -> at least row_end x d
  const float* const* queries = nullptr;  // [heads * group] -> rows x d: rows row_begin.. only
  const int* stop_rows = nullptr;         // [row_end], or null when no head asks for stopped sums
  double* row_max = nullptr;              // [heads * group][rows]
  double* row_inv = nullptr;              // [heads * group][rows]: 1 / (sum of exp * group)
  double* part = nullptr;                 // [heads][chunks][row_end]
  double* part_stop = nullptr;            // [heads][chunks][row_end], or null
  double* scores = nullptr;               // [heads][row_end]
  double* stopped = nullptr;              // [heads][row_end], or null
};

// Device copies of one ScoreBatch, reused across calls.
struct ScoreWorkspace final : OpWorkspace {
  DeviceBuffer keys, queries, stop_rows, stats, part, out, tables;
  void release() override {
    tables.release();
    keys.release();
    queries.release();
    stop_rows.release();
    stats.release();
    part.release();
    out.release();
  }
};

// Dynamic shared memory the larger of launches 1 and 2 needs for key width d and `group` query
// heads, or 0 when that is beyond `device_smem_optin` (the backend then declines the shape).
size_t attention_scores_smem_bytes(int d, int group, int device_smem_optin);

class ResidentLayers;

// Checks `b` as the CPU reference does (check_score_batch: std::invalid_argument), throws
// Cancelled when b.cancel is set, uploads it into `ws` and returns the device view. A batch with
// no rows (row_begin == row_end) uploads nothing and returns rows == 0. With `resident` and a
// non-zero b.layer_id, each head's whole keys (shared with attention_errors' copies) and its
// group's reduced query rows come from (or go once into) the resident layer copies.
ScoreDeviceArgs upload_score_batch(const ScoreBatch& b, ScoreWorkspace& ws,
                                   ResidentLayers* resident, cudaStream_t stream);

// Runs the three launches (rows > 0).
void launch_attention_scores(const ScoreDeviceArgs& a, int device_smem_optin, cudaStream_t stream);

// Copies every head's scores (and stopped sums) into the batch's arrays; with rows == 0 writes
// the zeros the CPU reference gives.
void download_score_outputs(const ScoreDeviceArgs& a, const ScoreBatch& b, cudaStream_t stream);

}  // namespace kvscope::cuda

namespace kvscope::cuda {
namespace {

// <q, k> / sqrt(d) in double, over c = 0..d-1 in order (the same code in launches 1 and 2, so
// both see the same logits).
__device__ __forceinline__ double score_logit(const float* q, const float* k, int d, double scale) {
  double acc = 0.0;
  for (int c = 0; c < d; ++c) acc += static_cast<double>(q[c]) * static_cast<double>(k[c]);
  return acc * scale;
}

// Stages keys [k0, k0 + kn) of one head into `ks` (row stride d + 1: one key per thread reads
// without bank conflicts).
__device__ __forceinline__ void stage_keys(const float* keys, int k0, int kn, int d, float* ks) {
  for (int e = threadIdx.x; e < kn * d; e += blockDim.x) {
    const int r = e / d, c = e - r * d;
    ks[r * (d + 1) + c] = keys[static_cast<size_t>(k0 + r) * d + c];
  }
}

// Launch 1. Shared memory: red_m, red_s [kScoreRowTile][kScoreKeyTile] doubles, then the row
// tile's queries [kScoreRowTile][d] and a key tile [kScoreKeyTile][d + 1] (floats).
__global__ void __launch_bounds__(kScoreKeyTile) score_row_stats_kernel(ScoreDeviceArgs a) {
  extern __shared__ __align__(16) unsigned char score_smem[];
  double* red_m = reinterpret_cast<double*>(score_smem);
  double* red_s = red_m + kScoreRowTile * kScoreKeyTile;
  float* qs = reinterpret_cast<float*>(red_s + kScoreRowTile * kScoreKeyTile);
  float* ks = qs + kScoreRowTile * a.d;
  const int qh = blockIdx.y;  // query head: kv head * group + g
  const int kv = qh / a.group;
  const int r0 = blockIdx.x * kScoreRowTile;  // first row of the tile, counted from row_begin
  const int rn = min(kScoreRowTile, a.rows - r0);
  const float* q = a.queries[qh] + static_cast<size_t>(r0) * a.d;
  for (int e = threadIdx.x; e < rn * a.d; e += blockDim.x) qs[e] = q[e];
  const float* keys = a.keys[kv];
  const int first_row = a.row_begin + r0;
  const int last_row = first_row + rn - 1;  // sees keys 0..last_row
  double m[kScoreRowTile], s[kScoreRowTile];
#pragma unroll
  for (int r = 0; r < kScoreRowTile; ++r) {
    m[r] = -INFINITY;
    s[r] = 0.0;
  }
  for (int k0 = 0; k0 <= last_row; k0 += kScoreKeyTile) {
    const int kn = min(kScoreKeyTile, last_row + 1 - k0);
    __syncthreads();  // the previous tile is consumed (and the queries are staged)
    stage_keys(keys, k0, kn, a.d, ks);
    __syncthreads();
    const int i = k0 + static_cast<int>(threadIdx.x);
    if (static_cast<int>(threadIdx.x) < kn) {
      const float* kr = ks + threadIdx.x * (a.d + 1);
#pragma unroll
      for (int r = 0; r < kScoreRowTile; ++r) {
        if (r >= rn || i > first_row + r) continue;  // causal: row j sees keys 0..j
        const double l = score_logit(qs + r * a.d, kr, a.d, a.scale);
        if (l > m[r]) {
          s[r] = s[r] * exp(m[r] - l) + 1.0;
          m[r] = l;
        } else {
          s[r] += exp(l - m[r]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kScoreRowTile; ++r) {
    red_m[r * kScoreKeyTile + threadIdx.x] = m[r];
    red_s[r * kScoreKeyTile + threadIdx.x] = s[r];
  }
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < rn) {
    const int r = threadIdx.x;
    double mx = -INFINITY;
    for (int t = 0; t < kScoreKeyTile; ++t) mx = fmax(mx, red_m[r * kScoreKeyTile + t]);
    double z = 0.0;
    for (int t = 0; t < kScoreKeyTile; ++t) {
      const double mt = red_m[r * kScoreKeyTile + t];
      if (mt != -INFINITY) z += red_s[r * kScoreKeyTile + t] * exp(mt - mx);
    }
    const size_t o = static_cast<size_t>(qh) * a.rows + r0 + r;
    a.row_max[o] = mx;
    a.row_inv[o] = 1.0 / (z * static_cast<double>(a.group));
  }
}

// Launch 2. Grid (key tiles, chunks * heads). Shared memory: the key tile [kScoreKeyTile][d + 1]
// and the staged rows' queries [group][kScoreRowTile][d] (floats), then their row max and inverse
// normaliser [group][kScoreRowTile] (doubles; the float part is padded to 8 bytes).
__global__ void __launch_bounds__(kScoreKeyTile) score_column_kernel(ScoreDeviceArgs a) {
  extern __shared__ __align__(16) unsigned char score_smem[];
  float* ks = reinterpret_cast<float*>(score_smem);
  float* qs = ks + kScoreKeyTile * (a.d + 1);
  const size_t float_count = static_cast<size_t>(kScoreKeyTile) * (a.d + 1) +
                             static_cast<size_t>(a.group) * kScoreRowTile * a.d;
  double* sm = reinterpret_cast<double*>(score_smem + (float_count * sizeof(float) + 7) / 8 * 8);
  double* sinv = sm + a.group * kScoreRowTile;
  const int chunk = blockIdx.y % a.chunks;
  const int kv = blockIdx.y / a.chunks;
  const int k0 = blockIdx.x * kScoreKeyTile;
  const int kn = min(kScoreKeyTile, a.row_end - k0);
  const int c0 = a.row_begin + chunk * a.chunk_rows;
  const int c1 = min(a.row_end, c0 + a.chunk_rows);
  const int start = max(c0, k0);  // rows before the tile's first key see none of its keys
  const int i = k0 + static_cast<int>(threadIdx.x);
  const bool owns = static_cast<int>(threadIdx.x) < kn;
  const int stop = owns && a.stop_rows ? a.stop_rows[i] : INT_MAX;
  if (start < c1) stage_keys(a.keys[kv], k0, kn, a.d, ks);
  const float* kr = ks + threadIdx.x * (a.d + 1);
  double sum = 0.0, stop_sum = 0.0;
  for (int j0 = start; j0 < c1; j0 += kScoreRowTile) {
    const int rn = min(kScoreRowTile, c1 - j0);
    __syncthreads();  // the previous rows are consumed (and the key tile is staged)
    for (int g = 0; g < a.group; ++g) {
      const size_t qh = static_cast<size_t>(kv) * a.group + g;
      const float* q = a.queries[qh] + static_cast<size_t>(j0 - a.row_begin) * a.d;
      for (int e = threadIdx.x; e < rn * a.d; e += blockDim.x)
        qs[g * kScoreRowTile * a.d + e] = q[e];
      for (int r = threadIdx.x; r < rn; r += blockDim.x) {
        sm[g * kScoreRowTile + r] = a.row_max[qh * a.rows + (j0 - a.row_begin) + r];
        sinv[g * kScoreRowTile + r] = a.row_inv[qh * a.rows + (j0 - a.row_begin) + r];
      }
    }
    __syncthreads();
    if (!owns) continue;
    for (int r = 0; r < rn; ++r) {
      const int j = j0 + r;
      if (i > j) continue;  // causal
      double mean = 0.0;
      for (int g = 0; g < a.group; ++g) {
        const double l = score_logit(qs + (g * kScoreRowTile + r) * a.d, kr, a.d, a.scale);
        mean += exp(l - sm[g * kScoreRowTile + r]) * sinv[g * kScoreRowTile + r];
      }
      sum += mean;
      if (j < stop) stop_sum += mean;
    }
  }
  if (owns) {
    const size_t o = (static_cast<size_t>(kv) * a.chunks + chunk) * a.row_end + i;
    a.part[o] = sum;
    if (a.part_stop) a.part_stop[o] = stop_sum;
  }
}

// Launch 3. Grid (key blocks, heads): the chunks' partial sums in order, then the epilogue.
__global__ void score_finish_kernel(ScoreDeviceArgs a) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const int kv = blockIdx.y;
  if (i >= a.row_end) return;
  double sum = 0.0, stop_sum = 0.0;
  for (int c = 0; c < a.chunks; ++c) {
    const size_t o = (static_cast<size_t>(kv) * a.chunks + c) * a.row_end + i;
    sum += a.part[o];
    if (a.part_stop) stop_sum += a.part_stop[o];
  }
  if (a.mean_seen) {
    const int seen = a.row_end - max(a.row_begin, i);
    if (seen > 0) sum /= static_cast<double>(seen);
  }
  a.scores[static_cast<size_t>(kv) * a.row_end + i] = sum;
  if (a.stopped) a.stopped[static_cast<size_t>(kv) * a.row_end + i] = stop_sum;
}

size_t row_stats_smem(int d) {
  return 2 * sizeof(double) * kScoreRowTile * kScoreKeyTile +
         sizeof(float) * (static_cast<size_t>(kScoreRowTile) * d +
                          static_cast<size_t>(kScoreKeyTile) * (d + 1));
}

size_t column_smem(int d, int group) {
  const size_t floats =
      static_cast<size_t>(kScoreKeyTile) * (d + 1) + static_cast<size_t>(group) * kScoreRowTile * d;
  return (floats * sizeof(float) + 7) / 8 * 8 + 2 * sizeof(double) * group * kScoreRowTile;
}

}  // namespace

size_t attention_scores_smem_bytes(int d, int group, int device_smem_optin) {
  if (d <= 0 || group <= 0) return 0;
  const size_t bytes = padded_smem(std::max(row_stats_smem(d), column_smem(d, group)));
  return bytes <= static_cast<size_t>(device_smem_optin) ? bytes : 0;
}

ScoreDeviceArgs upload_score_batch(const ScoreBatch& b, ScoreWorkspace& ws,
                                   ResidentLayers* resident, cudaStream_t stream) {
  check_score_batch(b);
  if (b.cancel && b.cancel->load(std::memory_order_relaxed)) throw Cancelled();
  ScoreDeviceArgs a;
  a.n = b.n;
  a.d = b.d;
  a.row_begin = b.row_begin;
  a.row_end = b.row_end;
  a.rows = b.row_end - b.row_begin;
  a.heads = static_cast<int>(b.heads.size());
  a.group = b.group();
  a.mean_seen = b.reduce == ScoreReduce::mean_seen;
  a.scale = 1.0 / std::sqrt(static_cast<double>(b.d));
  if (a.rows == 0) return a;
  a.chunk_rows = std::max(kScoreMinChunk, (a.rows + kScoreMaxChunks - 1) / kScoreMaxChunks);
  a.chunks = (a.rows + a.chunk_rows - 1) / a.chunk_rows;
  bool any_stopped = false;
  for (const ScoreHead& h : b.heads) any_stopped |= h.stopped != nullptr;

  const size_t d = b.d, end = b.row_end, rows = a.rows, heads = a.heads, group = a.group;
  // Per-head device pointers: [heads keys][heads * group queries].
  std::vector<const float*> table(heads + heads * group);
  const size_t key_bytes = static_cast<size_t>(b.n) * d * sizeof(float);  // whole: shared
  const size_t query_bytes = rows * d * sizeof(float);
  if (resident && b.layer_id != 0 &&
      resident->begin_call(heads * key_bytes + heads * group * query_bytes)) {
    for (size_t h = 0; h < heads; ++h) {
      const ScoreHead& head = b.heads[h];
      table[h] = static_cast<const float*>(
          resident->find_or_upload(b.layer_id, head.keys, key_bytes, stream));
      for (size_t g = 0; g < group; ++g)  // the reduced rows only
        table[heads + h * group + g] = static_cast<const float*>(resident->find_or_upload(
            b.layer_id, head.queries[g] + b.row_begin * d, query_bytes, stream));
    }
  } else {
    float* keys = ws.keys.reserve_as<float>(heads * end * d);
    float* queries = ws.queries.reserve_as<float>(heads * group * rows * d);
    for (size_t h = 0; h < heads; ++h) {
      const ScoreHead& head = b.heads[h];
      table[h] = keys + h * end * d;
      KVS_CUDA_CHECK(cudaMemcpyAsync(keys + h * end * d, head.keys, end * d * sizeof(float),
                                     cudaMemcpyHostToDevice, stream));
      for (size_t g = 0; g < group; ++g) {  // the reduced rows only
        table[heads + h * group + g] = queries + (h * group + g) * rows * d;
        KVS_CUDA_CHECK(cudaMemcpyAsync(queries + (h * group + g) * rows * d,
                                       head.queries[g] + b.row_begin * d, query_bytes,
                                       cudaMemcpyHostToDevice, stream));
      }
    }
  }
  const float** tables = ws.tables.reserve_as<const float*>(table.size());
  KVS_CUDA_CHECK(cudaMemcpyAsync(tables, table.data(), table.size() * sizeof(const float*),
                                 cudaMemcpyHostToDevice, stream));
  if (any_stopped) {
    int* stop_rows = ws.stop_rows.reserve_as<int>(end);
    KVS_CUDA_CHECK(
        cudaMemcpyAsync(stop_rows, b.stop_rows, end * sizeof(int), cudaMemcpyHostToDevice, stream));
    a.stop_rows = stop_rows;
  }
  double* stats = ws.stats.reserve_as<double>(2 * heads * group * rows);
  const size_t parts = heads * a.chunks * end;
  double* part = ws.part.reserve_as<double>((any_stopped ? 2 : 1) * parts);
  double* out = ws.out.reserve_as<double>((any_stopped ? 2 : 1) * heads * end);
  // The table dies with this function: finish the copies first.
  KVS_CUDA_CHECK(cudaStreamSynchronize(stream));
  a.keys = tables;
  a.queries = tables + heads;
  a.row_max = stats;
  a.row_inv = stats + heads * group * rows;
  a.part = part;
  a.part_stop = any_stopped ? part + parts : nullptr;
  a.scores = out;
  a.stopped = any_stopped ? out + heads * end : nullptr;
  return a;
}

void launch_attention_scores(const ScoreDeviceArgs& a, int device_smem_optin, cudaStream_t stream) {
  if (a.rows == 0) return;
  if (attention_scores_smem_bytes(a.d, a.group, device_smem_optin) == 0)
    throw Unsupported("attention_scores: key width d=" + std::to_string(a.d) + " with " +
                      std::to_string(a.group) +
                      " query heads per group exceeds the CUDA kernels' shared-memory tiles");
  const size_t stats_smem = row_stats_smem(a.d);
  KVS_CUDA_CHECK(cudaFuncSetAttribute(score_row_stats_kernel,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(stats_smem)));
  const dim3 stats_grid((a.rows + kScoreRowTile - 1) / kScoreRowTile, a.heads * a.group);
  score_row_stats_kernel<<<stats_grid, kScoreKeyTile, stats_smem, stream>>>(a);
  KVS_CUDA_CHECK_LAUNCH("score_row_stats_kernel");

  const size_t col_smem = column_smem(a.d, a.group);
  KVS_CUDA_CHECK(cudaFuncSetAttribute(score_column_kernel,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(col_smem)));
  const dim3 col_grid((a.row_end + kScoreKeyTile - 1) / kScoreKeyTile, a.chunks * a.heads);
  score_column_kernel<<<col_grid, kScoreKeyTile, col_smem, stream>>>(a);
  KVS_CUDA_CHECK_LAUNCH("score_column_kernel");

  constexpr int kFinishThreads = 256;
  const dim3 finish_grid((a.row_end + kFinishThreads - 1) / kFinishThreads, a.heads);
  score_finish_kernel<<<finish_grid, kFinishThreads, 0, stream>>>(a);
  KVS_CUDA_CHECK_LAUNCH("score_finish_kernel");
}

void download_score_outputs(const ScoreDeviceArgs& a, const ScoreBatch& b, cudaStream_t stream) {
  const size_t end = b.row_end;
  for (size_t h = 0; h < b.heads.size(); ++h) {
    const ScoreHead& head = b.heads[h];
    if (a.rows == 0) {  // no rows: every key's sum is 0, as on the CPU
      std::fill(head.scores, head.scores + end, 0.0);
      if (head.stopped) std::fill(head.stopped, head.stopped + end, 0.0);
      continue;
    }
    KVS_CUDA_CHECK(cudaMemcpyAsync(head.scores, a.scores + h * end, end * sizeof(double),
                                   cudaMemcpyDeviceToHost, stream));
    if (head.stopped)
      KVS_CUDA_CHECK(cudaMemcpyAsync(head.stopped, a.stopped + h * end, end * sizeof(double),
                                     cudaMemcpyDeviceToHost, stream));
  }
  KVS_CUDA_CHECK(cudaStreamSynchronize(stream));
}

// ---- the backend's op ---------------------------------------------------------------------

void CudaBackend::attention_scores(const ScoreBatch& b) {
  const int group = b.group();
  if (b.d > 0 && group > 0 && attention_scores_smem_bytes(b.d, group, smem_optin_) == 0)
    throw DeviceFailure("key width d=" + std::to_string(b.d) + " with " + std::to_string(group) +
                        " query heads per group exceeds the CUDA kernels' tiles");
  guarded([&] {
    const ScoreDeviceArgs a =
        upload_score_batch(b, workspace<ScoreWorkspace>(Op::attention_scores), &resident_, stream_);
    launch([a, this] { launch_attention_scores(a, smem_optin_, stream_); });
    download_score_outputs(a, b, stream_);
  });
}

}  // namespace kvscope::cuda
