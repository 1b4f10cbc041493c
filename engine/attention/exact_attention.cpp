// Exact causal attention and the weighted estimator of docs/evaluation.md, in double precision.
//
// Every error figure in KVScope comes out of ExactReference below: the per-query-head function,
// the Backend seam's CPU op (cpu_attention_errors in engine/ops/attention_errors_cpu.cpp, the
// reference the CUDA kernel is tested against) and the protocol all use it, so they cannot drift
// apart.
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
// The exact side does not depend on the selection, so it is computed once per head (and kept per
// capture by engine/eval/reference_cache.h); scoring a selection then costs O((s + |selection| + E)
// (d + d_v)) per query instead of O(j (d + d_v)). The exact side is one dense product K Q^T (the
// logits of every key for every evaluation query, which a reference may keep: scoring then gathers
// the kept tokens' logits from it instead of multiplying again), then, over panels of up to 64
// queries, exp in place and P^T V. Without the held logits, scoring computes the kept columns'
// logits with the same kernel: each product entry is accumulated in the same order whatever the
// matrix around it (engine/core/simd/kernels.inc), so both forms give the same figures bit for bit.
// The products, exp and column sums are the SIMD kernels of engine/core/simd.h (in double,
// dispatched to the CPU's widest instruction set). Keeping everything at weight 1 reproduces the
// exact output up to rounding (error ~1e-16). Large work arrays come from a pool
// (engine/core/scratch.h) instead of fresh pages for every head.
#include "engine/attention/exact_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

#include "engine/attention/eval_window.h"
#include "engine/core/error.h"
#include "engine/core/simd.h"
#include "engine/io/capture.h"

