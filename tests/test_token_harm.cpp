// Per-token harm (engine/eval/token_harm.h) against brute force: each middle token is actually
// evicted, the outputs recomputed without it (in long double, independently of the engine, and
// through ExactReference's approximation of a selection holding every other middle token), and
// the relative output change averaged over the evaluation queries and query heads.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <random>
#include <vector>

#include "engine/attention/exact_attention.h"
#include "engine/core/error.h"
#include "engine/eval/token_harm.h"
#include "engine/io/capture.h"
#include "sample_captures.h"

using namespace kvscope;

namespace {

using LD = long double;

MatrixF random_matrix(int rows, int cols, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> g(0.0f, scale);
  MatrixF m(rows, cols);
  for (int i = 0; i < rows; ++i)
    for (int c = 0; c < cols; ++c) m(i, c) = g(rng);
  return m;
}

// Output of query q at position `pos` over keys [0, pos], leaving out key `skip` (-1: none).
std::vector<LD> brute_output(const MatrixF& Q, const MatrixF& K, const MatrixF& V, int pos,
                             int skip) {
  const int d = static_cast<int>(K.cols()), dv = static_cast<int>(V.cols());
  const LD scale = 1.0L / std::sqrt(static_cast<LD>(d));
  std::vector<LD> logit(static_cast<size_t>(pos + 1));
  LD mx = -INFINITY;
  for (int k = 0; k <= pos; ++k) {
    LD acc = 0;
    for (int c = 0; c < d; ++c) acc += static_cast<LD>(Q(pos, c)) * K(k, c);
    logit[static_cast<size_t>(k)] = acc * scale;
    if (k != skip) mx = std::max(mx, logit[static_cast<size_t>(k)]);
  }
  std::vector<LD> out(static_cast<size_t>(dv), 0.0L);
  LD z = 0;
  for (int k = 0; k <= pos; ++k) {
    if (k == skip) continue;
    const LD w = std::exp(logit[static_cast<size_t>(k)] - mx);
    z += w;
    for (int c = 0; c < dv; ++c) out[static_cast<size_t>(c)] += w * V(k, c);
  }
  for (LD& o : out) o /= z;
  return out;
}

// Mean over queries and heads of ||o' - o|| / ||o|| with token j actually evicted.
double brute_harm(const std::vector<const MatrixF*>& queries, const MatrixF& K, const MatrixF& V,
                  int eval, int j) {
  const int n = static_cast<int>(K.rows());
  LD acc = 0;
  for (const MatrixF* Q : queries)
    for (int pos = n - eval; pos < n; ++pos) {
      const std::vector<LD> o = brute_output(*Q, K, V, pos, -1);
      const std::vector<LD> o2 = brute_output(*Q, K, V, pos, j);
      LD diff = 0, norm = 0;
      for (size_t c = 0; c < o.size(); ++c) {
        diff += (o2[c] - o[c]) * (o2[c] - o[c]);
        norm += o[c] * o[c];
      }
      acc += std::sqrt(diff) / std::sqrt(norm);
    }
  return static_cast<double>(acc / (static_cast<LD>(queries.size()) * eval));
}

double rel_diff(double a, double b) {
  return std::abs(a - b) / std::max(std::abs(b), 1e-300);
}

}  // namespace

TEST(TokenHarm, MatchesEvictionOnRandomData) {
  std::mt19937 rng(7);
  const int n = 72, d = 8, dv = 6, sink = 4, eval = 12;
  const MatrixF K = random_matrix(n, d, rng, 1.5f), V = random_matrix(n, dv, rng);
  const MatrixF Q1 = random_matrix(n, d, rng, 1.5f), Q2 = random_matrix(n, d, rng, 1.5f);
  const std::vector<const MatrixF*> queries = {&Q1, &Q2};
  const TokenHarm h = token_harm(queries, K, V, sink, eval);
  ASSERT_EQ(h.sink, sink);
  ASSERT_EQ(h.eval, eval);
  ASSERT_EQ(static_cast<int>(h.harm.size()), n - eval - sink);
  for (int j = sink; j < n - eval; ++j)
    EXPECT_LT(rel_diff(h.harm[static_cast<size_t>(j - sink)], brute_harm(queries, K, V, eval, j)),
              1e-9)
        << "token " << j;
}

