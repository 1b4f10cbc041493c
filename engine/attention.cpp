// Exact causal attention and the weighted estimator of DESIGN.md section 3, in double precision.
//
// Every error figure in KVScope comes out of ExactReference below: the per-query-head function,
// the Backend seam's CPU op (cpu_attention_errors, the reference the CUDA kernel is tested
// against) and the protocol all use it, so they cannot drift apart.
//
// For one query q_j (position j, n tokens, s sinks, E evaluation queries):
//   logits        l_i = <q_j, k_i> / sqrt(d)                     for i in [0, j]
//   exact         Attn_j = sum_i exp(l_i - M) v_i / sum_i exp(l_i - M),  M = max_i l_i
//   approximation z_j = sum_{i in N} exp(l_i + log w_i - M') v_i / sum_{i in D} exp(l_i + log w_i -
//   M')
//                 N = sinks [0, s) + numerator selection + window [n-E, j], weight 1 outside the
//                 middle; D the same with the denominator selection (= the numerator's unless the
//                 method returned separate sets); M' = max of the biased logits over N and D.
// The shifts cancel in the ratios; they only keep exp() in range (log-sum-exp).
//   relative      ||z_j - Attn_j|| / ||Attn_j||
//   normalized    ||z_j - Attn_j|| / (||softmax(K_j q_j / sqrt d)||_2 ||V_j||_F)   (Eq. (2) of the
//                 BalanceKV paper; K_j, V_j = rows 0..j)
//   mass          sum of the exact softmax probabilities of the kept tokens (sinks, numerator or
//                 denominator selection, window up to j)
//
// The exact side does not depend on the selection, so it is computed once per head; scoring a
// selection then costs O((s + |selection| + E) (d + d_v)) per query instead of O(j (d + d_v)).
// Logits are always computed by the same function in the same way, and kept tokens are summed in
// increasing index order, so keeping everything at weight 1 reproduces the exact output bit for
// bit (error exactly 0).
#include "engine/attention.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

#include "engine/cpu_ops.h"
#include "engine/protocol.h"