namespace kvscope {

// A selection merged over numerator and denominator: sorted unique middle tokens.
struct ExactReference::Kept {
  std::vector<int> idx;
  std::vector<char> in_num, in_den;
  std::vector<double> num_logw, den_logw;
  std::vector<double> num_inv_w, den_inv_w;  // 1 / w, to turn a weighted term back into exp(l)
  // The value rows (C x d_v) of every scored column (the kept middle tokens, idx; the sinks and
  // the window are in ExactSide's fixed sums), gathered once per selection for all query heads
  // and panels instead of in every product, as they are and packed as the numerator's product
  // reads them (engine/core/simd.h, pack_atb_b); the key rows (C x d) too, packed for the kept
  // columns' logits (pack_abt_a), when the logits of every key are not held.
  int columns = 0;
  scratch::Buffer values, values_packed, keys_packed;
};

void check_window(int n, int sink, int eval) {
  if (n <= 0 || sink < 0 || eval <= 0 || sink + eval > n)
    throw std::invalid_argument("attention: bad window n=" + std::to_string(n) +
                                " s=" + std::to_string(sink) + " E=" + std::to_string(eval));
}

namespace {

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

// Query rows per panel: bounds the work panel to n x kPanelRows doubles (16 MiB at n = 32k).
constexpr int kPanelRows = 64;
// Scoring a selection takes as many rows per panel as keep its kept-columns x rows block within
// this many doubles (8 MiB), at least kPanelRows: each panel's numerator is one product whose
// packing of the kept values is paid once per panel, so fewer, taller panels pack less (all 256
// rows of a head at 8k tokens and ratio 1/4 in one). The figures do not depend on it.
constexpr size_t kScorePanelValues = size_t{1} << 20;
constexpr double kMinusInf = -std::numeric_limits<double>::infinity();

// Rows of a float matrix (row stride `cols`) into doubles.
void rows_to_double(const float* src, long rows, int cols, double* dst) {
  const long count = rows * cols;
  for (long i = 0; i < count; ++i) dst[i] = static_cast<double>(src[i]);
}

}  // namespace

size_t ExactSide::bytes() const {
  size_t b = sizeof(ExactSide);
  for (const Head& h : heads)
    b += sizeof(Head) +
         sizeof(double) *
             static_cast<size_t>(h.exact.size() + h.shift.size() + h.norm.size() +
                                 h.softmax_norm.size() + h.v_frob.size() + h.fixed_num.size() +
                                 h.fixed_max.size() + h.fixed_sum.size());
  return b;
}

ExactReference::ExactReference(ExactReference&&) noexcept = default;
ExactReference& ExactReference::operator=(ExactReference&&) noexcept = default;
ExactReference::~ExactReference() = default;

ExactReference::ExactReference(const std::vector<const float*>& queries, const float* K,
                               const float* V, int n, int d, int dv, int sink, int eval)
    : n_(n), d_(d), dv_(dv), sink_(sink), eval_(eval) {
  check_window(n, sink, eval);
  if (d <= 0 || dv <= 0) throw std::invalid_argument("attention: empty key or value rows");
  own_k_.assign(K, K + static_cast<size_t>(n) * d);
  own_v_.assign(V, V + static_cast<size_t>(n) * dv);
  K_ = own_k_.data();
  V_ = own_v_.data();
  build_side(queries, true, nullptr);
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

struct ExactReference::PackedKV {
  scratch::Buffer keys;             // pack_abt_a of the keys (n x d)
  scratch::Buffer values;           // pack_atb_b of the values (n x dv)
  scratch::Buffer vd;               // the values in double, n x dv row-major
  std::vector<double> v_sq_prefix;  // [i]: sum_{i' <= i} ||v_i'||^2
};

ExactReference::PackedKV ExactReference::pack_kv() const {
  const simd::Kernels& kern = simd::kernels();
  PackedKV kv;
  kv.vd.reserve(static_cast<size_t>(n_) * dv_);
  rows_to_double(V_, n_, dv_, kv.vd.data());
  const Eigen::Map<const MatrixD> Vd(kv.vd.data(), n_, dv_);
  kv.v_sq_prefix.resize(n_);
  double acc = 0;
  for (int i = 0; i < n_; ++i) kv.v_sq_prefix[i] = acc += Vd.row(i).squaredNorm();
  kv.values.reserve(kern.packed_size(n_, dv_));
  kern.pack_atb_b(kv.vd.data(), n_, dv_, dv_, kv.values.data());
  scratch::Buffer kd(static_cast<size_t>(n_) * d_);
  rows_to_double(K_, n_, d_, kd.data());
  kv.keys.reserve(kern.packed_size(n_, d_));
  kern.pack_abt_a(kd.data(), n_, d_, d_, kv.keys.data());
  return kv;
}

ExactReference ExactReference::build(const std::vector<const float*>& queries, const float* K,
                                     const float* V, int n, int d, int dv, int sink, int eval,
                                     bool keep_logits, const std::atomic<bool>* cancel) {
  check_window(n, sink, eval);
  if (d <= 0 || dv <= 0) throw std::invalid_argument("attention: empty key or value rows");
  ExactReference r;
  r.n_ = n;
  r.d_ = d;
  r.dv_ = dv;
  r.sink_ = sink;
  r.eval_ = eval;
  r.K_ = K;
  r.V_ = V;
  r.build_side(queries, keep_logits, cancel);
  return r;
}

ExactReference::ExactReference(std::shared_ptr<const ExactSide> side,
                               const std::vector<const float*>& queries, const float* K,
                               const float* V, bool with_logits)
    : side_(std::move(side)) {
  if (!side_) throw std::invalid_argument("attention: no exact side");
  n_ = side_->n;
  d_ = side_->d;
  dv_ = side_->dv;
  sink_ = side_->sink;
  eval_ = side_->eval;
  if (queries.size() != side_->heads.size())
    throw std::invalid_argument("attention: the exact side has " +
                                std::to_string(side_->heads.size()) + " query heads, not " +
                                std::to_string(queries.size()));
  K_ = K;
  V_ = V;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d_));
  const simd::Kernels& kern = simd::kernels();
  scratch::Buffer keys_packed;  // the keys in double, packed once for all heads
  if (with_logits) {
    scratch::Buffer kd(static_cast<size_t>(n_) * d_);
    rows_to_double(K_, n_, d_, kd.data());
    keys_packed.reserve(kern.packed_size(n_, d_));
    kern.pack_abt_a(kd.data(), n_, d_, d_, keys_packed.data());
  }
  for (const float* q : queries) {
    const Eigen::Map<const MatrixF> Q(q, n_, d_);
    MatrixD qd = Q.bottomRows(eval_).cast<double>();
    if (with_logits) {
      scratch::Buffer l(static_cast<size_t>(n_) * eval_);
      kern.gemm_abt_prepacked(n_, eval_, d_, scale, keys_packed.data(), n_, qd.data(), d_, l.data(),
                              eval_);
      logits_.push_back(std::move(l));
    } else {
      q_.push_back(std::move(qd));
    }
  }
}

