// FFT-accelerated interpolation of the t-SNE repulsive forces (Linderman, Rachh, Hoskins,
// Steinerberger & Kluger, "Fast interpolation-based t-SNE for improved visualization of single-cell
// RNA-seq data", Nature Methods 2019 -- FIt-SNE; the same scheme as openTSNE's
// "fft" negative-gradient method), for long captures where Barnes-Hut is too slow.
//
// The repulsion needs, for every point i, sum_j w_ij^2 (y_i - y_j) and Z = sum_{i != j} w_ij with
// w_ij = 1 / (1 + |y_i - y_j|^2). Both are sums of the smooth kernel K(a, b) = w(a, b)^2 against
// four charges per point (1, y_x, y_y, |y|^2), since w^2 (1 + |y_i - y_j|^2) = w:
//   phi_c(i) = sum_j K(y_i, y_j) charge_c(j)
//   repulsion_i = y_i phi_0(i) - (phi_1(i), phi_2(i))
//   Z = sum_i [(1 + |y_i|^2) phi_0(i) - 2 y_i . (phi_1(i), phi_2(i)) + phi_3(i)] - n
// (the j = i terms add exactly 1 to each Z_i and nothing to the force). The sums are computed by
//  1. splitting the embedding's bounding square into B x B boxes of side h, each with p x p
//     equispaced interpolation nodes (p = 3);
//  2. spreading the charges onto the nodes with the Lagrange polynomials of each point's box;
//  3. convolving the node charges with K sampled on the node lattice, by a 2-D FFT of the
//     zero-padded grid (a Toeplitz product embedded in a circulant one; radix-2, written here);
//  4. interpolating the node potentials back to the points with the same Lagrange weights.
// Cost per iteration O(n p^2 + M^2 log M) with M the padded FFT side; memory O(n + M^2).
// Accuracy is that of the interpolation of K over a box (h <= 1 by default, as FIt-SNE's
// intervals_per_integer = 1): about 1e-3 relative on the force (test_tsne compares it to the
// exact gradient).
#pragma once

#include <memory>

#include "engine/backend.h"

namespace kvscope {

struct TsneFftParams {
  int nodes_per_box = 3;  // p
  int min_boxes = 50;     // per side
  double max_box = 1.0;   // largest box side h (embedding units)
};

// The repulsive sums of one embedding, with what can be kept from one iteration to the next (the
// FFT tables and the kernel's spectrum). One instance per t-SNE run; not thread-safe.
class TsneFftRepulsion {
 public:
  explicit TsneFftRepulsion(const TsneFftParams& params = {});
  ~TsneFftRepulsion();
  // rep[2i..2i+1] = sum_j w_ij^2 (y_i - y_j), z_each[i] = sum_{j != i} w_ij (y: n x 2), in
  // buffers owned by this object (valid until the next call).
  struct Sums {
    const double* rep;
    const double* z_each;
  };
  Sums compute(const float* y, int n);
  int last_fft_side() const { return last_fft_side_; }    // M of the latest call
  double last_box() const { return last_box_; }           // h of the latest call
  int kernel_updates() const { return kernel_updates_; }  // spectra computed so far

 private:
  struct State;
  TsneFftParams params_;
  std::unique_ptr<State> state_;
  int last_fft_side_ = 0;
  double last_box_ = 0;
  int kernel_updates_ = 0;
};

// The gradient of KL(P || Q), with the same definition and return value as cpu_tsne_gradient
// (whose theta is ignored here), the repulsion from `repulsion`. Defined in tsne.cpp next to the
// attractive term it shares.
double fft_tsne_gradient(const TsneGradInput& in, float* grad, TsneFftRepulsion& repulsion);

}  // namespace kvscope
