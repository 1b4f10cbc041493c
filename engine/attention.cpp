// Exact causal attention and the weighted estimator of DESIGN.md section 3, in double precision.
//
// Every error figure in KVScope comes out of `evaluate_head` below: the public per-query-head
// function, the Backend seam's CPU op (cpu_attention_errors, the reference the CUDA kernel is
// tested against) and the protocol all call it, so they cannot drift apart.
//
// For one query q_j (position j, n tokens, s sinks, E evaluation queries):
//   logits        l_i = <q_j, k_i> / sqrt(d)                     for i in [0, j]
//   exact         Attn_j = sum_i exp(l_i - M) v_i / sum_i exp(l_i - M),  M = max_i l_i
//   approximation z_j = sum_{i in N} exp(l_i + log w_i - M') v_i / sum_{i in D} exp(l_i + log w_i -
//   M')
//                 N = sinks [0, s) + numerator selection + window [n-E, j], weight 1 outside the
//                 middle; D the same with the denominator selection (= the numerator's unless the
//                 method returned separate sets); M' = max of the biased logits over N and D.
// The shift M' cancels in the ratio; it only keeps exp() in range (log-sum-exp).
#include "engine/attention.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

#include "engine/cpu_ops.h"
#include "engine/protocol.h"

namespace kvscope {
namespace {

// One selection of the middle, sorted by token index so that a full selection with weight 1 sums
// in exactly the order of the exact attention (exact then gives an error of exactly zero).
struct MiddleSet {
  std::vector<int> idx;
  std::vector<double> logw;
};

MiddleSet sorted_set(const int* idx, const double* logw, size_t count) {
  std::vector<size_t> order(count);
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return idx[a] < idx[b]; });
  MiddleSet s;
  s.idx.reserve(count);
  s.logw.reserve(count);
  for (size_t o : order) {
    s.idx.push_back(idx[o]);
    s.logw.push_back(logw[o]);
  }
  return s;
}

MiddleSet set_from_weights(const std::vector<int>& idx, const std::vector<double>& w) {
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
  return sorted_set(idx.data(), logw.data(), idx.size());
}

void check_set(const MiddleSet& s, int mid_begin, int mid_end, const char* which) {
  for (size_t i = 0; i < s.idx.size(); ++i) {
    if (s.idx[i] < mid_begin || s.idx[i] >= mid_end)
      throw std::out_of_range(std::string(which) + " selection index " + std::to_string(s.idx[i]) +
                              " is outside the middle [" + std::to_string(mid_begin) + ", " +
                              std::to_string(mid_end) + ")");
    if (i > 0 && s.idx[i] == s.idx[i - 1])
      throw std::invalid_argument(std::string(which) + " selection holds token " +
                                  std::to_string(s.idx[i]) + " twice");
  }
}

// The inputs of one head's evaluation, converted to double once.
struct HeadInputs {
  int n = 0, d = 0, dv = 0, sink = 0, eval = 0;
  MatrixD K, V;
  std::vector<double> v_sq_prefix;  // sum_{i<=j} ||v_i||^2, for ||V_j||_F
  MiddleSet num, den;
  std::vector<char> kept_middle;  // 1 for middle tokens in the numerator or denominator set
};

void prepare_head(HeadInputs& h, const float* K, const float* V) {
  h.K = Eigen::Map<const MatrixF>(K, h.n, h.d).cast<double>();
  h.V = Eigen::Map<const MatrixF>(V, h.n, h.dv).cast<double>();
  h.v_sq_prefix.resize(h.n);
  double acc = 0;
  for (int i = 0; i < h.n; ++i) {
    acc += h.V.row(i).squaredNorm();
    h.v_sq_prefix[i] = acc;
  }
  const int mid_begin = h.sink, mid_end = h.n - h.eval;
  check_set(h.num, mid_begin, mid_end, "numerator");
  check_set(h.den, mid_begin, mid_end, "denominator");
  h.kept_middle.assign(h.n, 0);
  for (int i : h.num.idx) h.kept_middle[i] = 1;
  for (int i : h.den.idx) h.kept_middle[i] = 1;
}

