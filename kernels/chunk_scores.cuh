// Compactor's chunked non-causal attention on the GPU (ChunkScoreBatch and the CPU reference
// cpu_chunk_scores in engine/ops/chunk_scores.h), in double precision. Two launches:
//   1. row statistics: one block per (row, query head): the row's query in shared memory, each
//      thread the logits of its share of the row's chunk; the block's max and sum of
//      exp(l - max), with the press's padded keys (logit -1e-9) in the last, partial chunk;
//   2. columns: one thread per key, adding, head by head and row by row of its chunk in the CPU
//      reference's order, its probability from each row, then the padded rows' share.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "engine/ops/backend.h"
#include "kernels/cuda_check.cuh"

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

struct ChunkWorkspace {
  DeviceBuffer keys, queries, stats, col;
  void release() {
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
