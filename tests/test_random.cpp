#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "engine/core/random.h"

using namespace kvscope;

// Known-answer test for Philox4x32-10 from the Random123 distribution (kat_vectors).
TEST(Philox, MatchesRandom123KnownAnswers) {
  Philox4 zero{{0, 0, 0, 0}};
  Philox4 r = philox4x32(zero, 0, 0);
  EXPECT_EQ(r.v[0], 0x6627e8d5u);
  EXPECT_EQ(r.v[1], 0xe169c58du);
  EXPECT_EQ(r.v[2], 0xbc57ac4cu);
  EXPECT_EQ(r.v[3], 0x9b00dbd8u);
  Philox4 ones{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}};
  r = philox4x32(ones, 0xffffffffu, 0xffffffffu);
  EXPECT_EQ(r.v[0], 0x408f276du);
  EXPECT_EQ(r.v[1], 0x41c83b0eu);
  EXPECT_EQ(r.v[2], 0xa20bc7c6u);
  EXPECT_EQ(r.v[3], 0x6d5451fdu);
}

TEST(Philox, UniformsAreUniformAndDistinctPerCounter) {
  double sum = 0, sum2 = 0;
  std::set<double> seen;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    double u = counter_uniform(42, kRandWalk, 3, 1, 0, 7, static_cast<uint32_t>(i));
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    sum2 += u * u;
    seen.insert(u);
  }
  double mean = sum / n, var = sum2 / n - mean * mean;
  EXPECT_NEAR(mean, 0.5, 0.005);
  EXPECT_NEAR(var, 1.0 / 12.0, 0.002);
  EXPECT_EQ(static_cast<int>(seen.size()), n);
  EXPECT_NE(counter_uniform(42, kRandWalk, 3, 1, 0, 7, 0),
            counter_uniform(43, kRandWalk, 3, 1, 0, 7, 0));
  EXPECT_NE(counter_uniform(42, kRandWalk, 3, 1, 0, 7, 0),
            counter_uniform(42, kRandWalk, 3, 2, 0, 7, 0));
}
