// PCA against Eigen's SVD of the centred matrix, sign convention, and bad input.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/core/error.h"
#include "engine/core/random.h"
#include "engine/geometry/pca.h"

namespace kvscope {
namespace {

// Points with a known anisotropic spread: column c scaled by (c + 1), then rotated.
MatrixF anisotropic_points(int n, int d, uint64_t seed, float offset) {
  CounterRng rng(seed, kRandMisc, 0, 0);
  MatrixF x(n, d);
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < d; ++c) x(i, c) = static_cast<float>((rng.uniform() - 0.5) * (c + 1));
  // A fixed rotation so the components are not the coordinate axes.
  MatrixD a(d, d);
  for (int r = 0; r < d; ++r)
    for (int c = 0; c < d; ++c) a(r, c) = std::sin(1.0 + r * 7 + c * 3);
  Eigen::HouseholderQR<MatrixD> qr(a);
  MatrixD q = qr.householderQ();
  MatrixF out = (x.cast<double>() * q).cast<float>();
  out.array() += offset;
  return out;
}

TEST(Pca, MatchesSvdOfCentredMatrix) {
  const int n = 400, d = 6;
  const MatrixF x = anisotropic_points(n, d, 11, 0.f);
  const PcaResult r = pca(x, 3);
  ASSERT_EQ(r.coords.rows(), n);
  ASSERT_EQ(r.coords.cols(), 3);

  MatrixD centred = x.cast<double>().rowwise() - x.cast<double>().colwise().mean();
  Eigen::JacobiSVD<MatrixD> svd(centred, Eigen::ComputeThinU | Eigen::ComputeThinV);
  for (int c = 0; c < 3; ++c) {
    const double s = svd.singularValues()(c);
    EXPECT_NEAR(r.explained_variance(c), s * s / (n - 1), 1e-6 * s * s);
    // Same direction up to sign.
    const VectorD v = svd.matrixV().col(c);
    const double cosine = std::abs(r.components.row(c).dot(v.transpose()));
    EXPECT_NEAR(cosine, 1.0, 1e-9);
    // Coordinates are U * S up to the same sign.
    const double sign = r.components.row(c).dot(v.transpose()) > 0 ? 1.0 : -1.0;
    const VectorD expected = svd.matrixU().col(c) * s * sign;
    EXPECT_LT((r.coords.col(c).cast<double>() - expected).norm(), 1e-4 * expected.norm());
  }
  EXPECT_NEAR(r.total_variance, svd.singularValues().squaredNorm() / (n - 1),
              1e-9 * r.total_variance);
  // Decreasing variance.
  EXPECT_GE(r.explained_variance(0), r.explained_variance(1));
  EXPECT_GE(r.explained_variance(1), r.explained_variance(2));
}

TEST(Pca, SignConventionMakesLargestEntryPositive) {
  const MatrixF x = anisotropic_points(200, 5, 3, 0.f);
  const PcaResult r = pca(x, 5);
  for (int c = 0; c < 5; ++c) {
    Eigen::Index at = 0;
    r.components.row(c).cwiseAbs().maxCoeff(&at);
    EXPECT_GT(r.components(c, at), 0.0) << "component " << c;
  }
  // Negating the data flips the coordinates but not the components.
  const PcaResult neg = pca(-x, 2);
  EXPECT_LT((neg.components - r.components.topRows(2)).norm(), 1e-9);
  EXPECT_LT((neg.coords + r.coords.leftCols(2)).norm(), 1e-3);
}

TEST(Pca, LargeCommonOffsetDoesNotHurt) {
  // Real keys carry large shared offsets; double accumulation keeps the spread exact.
  const MatrixF small = anisotropic_points(300, 4, 5, 0.f);
  const MatrixF shifted = anisotropic_points(300, 4, 5, 1000.f);
  const PcaResult a = pca(small, 2), b = pca(shifted, 2);
  for (int c = 0; c < 2; ++c) {
    EXPECT_NEAR(std::abs(a.components.row(c).dot(b.components.row(c))), 1.0, 1e-4);
    EXPECT_NEAR(a.explained_variance(c), b.explained_variance(c), 2e-3 * a.explained_variance(c));
  }
}

TEST(Pca, TwoDimensionalMapAndClamping) {
  const MatrixF x = anisotropic_points(50, 3, 9, 0.f);
  EXPECT_EQ(pca(x, 10).coords.cols(), 3);  // k clamped to d
  const MatrixF m = pca_2d(x);
  EXPECT_EQ(m.rows(), 50);
  EXPECT_EQ(m.cols(), 2);
  MatrixF one_feature = x.leftCols(1);
  const MatrixF m1 = pca_2d(one_feature);
  EXPECT_EQ(m1.cols(), 2);
  EXPECT_EQ(m1.col(1).cwiseAbs().maxCoeff(), 0.f);
}

TEST(Pca, BadInputIsAnInputError) {
  EXPECT_THROW(pca(MatrixF(0, 3), 2), InputError);
  MatrixF x = MatrixF::Ones(5, 3);
  EXPECT_THROW(pca(x, 0), InputError);
  x(2, 1) = std::nanf("");
  EXPECT_THROW(pca(x, 2), InputError);
}

}  // namespace
}  // namespace kvscope
