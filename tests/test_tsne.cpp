// t-SNE: neighbourhood preservation on labelled blobs, Barnes-Hut against the exact gradient,
// the FFT-interpolated repulsion against the exact gradient and Barnes-Hut's maps, the gradient
// against finite differences of the KL divergence, affinities, determinism,
// the AttentionViz joint space, cancellation and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <complex>
#include <cstdio>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/random.h"
#include "engine/core/simd.h"
#include "engine/geometry/knn.h"
#include "engine/geometry/projection_cache.h"
#include "engine/geometry/tsne.h"
#include "engine/ops/backend.h"
#include "engine/ops/tsne_gradient_fft.h"

namespace kvscope {
namespace {

double gaussian(CounterRng& rng) {
  // Box-Muller from the project's counter-based generator.
  const double u1 = std::max(rng.uniform(), 1e-300), u2 = rng.uniform();
  return std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// `blobs` isotropic Gaussian clusters in d dimensions, centres 8 apart on average.
MatrixF gaussian_blobs(int n, int d, int blobs, uint64_t seed, std::vector<int>* labels) {
  CounterRng rng(seed, kRandMisc, 1, 2);
  MatrixF centres(blobs, d);
  for (int b = 0; b < blobs; ++b)
    for (int c = 0; c < d; ++c) centres(b, c) = static_cast<float>(8 * (rng.uniform() - 0.5) * 2);
  MatrixF x(n, d);
  labels->resize(n);
  for (int i = 0; i < n; ++i) {
    const int b = i % blobs;
    (*labels)[i] = b;
    for (int c = 0; c < d; ++c) x(i, c) = centres(b, c) + static_cast<float>(gaussian(rng));
  }
  return x;
}

// The gradient's input for embedding y (n x 2) and affinities p: exact repulsion (theta 0),
// no exaggeration, KL wanted.
TsneGradInput gradient_input(const MatrixF& y, const TsneAffinities& p) {
  TsneGradInput in;
  in.n = static_cast<int>(y.rows());
  in.y = y.data();
  in.p_rowptr = p.rowptr.data();
  in.p_col = p.col.data();
  in.p_val = p.val.data();
  in.theta = 0;
  return in;
}

// Share of points whose nearest embedded neighbour has their label.
double nearest_neighbour_label_agreement(const MatrixF& y, const std::vector<int>& labels) {
  const int n = static_cast<int>(y.rows());
  int agree = 0;
  for (int i = 0; i < n; ++i) {
    int best = -1;
    float best_d = 0;
    for (int j = 0; j < n; ++j) {
      if (j == i) continue;
      const float dd = (y.row(i) - y.row(j)).squaredNorm();
      if (best < 0 || dd < best_d) best = j, best_d = dd;
    }
    agree += labels[best] == labels[i];
  }
  return double(agree) / n;
}

TEST(Tsne, ExactGradientPreservesBlobNeighbourhoods) {
  std::vector<int> labels;
  const MatrixF x = gaussian_blobs(400, 12, 5, 7, &labels);
  TsneParams params;
  params.iterations = 500;
  TsneRun run(x, params);
  EXPECT_EQ(run.theta(), 0.0);                  // small n: exact gradient, all-pairs affinities
  EXPECT_DOUBLE_EQ(run.learning_rate(), 50.0);  // max(400 / 12 / 4, 50)
  run.run_to_end();
  EXPECT_EQ(run.iteration(), 500);
  const double t = trustworthiness(x, run.embedding(), 10);
  EXPECT_GE(t, 0.9);
  EXPECT_GE(nearest_neighbour_label_agreement(run.embedding(), labels), 0.97);
  EXPECT_TRUE(std::isfinite(run.kl()));
  EXPECT_LT(run.kl(), 2.0);
}

TEST(Tsne, BarnesHutPreservesBlobNeighbourhoods) {
  std::vector<int> labels;
  const MatrixF x = gaussian_blobs(1000, 10, 6, 21, &labels);
  TsneParams params;
  params.iterations = 400;
  params.theta = 0.5;  // sparse kNN affinities + quadtree, as for large n
  TsneRun run(x, params);
  EXPECT_EQ(run.theta(), 0.5);
  EXPECT_DOUBLE_EQ(run.learning_rate(), 50.0);  // max(1000 / 12 / 4, 50)
  run.run_to_end();
  EXPECT_GE(trustworthiness(x, run.embedding(), 10), 0.9);
  EXPECT_GE(nearest_neighbour_label_agreement(run.embedding(), labels), 0.97);
}

// Relative error of the Barnes-Hut gradient against the exact one on a converged-looking
// embedding (blobs, so the tree has both near and far cells).
TEST(Tsne, BarnesHutGradientApproachesExact) {
  std::vector<int> labels;
  const MatrixF x = gaussian_blobs(1000, 8, 4, 3, &labels);
  TsneParams params;
  params.iterations = 300;
  params.theta = 0.5;
  TsneRun run(x, params);
  run.run_to_end();
  const MatrixF y = run.embedding();
  const TsneAffinities p = tsne_affinities(x, 30, 91);

  auto gradient = [&](double theta, double* kl) {
    TsneGradInput in = gradient_input(y, p);
    in.theta = theta;
    MatrixF g(y.rows(), 2);
    *kl = cpu_tsne_gradient(in, g.data());
    return g;
  };
  double kl_exact, kl_05, kl_02;
  const MatrixF exact = gradient(0, &kl_exact);
  const MatrixF bh05 = gradient(0.5, &kl_05);
  const MatrixF bh02 = gradient(0.2, &kl_02);
  const double err05 = (bh05 - exact).norm() / exact.norm();
  const double err02 = (bh02 - exact).norm() / exact.norm();
  RecordProperty("bh_error_theta_0.5", std::to_string(err05));
  RecordProperty("bh_error_theta_0.2", std::to_string(err02));
  std::printf("Barnes-Hut gradient relative error: theta 0.5: %.4f, theta 0.2: %.4f\n", err05,
              err02);
  EXPECT_LT(err05, 0.1);
  EXPECT_LT(err02, 0.5 * err05);
  EXPECT_NEAR(kl_05, kl_exact, 0.02 * kl_exact);
  EXPECT_NEAR(kl_02, kl_exact, 0.005 * kl_exact);
}

// The FFT-interpolated repulsion (FIt-SNE) against the exact gradient on the same embedding: a
// small relative error on the whole gradient and on the KL divergence (through Z).
TEST(Tsne, FftGradientApproachesExact) {
  std::vector<int> labels;
  const MatrixF x = gaussian_blobs(1500, 8, 5, 4, &labels);
  TsneParams params;
  params.iterations = 200;
  params.theta = 0.5;
  TsneRun run(x, params);
  run.run_to_end();
  const MatrixF y = run.embedding();
  const TsneAffinities p = tsne_affinities(x, 30, 91);
  const TsneGradInput in = gradient_input(y, p);
  MatrixF exact(y.rows(), 2), fft(y.rows(), 2);
  const double kl_exact = cpu_tsne_gradient(in, exact.data());
  TsneFftRepulsion repulsion;
  const double kl_fft = fft_tsne_gradient(in, fft.data(), repulsion);
  const double err = (fft - exact).norm() / exact.norm();
  std::printf("FFT gradient relative error %.5f (FFT side %d, box %.3f); KL %.5f vs %.5f\n", err,
              repulsion.last_fft_side(), repulsion.last_box(), kl_fft, kl_exact);
  EXPECT_LT(err, 0.01);
  EXPECT_NEAR(kl_fft, kl_exact, 1e-3 * kl_exact);
  // A coarser grid (boxes of side about 1 here, 8 per side) is less accurate: the error is the
  // interpolation's, not the float FFT's.
  TsneFftParams coarse;
  coarse.max_box = 2;
  coarse.min_boxes = 8;
  TsneFftRepulsion coarse_repulsion(coarse);
  MatrixF fft_coarse(y.rows(), 2);
  fft_tsne_gradient(in, fft_coarse.data(), coarse_repulsion);
  const double err_coarse = (fft_coarse - exact).norm() / exact.norm();
  std::printf("coarse grid (FFT side %d, box %.3f): %.5f\n", coarse_repulsion.last_fft_side(),
              coarse_repulsion.last_box(), err_coarse);
  EXPECT_GT(err_coarse, 2 * err);
  // Same bound as Barnes-Hut at theta 0.5 above: the coarse error depends on the embedding the
  // 200 iterations reach (4.3% and 6.5% with two attraction kernels that differ only in float
  // rounding).
  EXPECT_LT(err_coarse, 0.1);
  // The FFT sides have no prime factor above 5.
  for (int side : {repulsion.last_fft_side(), coarse_repulsion.last_fft_side()}) {
    for (int f : {2, 3, 5})
      while (side % f == 0) side /= f;
    EXPECT_EQ(side, 1);
  }
}

// Above fft_threshold points the automatic mode switches to the FFT repulsion on the CPU; its
// map keeps the blobs' neighbourhoods as well as Barnes-Hut's does.
TEST(Tsne, FftPreservesBlobNeighbourhoodsLikeBarnesHut) {
  std::vector<int> labels;
  const MatrixF x = gaussian_blobs(1100, 10, 6, 17, &labels);
  TsneParams params;
  params.iterations = 300;
  params.fft_threshold = 1000;  // so that this small set takes the FFT path
  TsneRun fft_run(x, params);
  EXPECT_EQ(fft_run.gradient_name(), "FFT interpolation");
  fft_run.run_to_end();
  params.theta = 0.5;
  TsneRun bh_run(x, params);
  EXPECT_EQ(bh_run.gradient_name(), "Barnes-Hut");
  bh_run.run_to_end();
  const double t_fft = trustworthiness(x, fft_run.embedding(), 10);
  const double t_bh = trustworthiness(x, bh_run.embedding(), 10);
  std::printf("trustworthiness: FFT %.4f, Barnes-Hut %.4f\n", t_fft, t_bh);
  EXPECT_GE(t_fft, 0.9);
  EXPECT_NEAR(t_fft, t_bh, 0.01);
  EXPECT_GE(nearest_neighbour_label_agreement(fft_run.embedding(), labels), 0.97);
}

TEST(Tsne, ExactGradientIsTheDerivativeOfKl) {
  std::vector<int> labels;
  const MatrixF x = gaussian_blobs(60, 5, 3, 9, &labels);
  const TsneAffinities p = tsne_affinities(x, 10, 0);
  CounterRng rng(4, kRandMisc, 0, 0);
  MatrixF y(60, 2);
  for (int i = 0; i < y.size(); ++i) y.data()[i] = static_cast<float>(2 * gaussian(rng));

  auto kl_and_grad = [&](const MatrixF& at, MatrixF* g) {
    const TsneGradInput in = gradient_input(at, p);
    MatrixF scratch(60, 2);
    return cpu_tsne_gradient(in, g ? g->data() : scratch.data());
  };
  MatrixF g(60, 2);
  kl_and_grad(y, &g);
  const float h = 1e-2f;
  for (int probe : {0, 17, 59}) {
    for (int c = 0; c < 2; ++c) {
      MatrixF plus = y, minus = y;
      plus(probe, c) += h;
      minus(probe, c) -= h;
      const double numeric = (kl_and_grad(plus, nullptr) - kl_and_grad(minus, nullptr)) / (2 * h);
      EXPECT_NEAR(g(probe, c), numeric, 2e-3 * std::abs(numeric) + 1e-5)
          << "point " << probe << " coord " << c;
    }
  }
}

TEST(Tsne, AffinitiesAreSymmetricAndNormalised) {
  std::vector<int> labels;
  const MatrixF x = gaussian_blobs(300, 6, 3, 5, &labels);
  for (int neighbours : {0, 60}) {
    const TsneAffinities p = tsne_affinities(x, 20, neighbours);
    ASSERT_EQ(p.n, 300);
    double total = 0;
    MatrixD dense = MatrixD::Zero(300, 300);
    for (int i = 0; i < 300; ++i)
      for (int k = p.rowptr[i]; k < p.rowptr[i + 1]; ++k) {
        ASSERT_NE(p.col[k], i);
        ASSERT_GE(p.val[k], 0.f);
        dense(i, p.col[k]) = p.val[k];
        total += p.val[k];
      }
    EXPECT_NEAR(total, 1.0, 1e-4);
    EXPECT_LT((dense - dense.transpose()).cwiseAbs().maxCoeff(), 1e-9);
    // Each conditional row sums to 1, so row sums of P average 1/n.
    EXPECT_NEAR(dense.rowwise().sum().mean(), 1.0 / 300, 1e-7);
  }
  // Perplexity is clamped for tiny inputs and reported.
  const TsneAffinities tiny = tsne_affinities(x.topRows(10), 30, 0);
  EXPECT_DOUBLE_EQ(tiny.perplexity, 3.0);
}

// In more than 32 dimensions the neighbours come from the blocked brute force instead of the k-d
// tree: zero-padding the same points to 40 dimensions must give the same affinities up to the
// float rounding of the two distance formulas.
TEST(Tsne, BruteForceNeighboursMatchTheTree) {
  std::vector<int> labels;
  const MatrixF x = gaussian_blobs(600, 32, 4, 19, &labels);
  MatrixF padded = MatrixF::Zero(x.rows(), 40);
  padded.leftCols(32) = x;
  const TsneAffinities tree = tsne_affinities(x, 30, 91);
  const TsneAffinities brute = tsne_affinities(padded, 30, 91);
  ASSERT_EQ(tree.rowptr.size(), brute.rowptr.size());
  double diff = 0, total = 0;
  for (int i = 0; i < tree.n; ++i) {
    std::map<int, float> row;
    for (int k = brute.rowptr[i]; k < brute.rowptr[i + 1]; ++k) row[brute.col[k]] = brute.val[k];
    for (int k = tree.rowptr[i]; k < tree.rowptr[i + 1]; ++k) {
      auto it = row.find(tree.col[k]);
      diff += std::abs(tree.val[k] - (it == row.end() ? 0.f : it->second));
      total += tree.val[k];
    }
  }
  EXPECT_LT(diff, 1e-3 * total);
}

// The tiled brute-force kNN (engine/geometry/knn.h) against a plain double-precision ranking of all
// pairs: 1300 points (three 512-row blocks, a partial one), some duplicated rows.
TEST(Tsne, BruteForceNeighboursAreTheExactOnes) {
  std::vector<int> labels;
  MatrixF x = gaussian_blobs(1300, 48, 6, 23, &labels);
  for (int i = 0; i < 40; ++i) x.row(1000 + i) = x.row(3 * i);  // exact duplicates
  const int n = static_cast<int>(x.rows()), k = 25;
  std::vector<int> nb;
  std::vector<float> d2;
  knn_exact(x, k, nb, d2);
  int mismatched = 0;
  for (int i = 0; i < n; ++i) {
    std::vector<std::pair<double, int>> all;
    for (int j = 0; j < n; ++j)
      if (j != i) all.emplace_back((x.row(i) - x.row(j)).cast<double>().squaredNorm(), j);
    std::sort(all.begin(), all.end());
    const double kth = all[k - 1].first;
    for (int r = 0; r < k; ++r) {
      const int j = nb[static_cast<size_t>(i) * k + r];
      ASSERT_NE(j, i);
      const double truth = (x.row(i) - x.row(j)).cast<double>().squaredNorm();
      // Every returned neighbour is within float rounding of the true k-th distance, and its
      // distance is the true one to float rounding of the GEMM form.
      EXPECT_LE(truth, kth * (1 + 1e-4) + 1e-4);
      EXPECT_NEAR(d2[static_cast<size_t>(i) * k + r], truth, 1e-4 * kth + 1e-3);
      if (r > 0) {
        EXPECT_LE(d2[static_cast<size_t>(i) * k + r - 1], d2[static_cast<size_t>(i) * k + r]);
      }
      bool in_true_set = false;
      for (int t = 0; t < k; ++t) in_true_set |= all[t].second == j;
      mismatched += !in_true_set;
    }
  }
  // Set differences only where the k-th and (k+1)-th distances tie to float rounding.
  EXPECT_LT(mismatched, n * k / 200);
  // A duplicated row's first neighbour is its twin, at distance 0 up to the GEMM form's rounding
  // (squared norms here are about 1000).
  for (int i = 0; i < 40; ++i) {
    EXPECT_EQ(nb[static_cast<size_t>(1000 + i) * k], 3 * i);
    EXPECT_LT(d2[static_cast<size_t>(1000 + i) * k], 1e-2f);
  }
  EXPECT_THROW(knn_exact(x, 0, nb, d2), InputError);
  EXPECT_THROW(knn_exact(x, n, nb, d2), InputError);
}

TEST(Tsne, DeterministicAcrossRunsAndSteps) {
  std::vector<int> labels;
  const MatrixF x = gaussian_blobs(400, 6, 4, 13, &labels);
  TsneParams params;
  params.iterations = 120;
  params.exaggeration_iterations = 60;
  const MatrixF a = tsne(x, params);
  // Same run, stepped in uneven chunks as the view does.
  TsneRun run(x, params);
  while (!run.done()) run.step(7);
  EXPECT_EQ(run.iteration(), 120);
  EXPECT_EQ((a - run.embedding()).cwiseAbs().maxCoeff(), 0.f);
  // Barnes-Hut is deterministic too (threads reduce in index order).
  params.theta = 0.5;
  EXPECT_EQ((tsne(x, params) - tsne(x, params)).cwiseAbs().maxCoeff(), 0.f);
}

TEST(Tsne, CancelStopsTheRun) {
  std::vector<int> labels;
  const MatrixF x = gaussian_blobs(100, 4, 2, 1, &labels);
  std::atomic<bool> cancel{false};
  TsneParams params;
  params.iterations = 100;
  TsneRun run(x, params, nullptr, &cancel);
  EXPECT_EQ(run.step(10), 10);
  cancel = true;
  EXPECT_EQ(run.step(10), 0);
  EXPECT_TRUE(run.done());
  EXPECT_THROW(run.run_to_end(), Cancelled);
  EXPECT_THROW(TsneRun(x, params, nullptr, &cancel), Cancelled);
}

TEST(Tsne, JointSpaceKeepsEveryQueriesSoftmax) {
  CounterRng rng(2, kRandMisc, 0, 0);
  MatrixF keys(40, 8), queries(30, 8);
  for (int i = 0; i < keys.size(); ++i) keys.data()[i] = static_cast<float>(3 + gaussian(rng));
  for (int i = 0; i < queries.size(); ++i)
    queries.data()[i] = static_cast<float>(0.2 * gaussian(rng) - 1);
  const MatrixF joint = joint_keys_queries(keys, queries);
  ASSERT_EQ(joint.rows(), 70);
  const MatrixF k2 = joint.topRows(40), q2 = joint.bottomRows(30);
  // Same centroid, same mean norm... (scaling first, then translation, so norms are compared
  // before the shift; the centroid equality is exact).
  EXPECT_LT((k2.colwise().mean() - q2.colwise().mean()).norm(), 1e-4);
  // Logits change by a per-query constant only: softmax unchanged.
  const MatrixD before = (queries * keys.transpose()).cast<double>();
  const MatrixD after = (q2 * k2.transpose()).cast<double>();
  for (int q = 0; q < 30; ++q) {
    const Eigen::RowVectorXd diff = after.row(q) - before.row(q);
    EXPECT_LT(diff.maxCoeff() - diff.minCoeff(), 1e-3 * before.row(q).cwiseAbs().maxCoeff());
  }
  JointOptions none;
  none.translate = false;
  none.scale = false;
  const MatrixF raw = joint_keys_queries(keys, queries, none);
  EXPECT_EQ((raw.topRows(40) - keys).cwiseAbs().maxCoeff(), 0.f);
  EXPECT_THROW(joint_keys_queries(keys, queries.leftCols(4)), InputError);
}

TEST(Tsne, TrustworthinessSeparatesGoodFromBadMaps) {
  std::vector<int> labels;
  const MatrixF x = gaussian_blobs(300, 2, 3, 8, &labels);
  EXPECT_NEAR(trustworthiness(x, x, 10), 1.0, 1e-12);
  CounterRng rng(6, kRandMisc, 0, 0);
  MatrixF noise(300, 2);
  for (int i = 0; i < noise.size(); ++i) noise.data()[i] = static_cast<float>(rng.uniform());
  EXPECT_LT(trustworthiness(x, noise, 10), 0.7);
  EXPECT_THROW(trustworthiness(x, noise, 200), InputError);
}

TEST(Tsne, BadInputIsAnInputError) {
  EXPECT_THROW(tsne_affinities(MatrixF::Ones(2, 3), 30, 0), InputError);
  MatrixF x = MatrixF::Random(20, 3);
  x(3, 2) = INFINITY;
  EXPECT_THROW(tsne_affinities(x, 30, 0), InputError);
  EXPECT_THROW(tsne_affinities(MatrixF::Random(20, 3), -1, 0), InputError);
  TsneParams bad;
  bad.iterations = -5;
  EXPECT_THROW(TsneRun(MatrixF::Random(20, 3), bad), InputError);
}

TEST(Tsne, CoincidentPointsDoNotBreakTheTree) {
  // Many duplicates: the quadtree must stop splitting and the run must stay finite.
  MatrixF x(300, 3);
  for (int i = 0; i < 300; ++i) x.row(i) << float(i % 3), float(i % 3 == 1), 0.f;
  TsneParams params;
  params.iterations = 50;
  params.exaggeration_iterations = 20;
  params.theta = 0.5;
  const MatrixF y = tsne(x, params);
  EXPECT_TRUE(y.allFinite());
}

// The stepped run the Geometry view uses reports how its repulsion was computed, as the one-shot
// compute_projection does (the view's caption and JSON show it).
TEST(ProjectionCache, SteppedRunNamesItsGradient) {
  std::vector<int> labels;
  const MatrixF points = gaussian_blobs(300, 6, 3, 5, &labels);
  TsneParams params;
  params.iterations = 30;
  params.theta = 0.5;
  const Projection p = run_tsne_projection(points, params, nullptr, nullptr, 0.0, {});
  EXPECT_EQ(p.gradient, "Barnes-Hut");
  EXPECT_EQ(p.iterations, 30);
  params.theta = 0.0;
  EXPECT_EQ(run_tsne_projection(points, params, nullptr, nullptr, 0.0, {}).gradient,
            "exact gradient");
}

TEST(ProjectionCache, KeysNameEveryParameterAndEvictOldest) {
  ProjectionRequest a;
  ProjectionRequest b = a;
  b.tsne.perplexity = 31;
  ProjectionRequest c = a;
  c.with_queries = true;
  ProjectionRequest d = a;
  d.method = ProjectionMethod::Pca;
  const std::string ka = projection_key("x.safetensors", 1, 2, a);
  EXPECT_NE(ka, projection_key("x.safetensors", 1, 2, b));
  EXPECT_NE(ka, projection_key("x.safetensors", 1, 2, c));
  EXPECT_NE(ka, projection_key("x.safetensors", 1, 2, d));
  EXPECT_NE(ka, projection_key("x.safetensors", 1, 3, a));
  EXPECT_NE(ka, projection_key("y.safetensors", 1, 2, a));
  EXPECT_EQ(ka, projection_key("x.safetensors", 1, 2, a));

  ProjectionCache cache(2);
  auto p1 = std::make_shared<Projection>();
  auto p2 = std::make_shared<Projection>();
  auto p3 = std::make_shared<Projection>();
  cache.put("one", p1);
  cache.put("two", p2);
  EXPECT_EQ(cache.find("one"), p1);  // now the most recent
  cache.put("three", p3);            // evicts "two"
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.find("two"), nullptr);
  EXPECT_EQ(cache.find("one"), p1);
  EXPECT_EQ(cache.find("three"), p3);
}

TEST(ProjectionCache, InputChecksNameTheProblem) {
  CaptureInfo info;
  info.path = "mem.safetensors";
  info.q_heads = 4;
  info.kv_heads = 2;
  LayerData layer;
  layer.layer = 3;
  CounterRng rng(8, kRandMisc, 0, 0);
  for (int h = 0; h < 2; ++h) {
    MatrixF k(50, 4);
    for (int i = 0; i < k.size(); ++i) k.data()[i] = static_cast<float>(gaussian(rng));
    layer.keys.push_back(k);
  }
  layer.refused = {"", "NaN in layers.3.key head 1"};
  ProjectionRequest req;
  req.method = ProjectionMethod::Pca;
  EXPECT_EQ(projection_input(info, layer, 0, req).rows(), 50);
  try {
    projection_input(info, layer, 1, req);
    ADD_FAILURE() << "refused head accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("NaN in layers.3.key head 1"), std::string::npos);
  }
  EXPECT_THROW(projection_input(info, layer, 2, req), InputError);
  req.with_queries = true;
  EXPECT_THROW(projection_input(info, layer, 0, req), InputError);  // no queries captured
  layer.refused = {"", ""};
  for (int h = 0; h < 4; ++h) layer.queries.push_back(layer.keys[h / 2] * 0.5f);
  int used = -1;
  EXPECT_EQ(projection_input(info, layer, 1, req, &used).rows(), 100);
  EXPECT_EQ(used, 2);  // first query head of kv head 1's group
  req.query_head = 1;  // belongs to kv head 0
  EXPECT_THROW(projection_input(info, layer, 1, req), InputError);
  ProjectionRequest pca_request;
  pca_request.method = ProjectionMethod::Pca;
  const Projection p = compute_projection(info, layer, 0, pca_request);
  EXPECT_EQ(p.coords.rows(), 50);
  EXPECT_GT(p.explained[0], 0.0);
  EXPECT_GE(p.explained[0], p.explained[1]);
}

// The AVX2 attraction and KL rows (the default where the CPU has AVX2) against the portable
// scalar ones: the same float terms summed in another order, so agreement to float rounding.
TEST(Tsne, Avx2AttractionMatchesPortable) {
  std::vector<int> labels;
  const MatrixF x = gaussian_blobs(1200, 8, 4, 3, &labels);
  const TsneAffinities p = tsne_affinities(x, 30, 91);
  MatrixF y(x.rows(), 2);
  std::mt19937 rng(3);
  std::normal_distribution<float> g(0.f, 5.f);
  for (Eigen::Index i = 0; i < y.size(); ++i) y.data()[i] = g(rng);
  TsneGradInput in = gradient_input(y, p);
  in.exaggeration = 12;  // the attraction dominates the gradient
  in.want_kl = true;
  MatrixF fast(y.rows(), 2), portable(y.rows(), 2), fast16(y.rows(), 2);
  const double kl_fast = cpu_tsne_gradient(in, fast.data());
  // 16-bit columns (what TsneRun passes when n <= 65536): the same terms, bit for bit.
  const std::vector<uint16_t> col16(p.col.begin(), p.col.end());
  in.p_col16 = col16.data();
  EXPECT_EQ(cpu_tsne_gradient(in, fast16.data()), kl_fast);
  EXPECT_EQ(fast16, fast);
  in.p_col16 = nullptr;
  const bool before = set_cpu_tsne_simd(false);
  const double kl_portable = cpu_tsne_gradient(in, portable.data());
  set_cpu_tsne_simd(before);
  EXPECT_LT((fast - portable).norm() / portable.norm(), 1e-5);
  EXPECT_NEAR(kl_fast, kl_portable, 1e-5 * std::abs(kl_portable));
  // The AVX2 rows run when the SIMD table in use has AVX2 (not under KVSCOPE_SIMD=sse2).
  const std::string table = simd::kernels().name;
  if (table == "avx2" || table == "avx512")
    EXPECT_GT((fast - portable).cwiseAbs().maxCoeff(), 0.f) << "both runs took the same path";
  else
    EXPECT_EQ(fast, portable);
}

// The FFT under the repulsion (mixed radix 4, 2, 3, 5, 16 lanes, depth first, pruned to the live
// inputs and the kept outputs) against the O(M^2) circular convolution, on every size with no
// prime factor above 5 up to 160 and the sides the 32k-key runs use, full and pruned as
// convolve() prunes it (half the entries live, half the outputs kept) and to the extremes.
TEST(Tsne, FftCircularConvolutionMatchesDirectSum) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<int> sizes;
  for (int m = 1; m <= 160; ++m) {
    int r = m;
    for (int f : {2, 3, 5})
      while (r % f == 0) r /= f;
    if (r == 1) sizes.push_back(m);
  }
  for (int m : {300, 640, 675}) sizes.push_back(m);
  int checked = 0;
  for (int M : sizes) {
    std::vector<std::complex<float>> x(M), kernel(M);
    for (auto& k : kernel) k = {u(rng), u(rng)};
    const int half = (M + 1) / 2;
    for (auto [live, keep] : {std::pair{M, M}, {half, half}, {1, M}, {M, 1}, {0, M}}) {
      for (int t = 0; t < M; ++t) x[t] = t < live ? std::complex<float>(u(rng), u(rng)) : 0.f;
      const std::vector<std::complex<double>> got =
          tsne_fft_circular_convolution(x, kernel, live, keep);
      ASSERT_EQ(got.size() % std::max(keep, 1), 0u);
      double err = 0, norm = 0;
      for (int t = 0; t < keep; ++t) {
        std::complex<double> want = 0;
        for (int s = 0; s < M; ++s)
          want += std::complex<double>(x[s]) * std::complex<double>(kernel[(t - s + M) % M]);
        norm += std::norm(want);
        for (size_t lane = 0; lane < got.size() / keep; ++lane)
          err = std::max(err, std::abs(got[lane * keep + t] - want));
      }
      const double scale = std::sqrt(norm / std::max(keep, 1)) + 1e-30;
      EXPECT_LT(err, 1e-5 * std::sqrt(double(M)) * scale + (live == 0 ? 1e-30 : 0))
          << "M " << M << " live " << live << " keep " << keep;
      if (live == 0) {
        EXPECT_EQ(err, 0.0) << "M " << M;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 150);
  EXPECT_THROW(tsne_fft_circular_convolution(std::vector<std::complex<float>>(7),
                                             std::vector<std::complex<float>>(7), 7, 7),
               std::logic_error);
}

}  // namespace
}  // namespace kvscope