struct RowResult {
  QueryError err;
  VectorD exact, approx;
};

// Exact output, approximation and errors of query q (double, d entries) at position j.
void evaluate_row(const HeadInputs& h, const VectorD& q, int j, RowResult& r,
                  VectorD& logits /* scratch, n */) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(h.d));
  const int win_begin = h.n - h.eval;
  logits.head(j + 1).noalias() = (h.K.topRows(j + 1) * q) * scale;

  // Exact attention over [0, j].
  double m = -INFINITY;
  for (int i = 0; i <= j; ++i) m = std::max(m, logits[i]);
  r.exact.setZero(h.dv);
  double z = 0, p_sq = 0, kept_p = 0;
  for (int i = 0; i <= j; ++i) {
    const double e = std::exp(logits[i] - m);
    z += e;
    p_sq += e * e;
    r.exact.noalias() += e * h.V.row(i).transpose();
    if (i < h.sink || i >= win_begin || h.kept_middle[i]) kept_p += e;
  }
  r.exact /= z;

  // Weighted estimator: biased logits over sinks, the selection and the window [n-E, j].
  double m2 = -INFINITY;
  for (int i = 0; i < h.sink; ++i) m2 = std::max(m2, logits[i]);
  for (size_t t = 0; t < h.num.idx.size(); ++t)
    m2 = std::max(m2, logits[h.num.idx[t]] + h.num.logw[t]);
  for (size_t t = 0; t < h.den.idx.size(); ++t)
    m2 = std::max(m2, logits[h.den.idx[t]] + h.den.logw[t]);
  for (int i = win_begin; i <= j; ++i) m2 = std::max(m2, logits[i]);

  VectorD num = VectorD::Zero(h.dv);
  double den = 0;
  // Sinks and window: weight 1, in both sums.
  auto add_unit = [&](int i) {
    const double e = std::exp(logits[i] - m2);
    num.noalias() += e * h.V.row(i).transpose();
    den += e;
  };
  for (int i = 0; i < h.sink; ++i) add_unit(i);
  for (size_t t = 0; t < h.num.idx.size(); ++t) {
    const int i = h.num.idx[t];
    num.noalias() += std::exp(logits[i] + h.num.logw[t] - m2) * h.V.row(i).transpose();
  }
  for (size_t t = 0; t < h.den.idx.size(); ++t) {
    const int i = h.den.idx[t];
    den += std::exp(logits[i] + h.den.logw[t] - m2);
  }
  for (int i = win_begin; i <= j; ++i) add_unit(i);
  r.approx = num / den;  // den > 0: the window always holds j itself

  const double diff = (r.approx - r.exact).norm();
  const double exact_norm = r.exact.norm();
  const double softmax_norm = std::sqrt(p_sq) / z;
  const double v_frob = std::sqrt(h.v_sq_prefix[j]);
  r.err.position = j;
  // A zero exact output (all values zero) has no scale: report the absolute difference.
  r.err.relative = exact_norm > 0 ? diff / exact_norm : diff;
  r.err.normalized = v_frob > 0 ? diff / (softmax_norm * v_frob) : diff;
  r.err.mass = kept_p / z;
}

void check_window(int n, int sink, int eval) {
  if (n <= 0 || sink < 0 || eval <= 0 || sink + eval > n)
    throw std::invalid_argument("attention: bad window n=" + std::to_string(n) +
                                " s=" + std::to_string(sink) + " E=" + std::to_string(eval));
}

