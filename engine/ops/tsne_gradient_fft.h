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
//  2. spreading the charges onto the nodes with the Lagrange polynomials of each point's box
//     (the points taken in the order of their box's row, a counting sort, so the node grid is
//     swept rather than hit at random; two threads on the two halves of the box rows, which own
//     disjoint node rows; the 4 charges of a node interleaved);
//  3. convolving the node charges with K sampled on the node lattice, by a 2-D FFT of the
//     zero-padded grid (a Toeplitz product embedded in a circulant one). The FFT is written here:
//     mixed radix (4, 2, 3, 5) in float, 16 transforms side by side across the lanes of a strip
//     (butterflies on 8-float vectors), stages run depth first so a block's later passes stay in
//     L1, the first forward and last inverse stage pruned to the N of M entries that are nonzero
//     or wanted; the column transforms run in place, the row transforms on 16 rows at a time
//     copied (8 x 8 register transposes) into an L2-sized strip where the forward transform, the
//     product with the kernel's (real) spectrum and the inverse run fused, so the grid is never
//     transposed. The 4 real charges are packed as 2 complex grids (1 + i y_x, y_y + i |y|^2: the
//     kernel's spectrum is real, so real and imaginary parts never mix), one thread each;
//  4. interpolating the node potentials (interleaved again) back to the points with the same
//     Lagrange weights.
// Grid sizing as FIt-SNE's defaults: boxes of side h <= 1 (intervals_per_integer = 1), at least
// 50 per side (min_num_intervals), p = 3 nodes; the padded side M is the smallest number with
// no prime factor above 5 and M >= 2N - 1 (N = boxes * p), and the boxes are then made as many
// as that M holds. At 32768 keys the embedding ends about 110 wide: M = 675 (a power of two
// would need 1024).
// Cost per iteration O(n p^2 + M^2 log M); memory O(n + M^2).
// Accuracy is that of the interpolation of K over a box (test_tsne, gradient of a 1500-point
// embedding against the exact one): 1e-4 relative with boxes of side 0.16 (the 50-box minimum on
// that small embedding), 4% with boxes of side 1 (what long captures get; Barnes-Hut at
// theta 0.5: 4.5%).
#pragma once

#include <complex>
#include <memory>
#include <vector>

#include "engine/ops/tsne_gradient.h"

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

// The circular convolution (x * kernel)[t] = sum_s x[s] kernel[(t - s) mod M], t < keep, by the
// FFT the repulsion uses (M = x.size() = kernel.size(), no prime factor above 5; forward pruned
// to the first `live` entries of x, which must be the only nonzero ones; inverse pruned to the
// first `keep` outputs). The FFT runs 16 transforms side by side: lane l transforms (l + 1) x
// and its result is divided back, so the answer is 16 copies of the convolution, `keep` entries
// each, lane after lane. For the tests, against the O(M^2) sum.
std::vector<std::complex<double>> tsne_fft_circular_convolution(
    const std::vector<std::complex<float>>& x, const std::vector<std::complex<float>>& kernel,
    int live, int keep);

// The gradient of KL(P || Q), with the same definition and return value as cpu_tsne_gradient
// (whose theta is ignored here), the repulsion from `repulsion`. Defined in
// engine/ops/tsne_gradient_cpu.cpp next to the attractive term it shares.
double fft_tsne_gradient(const TsneGradInput& in, float* grad, TsneFftRepulsion& repulsion);

}  // namespace kvscope
