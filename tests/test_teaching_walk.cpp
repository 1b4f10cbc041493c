// The teaching walk: the talk's worked example, the known-direction proposition, the
// self-balancing walk's probabilities, determinism and balance, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/core/error.h"
#include "engine/core/random.h"
#include "engine/teaching/teaching_walk.h"

using namespace kvscope;

TEST(TeachingWalk, ReproducesTheTalksWorkedExample) {
  TeachingWalk w = TeachingWalk::talk_example();
  EXPECT_FALSE(w.done());
  w.run();
  ASSERT_TRUE(w.done());
  EXPECT_FALSE(w.step());
  const std::vector<int> signs{+1, -1, +1, +1, -1};
  const std::vector<double> prefix{0.1, -0.7, -0.2, 0.5, 0.2};
  ASSERT_EQ(w.steps().size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(w.steps()[i].sigma, signs[i]) << i;
    EXPECT_NEAR(w.steps()[i].prefix_along_z, prefix[i], 1e-12) << i;
  }
  EXPECT_LE(w.max_abs_prefix_along_z(), 1.0);
  const std::string table = w.table();
  EXPECT_NE(table.find("-0.70"), std::string::npos) << table;
  EXPECT_NE(table.find("0.80"), std::string::npos) << table;
}

TEST(TeachingWalk, KnownDirectionKeepsEveryPrefixWithinOne) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<double> unif(-1, 1);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<TeachingWalk::Vec2> v;
    for (int i = 0; i < 200; ++i) {
      double x = unif(rng), y = unif(rng);
      const double r = std::hypot(x, y);
      if (r > 1) x /= r, y /= r;  // |<u, z>| <= |u| <= 1
      v.push_back({x, y});
    }
    TeachingWalk w(v, {unif(rng), unif(rng) + 2}, TeachingWalk::Rule::KnownDirection);
    w.run();
    EXPECT_LE(w.max_abs_prefix_along_z(), 1.0 + 1e-12);
  }
}

TEST(TeachingWalk, SelfBalancingProbabilitiesAndDeterminism) {
  const std::vector<TeachingWalk::Vec2> v{{0.3, 0.9}, {-0.5, 0.2},  {0.8, -0.1},
                                          {0.1, 0.1}, {-0.7, -0.6}, {0.4, 0.4}};
  TeachingWalk a(v, {1, 1}, TeachingWalk::Rule::SelfBalancing, 0.8, 42);
  TeachingWalk b(v, {1, 1}, TeachingWalk::Rule::SelfBalancing, 0.8, 42);
  a.run();
  b.run();
  TeachingWalk::Vec2 w{0, 0};
  for (size_t j = 0; j < v.size(); ++j) {
    const auto& s = a.steps()[j];
    const double inner = w[0] * v[j][0] + w[1] * v[j][1];
    EXPECT_NEAR(s.inner, inner, 1e-12);
    EXPECT_NEAR(s.p, 0.5 - inner / (2 * 0.8), 1e-12);
    EXPECT_EQ(s.sigma, s.uniform < std::clamp(s.p, 0.0, 1.0) ? 1 : -1);
    EXPECT_EQ(s.sigma, b.steps()[j].sigma);
    w = {w[0] + s.sigma * v[j][0], w[1] + s.sigma * v[j][1]};
    EXPECT_NEAR(s.prefix[0], w[0], 1e-12);
    EXPECT_NEAR(s.prefix_along_z, (w[0] + w[1]) / std::sqrt(2.0), 1e-12);
  }
  std::vector<int> first;
  for (const auto& s : a.steps()) first.push_back(s.sigma);
  a.reset();
  EXPECT_TRUE(a.steps().empty());
  a.run();
  for (size_t j = 0; j < v.size(); ++j) EXPECT_EQ(a.steps()[j].sigma, first[j]);
}

TEST(TeachingWalk, SelfBalancingStaysBalancedWhereRandomSignsDrift) {
  std::mt19937 rng(7);
  std::normal_distribution<double> g(0, 1);
  const int n = 2000, seeds = 5;
  double walk = 0, random = 0;
  for (int s = 0; s < seeds; ++s) {
    std::vector<TeachingWalk::Vec2> v;
    for (int i = 0; i < n; ++i) {
      const double x = g(rng), y = g(rng), r = std::hypot(x, y);
      v.push_back({x / r, y / r});
    }
    TeachingWalk w(v, {0.6, 0.8}, TeachingWalk::Rule::SelfBalancing, 1.0, s);
    w.run();
    walk += std::abs(w.steps().back().prefix_along_z);
    double rz = 0;
    for (int i = 0; i < n; ++i)
      rz += (counter_uniform(s, kRandRandomSigns, 0, 0, 0, 0, i) < 0.5 ? 1 : -1) *
            (0.6 * v[i][0] + 0.8 * v[i][1]);
    random += std::abs(rz);
  }
  walk /= seeds;
  random /= seeds;
  EXPECT_LT(walk, 3.0);
  EXPECT_GT(random, 3 * walk);
}

TEST(TeachingWalk, RejectsBadInput) {
  EXPECT_THROW(TeachingWalk({}, {1, 0}, TeachingWalk::Rule::KnownDirection), InputError);
  EXPECT_THROW(TeachingWalk({{1, 0}}, {0, 0}, TeachingWalk::Rule::KnownDirection), InputError);
  EXPECT_THROW(TeachingWalk({{1, 0}}, {1, 0}, TeachingWalk::Rule::SelfBalancing, 0), InputError);
  EXPECT_THROW(TeachingWalk({{NAN, 0}}, {1, 0}, TeachingWalk::Rule::SelfBalancing), InputError);
}
