// The attention-score op (Backend::attention_scores, engine/ops/backend.h): the shared hot part of
// the score-ranking methods (h2o, snapkv and its kvpress variant, pyramidkv, tova and its kvpress
// variant, buzz with accumulate = full-prefix; engine/methods/scoring.h's h2o_scores and
// observation_window_scores). Its batch type and its CPU reference, cpu_attention_scores
// (engine/ops/attention_scores_cpu.cpp). The CUDA kernels are kernels/attention_scores.cu.
//
// For one kv head (keys k_0..k_{n-1}) and the query heads of its GQA group (G of them), query row
// j sees keys 0..j (causal) with the group-averaged softmax probabilities
//   P_j[i] = (1/G) sum_h exp(l_hji - max_i' l_hji') / sum_i' exp(l_hji' - max_i' l_hji'),
//   l_hji = <q_hj, k_i> / sqrt(d),
// in double precision. The op reduces the rows [row_begin, row_end) per key (the epilogue):
//   sum:        S_i = sum over rows j in [max(row_begin, i), row_end) of P_j[i]
//               (SnapKV's observation-window votes; TOVA's one row, row_end = row_begin + 1)
//   mean_seen:  S_i / (row_end - max(row_begin, i)), the mean over the rows that see key i (H2O)
// and, when a head asks for `stopped`, the running sum as it stood after row stop_rows[i] - 1:
//   stopped_i = sum over rows j in [max(row_begin, i), min(row_end, stop_rows[i])) of P_j[i]
// (BUZZ's accumulated score of a token at the step it was evicted).
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

namespace kvscope {

enum class ScoreReduce { sum, mean_seen };
const char* score_reduce_name(ScoreReduce r);  // "sum", "mean_seen"

// One kv head of a batch: its keys and its group's query heads (n x d row-major floats each; only
// rows below row_end are read), and where its outputs go.
struct ScoreHead {
  const float* keys = nullptr;
  std::vector<const float*> queries;  // the GQA group, at least one
  double* scores = nullptr;           // [row_end]: S_i (or the mean) for keys 0..row_end-1
  double* stopped = nullptr;          // [row_end] or null: the sums at stop_rows (batch)
};

struct ScoreBatch {
  int n = 0, d = 0;                // tokens and key width of every head
  int row_begin = 0, row_end = 0;  // query rows reduced: 0 <= row_begin <= row_end <= n
  ScoreReduce reduce = ScoreReduce::sum;
  std::vector<ScoreHead> heads;  // every head has the same group size
  // [row_end], for heads with `stopped`: key i's running sum stops after row stop_rows[i] - 1.
  const int* stop_rows = nullptr;
  // Checked between blocks of rows by the CPU reference (throws Cancelled), and before a device
  // launch.
  const std::atomic<bool>* cancel = nullptr;
  // Non-zero: every head's keys and queries are whole n-row matrices of the loaded layer with
  // this LayerData::id (engine/io/capture.h), unchanged while it lives, so a device backend may
  // keep them resident across calls (kernels/resident_layers.cuh). 0: upload them at every call.
  // The CPU ignores it.
  uint64_t layer_id = 0;

  int group() const { return heads.empty() ? 0 : static_cast<int>(heads.front().queries.size()); }
};

// Throws std::invalid_argument when the batch is inconsistent (no heads, a missing key or query
// array, unequal groups, d < 1, rows outside [0, n], `stopped` without stop_rows). The CPU
// reference and the device backends check the same way.
void check_score_batch(const ScoreBatch& batch);

// The op and its sizes, for Backend::supports() (OpShape: engine/ops/backend.h).
struct OpShape;
OpShape op_shape(const ScoreBatch& b);

// The CPU reference: the causal rows in blocks of 64 by a double-precision matrix product
// (engine/core/simd.h's gemm_abt and exp_shift_sum), summed per key in increasing row order.
void cpu_attention_scores(const ScoreBatch& batch);

}  // namespace kvscope
