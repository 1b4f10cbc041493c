// The walk op (cpu_walk_blocks), exact halving, the round schedule, traces, and the walk's
// discrepancy claim (flat along fixed directions, random signs grow like sqrt n).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/core/random.h"
#include "engine/core/simd.h"
#include "engine/methods/balancekv/balance_walk.h"
#include "engine/ops/walk_blocks.h"

using namespace kvscope;

namespace {

MatrixF random_matrix(int rows, int cols, uint32_t seed, float scale = 1.f, float offset = 0.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  MatrixF m(rows, cols);
  for (int i = 0; i < rows; ++i)
    for (int c = 0; c < cols; ++c) m(i, c) = offset + scale * g(rng);
  return m;
}

struct OneBatch {
  std::vector<int> offset;
  std::vector<uint32_t> head, id;
  std::vector<int8_t> sigma;
  std::vector<float> p, partial;
  WalkBatch batch;
};

// A batch over `keys`/`values` split into blocks of the given lengths.
OneBatch make_batch(const MatrixF& keys, const MatrixF& values, const std::vector<int>& lengths,
                    uint64_t seed, double gamma = 4) {
  OneBatch b;
  b.offset.push_back(0);
  for (size_t i = 0; i < lengths.size(); ++i) {
    b.offset.push_back(b.offset.back() + lengths[i]);
    b.head.push_back(static_cast<uint32_t>(i % 3));
    b.id.push_back(static_cast<uint32_t>(i));
  }
  const int rows = b.offset.back();
  b.sigma.assign(rows, 0);
  b.p.assign(rows, 0);
  b.partial.assign(rows, 0);
  WalkBatch& w = b.batch;
  w.d = static_cast<int>(keys.cols());
  w.dv = static_cast<int>(values.cols());
  w.num_blocks = static_cast<int>(lengths.size());
  w.keys = keys.data();
  w.values = values.data();
  w.block_offset = b.offset.data();
  w.block_head = b.head.data();
  w.block_id = b.id.data();
  w.seed = seed;
  w.layer = 2;
  w.round = 1;
  w.gamma = gamma;
  w.temp = 0.7;
  w.beta = 0.3;
  w.sigma = b.sigma.data();
  w.p = b.p.data();
  w.partial = b.partial.data();
  return b;
}

}  // namespace

TEST(ExactHalving, MajorityReachesHalfThenTailKept) {
  // + - + - + + - - : '+' reaches 4 = n/2 at position 5.
  Halving h = exact_halving({+1, -1, +1, -1, +1, +1, -1, -1}, 4);
  EXPECT_EQ(h.cut, 5);
  EXPECT_EQ(h.majority_sign, +1);
  EXPECT_EQ(h.kept, (std::vector<int>{1, 3, 6, 7}));
  EXPECT_EQ(h.factor, (std::vector<double>{2, 2, 1, 1}));
}

TEST(ExactHalving, AllSameSignKeepsTail) {
  Halving h = exact_halving({+1, +1, +1, +1, +1, +1}, 3);
  EXPECT_EQ(h.cut, 2);
  EXPECT_EQ(h.kept, (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(h.factor, (std::vector<double>{1, 1, 1}));
}

TEST(ExactHalving, OddLengthFloorAndCeil) {
  const std::vector<int8_t> s{+1, -1, -1, +1, -1, -1, +1};
  Halving lo = exact_halving(s, 3);  // quota 4: '-' reaches 4 at position 5
  EXPECT_EQ(lo.cut, 5);
  EXPECT_EQ(lo.majority_sign, -1);
  EXPECT_EQ(lo.kept, (std::vector<int>{0, 3, 6}));
  EXPECT_EQ(lo.factor, (std::vector<double>{2, 2, 1}));
  Halving hi = exact_halving(s, 4);  // quota 3: '-' reaches 3 at position 4
  EXPECT_EQ(hi.cut, 4);
  EXPECT_EQ(hi.kept, (std::vector<int>{0, 3, 5, 6}));
  EXPECT_EQ(hi.factor, (std::vector<double>{2, 2, 1, 1}));
}

TEST(ExactHalving, RejectsNonHalvingKeep) {
  EXPECT_THROW(exact_halving({+1, -1, +1, -1}, 1), std::invalid_argument);
  EXPECT_THROW(exact_halving({+1}, 0), std::invalid_argument);
}

TEST(ExactHalving, KeepsExactlyKeepOnRandomSequences) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 2 + static_cast<int>(rng() % 300);
    std::vector<int8_t> s(n);
    for (auto& v : s) v = (rng() & 1) ? 1 : -1;
    for (int keep : {n / 2, (n + 1) / 2}) {
      Halving h = exact_halving(s, keep);
      ASSERT_EQ(static_cast<int>(h.kept.size()), keep);
      for (size_t k = 0; k < h.kept.size(); ++k) {
        if (h.kept[k] <= h.cut) {
          EXPECT_NE(s[h.kept[k]], h.majority_sign);
          EXPECT_EQ(h.factor[k], 2.0);
        } else {
          EXPECT_EQ(h.factor[k], 1.0);
        }
      }
    }
  }
}