namespace kvscope {

// A selection merged over numerator and denominator: sorted unique middle tokens.
struct ExactReference::Kept {
  std::vector<int> idx;
  std::vector<char> in_num, in_den;
  std::vector<double> num_logw, den_logw;
  std::vector<double> num_inv_w, den_inv_w;  // 1 / w, to turn a weighted term back into exp(l)
};

namespace {

void check_window(int n, int sink, int eval) {
  if (n <= 0 || sink < 0 || eval <= 0 || sink + eval > n)
    throw std::invalid_argument("attention: bad window n=" + std::to_string(n) +
                                " s=" + std::to_string(sink) + " E=" + std::to_string(eval));
}

std::vector<double> log_of(const std::vector<int>& idx, const std::vector<double>& w) {
  if (idx.size() != w.size())
    throw std::invalid_argument("selection has " + std::to_string(idx.size()) + " indices but " +
                                std::to_string(w.size()) + " weights");
  std::vector<double> logw(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    if (!(w[i] > 0) || !std::isfinite(w[i]))
      throw std::invalid_argument("selection weight of token " + std::to_string(idx[i]) +
                                  " is not a positive finite number");
    logw[i] = std::log(w[i]);
  }
  return logw;
}

}  // namespace

ExactReference::ExactReference(const std::vector<const float*>& queries, const float* K,
                               const float* V, int n, int d, int dv, int sink, int eval)
    : n_(n), d_(d), dv_(dv), sink_(sink), eval_(eval) {
  check_window(n, sink, eval);
  if (d <= 0 || dv <= 0) throw std::invalid_argument("attention: empty key or value rows");
  K_ = Eigen::Map<const MatrixF>(K, n, d).cast<double>();
  V_ = Eigen::Map<const MatrixF>(V, n, dv).cast<double>();
  heads_.resize(queries.size());
  for (size_t h = 0; h < queries.size(); ++h) {
    const Eigen::Map<const MatrixF> Q(queries[h], n, d);
    heads_[h].rows.reserve(eval);
    for (int e = 0; e < eval; ++e) {
      const int j = n - eval + e;
      heads_[h].rows.push_back(make_row(Q.row(j).cast<double>().transpose(), j));
    }
  }
}

ExactReference::ExactReference(const std::vector<const MatrixF*>& queries, const MatrixF& K,
                               const MatrixF& V, int sink, int eval)
    : ExactReference(
          [&] {
            std::vector<const float*> q;
            for (const MatrixF* m : queries) {
              if (m->rows() != K.rows() || m->cols() != K.cols())
                throw std::invalid_argument("attention: queries are " + std::to_string(m->rows()) +
                                            "x" + std::to_string(m->cols()) + ", keys " +
                                            std::to_string(K.rows()) + "x" +
                                            std::to_string(K.cols()));
              q.push_back(m->data());
            }
            if (V.rows() != K.rows())
              throw std::invalid_argument("attention: " + std::to_string(K.rows()) + " keys but " +
                                          std::to_string(V.rows()) + " values");
            return q;
          }(),
          K.data(), V.data(), static_cast<int>(K.rows()), static_cast<int>(K.cols()),
          static_cast<int>(V.cols()), sink, eval) {}

double ExactReference::logit(const VectorD& q, int i) const {
  return K_.row(i).dot(q) / std::sqrt(static_cast<double>(d_));
}

ExactReference::Row ExactReference::make_row(const VectorD& q, int j) const {
  Row r;
  r.q = q;
  std::vector<double> l(j + 1);
  double m = -INFINITY;
  for (int i = 0; i <= j; ++i) m = std::max(m, l[i] = logit(q, i));
  r.exact = VectorD::Zero(dv_);
  double z = 0, p_sq = 0, v_sq = 0;
  for (int i = 0; i <= j; ++i) {
    const double e = std::exp(l[i] - m);
    z += e;
    p_sq += e * e;
    r.exact.noalias() += e * V_.row(i).transpose();
    v_sq += V_.row(i).squaredNorm();
  }
  r.exact /= z;
  r.shift = m;
  r.norm = z;
  r.softmax_norm = std::sqrt(p_sq) / z;
  r.v_frob = std::sqrt(v_sq);
  return r;
}

ExactReference::Kept ExactReference::prepare(const std::vector<int>& num_idx,
                                             const std::vector<double>& num_logw,
                                             const std::vector<int>& den_idx,
                                             const std::vector<double>& den_logw) const {
  if (num_idx.size() != num_logw.size() || den_idx.size() != den_logw.size())
    throw std::invalid_argument("attention: indices and log weights differ in length");
  const int mid_begin = sink_, mid_end = n_ - eval_;
  // Position of each middle token in the merged list (-1: not kept).
  std::vector<int> slot(std::max(mid_end - mid_begin, 0), -1);
  auto mark = [&](const std::vector<int>& idx, const char* which) {
    for (int i : idx)
      if (i < mid_begin || i >= mid_end)
        throw std::out_of_range(std::string(which) + " selection index " + std::to_string(i) +
                                " is outside the middle [" + std::to_string(mid_begin) + ", " +
                                std::to_string(mid_end) + ")");
  };
  mark(num_idx, "numerator");
  mark(den_idx, "denominator");
  Kept k;
  std::vector<int> all = num_idx;
  all.insert(all.end(), den_idx.begin(), den_idx.end());
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  k.idx = all;
  for (size_t t = 0; t < all.size(); ++t) slot[all[t] - mid_begin] = static_cast<int>(t);
  k.in_num.assign(all.size(), 0);
  k.in_den.assign(all.size(), 0);
  k.num_logw.assign(all.size(), 0.0);
  k.den_logw.assign(all.size(), 0.0);
  for (size_t t = 0; t < num_idx.size(); ++t) {
    const int s = slot[num_idx[t] - mid_begin];
    if (k.in_num[s]++)
      throw std::invalid_argument("numerator selection holds token " + std::to_string(num_idx[t]) +
                                  " twice");
    k.num_logw[s] = num_logw[t];
  }
  for (size_t t = 0; t < den_idx.size(); ++t) {
    const int s = slot[den_idx[t] - mid_begin];
    if (k.in_den[s]++)
      throw std::invalid_argument("denominator selection holds token " +
                                  std::to_string(den_idx[t]) + " twice");
    k.den_logw[s] = den_logw[t];
  }
  k.num_inv_w.resize(all.size());
  k.den_inv_w.resize(all.size());
  for (size_t u = 0; u < all.size(); ++u) {
    k.num_inv_w[u] = std::exp(-k.num_logw[u]);
    k.den_inv_w[u] = std::exp(-k.den_logw[u]);
  }
  return k;
}

QueryError ExactReference::score(const Kept& k, const Row& row, int j, VectorD* approx) const {
  const int win_begin = n_ - eval_;
  const size_t kept = k.idx.size();
  // Logits of the sinks, the merged selection and the window [n-E, j], in index order.
  std::vector<double> l(static_cast<size_t>(sink_) + kept + (j - win_begin + 1));
  size_t t = 0;
  for (int i = 0; i < sink_; ++i) l[t++] = logit(row.q, i);
  for (int i : k.idx) l[t++] = logit(row.q, i);
  for (int i = win_begin; i <= j; ++i) l[t++] = logit(row.q, i);

  double m2 = -INFINITY;
  for (int i = 0; i < sink_; ++i) m2 = std::max(m2, l[i]);
  for (size_t u = 0; u < kept; ++u) {
    if (k.in_num[u]) m2 = std::max(m2, l[sink_ + u] + k.num_logw[u]);
    if (k.in_den[u]) m2 = std::max(m2, l[sink_ + u] + k.den_logw[u]);
  }
  for (size_t u = sink_ + kept; u < l.size(); ++u) m2 = std::max(m2, l[u]);

  // One exp per kept token: the mass reuses the estimator's terms, rescaled from the shift M'
  // (and the weight) to the exact shift at the end.
  VectorD num = VectorD::Zero(dv_);
  double den = 0, mass = 0;            // mass in units of exp(l - M')
  auto unit = [&](int i, double li) {  // sinks and window: weight 1 in both sums
    const double e = std::exp(li - m2);
    num.noalias() += e * V_.row(i).transpose();
    den += e;
    mass += e;
  };
  for (int i = 0; i < sink_; ++i) unit(i, l[i]);
  for (size_t u = 0; u < kept; ++u) {
    const int i = k.idx[u];
    const double li = l[sink_ + u];
    if (k.in_num[u] && k.in_den[u] && k.num_logw[u] == k.den_logw[u]) {
      const double e = std::exp(li + k.num_logw[u] - m2);  // a joint selection: one term
      num.noalias() += e * V_.row(i).transpose();
      den += e;
      mass += e * k.num_inv_w[u];
      continue;
    }
    if (k.in_num[u]) {
      const double e = std::exp(li + k.num_logw[u] - m2);
      num.noalias() += e * V_.row(i).transpose();
      mass += e * k.num_inv_w[u];
    }
    if (k.in_den[u]) {
      const double e = std::exp(li + k.den_logw[u] - m2);
      den += e;
      if (!k.in_num[u]) mass += e * k.den_inv_w[u];
    }
  }
  t = sink_ + kept;
  for (int i = win_begin; i <= j; ++i) unit(i, l[t++]);
  mass *= std::exp(m2 - row.shift);

  const VectorD z = num / den;  // den > 0: the window always holds j itself
  const double diff = (z - row.exact).norm();
  const double exact_norm = row.exact.norm();
  QueryError err;
  err.position = j;
  // A zero exact output (all values zero) has no scale: report the absolute difference.
  err.relative = exact_norm > 0 ? diff / exact_norm : diff;
  err.normalized = row.v_frob > 0 ? diff / (row.softmax_norm * row.v_frob) : diff;
  err.mass = mass / row.norm;
  if (approx) *approx = z;
  return err;
}

std::vector<std::vector<QueryError>> ExactReference::evaluate_log(
    const std::vector<int>& num_idx, const std::vector<double>& num_logw,
    const std::vector<int>& den_idx, const std::vector<double>& den_logw) const {
  const Kept k = prepare(num_idx, num_logw, den_idx, den_logw);
  std::vector<std::vector<QueryError>> out(heads_.size(), std::vector<QueryError>(eval_));
  for (size_t h = 0; h < heads_.size(); ++h)
    for (int e = 0; e < eval_; ++e)
      out[h][e] = score(k, heads_[h].rows[e], n_ - eval_ + e, nullptr);
  return out;
}

std::vector<std::vector<QueryError>> ExactReference::evaluate(const Selection& sel) const {
  const std::vector<double> num_logw = log_of(sel.indices, sel.weights);
  if (!sel.separate) return evaluate_log(sel.indices, num_logw, sel.indices, num_logw);
  return evaluate_log(sel.indices, num_logw, sel.den_indices,
                      log_of(sel.den_indices, sel.den_weights));
}

VectorD ExactReference::approximation(const Selection& sel, const float* q, int j) const {
  if (j < n_ - eval_ || j >= n_)
    throw std::out_of_range("weighted attention: position " + std::to_string(j) +
                            " is not an evaluation query [" + std::to_string(n_ - eval_) + ", " +
                            std::to_string(n_) + ")");
  const std::vector<double> num_logw = log_of(sel.indices, sel.weights);
  const Kept k = sel.separate ? prepare(sel.indices, num_logw, sel.den_indices,
                                        log_of(sel.den_indices, sel.den_weights))
                              : prepare(sel.indices, num_logw, sel.indices, num_logw);
  VectorD z;
  score(k, make_row(Eigen::Map<const VectorF>(q, d_).cast<double>(), j), j, &z);
  return z;
}

VectorD exact_attention(const float* q, const MatrixF& K, const MatrixF& V, int upto) {
  if (upto < 0 || upto >= K.rows() || V.rows() != K.rows())
    throw std::out_of_range("exact_attention: position " + std::to_string(upto) + " outside the " +
                            std::to_string(K.rows()) + " keys");
  const int d = static_cast<int>(K.cols());
  const VectorD qd = Eigen::Map<const VectorF>(q, d).cast<double>();
  const VectorD logits =
      (K.topRows(upto + 1).cast<double>() * qd) / std::sqrt(static_cast<double>(d));
  const double m = logits.maxCoeff();
  VectorD out = VectorD::Zero(V.cols());
  double z = 0;
  for (int i = 0; i <= upto; ++i) {
    const double e = std::exp(logits[i] - m);
    z += e;
    out.noalias() += e * V.row(i).cast<double>().transpose();
  }
  return out / z;
}

VectorD weighted_attention(const float* q, const MatrixF& K, const MatrixF& V, int j,
                           const EvalWindow& w, const Selection& sel) {
  if (w.n != K.rows())
    throw std::invalid_argument("weighted_attention: window is for n=" + std::to_string(w.n) +
                                " but there are " + std::to_string(K.rows()) + " keys");
  const ExactReference ref(std::vector<const MatrixF*>{}, K, V, w.sink, w.eval);
  return ref.approximation(sel, q, j);
}

std::vector<QueryError> evaluate_query_head(const MatrixF& Q, const MatrixF& K, const MatrixF& V,
                                            const EvalWindow& w, const Selection& sel) {
  if (w.n != K.rows())
    throw std::invalid_argument("evaluate_query_head: window is for n=" + std::to_string(w.n) +
                                " but there are " + std::to_string(K.rows()) + " keys");
  return ExactReference({&Q}, K, V, w.sink, w.eval).evaluate(sel)[0];
}

std::vector<double> attention_row(const float* q, const MatrixF& K, int j) {
  if (j < 0 || j >= K.rows())
    throw std::out_of_range("attention_row: position " + std::to_string(j) + " outside the " +
                            std::to_string(K.rows()) + " keys");
  const int d = static_cast<int>(K.cols());
  const VectorD qd = Eigen::Map<const VectorF>(q, d).cast<double>();
  const VectorD logits = (K.topRows(j + 1).cast<double>() * qd) / std::sqrt(static_cast<double>(d));
  const double m = logits.maxCoeff();
  std::vector<double> p(j + 1);
  double z = 0;
  for (int i = 0; i <= j; ++i) z += p[i] = std::exp(logits[i] - m);
  for (double& x : p) x /= z;
  return p;
}

void cpu_attention_errors(const ErrorBatch& b) {
  if (b.kv_heads <= 0 || b.q_heads <= 0 || b.q_heads % b.kv_heads != 0)
    throw std::invalid_argument("attention_errors: " + std::to_string(b.q_heads) +
                                " query heads do not form groups over " +
                                std::to_string(b.kv_heads) + " kv heads");
  check_window(b.n, b.sink, b.eval);
  const auto kv = static_cast<size_t>(b.kv_heads);
  if (b.keys.size() != kv || b.values.size() != kv || b.num_idx.size() != kv ||
      b.den_idx.size() != kv || b.num_logw.size() != kv || b.den_logw.size() != kv ||
      b.queries.size() != static_cast<size_t>(b.q_heads))
    throw std::invalid_argument("attention_errors: per-head arrays do not match the head counts");
  const int group = b.q_heads / b.kv_heads;
  for (int kvh = 0; kvh < b.kv_heads; ++kvh) {
    const std::vector<const float*> queries(b.queries.begin() + kvh * group,
                                            b.queries.begin() + (kvh + 1) * group);
    const ExactReference ref(queries, b.keys[kvh], b.values[kvh], b.n, b.d, b.dv, b.sink, b.eval);
    const std::vector<double> num_logw(b.num_logw[kvh].begin(), b.num_logw[kvh].end());
    const std::vector<double> den_logw(b.den_logw[kvh].begin(), b.den_logw[kvh].end());
    const auto errs = ref.evaluate_log(b.num_idx[kvh], num_logw, b.den_idx[kvh], den_logw);
    for (int g = 0; g < group; ++g) {
      for (int e = 0; e < b.eval; ++e) {
        const size_t o = static_cast<size_t>(kvh * group + g) * b.eval + e;
        if (b.relative) b.relative[o] = errs[g][e].relative;
        if (b.normalized) b.normalized[o] = errs[g][e].normalized;
        if (b.mass) b.mass[o] = errs[g][e].mass;
      }
    }
  }
}

}  // namespace kvscope