void ExactReference::build_side(const std::vector<const float*>& queries, bool keep_logits,
                                const std::atomic<bool>* cancel) {
  auto side = std::make_shared<ExactSide>();
  side->n = n_;
  side->d = d_;
  side->dv = dv_;
  side->sink = sink_;
  side->eval = eval_;
  side->heads.reserve(queries.size());
  const PackedKV kv = pack_kv();
  for (const float* q : queries) {
    if (cancel && cancel->load()) throw Cancelled();
    const Eigen::Map<const MatrixF> Q(q, n_, d_);
    MatrixD qd = Q.bottomRows(eval_).cast<double>();
    if (keep_logits) {
      scratch::Buffer l(static_cast<size_t>(n_) * eval_);
      side->heads.push_back(exact_rows(qd, n_ - eval_, l.data(), kv));
      logits_.push_back(std::move(l));
    } else {
      side->heads.push_back(exact_rows(qd, n_ - eval_, nullptr, kv));
      q_.push_back(std::move(qd));
    }
  }
  side_ = std::move(side);
}

ExactReference::Rows ExactReference::rows(int h) const {
  Rows r;
  r.first_j = n_ - eval_;
  r.side = &side_->heads[h];
  if (!logits_.empty())
    r.logits = logits_[h].data();
  else
    r.q = q_[h].data();
  return r;
}