// The authors' rule (their balanced_walk): c = max(first index where #-1 reaches n//2, first
// index where #+1 does), the sign at c is dropped up to c, the rest kept at 2, everything after
// c at 1, the first n//2 by stable weight order.
TEST(AuthorsHalving, DocsExampleComesOutDifferentlyFromTheBalancedRule) {
  // + - + - + + - - : '+' reaches 4 at 5, '-' at 7: c = 7, sigma_7 = -1, so the '+' signs up to
  // 7 are kept at weight 2 (the balanced rule keeps 1, 3 at 2 and 6, 7 at 1).
  Halving h = authors_halving({+1, -1, +1, -1, +1, +1, -1, -1}, 4);
  EXPECT_EQ(h.cut, 7);
  EXPECT_EQ(h.majority_sign, -1);
  EXPECT_EQ(h.kept, (std::vector<int>{0, 2, 4, 5}));
  EXPECT_EQ(h.factor, (std::vector<double>{2, 2, 2, 2}));
}

TEST(AuthorsHalving, OddLengthDropsTheLastToken) {
  // n = 5, n//2 = 2: '+' reaches 2 at 2, '-' at 3: c = 3; weight 2 for 0 and 2, 1 for 4; the
  // first two survive, so the last token is dropped (KVScope's earlier variant kept
  // round(n/2) = 3 here, with the balanced rule: 1 at weight 2, then 3 and 4).
  Halving h = authors_halving({+1, -1, +1, -1, +1}, 2);
  EXPECT_EQ(h.cut, 3);
  EXPECT_EQ(h.kept, (std::vector<int>{0, 2}));
  EXPECT_EQ(h.factor, (std::vector<double>{2, 2}));
  const Halving b = exact_halving({+1, -1, +1, -1, +1}, 3);
  EXPECT_EQ(b.kept, (std::vector<int>{1, 3, 4}));
  // n = 7: '-' reaches 3 at 4, '+' at 6 = c, sigma_c = +1 so the '-' signs 1, 2, 4, 5 weigh 2;
  // the first three survive.
  Halving odd = authors_halving({+1, -1, -1, +1, -1, -1, +1}, 3);
  EXPECT_EQ(odd.cut, 6);
  EXPECT_EQ(odd.majority_sign, +1);
  EXPECT_EQ(odd.kept, (std::vector<int>{1, 2, 4}));
}

TEST(AuthorsHalving, AllSameSignAndTinyRounds) {
  Halving h = authors_halving({+1, +1, +1, +1, +1, +1}, 3);  // '-' never reaches 3: c = 2
  EXPECT_EQ(h.cut, 2);
  EXPECT_EQ(h.kept, (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(h.factor, (std::vector<double>{1, 1, 1}));
  EXPECT_TRUE(authors_halving({+1}, 0).kept.empty());
  Halving two = authors_halving({+1, -1}, 1);  // '+' reaches 1 at 0, '-' at 1 = c
  EXPECT_EQ(two.kept, (std::vector<int>{0}));
  EXPECT_EQ(two.factor, (std::vector<double>{2}));
  EXPECT_THROW(authors_halving({+1, -1, +1, -1}, 3), std::invalid_argument);
}

TEST(AuthorsHalving, KeepsNHalfInWalkOrderOnRandomSequences) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 2 + static_cast<int>(rng() % 300);
    std::vector<int8_t> s(n);
    s[0] = 1;
    for (int i = 1; i < n; ++i) s[i] = (rng() % 5 < 3) ? 1 : -1;
    for (int keep : {n / 2, (n + 1) / 2}) {
      Halving h = authors_halving(s, keep);
      ASSERT_EQ(static_cast<int>(h.kept.size()), keep);
      for (size_t k = 0; k < h.kept.size(); ++k) {
        if (k > 0) {
          EXPECT_LT(h.kept[k - 1], h.kept[k]);
        }
        EXPECT_EQ(h.factor[k], h.kept[k] <= h.cut ? 2.0 : 1.0);
        if (h.kept[k] <= h.cut) {
          EXPECT_NE(s[h.kept[k]], s[h.cut]);
        }
      }
    }
  }
}

