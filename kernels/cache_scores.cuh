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
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "engine/ops/backend.h"
#include "kernels/cuda_check.cuh"

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

struct CacheScoreWorkspace {
  DeviceBuffer keys, pos, queries, table, rows, stats, acc;
  void release() {
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