ExactSide::Head ExactReference::exact_rows(const MatrixD& q, int first_j, double* logits,
                                           const PackedKV& kv) const {
  const simd::Kernels& kern = simd::kernels();
  ExactSide::Head r;
  const int R = static_cast<int>(q.rows());
  const double scale = 1.0 / std::sqrt(static_cast<double>(d_));
  const double* vd = kv.vd.data();
  if (logits)
    kern.gemm_abt_prepacked(n_, R, d_, scale, kv.keys.data(), n_, q.data(), d_, logits, R);
  r.exact.setZero(R, dv_);
  r.fixed_num.setZero(R, dv_);
  r.fixed_max.resize(R);
  r.fixed_sum.resize(R);
  r.shift.resize(R);
  r.norm.resize(R);
  r.softmax_norm.resize(R);
  r.v_frob.resize(R);
  // Held logits are one panel of all R rows, read where they are (copying them into panels of
  // kPanelRows cost more than the wider panel's passes: docs/performance.md, "The app's grid");
  // otherwise panels of kPanelRows rows bound the work block. Each entry of every product and
  // sum is accumulated over the keys in the same order either way, so the figures do not depend
  // on the panel width (the masked keys a wider panel spans add exact zeros).
  const int panel_rows = logits ? R : std::min(R, kPanelRows);
  // Keys x panel rows: exp(l - max), 0 beyond each query's position.
  scratch::Buffer panel(logits ? 0 : static_cast<size_t>(first_j + R) * panel_rows);
  // The fixed columns' logits (sinks, then the window up to the panel's last row) and tokens.
  const int win_begin = n_ - eval_;
  scratch::Buffer fixed(static_cast<size_t>(sink_ + first_j + R - win_begin) * panel_rows);
  std::vector<int> fixed_tok;
  std::vector<double> z, p_sq;
  for (int r0 = 0; r0 < R; r0 += panel_rows) {
    const int rows = std::min(panel_rows, R - r0);
    const int keys = first_j + r0 + rows;  // the panel's last query sees keys [0, keys)
    double* P = logits;
    if (!logits) {
      panel.reserve(static_cast<size_t>(keys) * rows);
      P = panel.data();
      kern.gemm_abt_prepacked(keys, rows, d_, scale, kv.keys.data(), n_, q.row(r0).data(), d_, P,
                              rows);
    }
    for (int i = first_j + r0 + 1; i < keys; ++i)  // causal mask: query e sees keys <= j(e)
      for (int e = 0; e < i - first_j - r0; ++e) P[static_cast<long>(i) * rows + e] = kMinusInf;
    // The fixed columns on their own, from the same logits (masked alike).
    const int fixed_cols = sink_ + keys - win_begin;
    fixed_tok.resize(fixed_cols);
    double* F = fixed.data();
    for (int c = 0; c < fixed_cols; ++c) {
      fixed_tok[c] = c < sink_ ? c : win_begin + (c - sink_);
      std::copy(P + static_cast<long>(fixed_tok[c]) * rows,
                P + static_cast<long>(fixed_tok[c]) * rows + rows, F + static_cast<long>(c) * rows);
    }
    double* fmax = r.fixed_max.data() + r0;
    std::fill(fmax, fmax + rows, kMinusInf);
    kern.col_max(F, fixed_cols, rows, rows, fmax);
    kern.col_exp_sub(F, fixed_cols, rows, rows, fmax);
    double* fsum = r.fixed_sum.data() + r0;
    std::fill(fsum, fsum + rows, 0.0);
    kern.col_sums(F, fixed_cols, rows, rows, nullptr, fsum, nullptr);
    kern.gemm_atb_acc(rows, dv_, fixed_cols, F, rows, vd, dv_, fixed_tok.data(),
                      r.fixed_num.row(r0).data(), dv_);
    double* shift = r.shift.data() + r0;
    std::fill(shift, shift + rows, kMinusInf);
    kern.col_max(P, keys, rows, rows, shift);
    z.assign(rows, 0.0);
    p_sq.assign(rows, 0.0);
    // exp(l - shift), its sums and its product with the values, in one pass over the logits.
    simd::ExpProduct softmax;
    softmax.M = rows;
    softmax.N = dv_;
    softmax.K = keys;
    softmax.X = P;
    softmax.ldx = rows;
    softmax.m = shift;
    softmax.sum = z.data();
    softmax.sum_sq = p_sq.data();
    softmax.b_packed = kv.values.data();
    softmax.b_depth = n_;
    softmax.C = r.exact.row(r0).data();
    softmax.ldc = dv_;
    kern.exp_atb_acc(softmax);
    for (int e = 0; e < rows; ++e) {
      r.norm[r0 + e] = z[e];
      r.softmax_norm[r0 + e] = std::sqrt(p_sq[e]) / z[e];
      r.v_frob[r0 + e] = std::sqrt(kv.v_sq_prefix[first_j + r0 + e]);
      r.exact.row(r0 + e) /= z[e];
    }
  }
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
  // One column per kept middle token (the sinks and the window are in the exact side's fixed
  // sums).
  k.columns = static_cast<int>(all.size());
  const simd::Kernels& kern = simd::kernels();
  k.values.reserve(static_cast<size_t>(k.columns) * dv_);
  for (int c = 0; c < k.columns; ++c)
    rows_to_double(V_ + static_cast<long>(all[c]) * dv_, 1, dv_,
                   k.values.data() + static_cast<long>(c) * dv_);
  k.values_packed.reserve(kern.packed_size(k.columns, dv_));
  kern.pack_atb_b(k.values.data(), k.columns, dv_, dv_, k.values_packed.data());
  if (logits_.empty()) {
    scratch::Buffer keys(static_cast<size_t>(k.columns) * d_);
    for (int c = 0; c < k.columns; ++c)
      rows_to_double(K_ + static_cast<long>(all[c]) * d_, 1, d_,
                     keys.data() + static_cast<long>(c) * d_);
    k.keys_packed.reserve(kern.packed_size(k.columns, d_));
    kern.pack_abt_a(keys.data(), k.columns, d_, d_, k.keys_packed.data());
  }
  return k;
}