TEST(HalvingSchedule, FloorHalvingAsTheAuthors) {
  // The sample captures' middle of 405 tokens: 202, 101, 50 (the budgets are 203, 101, 51).
  EXPECT_EQ(floor_halving_schedule(405, 203), (std::vector<int>{202}));
  EXPECT_EQ(floor_halving_schedule(405, 101), (std::vector<int>{202, 101}));
  EXPECT_EQ(floor_halving_schedule(405, 51), (std::vector<int>{202, 101, 50}));
  EXPECT_EQ(floor_halving_schedule(405, 122), (std::vector<int>{202, 101}));  // then top up
  EXPECT_TRUE(floor_halving_schedule(10, 10).empty());
}

// The float32 op (the authors' semantics): p and the signs follow a float32 evaluation of the
// formula summed over the whole block row with sigma_j = 0 for j >= i, and an overflowing kernel
// entry anywhere in row i (here a key far out, exp(<k,k>/sqrt d) = inf) makes p NaN and sigma -1.
TEST(WalkOpFloat32, MatchesTheAuthorsFormulaIncludingOverflow) {
  const int d = 8, dv = 4, len = 40;
  MatrixF keys = random_matrix(len, d, 21, 0.8f);
  const MatrixF values = random_matrix(len, dv, 22, 0.3f);
  for (int c = 0; c < d; ++c) keys(30, c) = 12.0f;  // <k30,k30>/sqrt(8) = 407: exp overflows
  OneBatch b = make_batch(keys, values, {len}, 9, 4.0);
  b.batch.float32 = true;
  b.batch.value_eps = kAuthorsValueEps;
  cpu_walk_blocks(b.batch);
  const float temp = 0.7f, beta = 0.3f, sqrt_d = std::sqrt(static_cast<float>(d));
  auto kern = [&](int i, int j) {
    float g = 0, gv = 0;
    for (int c = 0; c < d; ++c) g += keys(i, c) * keys(j, c);
    for (int c = 0; c < dv; ++c) gv += values(i, c) * values(j, c);
    return std::exp((temp * g) / sqrt_d - beta) * ((gv + 1e-8f) + 0.025f);
  };
  std::vector<float> sig(len, 0.0f);
  int nan_rows = 0;
  for (int i = 0; i < len; ++i) {
    float partial = 0;
    for (int j = 0; j < len; ++j) partial += kern(i, j) * sig[j];  // sig_j = 0 for j >= i
    const float p = 0.5f - 4.0f * partial;
    if (std::isnan(p)) {
      ++nan_rows;
      EXPECT_TRUE(std::isnan(b.p[i])) << "row " << i;
    } else if (std::isfinite(p)) {
      EXPECT_NEAR(b.p[i], p, 1e-4f * (1 + std::abs(p))) << "row " << i;
    }
    const double u = counter_uniform(9, kRandWalk, 2, 0, 1, 0, static_cast<uint32_t>(i));
    const int expect = i == 0 ? 1 : (static_cast<float>(u) < p ? 1 : -1);
    ASSERT_EQ(b.sigma[i], expect) << "row " << i << " p " << p << " u " << u;
    sig[i] = static_cast<float>(b.sigma[i]);
  }
  EXPECT_GT(nan_rows, 0);  // row 30: its own diagonal K_30,30 = inf enters as inf * sigma_30 = 0
  // The double op never overflows there and clips instead.
  OneBatch dbl = make_batch(keys, values, {len}, 9, 4.0);
  cpu_walk_blocks(dbl.batch);
  for (int i = 0; i < len; ++i) EXPECT_FALSE(std::isnan(dbl.p[i])) << "row " << i;
}

