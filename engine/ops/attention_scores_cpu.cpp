// The CPU reference of the attention-score op (engine/ops/attention_scores.h): the causal,
// group-averaged softmax rows in double precision, computed in blocks of 64 rows by one matrix
// product per query head, and reduced per key in increasing row order. These are the figures the
// score-ranking methods had before the op existed (the code moved here from
// engine/methods/scoring.cpp unchanged); the CUDA kernels (kernels/attention_scores.cu) are tested
// against it (tests/test_cuda_parity.cpp).
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/simd.h"
#include "engine/core/tensor.h"
#include "engine/ops/attention_scores.h"
#include "engine/ops/backend.h"

namespace kvscope {
namespace {

using ConstMapF = Eigen::Map<const MatrixF>;

// Visits the causal rows [row_begin, row_end) in increasing order: for row j, `probs` holds the
// j+1 group-averaged probabilities P_j[0..j].
template <typename RowFn>
void for_each_row(const ScoreBatch& b, const ScoreHead& head, RowFn&& fn) {
  const int row_begin = b.row_begin, row_end = b.row_end, d = b.d;
  if (row_begin >= row_end) return;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  // Keys 0..row_end-1 in double, once; logits of a block of rows by one matrix product per head.
  const MatrixD k_d = ConstMapF(head.keys, row_end, d).cast<double>();
  constexpr int kBlockRows = 64;
  std::vector<double> mean(row_end);
  const size_t group = head.queries.size();
  std::vector<MatrixD> block_logits(group);
  const simd::Kernels& kern = simd::kernels();
  for (int b0 = row_begin; b0 < row_end; b0 += kBlockRows) {
    if (b.cancel && b.cancel->load(std::memory_order_relaxed)) throw Cancelled();
    const int b1 = std::min(row_end, b0 + kBlockRows);
    const int cols = b1;  // the last row of the block sees keys 0..b1-1
    for (size_t h = 0; h < group; ++h) {
      const MatrixD q_d =
          ConstMapF(head.queries[h] + static_cast<size_t>(b0) * d, b1 - b0, d).cast<double>();
      block_logits[h].resize(b1 - b0, cols);
      kern.gemm_abt(b1 - b0, cols, d, scale, q_d.data(), d, k_d.data(), d, block_logits[h].data(),
                    cols);
    }
    for (int j = b0; j < b1; ++j) {
      std::fill(mean.begin(), mean.begin() + j + 1, 0.0);
      for (size_t h = 0; h < group; ++h) {
        double* row = block_logits[h].row(j - b0).data();  // overwritten by exp(logit - max)
        const double mx = *std::max_element(row, row + j + 1);
        const double z = kern.exp_shift_sum(row, j + 1, mx, nullptr);
        const double norm = 1.0 / (z * static_cast<double>(group));
        for (int i = 0; i <= j; ++i) mean[i] += row[i] * norm;
      }
      fn(j, mean.data());
    }
  }
}

}  // namespace

const char* score_reduce_name(ScoreReduce r) {
  switch (r) {
    case ScoreReduce::sum:
      return "sum";
    case ScoreReduce::mean_seen:
      return "mean_seen";
  }
  return "?";
}

void check_score_batch(const ScoreBatch& b) {
  const std::string who = "attention_scores: ";
  if (b.heads.empty()) throw std::invalid_argument(who + "no heads");
  if (b.n < 0 || b.d < 1)
    throw std::invalid_argument(who + "bad shape n = " + std::to_string(b.n) +
                                ", d = " + std::to_string(b.d));
  if (b.row_begin < 0 || b.row_begin > b.row_end || b.row_end > b.n)
    throw std::invalid_argument(who + "rows [" + std::to_string(b.row_begin) + ", " +
                                std::to_string(b.row_end) + ") are not inside [0, " +
                                std::to_string(b.n) + "]");
  const size_t group = b.heads.front().queries.size();
  if (group == 0) throw std::invalid_argument(who + "a head has no query heads");
  for (const ScoreHead& h : b.heads) {
    if (h.queries.size() != group)
      throw std::invalid_argument(who + "heads have groups of " + std::to_string(group) + " and " +
                                  std::to_string(h.queries.size()) + " query heads");
    if (!h.keys || !h.scores) throw std::invalid_argument(who + "a head has no keys or no output");
    for (const float* q : h.queries)
      if (!q) throw std::invalid_argument(who + "a query head is missing");
    if (h.stopped && !b.stop_rows)
      throw std::invalid_argument(who + "stopped sums asked for without stop_rows");
  }
}

void cpu_attention_scores(const ScoreBatch& b) {
  check_score_batch(b);
  const int row_begin = b.row_begin, row_end = b.row_end;
  for (const ScoreHead& head : b.heads) {
    double* sums = head.scores;
    double* stopped = head.stopped;
    std::fill(sums, sums + row_end, 0.0);
    if (stopped) std::fill(stopped, stopped + row_end, 0.0);
    for_each_row(b, head, [&](int j, const double* p) {
      for (int i = 0; i <= j; ++i) sums[i] += p[i];
      if (stopped)
        for (int i = 0; i <= j; ++i)
          if (j < b.stop_rows[i]) stopped[i] += p[i];
    });
    if (b.reduce == ScoreReduce::mean_seen)
      for (int i = 0; i < row_end; ++i) {
        const int seen = row_end - std::max(row_begin, i);  // 0 only when there are no rows
        if (seen > 0) sums[i] /= static_cast<double>(seen);
      }
  }
}

OpShape op_shape(const ScoreBatch& b) {
  return {Op::attention_scores, b.n, b.d, static_cast<int>(b.heads.size()), b.group(), false};
}

}  // namespace kvscope