namespace {

// Where the logits of each kept column lie, for every query row: a row of the held logits, or of
// the kept columns' logits computed for the selection.
struct KeptLogits {
  const double* held = nullptr;  // n x R, or null
  const int* tok = nullptr;      // the kept columns' tokens: their rows of `held`
  const double* kept = nullptr;  // C x R, when `held` is null
  int R = 0;
  const double* row(int c) const {
    return held ? held + static_cast<long>(tok[c]) * R : kept + static_cast<long>(c) * R;
  }
};

// The biased logits l + log w of the C kept columns for query rows [r0, r0 + nr) into W
// (C x nr), -inf for a column not in this sum (so exp gives 0).
void gather_biased(const KeptLogits& logits, int C, const std::vector<char>& in,
                   const std::vector<double>& lw, int r0, int nr, double* W) {
  for (int c = 0; c < C; ++c) {
    double* w = W + static_cast<long>(c) * nr;
    if (!in[c]) {
      std::fill(w, w + nr, kMinusInf);
      continue;
    }
    const double* l = logits.row(c) + r0;
    for (int e = 0; e < nr; ++e) w[e] = l[e] + lw[c];
  }
}

// One column's biased logits with the running maximum of each row (the maxima col_max would
// give: a maximum does not depend on the order). Used when every column serves both sums.
void gather_biased_max(const KeptLogits& logits, int C, const std::vector<double>& lw, int r0,
                       int nr, double* W, double* m) {
  for (int c = 0; c < C; ++c) {
    double* w = W + static_cast<long>(c) * nr;
    const double* l = logits.row(c) + r0;
    const double lwc = lw[c];
    for (int e = 0; e < nr; ++e) {
      w[e] = l[e] + lwc;
      m[e] = w[e] > m[e] ? w[e] : m[e];
    }
  }
}

// The running maximum of each row's biased logits over the kept columns' logits computed here
// (kept: C x R), none written: the first of two passes when every column serves both sums.
void biased_max(const double* kept, int R, int C, const std::vector<double>& lw, int r0, int nr,
                double* m) {
  for (int c = 0; c < C; ++c) {
    const double* l = kept + static_cast<long>(c) * R + r0;
    const double lwc = lw[c];
    for (int e = 0; e < nr; ++e) {
      const double w = l[e] + lwc;
      m[e] = w > m[e] ? w : m[e];
    }
  }
}

// The errors (and approximations) of the query rows [r0, r0 + nr) of a panel, from its shift m2,
// its sums over the kept columns (den, msum, in units of exp(l - m2)) and its numerator `num`
// (nr x dv): the fixed columns are added to them, then z = num / den is compared with the exact
// output.
void panel_errors(const ExactSide::Head& ex, int first_j, int r0, int nr, const double* m2,
                  double* den, double* msum, MatrixD& num, QueryError* out, MatrixD* approx) {
  for (int e = 0; e < nr; ++e) {
    const int row = r0 + e;
    // The fixed columns, from their own shift to the panel's (f <= 1).
    const double f = std::exp(ex.fixed_max[row] - m2[e]);
    const double fixed = f * ex.fixed_sum[row];
    den[e] += fixed;
    msum[e] += fixed;
    num.row(e) += f * ex.fixed_num.row(row);
    // den > 0: the window always holds j itself.
    const double mass = msum[e] * std::exp(m2[e] - ex.shift[row]) / ex.norm[row];
    const VectorD z = num.row(e).transpose() / den[e];
    const double diff = (z - ex.exact.row(row).transpose()).norm();
    const double exact_norm = ex.exact.row(row).norm();
    QueryError& err = out[row];
    err.position = first_j + row;
    // A zero exact output (all values zero) has no scale: report the absolute difference.
    err.relative = exact_norm > 0 ? diff / exact_norm : diff;
    err.normalized = ex.v_frob[row] > 0 ? diff / (ex.softmax_norm[row] * ex.v_frob[row]) : diff;
    err.mass = mass;
    if (approx) approx->row(row) = z.transpose();
  }
}

}  // namespace