TEST(HalvingSchedule, PowersOfTwoAndTopUps) {
  EXPECT_EQ(halving_schedule(432, 216), (std::vector<int>{216}));
  EXPECT_EQ(halving_schedule(432, 108), (std::vector<int>{216, 108}));
  EXPECT_EQ(halving_schedule(432, 54), (std::vector<int>{216, 108, 54}));
  EXPECT_EQ(halving_schedule(432, 130), (std::vector<int>{216, 108}));  // then top up 22
  EXPECT_EQ(halving_schedule(11, 6), (std::vector<int>{6}));
  EXPECT_TRUE(halving_schedule(10, 10).empty());
  for (int n0 = 2; n0 < 700; n0 += 7)
    for (int target = 1; target < n0; target += 5) {
      auto s = halving_schedule(n0, target);
      ASSERT_FALSE(s.empty());
      EXPECT_LE(s.back(), target);
      int prev = n0;
      for (size_t r = 0; r < s.size(); ++r) {
        EXPECT_TRUE(s[r] == prev / 2 || s[r] == (prev + 1) / 2) << n0 << " " << target;
        if (r + 1 < s.size()) {
          EXPECT_GT(s[r], target);
        }
        prev = s[r];
      }
    }
}

TEST(CpuWalk, MatchesTheWalkFormulaInDouble) {
  const MatrixF keys = random_matrix(300, 12, 1, 0.8f);
  const MatrixF values = random_matrix(300, 5, 2, 0.5f);
  OneBatch b = make_batch(keys, values, {128, 100, 72}, 7, 4.0);
  cpu_walk_blocks(b.batch);
  const double scale = b.batch.temp / std::sqrt(12.0);
  for (int blk = 0; blk < 3; ++blk) {
    const int r0 = b.offset[blk], r1 = b.offset[blk + 1];
    EXPECT_EQ(b.sigma[r0], 1) << "sigma_0 = +1";
    for (int i = r0; i < r1; ++i) {
      double partial = 0;
      for (int j = r0; j < i; ++j) {
        const double kk = keys.row(i).cast<double>().dot(keys.row(j).cast<double>());
        const double vv = values.row(i).cast<double>().dot(values.row(j).cast<double>());
        partial += std::exp(scale * kk - b.batch.beta) * (vv + b.batch.value_bias) * b.sigma[j];
      }
      EXPECT_NEAR(b.partial[i], partial, 1e-5 * (1 + std::abs(partial)));
      const double p = 0.5 - b.batch.gamma * partial;
      EXPECT_NEAR(b.p[i], p, 1e-5 * (1 + std::abs(p)));
      if (i > r0 && std::abs(p) > 1e-6 && std::abs(p - 1) > 1e-6) {
        const double u = counter_uniform(7, kRandWalk, 2, b.head[blk], 1, b.id[blk],
                                         static_cast<uint32_t>(i - r0));
        // The sign is the uniform compared with the clipped probability.
        if (std::abs(u - std::clamp(p, 0.0, 1.0)) > 1e-6) {
          EXPECT_EQ(b.sigma[i], u < std::clamp(p, 0.0, 1.0) ? 1 : -1) << i;
        }
      }
    }
  }
}

TEST(CpuWalk, VectorAndPortableGramPathsAgree) {
  const MatrixF keys = random_matrix(600, 40, 31, 0.4f);
  const MatrixF values = random_matrix(600, 24, 32, 0.6f);
  // Blocks of odd lengths and one longer than a 256-row panel.
  OneBatch fast = make_batch(keys, values, {37, 128, 300, 135}, 9, 4.0);
  OneBatch portable = make_batch(keys, values, {37, 128, 300, 135}, 9, 4.0);
  cpu_walk_blocks(fast.batch);
  const bool before = set_cpu_walk_simd(false);
  cpu_walk_blocks(portable.batch);
  set_cpu_walk_simd(before);
  int same = 0;
  for (int i = 0; i < 600; ++i) {
    same += fast.sigma[i] == portable.sigma[i];
    if (fast.sigma[i] == portable.sigma[i]) {
      EXPECT_NEAR(fast.partial[i], portable.partial[i], 1e-5 * (1 + std::abs(portable.partial[i])));
    }
  }
  // Only a uniform within ~1e-15 of its probability could split them.
  EXPECT_EQ(same, 600);
}

