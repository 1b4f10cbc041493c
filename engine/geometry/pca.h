// Principal component analysis of a point set (rows = points), accumulated in double precision.
// Used for the Geometry view's PCA map, for the t-SNE initialisation, and anywhere a quick linear
// 2-D picture of keys is wanted.
#pragma once

#include "engine/core/tensor.h"

namespace kvscope {

struct PcaResult {
  MatrixF coords;              // n x k: the centred points projected on the components
  MatrixD components;          // k x d: unit principal directions, by decreasing variance
  VectorD explained_variance;  // k: variance along each component (divided by n - 1)
  double total_variance = 0;   // trace of the covariance, so explained / total is the share
  VectorD mean;                // d: the centre that was subtracted
};

// Top-k principal components of x (n x d). k is clamped to min(k, d). Components are unique up to
// sign; the sign is fixed so that each component's largest-magnitude entry is positive, which
// makes results deterministic across runs and platforms. Throws InputError when x is empty,
// k < 1, or x holds NaN/Inf.
PcaResult pca(const MatrixF& x, int k);

// Convenience: the n x 2 PCA map (a single-feature input gets a zero second column).
MatrixF pca_2d(const MatrixF& x);

}  // namespace kvscope
