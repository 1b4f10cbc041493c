// The cache-score op (Backend::cache_scores, engine/ops/backend.h): BUZZ's streamed scores
// (engine/methods/buzz.cpp), the hot part of its default rule (accumulate = compressed-cache, each
// query's softmax over the cache as it stands) and of full-prefix with log n. Its batch type and
// its CPU reference, cpu_cache_scores (engine/ops/cache_scores_cpu.cpp). The CUDA kernels are
// kernels/cache_scores.cu.
//
// BUZZ's cache changes membership only at an eviction, and which steps evict depends on counts
// only, so the stream splits into segments of rows between evictions: within one, the keys a row
// sees are a fixed set (the cache after the last eviction) plus the tokens that arrived since, up
// to the row itself. The op takes such a segment: the keys' positions key_ids (ascending), and
// rows [row_begin, row_end); row t sees the keys of key_ids with position <= t (L_t of them) and
// adds, for each query head h of the group in order, its probabilities to the accumulated scores:
//   acc[id] += exp(l_thid - max_id' l_thid') / (sum_id' exp(l_thid' - max) * G),
//   l_thid = <q_ht, k_id> * s_t,  s_t = 1/sqrt(d), or log(L_t)/log(512)/sqrt(d) with log_n,
// in double precision, rows in increasing order. The eviction between two segments (the
// per-chunk maxima of acc, a few comparisons per chunk) stays with the method, on the CPU.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

namespace kvscope {

struct CacheScoreBatch {
  const float* keys = nullptr;        // n x d row-major, by position
  std::vector<const float*> queries;  // the GQA group, n x d each (rows below row_end are read)
  int n = 0, d = 0;
  const int* key_ids = nullptr;  // [num_keys] ascending positions < row_end
  int num_keys = 0;
  int row_begin = 0, row_end = 0;  // 0 <= row_begin <= row_end <= n
  bool log_n = false;              // BUZZ with log n (paper Eq. 7-8)
  double* acc = nullptr;           // [n] accumulated scores by position: added to
  // Checked by the CPU reference every 64 rows (throws Cancelled), and before a device launch.
  const std::atomic<bool>* cancel = nullptr;
  // Non-zero: `keys` and every query array are key and query matrices of the loaded layer with
  // this LayerData::id (engine/io/capture.h), unchanged while it lives, so a device backend may
  // keep their first n rows resident across the segments and runs (kernels/resident_layers.cuh). 0:
  // upload the segment's rows at every call. The CPU ignores it.
  uint64_t layer_id = 0;

  int group() const { return static_cast<int>(queries.size()); }
};

// Throws std::invalid_argument when the batch is inconsistent (a missing array, no query head,
// d < 1, rows outside [0, n], key ids not ascending or outside [0, row_end), a row that sees no
// key).
void check_cache_score_batch(const CacheScoreBatch& batch);

// The op and its sizes, for Backend::supports() (OpShape: engine/ops/backend.h).
struct OpShape;
OpShape op_shape(const CacheScoreBatch& b);

// The CPU reference: row after row, each head's logits by a dot product in key order (the code
// BUZZ had before the op existed).
void cpu_cache_scores(const CacheScoreBatch& batch);

}  // namespace kvscope