// The float32 op's two paths (the fused SIMD Gram and kernel rows, and the portable loops used
// without AVX2 or under KVSCOPE_SIMD=sse2) on blocks from 1 row to longer than a Gram panel, odd
// widths included: the same overflow flags, the same signs except where the uniform lies within
// float rounding of p, and partial sums a few roundings apart.
TEST(CpuWalkFloat32, VectorAndPortablePathsAgree) {
  MatrixF keys = random_matrix(700, 40, 61, 0.3f, 0.2f);
  const MatrixF values = random_matrix(700, 24, 62, 0.4f);
  for (int c = 0; c < 40; ++c) keys(650, c) = 14.0f;  // overflows exp in its block
  const std::vector<int> lengths = {1, 2, 3, 7, 8, 9, 37, 128, 200, 305};
  OneBatch fast = make_batch(keys, values, lengths, 21, 4.0);
  OneBatch portable = make_batch(keys, values, lengths, 21, 4.0);
  for (OneBatch* b : {&fast, &portable}) {
    b->batch.float32 = true;
    b->batch.value_eps = kAuthorsValueEps;
  }
  cpu_walk_blocks(fast.batch);
  const bool before = set_cpu_walk_simd(false);
  cpu_walk_blocks(portable.batch);
  set_cpu_walk_simd(before);
  int nan_rows = 0;
  for (size_t blk = 0; blk + 1 < fast.offset.size(); ++blk) {
    for (int i = fast.offset[blk]; i < fast.offset[blk + 1]; ++i) {
      ASSERT_EQ(std::isnan(fast.p[i]), std::isnan(portable.p[i]))
          << "block " << blk << " row " << i;
      nan_rows += std::isnan(fast.p[i]);
      if (std::isnan(fast.p[i])) continue;
      const float tol = 1e-4f * (1 + std::abs(portable.partial[i]));
      if (fast.sigma[i] != portable.sigma[i]) {
        const double u = counter_uniform(21, kRandWalk, 2, fast.head[blk], 1, fast.id[blk],
                                         static_cast<uint32_t>(i - fast.offset[blk]));
        EXPECT_LT(std::abs(u - portable.p[i]), 1e-4) << "block " << blk << " row " << i;
        break;  // the rest of the block walks on different signs
      }
      ASSERT_NEAR(fast.partial[i], portable.partial[i], tol) << "block " << blk << " row " << i;
    }
  }
  EXPECT_GT(nan_rows, 0) << "the far-out key should overflow float32 in its block";
}

TEST(CpuWalk, DeterministicPerSeedAndDifferentAcrossSeeds) {
  const MatrixF keys = random_matrix(256, 16, 4);
  const MatrixF values = random_matrix(256, 16, 5);
  OneBatch a = make_batch(keys, values, {128, 128}, 11, 0.05);
  OneBatch b = make_batch(keys, values, {128, 128}, 11, 0.05);
  OneBatch c = make_batch(keys, values, {128, 128}, 12, 0.05);
  cpu_walk_blocks(a.batch);
  cpu_walk_blocks(b.batch);
  cpu_walk_blocks(c.batch);
  EXPECT_EQ(a.sigma, b.sigma);
  EXPECT_NE(a.sigma, c.sigma);
}

TEST(CpuWalk, GammaZeroIsFairCoin) {
  const MatrixF keys = random_matrix(2048, 8, 6);
  const MatrixF values = random_matrix(2048, 8, 7);
  OneBatch b = make_batch(keys, values, std::vector<int>(16, 128), 3, 0.0);
  cpu_walk_blocks(b.batch);
  int plus = 0;
  for (int i = 0; i < 2048; ++i) {
    EXPECT_FLOAT_EQ(b.p[i], 0.5f);
    plus += b.sigma[i] > 0;
  }
  // 16 forced +1s plus 2032 fair coins: mean 1032, sd ~22.5.
  EXPECT_NEAR(plus, 1032, 5 * 22.5);
}

// Least-squares slope of log(y) against log(x).
static double loglog_slope(const std::vector<double>& x, const std::vector<double>& y) {
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  const double k = static_cast<double>(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double lx = std::log(x[i]), ly = std::log(y[i]);
    sx += lx, sy += ly, sxx += lx * lx, sxy += lx * ly;
  }
  return (k * sxy - sx * sy) / (k * sxx - sx * sx);
}