std::vector<QueryError> ExactReference::score(const Kept& k, const Rows& rows,
                                              MatrixD* approx) const {
  // Columns: the merged selection (index order). The sinks and the window up to j (weight 1 in
  // both sums) enter through the exact side's fixed sums, rescaled to the panel's shift. The
  // biased logits l + log w of a panel of queries are gathered from the exact logits (held, or
  // computed here for the kept columns only) into a columns x queries block (an absent term is
  // -inf, so exp gives 0), then exponentiated in place and summed column-wise, and the
  // numerator is that block times the values of the kept tokens.
  const simd::Kernels& kern = simd::kernels();
  const ExactSide::Head& ex = *rows.side;
  const int C = k.columns;
  const int R = static_cast<int>(ex.exact.rows());
  bool shared_terms = true;  // every column serves numerator and denominator with one weight
  for (int c = 0; c < C; ++c)
    shared_terms = shared_terms && k.in_num[c] && k.in_den[c] && k.num_logw[c] == k.den_logw[c];
  // Denominator-only columns enter the mass through their own weight; the others through the
  // numerator's.
  std::vector<double> den_mass_coef(C, 0.0);
  if (!shared_terms)
    for (int c = 0; c < C; ++c) den_mass_coef[c] = k.in_num[c] ? 0.0 : k.den_inv_w[c];

  // The logits of column c for every row: a row of the held logits, or of the kept columns'
  // logits computed here (the same products, so the same values bit for bit).
  scratch::Buffer kept_logits;
  if (!rows.logits && C > 0) {
    kept_logits.reserve(static_cast<size_t>(C) * R);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d_));
    kern.gemm_abt_prepacked(C, R, d_, scale, k.keys_packed.data(), C, rows.q, d_,
                            kept_logits.data(), R);
  }
  KeptLogits logits;
  logits.held = rows.logits;
  logits.tok = k.idx.data();
  logits.kept = kept_logits.data();
  logits.R = R;

  std::vector<QueryError> out(R);
  if (approx) approx->resize(R, dv_);
  const int panel_rows = std::min(
      R, std::max(kPanelRows, static_cast<int>(kScorePanelValues / std::max<size_t>(C, 1))));
  // The biased logits, gathered (not needed when the kept logits are computed here and every
  // column serves both sums: the exponentials read those directly).
  const bool gathered = rows.logits || !shared_terms;
  scratch::Buffer Wn(gathered ? static_cast<size_t>(std::max(C, 1)) * panel_rows : 0);
  scratch::Buffer Wd(shared_terms ? 0 : static_cast<size_t>(std::max(C, 1)) * panel_rows);
  MatrixD num;  // panel rows x dv
  std::vector<double> m2, den, msum;
  for (int r0 = 0; r0 < R; r0 += panel_rows) {
    const int nr = std::min(panel_rows, R - r0);
    // The panel's shift: the largest biased logit of the kept columns and the fixed ones.
    m2.assign(ex.fixed_max.data() + r0, ex.fixed_max.data() + r0 + nr);
    den.assign(nr, 0.0);
    msum.assign(nr, 0.0);  // in units of exp(l - M')
    if (shared_terms && !rows.logits) {
      // Two passes over the kept columns' logits, none written: their maxima with the weights
      // added, then (below) the exponentials with both sums and the numerator.
      biased_max(kept_logits.data(), R, C, k.num_logw, r0, nr, m2.data());
    } else if (shared_terms) {
      // The held logits' rows gathered with their maxima, then (below) as above.
      gather_biased_max(logits, C, k.num_logw, r0, nr, Wn.data(), m2.data());
    } else {
      gather_biased(logits, C, k.in_num, k.num_logw, r0, nr, Wn.data());
      kern.col_max(Wn.data(), C, nr, nr, m2.data());
      gather_biased(logits, C, k.in_den, k.den_logw, r0, nr, Wd.data());
      kern.col_max(Wd.data(), C, nr, nr, m2.data());
      kern.col_exp_sub(Wn.data(), C, nr, nr, m2.data());
      kern.col_sums(Wn.data(), C, nr, nr, k.num_inv_w.data(), msum.data(), nullptr);
      kern.col_exp_sub(Wd.data(), C, nr, nr, m2.data());
      kern.col_sums(Wd.data(), C, nr, nr, nullptr, den.data(), nullptr);
      kern.col_sums(Wd.data(), C, nr, nr, den_mass_coef.data(), msum.data(), nullptr);
    }
    num.setZero(nr, dv_);
    if (shared_terms) {  // the exponentials, both sums and the numerator in one pass
      simd::ExpProduct e;
      e.M = nr;
      e.N = dv_;
      e.K = C;
      if (rows.logits) {
        e.X = Wn.data();
        e.ldx = nr;
      } else {  // the kept logits, each row with its weight added as the gather would
        e.X = kept_logits.data() + r0;
        e.ldx = R;
        e.bias = k.num_logw.data();
      }
      e.m = m2.data();
      e.coef = k.num_inv_w.data();
      e.wsum = msum.data();
      e.sum = den.data();
      e.b_packed = k.values_packed.data();
      e.b_depth = C;
      e.C = num.data();
      e.ldc = dv_;
      kern.exp_atb_acc(e);
    } else {
      kern.gemm_atb_acc(nr, dv_, C, Wn.data(), nr, k.values.data(), dv_, nullptr, num.data(), dv_);
    }
    panel_errors(ex, rows.first_j, r0, nr, m2.data(), den.data(), msum.data(), num, out.data(),
                 approx);
  }
  return out;
}

