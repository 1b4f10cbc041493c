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
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "engine/ops/backend.h"
#include "kernels/cuda_check.cuh"

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
struct ScoreWorkspace {
  DeviceBuffer keys, queries, stop_rows, stats, part, out, tables;
  void release() {
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
