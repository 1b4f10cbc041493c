// SubGen (Algorithm 1 of the paper): both estimators unbiased on a fixed query, clusters grow in
// number as delta falls, the budget split, and the reservoir weights.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "engine/core/error.h"
#include "engine/methods/method.h"

namespace kvscope {
namespace {

struct Data {
  MatrixF keys, values;
  MethodInput input(int budget, uint64_t seed) const {
    MethodInput in;
    in.keys = &keys;
    in.values = &values;
    in.n = static_cast<int>(keys.rows());
    in.sink = in.mid_begin = 6;
    in.eval = 10;
    in.mid_end = in.n - in.eval;
    in.budget = budget;
    in.seed = seed;
    return in;
  }
};

// Keys around `centres` cluster centres (spread `spread`, noise `noise`), random values.
Data clustered(int n, int d, int centres, float spread, float noise, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  MatrixF c(centres, d);
  for (int i = 0; i < centres; ++i)
    for (int j = 0; j < d; ++j) c(i, j) = spread * normal(gen);
  Data data;
  data.keys.resize(n, d);
  data.values.resize(n, d);
  for (int i = 0; i < n; ++i) {
    const int which = static_cast<int>(gen() % centres);
    for (int j = 0; j < d; ++j) {
      data.keys(i, j) = c(which, j) + noise * normal(gen);
      data.values(i, j) = normal(gen) * (1.0f + (i % 5));  // uneven norms: non-trivial sampling
    }
  }
  return data;
}

const Method& subgen() {
  return *find_method("subgen");
}

int cluster_count(const Selection& sel) {
  std::set<int> ids(sel.cluster.begin(), sel.cluster.end());
  return static_cast<int>(ids.size());
}

// The exact middle sums for query q and the estimates of many seeds: the mean of the estimates
// must be within a few standard errors of the exact value (numerator per coordinate).
void check_unbiased(const Data& data, int budget, ParamValues params, int seeds) {
  std::mt19937 gen(99);
  std::normal_distribution<double> normal(0, 1);
  const int d = static_cast<int>(data.keys.cols());
  Eigen::VectorXd q(d);
  for (int j = 0; j < d; ++j) q[j] = 0.4 * normal(gen);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  MethodInput in = data.input(budget, 0);
  in.params = params;
  auto score = [&](int i) { return std::exp(data.keys.row(i).cast<double>().dot(q) * scale); };
  double den_exact = 0;
  Eigen::VectorXd num_exact = Eigen::VectorXd::Zero(data.values.cols());
  for (int i = in.mid_begin; i < in.mid_end; ++i) {
    den_exact += score(i);
    num_exact += score(i) * data.values.row(i).cast<double>().transpose();
  }
  std::vector<double> den_est;
  std::vector<Eigen::VectorXd> num_est;
  for (int s = 0; s < seeds; ++s) {
    in.seed = 1000 + s;
    const Selection sel = subgen().select(in);
    ASSERT_TRUE(sel.separate);
    double den = 0;
    for (size_t k = 0; k < sel.den_indices.size(); ++k)
      den += sel.den_weights[k] * score(sel.den_indices[k]);
    Eigen::VectorXd num = Eigen::VectorXd::Zero(data.values.cols());
    for (size_t k = 0; k < sel.indices.size(); ++k)
      num += sel.weights[k] * score(sel.indices[k]) *
             data.values.row(sel.indices[k]).cast<double>().transpose();
    den_est.push_back(den);
    num_est.push_back(num);
  }
  auto z_score = [&](const std::vector<double>& xs, double exact) {
    double mean = 0, var = 0;
    for (double x : xs) mean += x;
    mean /= xs.size();
    for (double x : xs) var += (x - mean) * (x - mean);
    var /= (xs.size() - 1);
    const double se = std::sqrt(var / xs.size());
    EXPECT_GT(se, 0.0) << "the estimate does not vary with the seed";
    return (mean - exact) / std::max(se, 1e-300);
  };
  EXPECT_LT(std::abs(z_score(den_est, den_exact)), 4.0) << "denominator";
  for (int c = 0; c < num_exact.size(); ++c) {
    std::vector<double> coord;
    for (const auto& v : num_est) coord.push_back(v[c]);
    EXPECT_LT(std::abs(z_score(coord, num_exact[c])), 4.0) << "numerator coordinate " << c;
  }
}

TEST(SubGen, EstimatorsAreUnbiasedOnAFixedQuery) {
  const Data data = clustered(120, 8, 5, 1.5f, 0.6f, 1);
  check_unbiased(data, 30, {{"t", 2}}, 400);
}

TEST(SubGen, LiteralStreamingReservoirIsUnbiasedToo) {
  const Data data = clustered(90, 6, 4, 1.5f, 0.6f, 2);
  check_unbiased(data, 24, {{"t", 3}, {"literal_reservoir", 1}}, 300);
}

TEST(SubGen, MoreClustersAsDeltaFalls) {
  // Five well separated groups: one cluster for a huge delta, exactly five for a delta between
  // the group diameter and the group distance, more below the group diameter.
  const Data data = clustered(200, 8, 5, 10.f, 0.3f, 3);
  MethodInput in = data.input(184, 1);
  in.params["t"] = 1;
  in.params["split"] = 0.05;
  int previous = 0;
  std::vector<int> counts;
  for (double delta : {1000.0, 6.0, 3.0, 1.5, 1.0, 0.7}) {
    in.params["delta"] = delta;
    const Selection sel = subgen().select(in);
    EXPECT_EQ(sel.note.find("automatic"), std::string::npos) << sel.note;
    const int count = cluster_count(sel);
    EXPECT_GE(count, previous) << "delta " << delta;
    previous = count;
    counts.push_back(count);
  }
  EXPECT_EQ(counts.front(), 1);
  EXPECT_EQ(counts[1], 5);
  EXPECT_GT(counts.back(), 5);
}

TEST(SubGen, AutomaticDeltaMeetsTheBudgetAndWeightsCountTheClusters) {
  const Data data = clustered(300, 8, 12, 3.f, 0.8f, 4);
  for (int m : {2, 10, 40, 140}) {
    for (int t : {1, 2, 4}) {
      MethodInput in = data.input(m, 7);
      in.params["t"] = t;
      const Selection sel = subgen().select(in);
      const int n_mid = in.mid_end - in.mid_begin;
      ASSERT_TRUE(sel.separate);
      EXPECT_LE(static_cast<int>(sel.indices.size() + sel.den_indices.size()), m) << sel.note;
      EXPECT_FALSE(sel.indices.empty());
      EXPECT_FALSE(sel.den_indices.empty());
      // Each cluster's t samples carry n_c/t each: the denominator weights add up to n_mid.
      double den_total = 0;
      for (double w : sel.den_weights) den_total += w;
      EXPECT_NEAR(den_total, n_mid, 1e-9 * n_mid) << sel.note;
      ASSERT_EQ(static_cast<int>(sel.cluster.size()), n_mid);
      // The clustering is what the budget allows: at most the denominator's share of clusters.
      EXPECT_LE(cluster_count(sel), m - static_cast<int>(std::lround(0.5 * m))) << sel.note;
      // Every denominator sample lies in a cluster of its own id's members.
      for (int i : sel.den_indices) EXPECT_GE(sel.cluster[i - in.mid_begin], 0);
    }
  }
}

TEST(SubGen, SmallerDeltaMeansMoreClustersWhenTheBudgetGrows) {
  const Data data = clustered(300, 8, 40, 3.f, 1.0f, 5);
  int previous = 0;
  for (int m : {8, 30, 100, 200}) {
    const Selection sel = subgen().select(data.input(m, 1));
    const int count = cluster_count(sel);
    EXPECT_GE(count, previous) << sel.note;
    previous = count;
  }
  EXPECT_GT(previous, 20);
}

TEST(SubGen, SeedsChangeTheSamplesButNotTheClusters) {
  const Data data = clustered(200, 8, 6, 2.f, 1.f, 6);
  const Selection a = subgen().select(data.input(40, 1));
  const Selection b = subgen().select(data.input(40, 2));
  EXPECT_EQ(a.cluster, b.cluster);
  EXPECT_TRUE(a.indices != b.indices || a.den_indices != b.den_indices);
}

TEST(SubGen, BadParametersAreInputErrors) {
  const Data data = clustered(60, 4, 3, 2.f, 1.f, 7);
  MethodInput in = data.input(10, 1);
  in.params["split"] = 1.5;
  EXPECT_THROW(subgen().select(in), InputError);
  in.params = {{"t", 0}};
  EXPECT_THROW(subgen().select(in), InputError);
  in.params = {{"no_such", 1}};
  EXPECT_THROW(subgen().select(in), InputError);
}

}  // namespace
}  // namespace kvscope