HeadInputs inputs_from_selection(const MatrixF& K, const MatrixF& V, const EvalWindow& w,
                                 const Selection& sel) {
  HeadInputs h;
  h.n = static_cast<int>(K.rows());
  h.d = static_cast<int>(K.cols());
  h.dv = static_cast<int>(V.cols());
  h.sink = w.sink;
  h.eval = w.eval;
  if (w.n != h.n || V.rows() != K.rows())
    throw std::invalid_argument("attention: window is for n=" + std::to_string(w.n) +
                                " but keys/values have " + std::to_string(K.rows()) + "/" +
                                std::to_string(V.rows()) + " rows");
  check_window(h.n, h.sink, h.eval);
  h.num = set_from_weights(sel.indices, sel.weights);
  h.den = sel.separate ? set_from_weights(sel.den_indices, sel.den_weights) : h.num;
  prepare_head(h, K.data(), V.data());
  return h;
}

}  // namespace

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
  const HeadInputs h = inputs_from_selection(K, V, w, sel);
  if (j < h.n - h.eval || j >= h.n)
    throw std::out_of_range("weighted_attention: position " + std::to_string(j) +
                            " is not an evaluation query [" + std::to_string(h.n - h.eval) + ", " +
                            std::to_string(h.n) + ")");
  VectorD logits(h.n);
  RowResult r;
  evaluate_row(h, Eigen::Map<const VectorF>(q, h.d).cast<double>(), j, r, logits);
  return r.approx;
}

std::vector<QueryError> evaluate_query_head(const MatrixF& Q, const MatrixF& K, const MatrixF& V,
                                            const EvalWindow& w, const Selection& sel) {
  const HeadInputs h = inputs_from_selection(K, V, w, sel);
  if (Q.rows() != K.rows() || Q.cols() != K.cols())
    throw std::invalid_argument("evaluate_query_head: queries are " + std::to_string(Q.rows()) +
                                "x" + std::to_string(Q.cols()) + ", keys " +
                                std::to_string(K.rows()) + "x" + std::to_string(K.cols()));
  std::vector<QueryError> out(h.eval);
  VectorD logits(h.n);
  RowResult r;
  for (int e = 0; e < h.eval; ++e) {
    const int j = h.n - h.eval + e;
    evaluate_row(h, Q.row(j).cast<double>().transpose(), j, r, logits);
    out[e] = r.err;
  }
  return out;
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
    HeadInputs h;
    h.n = b.n;
    h.d = b.d;
    h.dv = b.dv;
    h.sink = b.sink;
    h.eval = b.eval;
    if (b.num_idx[kvh].size() != b.num_logw[kvh].size() ||
        b.den_idx[kvh].size() != b.den_logw[kvh].size())
      throw std::invalid_argument("attention_errors: kv head " + std::to_string(kvh) +
                                  ": indices and log weights differ in length");
    const std::vector<double> num_logw(b.num_logw[kvh].begin(), b.num_logw[kvh].end());
    const std::vector<double> den_logw(b.den_logw[kvh].begin(), b.den_logw[kvh].end());
    h.num = sorted_set(b.num_idx[kvh].data(), num_logw.data(), num_logw.size());
    h.den = sorted_set(b.den_idx[kvh].data(), den_logw.data(), den_logw.size());
    prepare_head(h, b.keys[kvh], b.values[kvh]);
    VectorD logits(h.n);
    RowResult r;
    for (int g = 0; g < group; ++g) {
      const int qh = kvh * group + g;
      const Eigen::Map<const MatrixF> Q(b.queries[qh], b.n, b.d);
      for (int e = 0; e < b.eval; ++e) {
        const int j = b.n - b.eval + e;
        evaluate_row(h, Q.row(j).cast<double>().transpose(), j, r, logits);
        const size_t o = static_cast<size_t>(qh) * b.eval + e;
        if (b.relative) b.relative[o] = r.err.relative;
        if (b.normalized) b.normalized[o] = r.err.normalized;
        if (b.mass) b.mass[o] = r.err.mass;
      }
    }
  }
}

}  // namespace kvscope
