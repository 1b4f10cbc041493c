// Exact causal attention and the weighted estimator of docs/evaluation.md, in double precision.
#pragma once

#include <vector>

#include "engine/method.h"
#include "engine/tensor.h"

namespace kvscope {

struct EvalWindow;

// Exact output Attn(q; K[0..upto], V[0..upto]) (causal: keys 0..upto inclusive), scale 1/sqrt(d).
VectorD exact_attention(const float* q, const MatrixF& K, const MatrixF& V, int upto);

// Errors for one evaluation query j.
struct QueryError {
  int position = 0;       // j
  double relative = 0;    // ||z_j - Attn_j|| / ||Attn_j||
  double normalized = 0;  // ||z_j - Attn_j|| / (||softmax_j|| * ||V_j||_F), the paper's Eq. (2)
  double mass = 0;        // exact attention mass on the kept set (sinks + selection + window)
};

// The approximation z_j of docs/evaluation.md for query q at position j: sinks [0, s) and window
// [n-E, j] at weight 1, the selection with its weights entering as logit biases log w (separate
// numerator and denominator sets when sel.separate).
VectorD weighted_attention(const float* q, const MatrixF& K, const MatrixF& V, int j,
                           const EvalWindow& w, const Selection& sel);

// Every evaluation query of one query head: Q is n x d; returns E entries for j = n-E .. n-1.
std::vector<QueryError> evaluate_query_head(const MatrixF& Q, const MatrixF& K, const MatrixF& V,
                                            const EvalWindow& w, const Selection& sel);

// Softmax attention weights of query position j over keys [0, j] (for views).
std::vector<double> attention_row(const float* q, const MatrixF& K, int j);

// The exact side of the errors of one kv head: for every evaluation query j of every given query
// head, Attn_j with its log-sum-exp shift, normaliser and the norms Eq. (2) needs. It does not
// depend on the method, keep ratio or seed, so the protocol computes it once per head and scores
// each selection against it, touching only the kept tokens. Every error figure in the engine
// (evaluate_query_head, cpu_attention_errors, run_head, run_eval) comes out of `evaluate`.
class ExactReference {
 public:
  // queries: n x d each (the GQA group, or the keys as proxy queries); sink s and eval E as in
  // EvalWindow. Throws std::invalid_argument on inconsistent shapes or window.
  ExactReference(const std::vector<const float*>& queries, const float* K, const float* V, int n,
                 int d, int dv, int sink, int eval);
  ExactReference(const std::vector<const MatrixF*>& queries, const MatrixF& K, const MatrixF& V,
                 int sink, int eval);

  int num_heads() const { return static_cast<int>(heads_.size()); }
  int n() const { return n_; }
  int eval() const { return eval_; }
  // Exact output Attn_j of head h at evaluation query e (j = n - E + e).
  VectorD exact_output(int h, int e) const { return heads_[h].exact.row(e).transpose(); }

  // Errors of a selection: [head][E]. Indices must be in the middle [s, n-E) and unique (throws
  // std::out_of_range / std::invalid_argument otherwise); weights enter as log w.
  std::vector<std::vector<QueryError>> evaluate(const Selection& sel) const;
  std::vector<std::vector<QueryError>> evaluate_log(const std::vector<int>& num_idx,
                                                    const std::vector<double>& num_logw,
                                                    const std::vector<int>& den_idx,
                                                    const std::vector<double>& den_logw) const;
  // The approximation z_j for query q (d floats) at evaluation position j in [n-E, n).
  VectorD approximation(const Selection& sel, const float* q, int j) const;

 private:
  // Exact side of consecutive query positions first_j, first_j + 1, ... (one row each).
  struct Rows {
    int first_j = 0;
    // Scaled logits <q_j, k_i> / sqrt(d) of every key i < n (rows) for every query row (columns):
    // scoring a selection gathers its columns from here instead of multiplying again. n x R
    // doubles per query head (16 MiB at n = 8192, E = 256).
    MatrixD logits_t;
    MatrixD exact;                              // Attn_j
    VectorD shift, norm, softmax_norm, v_frob;  // max logit, sum exp(l - shift), Eq. (2) norms
  };
  struct Kept;  // a validated selection, merged over numerator and denominator
  Kept prepare(const std::vector<int>& num_idx, const std::vector<double>& num_logw,
               const std::vector<int>& den_idx, const std::vector<double>& den_logw) const;
  Rows exact_rows(const MatrixD& q, int first_j) const;
  // Errors (and optionally the approximations) of every row of `rows` for one kept set.
  std::vector<QueryError> score(const Kept& kept, const Rows& rows, MatrixD* approx) const;

  int n_ = 0, d_ = 0, dv_ = 0, sink_ = 0, eval_ = 0;
  MatrixD K_, V_;
  std::vector<double> v_sq_prefix_;  // sum_{i<=j} ||v_i||^2
  std::vector<Rows> heads_;
};

}  // namespace kvscope