std::vector<std::vector<QueryError>> ExactReference::evaluate_log(
    const std::vector<int>& num_idx, const std::vector<double>& num_logw,
    const std::vector<int>& den_idx, const std::vector<double>& den_logw) const {
  const Kept k = prepare(num_idx, num_logw, den_idx, den_logw);
  std::vector<std::vector<QueryError>> out;
  out.reserve(side_->heads.size());
  for (int h = 0; h < num_heads(); ++h) out.push_back(score(k, rows(h), nullptr));
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
  MatrixD z;
  const MatrixD qd = Eigen::Map<const VectorF>(q, d_).cast<double>().transpose();
  Rows r;
  r.first_j = j;
  ExactSide::Head head;
  scratch::Buffer logits;
  if (logits_.empty()) {
    head = exact_rows(qd, j, nullptr, pack_kv());
    r.q = qd.data();
  } else {
    logits.reserve(static_cast<size_t>(n_));
    head = exact_rows(qd, j, logits.data(), pack_kv());
    r.logits = logits.data();
  }
  r.side = &head;
  score(k, r, &z);
  return z.row(0).transpose();
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

std::vector<const MatrixF*> reference_queries(const LayerData& layer, int kv) {
  if (layer.queries.empty()) return {&layer.keys[kv]};
  const size_t group = layer.queries.size() / layer.keys.size();
  std::vector<const MatrixF*> q;
  for (size_t g = 0; g < group; ++g) q.push_back(&layer.queries[kv * group + g]);
  return q;
}

}  // namespace kvscope