TEST(TokenHarm, MatchesExactReferenceWithTheTokenLeftOut) {
  // The engine's own evaluation path: a selection of every middle token but j at weight 1.
  std::mt19937 rng(11);
  const int n = 48, d = 6, dv = 5, sink = 3, eval = 8;
  const MatrixF K = random_matrix(n, d, rng), V = random_matrix(n, dv, rng);
  const MatrixF Q = random_matrix(n, d, rng);
  const std::vector<const MatrixF*> queries = {&Q};
  const ExactReference ref(queries, K, V, sink, eval);
  const TokenHarm h = token_harm(queries, K, V, sink, eval);
  for (int j = sink; j < n - eval; ++j) {
    Selection sel;
    for (int i = sink; i < n - eval; ++i)
      if (i != j) {
        sel.indices.push_back(i);
        sel.weights.push_back(1.0);
      }
    double acc = 0;
    for (int e = 0; e < eval; ++e) {
      const int pos = n - eval + e;
      const VectorD o = ref.exact_output(0, e);
      const VectorD o2 = ref.approximation(sel, Q.row(pos).data(), pos);
      acc += (o2 - o).norm() / o.norm();
    }
    EXPECT_LT(rel_diff(h.harm[static_cast<size_t>(j - sink)], acc / eval), 1e-9) << "token " << j;
  }
}

TEST(TokenHarm, ExactWhereOneTokenHoldsNearlyAllAttention) {
  // p_ij near 1: 1 - p cancels in z - P, and o_i is close to v_j. Token 17's logit is `gap`
  // above the others for every evaluation query.
  for (float gap : {3.0f, 6.0f}) {
    SCOPED_TRACE(gap);
    std::mt19937 rng(3);
    const int n = 40, d = 4, dv = 4, sink = 2, eval = 6;
    MatrixF K = random_matrix(n, d, rng, 0.1f);
    const MatrixF V = random_matrix(n, dv, rng);
    MatrixF Q = random_matrix(n, d, rng, 0.1f);
    for (int c = 0; c < d; ++c) K(17, c) = gap;
    for (int i = n - eval; i < n; ++i)
      for (int c = 0; c < d; ++c) Q(i, c) = gap;
    const std::vector<const MatrixF*> queries = {&Q};
    const TokenHarm h = token_harm(queries, K, V, sink, eval);
    // At gap 6 (1 - p ~ 1e-30) the others' output changes are below long double's resolution of
    // o_i, so only token 17 is checked there.
    const std::vector<int> js =
        gap < 4 ? std::vector<int>{sink, 16, 17, 18, 30, n - eval - 1} : std::vector<int>{17};
    for (int j : js)
      EXPECT_LT(rel_diff(h.harm[static_cast<size_t>(j - sink)], brute_harm(queries, K, V, eval, j)),
                1e-9)
          << "token " << j;
    EXPECT_GT(h.harm[17 - sink], 0.1);  // evicting it moves the output to the others' mean
    // The mass: every query's attention sums to 1 over the keys it sees.
    double total = 0;
    for (double m : h.mass) total += m;
    EXPECT_NEAR(total, 1.0, 1e-12);
    EXPECT_GT(h.mass[17], 0.999);
  }
}

TEST(TokenHarm, MatchesEvictionOnSampleCaptures) {
  for (const std::string& path : kvscope::testing::sample_capture_paths()) {
    SCOPED_TRACE(path);
    auto cap = CaptureFile::open(path);
    const int L = cap->info().num_layers - 1;
    auto layer = cap->layer(L);
    const int kv = static_cast<int>(layer->keys.size()) - 1;
    const MatrixF& K = layer->keys[static_cast<size_t>(kv)];
    const MatrixF& V = layer->values[static_cast<size_t>(kv)];
    const int n = static_cast<int>(K.rows());
    const int sink = 4, eval = 6;
    const std::vector<const MatrixF*> queries = harm_queries(*layer, kv);
    ASSERT_FALSE(queries.empty());
    const TokenHarm h = token_harm(queries, K, V, sink, eval);
    ASSERT_EQ(static_cast<int>(h.harm.size()), n - eval - sink);
    // A spread of tokens, and the most harmful one.
    int top = sink;
    for (int j = sink; j < n - eval; ++j)
      if (h.harm[static_cast<size_t>(j - sink)] > h.harm[static_cast<size_t>(top - sink)]) top = j;
    std::vector<int> js = {sink, top, n - eval - 1};
    for (int j = sink + 7; j < n - eval; j += std::max(1, (n - eval - sink) / 12)) js.push_back(j);
    for (int j : js)
      EXPECT_LT(rel_diff(h.harm[static_cast<size_t>(j - sink)], brute_harm(queries, K, V, eval, j)),
                1e-9)
          << "token " << j;
  }
}

