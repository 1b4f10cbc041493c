// Exact and weighted attention, the error metrics and the Backend seam's CPU op, against an
// independent brute-force float64 reference (no log-sum-exp, no shared code with attention.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>

#include "engine/attention/exact_attention.h"
#include "engine/eval/protocol.h"
#include "engine/io/capture.h"
#include "engine/ops/attention_errors.h"
#include "tests/sample_captures.h"

namespace kvscope {
namespace {

MatrixF random_matrix(int rows, int cols, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  MatrixF m(rows, cols);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) m(i, j) = dist(rng);
  return m;
}

// The textbook formulas, written out directly. Inputs are small enough that exp() cannot
// overflow, so no shift is needed.
struct Reference {
  std::vector<double> exact, approx;
  double relative = 0, normalized = 0, mass = 0;
};

Reference brute_force(const MatrixF& Q, const MatrixF& K, const MatrixF& V, int j, int sink,
                      int eval, const Selection& sel) {
  const int n = static_cast<int>(K.rows()), d = static_cast<int>(K.cols());
  const int dv = static_cast<int>(V.cols());
  std::vector<double> expl(j + 1);
  for (int i = 0; i <= j; ++i) {
    double dot = 0;
    for (int c = 0; c < d; ++c) dot += static_cast<double>(Q(j, c)) * K(i, c);
    expl[i] = std::exp(dot / std::sqrt(static_cast<double>(d)));
  }
  Reference r;
  r.exact.assign(dv, 0);
  double z = 0;
  for (int i = 0; i <= j; ++i) {
    z += expl[i];
    for (int c = 0; c < dv; ++c) r.exact[c] += expl[i] * V(i, c);
  }
  for (double& x : r.exact) x /= z;

  // Weight of each token in the numerator and the denominator (0 = not in the set).
  std::vector<double> wn(n, 0), wd(n, 0);
  for (int i = 0; i < sink; ++i) wn[i] = wd[i] = 1;
  for (int i = n - eval; i <= j; ++i) wn[i] = wd[i] = 1;
  for (size_t t = 0; t < sel.indices.size(); ++t) wn[sel.indices[t]] = sel.weights[t];
  const auto& di = sel.separate ? sel.den_indices : sel.indices;
  const auto& dw = sel.separate ? sel.den_weights : sel.weights;
  for (size_t t = 0; t < di.size(); ++t) wd[di[t]] = dw[t];
  std::vector<double> num(dv, 0);
  double den = 0, kept = 0, p_sq = 0, v_frob = 0;
  for (int i = 0; i <= j; ++i) {
    for (int c = 0; c < dv; ++c) num[c] += wn[i] * expl[i] * V(i, c);
    den += wd[i] * expl[i];
    if (wn[i] > 0 || wd[i] > 0) kept += expl[i] / z;
    p_sq += (expl[i] / z) * (expl[i] / z);
    for (int c = 0; c < dv; ++c) v_frob += static_cast<double>(V(i, c)) * V(i, c);
  }
  r.approx.resize(dv);
  double diff = 0, exact_norm = 0;
  for (int c = 0; c < dv; ++c) {
    r.approx[c] = num[c] / den;
    diff += (r.approx[c] - r.exact[c]) * (r.approx[c] - r.exact[c]);
    exact_norm += r.exact[c] * r.exact[c];
  }
  r.relative = std::sqrt(diff / exact_norm);
  r.normalized = std::sqrt(diff) / (std::sqrt(p_sq) * std::sqrt(v_frob));
  r.mass = kept;
  return r;
}

// A random weighted selection of the middle (weights in [0.5, 4]).
Selection random_selection(const EvalWindow& w, int count, std::mt19937& rng) {
  std::vector<int> mid;
  for (int i = w.mid_begin; i < w.mid_end; ++i) mid.push_back(i);
  std::shuffle(mid.begin(), mid.end(), rng);
  std::uniform_real_distribution<double> wd(0.5, 4.0);
  Selection s;
  for (int t = 0; t < count; ++t) {
    s.indices.push_back(mid[t]);
    s.weights.push_back(wd(rng));
  }
  return s;
}

TEST(Attention, ExactMatchesBruteForce) {
  std::mt19937 rng(1);
  const MatrixF Q = random_matrix(64, 8, rng), K = random_matrix(64, 8, rng);
  const MatrixF V = random_matrix(64, 5, rng);
  for (int j : {0, 1, 17, 63}) {
    const VectorD a = exact_attention(Q.row(j).data(), K, V, j);
    const Reference r = brute_force(Q, K, V, j, 0, 64, Selection{});
    for (int c = 0; c < 5; ++c) EXPECT_NEAR(a[c], r.exact[c], 1e-12) << "j=" << j;
  }
}

TEST(Attention, AttentionRowIsTheCausalSoftmax) {
  std::mt19937 rng(2);
  const MatrixF Q = random_matrix(20, 4, rng), K = random_matrix(20, 4, rng);
  const std::vector<double> p = attention_row(Q.row(10).data(), K, 10);
  ASSERT_EQ(p.size(), 11u);
  double sum = 0;
  for (double x : p) sum += x;
  EXPECT_NEAR(sum, 1.0, 1e-12);
  // Ratio of two entries is exp of the logit difference.
  const double l0 = Q.row(10).cast<double>().dot(K.row(0).cast<double>()) / 2.0;
  const double l3 = Q.row(10).cast<double>().dot(K.row(3).cast<double>()) / 2.0;
  EXPECT_NEAR(p[0] / p[3], std::exp(l0 - l3), 1e-10);
}

TEST(Attention, WeightedEstimatorAndErrorsMatchBruteForce) {
  std::mt19937 rng(3);
  const int n = 96;
  const MatrixF Q = random_matrix(n, 8, rng), K = random_matrix(n, 8, rng);
  const MatrixF V = random_matrix(n, 6, rng);
  const EvalWindow w = EvalWindow::make(n, 0.25, 4, 16);
  const Selection sel = random_selection(w, w.budget, rng);
  const std::vector<QueryError> errs = evaluate_query_head(Q, K, V, w, sel);
  ASSERT_EQ(static_cast<int>(errs.size()), w.eval);
  for (int e = 0; e < w.eval; ++e) {
    const int j = n - w.eval + e;
    const Reference r = brute_force(Q, K, V, j, w.sink, w.eval, sel);
    const VectorD z = weighted_attention(Q.row(j).data(), K, V, j, w, sel);
    for (int c = 0; c < 6; ++c) EXPECT_NEAR(z[c], r.approx[c], 1e-12);
    EXPECT_EQ(errs[e].position, j);
    EXPECT_NEAR(errs[e].relative, r.relative, 1e-10 * r.relative + 1e-14);
    EXPECT_NEAR(errs[e].normalized, r.normalized, 1e-10 * r.normalized + 1e-14);
    EXPECT_NEAR(errs[e].mass, r.mass, 1e-12);
    EXPECT_GT(errs[e].relative, 0.0);
  }
}

TEST(Attention, SeparateNumeratorAndDenominatorSets) {
  std::mt19937 rng(4);
  const int n = 80;
  const MatrixF Q = random_matrix(n, 4, rng), K = random_matrix(n, 4, rng);
  const MatrixF V = random_matrix(n, 3, rng);
  const EvalWindow w = EvalWindow::make(n, 0.5, 2, 10);
  Selection sel = random_selection(w, 10, rng);
  const Selection den = random_selection(w, 25, rng);
  sel.separate = true;
  sel.den_indices = den.indices;
  sel.den_weights = den.weights;
  for (int j = n - w.eval; j < n; ++j) {
    const Reference r = brute_force(Q, K, V, j, w.sink, w.eval, sel);
    const VectorD z = weighted_attention(Q.row(j).data(), K, V, j, w, sel);
    for (int c = 0; c < 3; ++c) EXPECT_NEAR(z[c], r.approx[c], 1e-12);
  }
  // Ignoring `separate` would give a different answer: the flag is honoured.
  Selection joint = sel;
  joint.separate = false;
  const int j = n - 1;
  EXPECT_GT((weighted_attention(Q.row(j).data(), K, V, j, w, sel) -
             weighted_attention(Q.row(j).data(), K, V, j, w, joint))
                .norm(),
            1e-6);
}

TEST(Attention, FullSelectionGivesZeroErrorAndFullMass) {
  std::mt19937 rng(5);
  const int n = 64;
  const MatrixF Q = random_matrix(n, 8, rng), K = random_matrix(n, 8, rng);
  const MatrixF V = random_matrix(n, 8, rng);
  const EvalWindow w = EvalWindow::make(n, 1.0);
  Selection all;
  for (int i = w.mid_begin; i < w.mid_end; ++i) {
    all.indices.push_back(i);
    all.weights.push_back(1.0);
  }
  for (const QueryError& e : evaluate_query_head(Q, K, V, w, all)) {
    EXPECT_NEAR(e.relative, 0.0, 1e-13);  // rounding only
    EXPECT_NEAR(e.mass, 1.0, 1e-12);
  }
}

TEST(Attention, EmptySelectionKeepsOnlySinksAndWindow) {
  std::mt19937 rng(6);
  const int n = 64;
  const MatrixF Q = random_matrix(n, 8, rng), K = random_matrix(n, 8, rng);
  const MatrixF V = random_matrix(n, 8, rng);
  const EvalWindow w = EvalWindow::make(n, 0.5, 4, 8);
  const Selection none;
  const std::vector<QueryError> errs = evaluate_query_head(Q, K, V, w, none);
  for (const QueryError& e : errs) {
    const std::vector<double> p = attention_row(Q.row(e.position).data(), K, e.position);
    double kept = 0;
    for (int i = 0; i <= e.position; ++i)
      if (i < w.sink || i >= w.mid_end) kept += p[i];
    EXPECT_NEAR(e.mass, kept, 1e-12);
    EXPECT_LT(e.mass, 1.0);
  }
}

TEST(Attention, LargeLogitsStayFinite) {
  // Logits in the thousands: a naive exp() overflows, the log-sum-exp form must not.
  std::mt19937 rng(7);
  const int n = 48;
  const MatrixF Q = random_matrix(n, 4, rng, 40.0f), K = random_matrix(n, 4, rng, 40.0f);
  const MatrixF V = random_matrix(n, 4, rng);
  const EvalWindow w = EvalWindow::make(n, 0.5, 2, 6);
  Selection sel = random_selection(w, w.budget, rng);
  for (double& x : sel.weights) x = 1e6;  // a huge weight is a huge logit bias
  for (const QueryError& e : evaluate_query_head(Q, K, V, w, sel)) {
    EXPECT_TRUE(std::isfinite(e.relative));
    EXPECT_TRUE(std::isfinite(e.normalized));
    EXPECT_TRUE(std::isfinite(e.mass));
  }
}

TEST(Attention, WeightsEnterAsLogitBias) {
  // Doubling the weight of a token is the same as adding log 2 to its logit: shifting its key
  // along q by log(2) * sqrt(d) / ||q||^2 * q.
  std::mt19937 rng(8);
  const int n = 40, d = 4;
  const MatrixF Q = random_matrix(n, d, rng), V = random_matrix(n, 3, rng);
  MatrixF K = random_matrix(n, d, rng);
  const EvalWindow w = EvalWindow::make(n, 0.5, 2, 5);
  const int j = n - 1, tok = 10;
  Selection weighted, shifted;
  weighted.indices = shifted.indices = {tok};
  weighted.weights = {2.0};
  shifted.weights = {1.0};
  MatrixF K2 = K;
  const Eigen::VectorXf q = Q.row(j).transpose();
  K2.row(tok) += (std::log(2.0f) * std::sqrt(static_cast<float>(d)) / q.squaredNorm()) * q;
  const VectorD a = weighted_attention(Q.row(j).data(), K, V, j, w, weighted);
  const VectorD b = weighted_attention(Q.row(j).data(), K2, V, j, w, shifted);
  EXPECT_LT((a - b).norm(), 1e-5);
}

TEST(Attention, RejectsBadSelections) {
  std::mt19937 rng(9);
  const MatrixF Q = random_matrix(32, 4, rng), K = random_matrix(32, 4, rng);
  const MatrixF V = random_matrix(32, 4, rng);
  const EvalWindow w = EvalWindow::make(32, 0.5, 2, 4);
  Selection outside;
  outside.indices = {1};  // a sink, not the middle
  outside.weights = {1.0};
  EXPECT_THROW(evaluate_query_head(Q, K, V, w, outside), std::out_of_range);
  Selection dup;
  dup.indices = {5, 5};
  dup.weights = {1.0, 1.0};
  EXPECT_THROW(evaluate_query_head(Q, K, V, w, dup), std::invalid_argument);
  Selection neg;
  neg.indices = {5};
  neg.weights = {-1.0};
  EXPECT_THROW(evaluate_query_head(Q, K, V, w, neg), std::invalid_argument);
}

// The Backend seam's CPU op, for a GQA layer (2 kv heads, 4 query heads), against the per-head
// function and the brute force.
TEST(Attention, CpuAttentionErrorsMatchesPerHeadEvaluation) {
  std::mt19937 rng(10);
  const int n = 72, d = 8, dv = 8, kvh = 2, qh = 4;
  std::vector<MatrixF> K, V, Q;
  for (int h = 0; h < kvh; ++h) {
    K.push_back(random_matrix(n, d, rng));
    V.push_back(random_matrix(n, dv, rng));
  }
  for (int h = 0; h < qh; ++h) Q.push_back(random_matrix(n, d, rng));
  const EvalWindow w = EvalWindow::make(n, 0.25, 3, 9);
  std::vector<Selection> sels;
  for (int h = 0; h < kvh; ++h) sels.push_back(random_selection(w, w.budget, rng));
  sels[1].separate = true;
  const Selection den = random_selection(w, 2 * w.budget, rng);
  sels[1].den_indices = den.indices;
  sels[1].den_weights = den.weights;

  ErrorBatch b;
  b.n = n, b.d = d, b.dv = dv, b.q_heads = qh, b.kv_heads = kvh, b.sink = w.sink, b.eval = w.eval;
  for (int h = 0; h < kvh; ++h) {
    b.keys.push_back(K[h].data());
    b.values.push_back(V[h].data());
    const Selection& s = sels[h];
    auto logw = [](const std::vector<double>& ws) {
      std::vector<double> out;
      for (double x : ws) out.push_back(std::log(x));
      return out;
    };
    b.num_idx.push_back(s.indices);
    b.num_logw.push_back(logw(s.weights));
    b.den_idx.push_back(s.separate ? s.den_indices : s.indices);
    b.den_logw.push_back(logw(s.separate ? s.den_weights : s.weights));
  }
  for (int h = 0; h < qh; ++h) b.queries.push_back(Q[h].data());
  std::vector<double> rel(qh * w.eval), nrm(qh * w.eval), mass(qh * w.eval);
  b.relative = rel.data(), b.normalized = nrm.data(), b.mass = mass.data();
  cpu_attention_errors(b);

  for (int h = 0; h < qh; ++h) {
    const int kv = h / (qh / kvh);
    // The op takes the double log weights of the selection itself: the same figures.
    const Selection& seen = sels[kv];
    const std::vector<QueryError> ref = evaluate_query_head(Q[h], K[kv], V[kv], w, seen);
    for (int e = 0; e < w.eval; ++e) {
      const Reference bf = brute_force(Q[h], K[kv], V[kv], n - w.eval + e, w.sink, w.eval, seen);
      EXPECT_NEAR(rel[h * w.eval + e], ref[e].relative, 1e-12 * ref[e].relative + 1e-15);
      EXPECT_NEAR(rel[h * w.eval + e], bf.relative, 1e-9 * bf.relative);
      EXPECT_NEAR(nrm[h * w.eval + e], bf.normalized, 1e-9 * bf.normalized);
      EXPECT_NEAR(mass[h * w.eval + e], bf.mass, 1e-12);
    }
  }
}

// The protocol scores many selections against one precomputed reference: reusing it must give
// exactly what a fresh evaluation gives, for every selection, in any order.
TEST(Attention, ExactReferenceIsReusableAcrossSelections) {
  std::mt19937 rng(12);
  const int n = 128;
  const MatrixF Q0 = random_matrix(n, 8, rng), Q1 = random_matrix(n, 8, rng);
  const MatrixF K = random_matrix(n, 8, rng), V = random_matrix(n, 4, rng);
  const EvalWindow w = EvalWindow::make(n, 0.25);
  const ExactReference ref({&Q0, &Q1}, K, V, w.sink, w.eval);
  ASSERT_EQ(ref.num_heads(), 2);
  for (int e = 0; e < w.eval; e += 5) {
    const VectorD a = exact_attention(Q1.row(n - w.eval + e).data(), K, V, n - w.eval + e);
    EXPECT_LT((ref.exact_output(1, e) - a).norm(), 1e-12);
  }
  std::vector<Selection> sels;
  for (int t = 0; t < 4; ++t) sels.push_back(random_selection(w, 5 + 10 * t, rng));
  for (int pass = 0; pass < 2; ++pass) {
    for (const Selection& sel : sels) {
      const auto errs = ref.evaluate(sel);
      ASSERT_EQ(errs.size(), 2u);
      const auto fresh = evaluate_query_head(Q1, K, V, w, sel);
      for (int e = 0; e < w.eval; ++e) {
        EXPECT_EQ(errs[1][e].relative, fresh[e].relative);
        EXPECT_EQ(errs[1][e].mass, fresh[e].mass);
      }
    }
  }
  // Keeping everything at weight 1 reproduces the exact output (up to rounding).
  Selection all;
  for (int i = w.mid_begin; i < w.mid_end; ++i) all.indices.push_back(i);
  all.weights.assign(all.indices.size(), 1.0);
  for (const auto& head : ref.evaluate(all))
    for (const QueryError& qe : head) EXPECT_NEAR(qe.relative, 0.0, 1e-13);
  // Selection order does not matter.
  Selection shuffled = sels[3];
  std::vector<size_t> perm(shuffled.indices.size());
  std::iota(perm.begin(), perm.end(), size_t{0});
  std::shuffle(perm.begin(), perm.end(), rng);
  Selection permuted;
  for (size_t p : perm) {
    permuted.indices.push_back(shuffled.indices[p]);
    permuted.weights.push_back(shuffled.weights[p]);
  }
  const auto a = ref.evaluate(shuffled), b = ref.evaluate(permuted);
  for (int e = 0; e < w.eval; ++e) EXPECT_EQ(a[0][e].relative, b[0][e].relative);
}

// The real captures (stories260K and kjv3M, made by `kvscope-cli capture`): the engine against
// the brute force on real keys, values and queries.
TEST(Attention, RealCaptureMatchesBruteForce) {
  for (const std::string& path : ::kvscope::testing::sample_capture_paths()) {
    SCOPED_TRACE(path);
    ASSERT_TRUE(std::filesystem::exists(path)) << "sample capture not found: " << path;
    auto cap = CaptureFile::open(path);
    ASSERT_TRUE(cap->info().has_queries);
    const int layer_index = cap->info().num_layers - 1;
    auto layer = cap->layer(layer_index);
    const int n = cap->info().num_tokens;
    const EvalWindow w = EvalWindow::make(n, 0.25);
    std::mt19937 rng(11);
    const Selection sel = random_selection(w, w.budget, rng);
    const int kv = 1;
    const auto group = layer->group_queries(kv);
    ASSERT_FALSE(group.empty());
    const MatrixF& Q = *group[0];
    const std::vector<QueryError> errs =
        evaluate_query_head(Q, layer->keys[kv], layer->values[kv], w, sel);
    for (int e = 0; e < w.eval; e += 7) {
      const Reference bf =
          brute_force(Q, layer->keys[kv], layer->values[kv], n - w.eval + e, w.sink, w.eval, sel);
      EXPECT_NEAR(errs[e].relative, bf.relative, 1e-9 * bf.relative);
      EXPECT_NEAR(errs[e].normalized, bf.normalized, 1e-9 * bf.normalized);
      EXPECT_NEAR(errs[e].mass, bf.mass, 1e-12);
    }
  }
}

}  // namespace
}  // namespace kvscope
