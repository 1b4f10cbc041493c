#include "engine/geometry/pca.h"

#include <Eigen/Eigenvalues>
#include <algorithm>
#include <cmath>
#include <string>

#include "engine/core/error.h"

namespace kvscope {

PcaResult pca(const MatrixF& x, int k) {
  const Eigen::Index n = x.rows(), d = x.cols();
  if (n == 0 || d == 0) throw InputError("pca: the point set is empty");
  if (k < 1) throw InputError("pca: asked for " + std::to_string(k) + " components (need >= 1)");
  if (!x.allFinite()) throw InputError("pca: the point set holds NaN or Inf");
  const Eigen::Index kk = std::min<Eigen::Index>(k, d);

  // Covariance in double: keys of real models have large common offsets (the reason the walk
  // centres them), and float accumulation of n * offset^2 would swamp the small spread.
  PcaResult r;
  r.mean = x.cast<double>().colwise().mean().transpose();
  MatrixD centred = x.cast<double>().rowwise() - r.mean.transpose();
  MatrixD cov = centred.transpose() * centred;
  if (n > 1) cov /= static_cast<double>(n - 1);
  r.total_variance = cov.trace();

  Eigen::SelfAdjointEigenSolver<MatrixD> eig(cov);
  // Eigen returns eigenvalues in increasing order; take the top kk from the end.
  r.components.resize(kk, d);
  r.explained_variance.resize(kk);
  for (Eigen::Index c = 0; c < kk; ++c) {
    const Eigen::Index col = d - 1 - c;
    VectorD v = eig.eigenvectors().col(col);
    Eigen::Index argmax = 0;
    v.cwiseAbs().maxCoeff(&argmax);
    if (v(argmax) < 0) v = -v;
    r.components.row(c) = v.transpose();
    r.explained_variance(c) = std::max(0.0, eig.eigenvalues()(col));
  }
  r.coords = (centred * r.components.transpose()).cast<float>();
  return r;
}

MatrixF pca_2d(const MatrixF& x) {
  PcaResult r = pca(x, 2);
  if (r.coords.cols() == 2) return r.coords;
  MatrixF out = MatrixF::Zero(r.coords.rows(), 2);
  out.col(0) = r.coords.col(0);
  return out;
}

}  // namespace kvscope