TEST(TokenHarm, SplitSumsKeptAndDropped) {
  TokenHarm h;
  h.sink = 10;
  h.eval = 4;
  h.harm = {1.0, 2.0, 4.0, 8.0, 16.0};  // tokens 10..14
  Selection sel;
  sel.indices = {11, 14};
  sel.weights = {1, 1};
  HarmSplit s = harm_split(h, sel);
  EXPECT_EQ(s.kept_count, 2);
  EXPECT_EQ(s.dropped_count, 3);
  EXPECT_DOUBLE_EQ(s.kept_sum, 18.0);
  EXPECT_DOUBLE_EQ(s.dropped_sum, 13.0);
  EXPECT_DOUBLE_EQ(s.kept_mean, 9.0);
  EXPECT_DOUBLE_EQ(s.dropped_mean, 13.0 / 3);
  EXPECT_DOUBLE_EQ(s.total, 31.0);
  // A separate denominator's tokens are kept too.
  sel.separate = true;
  sel.den_indices = {10};
  sel.den_weights = {1};
  s = harm_split(h, sel);
  EXPECT_EQ(s.kept_count, 3);
  EXPECT_DOUBLE_EQ(s.dropped_sum, 12.0);
  sel.indices = {9};  // a sink
  EXPECT_THROW(harm_split(h, sel), std::out_of_range);
  Selection past_the_middle;
  past_the_middle.indices = {15};
  past_the_middle.weights = {1.0};
  EXPECT_THROW(harm_split(h, past_the_middle), std::out_of_range);
  // Nothing kept: the kept mean is 0.
  s = harm_split(h, Selection{});
  EXPECT_EQ(s.kept_count, 0);
  EXPECT_EQ(s.kept_mean, 0.0);
  EXPECT_DOUBLE_EQ(s.dropped_mean, 31.0 / 5);
}

// The Tokens view's harm job can be cancelled: a set flag stops the work with Cancelled, an
// unset one changes nothing.
TEST(TokenHarm, ASetCancelFlagStopsIt) {
  std::mt19937 rng(11);
  const int n = 96, d = 8;
  const MatrixF K = random_matrix(n, d, rng), V = random_matrix(n, d, rng);
  const MatrixF Q = random_matrix(n, d, rng);
  std::atomic<bool> cancel{true};
  EXPECT_THROW(token_harm({&Q}, K, V, 4, 12, &cancel), Cancelled);
  cancel = false;
  const TokenHarm a = token_harm({&Q}, K, V, 4, 12, &cancel), b = token_harm({&Q}, K, V, 4, 12);
  EXPECT_EQ(a.harm, b.harm);
}

TEST(TokenHarm, RefusesInconsistentShapes) {
  std::mt19937 rng(1);
  const MatrixF K = random_matrix(20, 4, rng), V = random_matrix(20, 3, rng);
  const MatrixF Qbad = random_matrix(19, 4, rng);
  EXPECT_THROW(token_harm({&Qbad}, K, V, 2, 4), std::invalid_argument);
  EXPECT_THROW(token_harm({&K}, K, V, 10, 11), std::invalid_argument);
  EXPECT_THROW(token_harm({&K}, K, V, 2, 0), std::invalid_argument);
  EXPECT_THROW(token_harm({}, K, V, 2, 4), std::invalid_argument);
  const MatrixF Vbad = random_matrix(18, 3, rng);
  EXPECT_THROW(token_harm({&K}, K, Vbad, 2, 4), std::invalid_argument);
  EXPECT_NO_THROW(token_harm({&K}, K, V, 0, 20));  // no middle: nothing to harm
}