// The paper's claim on the walk: run as one block on n random unit keys with values 1, the
// signed sum sum_i sigma_i exp(<k_i,q>/sqrt d) along fixed query directions stays nearly flat in
// n while random signs grow like sqrt n.
TEST(CpuWalk, DiscrepancyFlatAlongQueriesWhileRandomSignsGrowLikeSqrtN) {
  const int d = 16, num_queries = 6, seeds = 3;
  std::mt19937 rng(99);
  std::normal_distribution<double> g(0, 1);
  auto unit = [&](int rows) {
    MatrixF m(rows, d);
    for (int i = 0; i < rows; ++i) {
      Eigen::VectorXd v(d);
      for (int c = 0; c < d; ++c) v(c) = g(rng);
      v.normalize();
      for (int c = 0; c < d; ++c) m(i, c) = static_cast<float>(v(c));
    }
    return m;
  };
  const MatrixF queries = unit(num_queries);
  std::vector<double> ns, walk_disc, random_disc, kernel_norm;
  for (int n = 64; n <= 4096; n *= 4) {
    double walk_sum = 0, random_sum = 0, kernel_sum = 0;
    for (int s = 0; s < seeds; ++s) {
      const MatrixF keys = unit(n);
      const MatrixF ones = MatrixF::Ones(n, 1);
      OneBatch b = make_batch(keys, ones, {n}, 1000 + s, 4.0);
      b.batch.temp = 1;
      b.batch.beta = 0;
      cpu_walk_blocks(b.batch);
      // Kernel-space norm sqrt(sigma^T K sigma) from the op's own partial sums:
      // sigma^T K sigma = sum_i (2 sigma_i partial_i + K_ii).
      double quad = 0;
      for (int i = 0; i < n; ++i)
        quad += 2.0 * b.sigma[i] * b.partial[i] +
                std::exp(keys.row(i).squaredNorm() / std::sqrt(static_cast<double>(d))) * 1.025;
      kernel_sum += std::sqrt(std::max(0.0, quad));
      for (int q = 0; q < num_queries; ++q) {
        double walk = 0, random = 0;
        for (int i = 0; i < n; ++i) {
          const double term =
              std::exp(keys.row(i).cast<double>().dot(queries.row(q).cast<double>()) /
                       std::sqrt(static_cast<double>(d)));
          walk += b.sigma[i] * term;
          const double u = counter_uniform(1000 + s, kRandRandomSigns, 0, q, 0, 0, i);
          random += (u < 0.5 ? 1 : -1) * term;
        }
        walk_sum += std::abs(walk);
        random_sum += std::abs(random);
      }
    }
    ns.push_back(n);
    walk_disc.push_back(walk_sum / (seeds * num_queries));
    random_disc.push_back(random_sum / (seeds * num_queries));
    kernel_norm.push_back(kernel_sum / seeds);
  }
  const double walk_slope = loglog_slope(ns, walk_disc);
  const double random_slope = loglog_slope(ns, random_disc);
  EXPECT_LT(walk_slope, 0.2) << "walk discrepancy grows too fast";
  EXPECT_GT(random_slope, 0.35) << "random signs should grow like sqrt n";
  // Reported, not asserted: balance holds per direction, not in the kernel-space norm.
  const double kernel_slope = loglog_slope(ns, kernel_norm);
  RecordProperty("walk_slope", std::to_string(walk_slope));
  RecordProperty("random_slope", std::to_string(random_slope));
  RecordProperty("kernel_norm_slope", std::to_string(kernel_slope));
  std::printf(
      "log-log slopes over n = 64..4096: walk %.3f, random signs %.3f, walk kernel-space "
      "norm %.3f\n",
      walk_slope, random_slope, kernel_slope);
}

TEST(BlockTrace, KernelNormQueryDiscrepancyAndPcaPath) {
  // A linear kernel K = X X^T: kernel PCA is ordinary PCA of the centred rows, so the path must
  // be the prefix signed sum projected on the top principal directions of X.
  const int len = 40, d = 3;
  const MatrixF xf = random_matrix(len, d, 21, 1.f);
  const MatrixD x = xf.cast<double>();
  // Stretch the axes so the principal directions are well separated.
  MatrixD xs = x;
  xs.col(0) *= 5;
  xs.col(1) *= 2;
  const MatrixD kernel = xs * xs.transpose();
  WalkBlockTrace t;
  for (int i = 0; i < len; ++i) t.sigma.push_back((i * 7 % 3) ? 1 : -1);
  const MatrixD terms = MatrixD::Ones(len, 1);
  fill_block_trace(t, kernel, terms, 5, 0, 0, 0, 0);
  ASSERT_EQ(static_cast<int>(t.disc_kernel.size()), len);
  ASSERT_EQ(static_cast<int>(t.path.size()), len);
  ASSERT_EQ(static_cast<int>(t.random_path.size()), len);

  Eigen::VectorXd sig(len);
  for (int i = 0; i < len; ++i) sig(i) = t.sigma[i];
  EXPECT_NEAR(t.disc_kernel.back(), std::sqrt(sig.dot(kernel * sig)), 1e-9);
  EXPECT_NEAR(t.disc_query.back(), std::abs(sig.sum()), 1e-12);

  MatrixD centred = xs.rowwise() - xs.colwise().mean();
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eig(centred.transpose() * centred);
  const Eigen::VectorXd sum = xs.transpose() * sig;  // prefix sum of the whole block
  for (int a = 0; a < 2; ++a) {
    const Eigen::VectorXd dir = eig.eigenvectors().col(d - 1 - a);
    EXPECT_NEAR(std::abs(t.path.back()[a]), std::abs(sum.dot(dir)), 1e-8) << "component " << a;
  }
}

