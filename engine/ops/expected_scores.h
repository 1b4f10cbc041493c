// The expected-attention op (Backend::expected_scores, engine/ops/backend.h): the hot part of
// expected-attention (engine/methods/expected_attention.cpp, kvpress's ExpectedAttentionPress).
// Its batch type and its CPU reference, cpu_expected_scores (engine/ops/expected_scores_cpu.cpp).
// The CUDA kernels are kernels/expected_scores.cu.
//
// For one kv head: the context's keys after the sinks k_0..k_{c-1} (c = count, width d, after
// RoPE), the values of the same tokens (width dv), and for each query head h of the GQA group
// (G of them) its queries of those tokens before RoPE, q_h (c x d, double). With R the mean RoPE
// rotation over the future positions (d x d, computed by the method), per query head
//   mu_h = mean_t q_ht,  S_h = (q_h - mu_h)^T (q_h - mu_h) / c,
//   l_hj = k_j . (R mu_h) / sqrt(d)  [+ k_j^T (R S_h R^T) k_j / (2d)  when use_covariance]
// and the output is, in double precision,
//   p_j = (1/G) sum_h exp(l_hj - max_j' l_hj') / sum_j' exp(l_hj' - max_j' l_hj'),
//   score_j = (p_j + epsilon) |v_j|  when use_vnorm, else p_j.
// The cost is the covariance terms: O(G c d^2) for S_h and for the quadratic forms, against
// O(G c d) inputs; the rotation R (O(d x future)) and the sinks' ranking stay in the method.
#pragma once

#include <atomic>
#include <vector>

namespace kvscope {

struct ExpectedScoreHead {
  const float* keys = nullptr;         // count x d row-major (after RoPE)
  const float* values = nullptr;       // count x dv row-major; read when use_vnorm
  std::vector<const double*> queries;  // the GQA group, count x d each (before RoPE)
  double* scores = nullptr;            // [count]
};

struct ExpectedScoreBatch {
  int count = 0, d = 0, dv = 0;      // tokens scored, key width, value width
  const double* rotation = nullptr;  // R, d x d row-major
  bool use_covariance = true, use_vnorm = true;
  double epsilon = 0;
  std::vector<ExpectedScoreHead> heads;  // every head has the same group size
  // Checked by the CPU reference before each query head (throws Cancelled), and before a device
  // launch.
  const std::atomic<bool>* cancel = nullptr;

  int group() const { return heads.empty() ? 0 : static_cast<int>(heads.front().queries.size()); }
};

// Throws std::invalid_argument when the batch is inconsistent (no heads, count < 1, d < 1, a
// missing array, no rotation, unequal groups, dv < 1 with use_vnorm). The CPU reference and the
// device backends check the same way.
void check_expected_score_batch(const ExpectedScoreBatch& batch);

// The op and its sizes, for Backend::supports() (OpShape: engine/ops/backend.h).
struct OpShape;
OpShape op_shape(const ExpectedScoreBatch& b);

// The CPU reference: Eigen products in double per query head, the softmax summed in token order
// (the code expected-attention had before the op existed, moved unchanged).
void cpu_expected_scores(const ExpectedScoreBatch& batch);

}  // namespace kvscope
