// Exact causal attention and the weighted estimator of docs/evaluation.md, in double precision.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "engine/attention/selection.h"
#include "engine/core/scratch.h"
#include "engine/core/tensor.h"

namespace kvscope {

struct EvalWindow;
struct LayerData;

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

// The queries the errors of kv head `kv` use: its GQA group, or the keys when the layer has no
// queries.
std::vector<const MatrixF*> reference_queries(const LayerData& layer, int kv);

// Throws std::invalid_argument unless 0 < E, 0 <= s and s + E <= n (the window every error
// figure needs; ExactReference checks it too).
void check_window(int n, int sink, int eval);

// The exact side of the errors of one kv head in compact form: for every evaluation query j of
// every query head, Attn_j, its log-sum-exp shift and normaliser and the norms Eq. (2) needs. About
// E * (d_v + 4) doubles per query head (1 MiB per kv head of Llama-3-8B's shapes at E = 256),
// whatever n is: what the reference cache (engine/eval/reference_cache.h) keeps per (layer, kv
// head, window) so that every method, ratio, seed and parameter is scored without recomputing it.
struct ExactSide {
  int n = 0, d = 0, dv = 0, sink = 0, eval = 0;
  struct Head {
    MatrixD exact;                              // E x d_v: Attn_j
    VectorD shift, norm, softmax_norm, v_frob;  // max logit, sum exp(l - shift), Eq. (2) norms
    // The part every selection keeps: the sinks and the window up to j (weight 1 in both sums),
    // summed once here so that scoring a selection touches its kept middle tokens only
    // (docs/performance.md, "Exact reference cache"): with f = max of their logits,
    // fixed_sum_j = sum exp(l_i - f) and fixed_num_j = sum exp(l_i - f) v_i (E x d_v).
    MatrixD fixed_num;
    VectorD fixed_max, fixed_sum;
  };
  std::vector<Head> heads;  // one per query head
  size_t bytes() const;     // memory held
};

// The exact side of the errors of one kv head: for every evaluation query j of every given query
// head, Attn_j with its log-sum-exp shift, normaliser and the norms Eq. (2) needs. It does not
// depend on the method, keep ratio or seed, so the protocol computes it once per head (and the
// reference cache once per capture) and scores each selection against it, touching only the kept
// tokens. Every error figure in the engine (evaluate_query_head, cpu_attention_errors, run_head,
// run_eval) comes out of `evaluate`.
//
// Two forms score identically, bit for bit: with the logits of every key for every evaluation
// query kept (n x E doubles per query head; what the constructors below build, and worth it when
// many selections are scored), or from the compact ExactSide alone, computing per selection the
// logits of the kept tokens only (one kept x d by d x E product per query head).
class ExactReference {
 public:
  // queries: n x d each (the GQA group, or the keys as proxy queries); sink s and eval E as in
  // EvalWindow. Throws std::invalid_argument on inconsistent shapes or window. These copy the
  // keys and values and keep the logits of every key.
  ExactReference(const std::vector<const float*>& queries, const float* K, const float* V, int n,
                 int d, int dv, int sink, int eval);
  ExactReference(const std::vector<const MatrixF*>& queries, const MatrixF& K, const MatrixF& V,
                 int sink, int eval);
  // Computes the exact side of these queries, keys and values, borrowing them (they must outlive
  // the reference): keep_logits keeps the logits of every key (computed anyway) for scoring. A
  // set cancel flag stops the work between query heads and throws Cancelled.
  static ExactReference build(const std::vector<const float*>& queries, const float* K,
                              const float* V, int n, int d, int dv, int sink, int eval,
                              bool keep_logits, const std::atomic<bool>* cancel = nullptr);
  // Scores against `side`, an exact side built earlier for the same queries, keys and values
  // (the reference cache's), borrowing them (they must outlive the reference). with_logits:
  // computes the logits of every key once (one n x E x d product per query head), cheaper than
  // the kept tokens' logits of every selection when many are scored.
  ExactReference(std::shared_ptr<const ExactSide> side, const std::vector<const float*>& queries,
                 const float* K, const float* V, bool with_logits);
  ExactReference(ExactReference&&) noexcept;
  ExactReference& operator=(ExactReference&&) noexcept;
  ~ExactReference();

  int num_heads() const { return static_cast<int>(side_->heads.size()); }
  int n() const { return n_; }
  int eval() const { return eval_; }
  // Exact output Attn_j of head h at evaluation query e (j = n - E + e).
  VectorD exact_output(int h, int e) const { return side_->heads[h].exact.row(e).transpose(); }
  // The compact exact side (shared with the reference cache).
  const std::shared_ptr<const ExactSide>& side() const { return side_; }
  // Whether the logits of every key are held (else each selection computes its own).
  bool has_logits() const { return !logits_.empty(); }

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
  ExactReference() = default;
  // What scoring reads for consecutive query positions first_j, first_j + 1, ... (one row each):
  // the exact side, and either the scaled logits <q_j, k_i> / sqrt(d) of every key i < n (rows)
  // for every query row (columns), from which a selection gathers its columns, or the queries
  // (rows x d, double), from which the kept tokens' logits are computed.
  struct Rows {
    int first_j = 0;
    const ExactSide::Head* side = nullptr;
    const double* logits = nullptr;  // n x R, or null
    const double* q = nullptr;       // R x d, when logits is null
  };
  struct Kept;  // a validated selection, merged over numerator and denominator
  Kept prepare(const std::vector<int>& num_idx, const std::vector<double>& num_logw,
               const std::vector<int>& den_idx, const std::vector<double>& den_logw) const;
  // The keys and the values as the exact side's products read them, converted to double and
  // packed once for every query head and panel (engine/attention/exact_attention.cpp).
  struct PackedKV;
  PackedKV pack_kv() const;
  // The exact side of query rows q (R x d) at positions first_j ...; the logits of every key go to
  // `logits` (n x R) when not null (one panel, read in place: the window's keys past each query
  // are left masked to -inf there, which scoring never reads), else they are computed panel by
  // panel.
  ExactSide::Head exact_rows(const MatrixD& q, int first_j, double* logits,
                             const PackedKV& kv) const;
  void build_side(const std::vector<const float*>& queries, bool keep_logits,
                  const std::atomic<bool>* cancel);
  Rows rows(int h) const;
  // Errors (and optionally the approximations) of every row of `rows` for one kept set.
  std::vector<QueryError> score(const Kept& kept, const Rows& rows, MatrixD* approx) const;

  int n_ = 0, d_ = 0, dv_ = 0, sink_ = 0, eval_ = 0;
  std::vector<float> own_k_, own_v_;  // copies, for the constructors that do not borrow
  const float* K_ = nullptr;          // n x d
  const float* V_ = nullptr;          // n x dv
  std::shared_ptr<const ExactSide> side_;
  std::vector<MatrixD> q_;               // per head R x d (double), when no logits are held
  std::vector<scratch::Buffer> logits_;  // per head n x R, or empty
};

}  // namespace kvscope