// ---- The float32 walk's bits. Speed changes to the CPU float32 walk (tiling, rows read in
// place, block rows reused, prefetching the next block) must not move a sign or a p: the CUDA
// float walk is tested against it and 1656 golden cases against the authors' code. They are
// pinned here by hashes of selections, signs and p, on block lengths and widths that reach every
// edge of the tiles (rows not a multiple of 4 or 6, widths not a multiple of 8, a block shorter
// than B, an overflowing kernel entry, several jobs in one call, top-ups). The hashes are of the
// Gram in feature order with fused multiply-adds (engine/core/simd.h walk_gram_f32, the CUDA
// kernel's order); the earlier 8-lane order gave the same selections and a different p in the last
// bits.
namespace {

struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void add(const void* data, size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
};

uint64_t hash_outcomes(const std::vector<WalkOutcome>& out) {
  Fnv f;
  for (const WalkOutcome& o : out) {
    f.add(o.indices.data(), o.indices.size() * sizeof(int));
    f.add(o.weights.data(), o.weights.size() * sizeof(double));
    f.add(&o.saturated_steps, sizeof(long));
  }
  return f.h;
}

WalkJob walk_job(const MatrixF& keys, const MatrixF& values, int kv_head, int n, int target) {
  WalkJob job;
  job.keys = &keys;
  job.values = &values;
  job.kv_head = kv_head;
  for (int t = 0; t < n; ++t) job.tokens.push_back(t);
  job.target = target;
  return job;
}

// The fused Gram runs when the SIMD table in use has it (not under KVSCOPE_SIMD=sse2; a table
// is only in use where the CPU runs it).
bool float32_walk_uses_avx2() {
  return simd::kernels().walk_gram_f32 != nullptr;
}

}  // namespace

TEST(CpuWalkFloat32, SelectionsAndSignsHashAsBefore) {
  if (!float32_walk_uses_avx2()) GTEST_SKIP() << "hashes are of the fused float32 Gram's bits";
  // Keys with a shared offset, as real keys have; one far-out key overflows exp in its block.
  MatrixF keys = random_matrix(1000, 128, 41, 0.3f, 0.2f);
  const MatrixF values = random_matrix(1000, 128, 42, 0.1f);
  for (int c = 0; c < 128; ++c) keys(300, c) = 12.0f;
  // Two heads in one call: 1000 tokens to 250 (two rounds, the last block short), 777 to 300
  // (a ratio that is not a power of two: two rounds and a top-up).
  const std::vector<WalkJob> jobs = {walk_job(keys, values, 0, 1000, 250),
                                     walk_job(keys, values, 1, 777, 300)};
  const uint64_t two_heads =
      hash_outcomes(run_balance_walks(jobs, 3, 77, BalanceParams{}, nullptr));
  EXPECT_EQ(two_heads, 17156138043989436690ull) << "two heads, d = 128";

  // Widths not a multiple of 8 and blocks of 50 rows (not a multiple of 4).
  const MatrixF k72 = random_matrix(333, 72, 43, 0.35f, -0.1f);
  const MatrixF v40 = random_matrix(333, 40, 44, 0.15f);
  BalanceParams b50;
  b50.block = 50;
  const uint64_t narrow =
      hash_outcomes(run_balance_walks({walk_job(k72, v40, 2, 333, 83)}, 1, 5, b50, nullptr));
  EXPECT_EQ(narrow, 10291668621779200529ull) << "d = 72, dv = 40, B = 50";

  // The op alone: blocks of 37, 128 and 61 rows in one batch, signs and p.
  OneBatch b = make_batch(keys, values, {37, 128, 61}, 9, 4.0);
  b.batch.float32 = true;
  b.batch.value_eps = kAuthorsValueEps;
  cpu_walk_blocks(b.batch);
  Fnv f;
  f.add(b.sigma.data(), b.sigma.size());
  f.add(b.p.data(), b.p.size() * sizeof(float));
  EXPECT_EQ(f.h, 16562020968355184307ull) << "op, blocks 37 + 128 + 61";
}

