// BUZZ (Algorithms 1-2 of the paper): one local heavy hitter per stride chunk of the new
// segment, old survivors re-sampled with stride ceil(s/2), window always kept, and the budget.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "engine/error.h"
#include "engine/method.h"

namespace kvscope {
namespace {

constexpr int kSink = 8, kEval = 8;

struct Head {
  MatrixF keys, values;
  std::vector<MatrixF> queries;
  MethodInput input(int budget) const {
    MethodInput in;
    in.keys = &keys;
    in.values = &values;
    for (const MatrixF& q : queries) in.queries.push_back(&q);
    in.n = static_cast<int>(keys.rows());
    in.sink = in.mid_begin = kSink;
    in.eval = kEval;
    in.mid_end = in.n - kEval;
    in.budget = budget;
    return in;
  }
};

Head random_head(int n_mid, unsigned seed) {
  const int n = kSink + n_mid + kEval, d = 8;
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  Head h;
  h.keys.resize(n, d);
  h.values.resize(n, d);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < d; ++j) {
      h.keys(i, j) = 2.f * normal(gen);
      h.values(i, j) = normal(gen);
    }
  for (int g = 0; g < 2; ++g) {
    MatrixF q(n, d);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < d; ++j) q(i, j) = normal(gen);
    h.queries.push_back(std::move(q));
  }
  return h;
}

// Accumulated attention each key received from queries [mid_begin, upto], group-averaged,
// computed directly.
std::vector<double> accumulated(const Head& h, int upto) {
  const int d = static_cast<int>(h.keys.cols());
  std::vector<double> acc(h.keys.rows(), 0.0);
  for (const MatrixF& q : h.queries)
    for (int j = kSink; j <= upto; ++j) {
      std::vector<double> p(j + 1);
      double mx = -1e300, z = 0;
      for (int i = 0; i <= j; ++i) {
        p[i] = q.row(j).cast<double>().dot(h.keys.row(i).cast<double>()) / std::sqrt(d * 1.0);
        mx = std::max(mx, p[i]);
      }
      for (double& x : p) z += (x = std::exp(x - mx));
      for (int i = 0; i <= j; ++i) acc[i] += p[i] / z / h.queries.size();
    }
  return acc;
}

// Argmax of acc over each chunk of `stride` consecutive tokens in [begin, end) (absolute).
std::vector<int> chunk_argmax(const std::vector<double>& acc, int begin, int end, int stride) {
  std::vector<int> out;
  for (int c = begin; c < end; c += stride) {
    int best = c;
    for (int i = c + 1; i < std::min(end, c + stride); ++i)
      if (acc[i] > acc[best]) best = i;
    out.push_back(best);
  }
  return out;
}

ParamValues small_params() {
  return {{"window", 10}, {"stride", 5}, {"threshold", 20}, {"auto_scale", 0}, {"top_up", 0}};
}

const Method& buzz() {
  return *find_method("buzz");
}

TEST(Buzz, OneLocalHeavyHitterPerChunkOfTheNewSegment) {
  // 40 middle tokens, window 10, threshold 20: the body reaches 21 new tokens (relative 0..20)
  // when relative token 30 arrives; one eviction keeps the chunk maxima of 0-4, 5-9, 10-14,
  // 15-19, 20. Tokens 21..29 stay in the new buffer, 30..39 are the window.
  const Head h = random_head(40, 1);
  MethodInput in = h.input(40);
  in.params = small_params();
  const Selection sel = buzz().select(in);
  const std::vector<double> acc = accumulated(h, kSink + 30);
  std::vector<int> expected = chunk_argmax(acc, kSink, kSink + 21, 5);
  for (int r = 21; r < 40; ++r) expected.push_back(kSink + r);
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(sel.indices, expected) << sel.note;
  EXPECT_EQ(sel.indices.size(), 24u);
  EXPECT_NE(sel.note.find("1 evictions while streaming"), std::string::npos) << sel.note;
  EXPECT_NE(sel.note.find("< m"), std::string::npos) << sel.note;  // top_up off: says so
}

TEST(Buzz, OldSurvivorsAreResampledWithHalfTheStride) {
  // Continue to 50 tokens: a second eviction when relative token 46 arrives (5 old + 16 new >
  // 20) keeps old survivors 0 and 3 (stride ceil(5/2) = 3) and the chunk maxima of 21..36.
  const Head h = random_head(50, 2);
  MethodInput in = h.input(50);
  in.params = small_params();
  const Selection sel = buzz().select(in);
  const std::vector<int> first = chunk_argmax(accumulated(h, kSink + 30), kSink, kSink + 21, 5);
  const std::vector<int> second =
      chunk_argmax(accumulated(h, kSink + 46), kSink + 21, kSink + 37, 5);
  std::vector<int> expected = {first[0], first[3]};
  expected.insert(expected.end(), second.begin(), second.end());
  for (int r = 37; r < 50; ++r) expected.push_back(kSink + r);
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(sel.indices, expected) << sel.note;
  EXPECT_NE(sel.note.find("2 evictions while streaming"), std::string::npos) << sel.note;
}

TEST(Buzz, KeepsExactlyTheBudgetWithTheWindowInside) {
  const Head h = random_head(400, 3);
  for (int m : {1, 12, 50, 100, 200, 399}) {
    const MethodInput in = h.input(m);
    const Selection sel = buzz().select(in);
    ASSERT_EQ(static_cast<int>(sel.indices.size()), m) << sel.note;
    const std::set<int> kept(sel.indices.begin(), sel.indices.end());
    EXPECT_EQ(kept.size(), sel.indices.size());
    // Scaled defaults: the window is min(160, m/2) most recent middle tokens.
    const int window = std::min(160, m / 2);
    for (int t = in.mid_end - window; t < in.mid_end; ++t) EXPECT_TRUE(kept.count(t)) << m;
    if (2 * 160 > m) {
      EXPECT_NE(sel.note.find("scaled"), std::string::npos) << sel.note;
    }
  }
}

TEST(Buzz, WithoutTopUpTheLastEvictionsStayUnderTheBudget) {
  const Head h = random_head(300, 4);
  for (int m : {20, 60, 150}) {
    MethodInput in = h.input(m);
    in.params["top_up"] = 0;
    const Selection sel = buzz().select(in);
    EXPECT_LE(static_cast<int>(sel.indices.size()), m) << sel.note;
    EXPECT_GT(sel.indices.size(), 0u);
  }
}

TEST(Buzz, BadParametersAreInputErrors) {
  const Head h = random_head(30, 5);
  MethodInput in = h.input(10);
  in.params["stride"] = 0;
  EXPECT_THROW(buzz().select(in), InputError);
}

}  // namespace
}  // namespace kvscope