// Every table with the fused Gram (avx2, and avx512 where the CPU has it: there the kernel rows
// run 16 wide too) walks to the same bits: signs, p and partial sums, overflowing rows included,
// on blocks from 1 row to longer than a Gram panel.
TEST(CpuWalkFloat32, EveryFusedTableWalksToTheSameBits) {
  std::vector<std::string> fused;
  for (const std::string& name : simd::available())
    if (simd::table(name).walk_gram_f32) fused.push_back(name);
  if (fused.size() < 2) GTEST_SKIP() << "this CPU runs one fused table only";
  MatrixF keys = random_matrix(900, 128, 71, 0.3f, 0.2f);
  const MatrixF values = random_matrix(900, 72, 72, 0.4f);
  for (int c = 0; c < 128; ++c) keys(610, c) = 13.0f;  // overflows exp in its block
  const std::vector<int> lengths = {1, 5, 16, 17, 33, 128, 100, 300, 200};
  const std::string before = simd::kernels().name;
  std::vector<OneBatch> runs;
  runs.reserve(fused.size());  // the batches point into their own vectors
  for (const std::string& name : fused) {
    simd::use(name);
    runs.push_back(make_batch(keys, values, lengths, 23, 4.0));
    runs.back().batch.float32 = true;
    runs.back().batch.value_eps = kAuthorsValueEps;
    cpu_walk_blocks(runs.back().batch);
  }
  simd::use(before);
  int nan_rows = 0;
  const int walked = runs[0].offset.back();  // rows past the blocks are not written
  for (size_t t = 1; t < runs.size(); ++t) {
    EXPECT_EQ(runs[t].sigma, runs[0].sigma) << fused[t] << " vs " << fused[0];
    for (int i = 0; i < walked; ++i) {
      ASSERT_EQ(std::memcmp(&runs[t].p[i], &runs[0].p[i], sizeof(float)), 0)
          << fused[t] << " row " << i << ": p " << runs[t].p[i] << " vs " << runs[0].p[i];
      ASSERT_EQ(std::memcmp(&runs[t].partial[i], &runs[0].partial[i], sizeof(float)), 0)
          << fused[t] << " row " << i;
    }
  }
  for (int i = 0; i < walked; ++i) nan_rows += std::isnan(runs[0].p[i]);
  EXPECT_GT(nan_rows, 0) << "the far-out key should overflow float32 in its block";
}

TEST(CpuWalkFloat32, SameSelectionsWhateverIsWalkedAlongside) {
  // Each head alone, both heads in one call, and with traces on (which keep the whole round's
  // prepared rows instead of reusing one block's) give the same kept tokens and weights.
  const MatrixF keys = random_matrix(700, 64, 51, 0.3f, 0.3f);
  const MatrixF values = random_matrix(700, 64, 52, 0.1f);
  const std::vector<WalkJob> jobs = {walk_job(keys, values, 0, 700, 175),
                                     walk_job(keys, values, 1, 431, 150)};
  const std::vector<WalkOutcome> both = run_balance_walks(jobs, 0, 3, BalanceParams{}, nullptr);
  for (size_t j = 0; j < jobs.size(); ++j) {
    const std::vector<WalkOutcome> alone =
        run_balance_walks({jobs[j]}, 0, 3, BalanceParams{}, nullptr);
    EXPECT_EQ(alone[0].indices, both[j].indices) << "head " << j;
    EXPECT_EQ(alone[0].weights, both[j].weights) << "head " << j;
    WalkJob traced = jobs[j];
    traced.trace_query.assign(64, 0.1f);
    const std::vector<WalkOutcome> with_trace =
        run_balance_walks({traced}, 0, 3, BalanceParams{}, nullptr);
    EXPECT_EQ(with_trace[0].indices, both[j].indices) << "head " << j << " traced";
    EXPECT_EQ(with_trace[0].weights, both[j].weights) << "head " << j << " traced";
    EXPECT_FALSE(with_trace[0].trace_blocks.empty());
  }
}
