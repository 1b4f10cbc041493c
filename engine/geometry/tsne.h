// t-SNE (van der Maaten & Hinton 2008; Barnes-Hut: van der Maaten 2014) to 2-D, run in steps so
// the Geometry view can animate it while it converges.
//
// What is implemented, in order:
//  - input affinities: per point, a binary search on the Gaussian precision so the conditional
//    distribution p_{j|i} over squared Euclidean distances has the requested perplexity
//    (entropy log(perplexity), tolerance 1e-5, at most 100 halvings). Small inputs
//    (n <= exact_threshold) use every other point; large inputs use the 3*perplexity nearest
//    neighbours (exact: engine/geometry/knn.h), as BH-SNE does;
//  - P = (P_cond + P_cond^T) / (2n), stored as CSR (the Backend seam's TsneGradInput);
//  - initialisation: the 2-D PCA of the input, scaled so column 0 has std 1e-4 (sklearn and
//    openTSNE's "pca" init);
//  - optimisation: gradient descent with momentum 0.5 during early exaggeration (12 for 250
//    iterations) and 0.8 afterwards, per-coordinate gains (+0.2 / *0.8, floor 0.01), learning
//    rate max(n / exaggeration / 4, 50) ("auto": Belkina et al. 2019 as sklearn writes it for a
//    gradient that includes the factor 4), embedding re-centred every iteration;
//  - gradient: exact O(n^2) when theta == 0, Barnes-Hut quadtree with opening angle theta
//    otherwise, via Backend::tsne_gradient (CPU: cpu_tsne_gradient,
//    engine/ops/tsne_gradient_cpu.cpp; CUDA: kernels/); in automatic mode on the CPU above
//    fft_threshold points (10000), FFT-accelerated interpolation of the repulsion (FIt-SNE;
//    engine/ops/tsne_gradient_fft.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/tensor.h"

namespace kvscope {

class Backend;
class TsneFftRepulsion;

struct TsneParams {
  double perplexity = 30;
  int iterations = 1000;  // total, including the early exaggeration phase
  double early_exaggeration = 12;
  int exaggeration_iterations = 250;
  double learning_rate = 0;  // <= 0: automatic, max(n / early_exaggeration / 4, 50)
  double momentum_early = 0.5, momentum_late = 0.8;
  double min_gain = 0.01;
  // Barnes-Hut opening angle. < 0: automatic (0 = exact when n <= exact_threshold, else 0.5).
  double theta = -1;
  int exact_threshold = 2000;
  // Automatic mode (theta < 0) on the CPU: above this many points the repulsion is computed by
  // FFT-accelerated interpolation (engine/ops/tsne_gradient_fft.h) instead of Barnes-Hut. At 32768
  // points it measured 1.9x less CPU than Barnes-Hut at the same trustworthiness
  // (docs/performance.md); kFftOff keeps Barnes-Hut at every size (`embed --fft-above N` sets it).
  static constexpr int kFftOff = 1 << 30;
  int fft_threshold = 10000;
  // Every how many iterations the backend is asked for the KL divergence (and on the last one);
  // 0: never. It costs a log per P entry, as much as the forces themselves.
  int kl_every = 25;
};

// The input affinities in CSR form (symmetric, sums to 1).
struct TsneAffinities {
  int n = 0;
  std::vector<int> rowptr, col;
  std::vector<float> val;
  double perplexity = 0;  // the perplexity actually used (clamped for tiny inputs)
};

// Conditional affinities calibrated to `perplexity`, symmetrised. neighbours <= 0: all points;
// otherwise that many nearest neighbours per point. Throws InputError for fewer than 3 points or
// non-finite input; perplexity is clamped to (n - 1) / 3 for tiny inputs (recorded in the result).
TsneAffinities tsne_affinities(const MatrixF& x, double perplexity, int neighbours,
                               const std::atomic<bool>* cancel = nullptr);

// One t-SNE optimisation, advanced by step(). Not thread-safe: one thread steps it; others read a
// copy of embedding() only through the owner (the app's worker hands copies to the UI).
class TsneRun {
 public:
  // Computes the affinities and the PCA initialisation (the expensive setup). `backend` must
  // outlive the run; nullptr means the CPU backend. Throws InputError for bad input/params and
  // Cancelled when `cancel` is set during setup.
  TsneRun(const MatrixF& x, const TsneParams& params, Backend* backend = nullptr,
          const std::atomic<bool>* cancel = nullptr);
  ~TsneRun();

  // Runs up to `iters` more iterations (stopping at params.iterations or when cancelled);
  // returns how many were run. Never throws Cancelled: a cancelled run simply stops advancing.
  int step(int iters);
  // Runs to the end; throws Cancelled if the flag stops it first.
  void run_to_end();

  int iteration() const { return iteration_; }
  int total_iterations() const { return params_.iterations; }
  bool done() const { return iteration_ >= params_.iterations || cancelled(); }
  bool cancelled() const;
  void cancel() { own_cancel_ = true; }

  const MatrixF& embedding() const { return y_; }  // n x 2
  // Latest KL(P||Q) reported by the backend (Barnes-Hut: with its estimate of Z); NaN before
  // the first iteration or when the backend does not compute it.
  double kl() const { return kl_; }
  double theta() const { return theta_; }
  // "exact gradient", "Barnes-Hut" or "FFT interpolation": how the repulsion is computed.
  std::string gradient_name() const;
  double learning_rate() const { return learning_rate_; }
  double perplexity() const { return affinities_.perplexity; }
  int num_points() const { return static_cast<int>(y_.rows()); }

 private:
  void iterate_once();

  TsneParams params_;
  Backend* backend_;
  const std::atomic<bool>* external_cancel_;
  std::atomic<bool> own_cancel_{false};
  TsneAffinities affinities_;
  std::vector<uint16_t> col16_;  // affinities_.col as 16-bit indices when n <= 65536
  MatrixF y_, update_, gains_, grad_;
  std::unique_ptr<TsneFftRepulsion> fft_;  // set when the FFT repulsion is used
  double theta_ = 0, learning_rate_ = 0, kl_;
  int iteration_ = 0;
};

// Whole run in one call.
MatrixF tsne(const MatrixF& x, const TsneParams& params = {}, Backend* backend = nullptr,
             const std::atomic<bool>* cancel = nullptr);

// Keys and queries in one space, as AttentionViz (Yeh et al. 2023) does before projecting them
// together. Two transformations that leave every attention score <q, k> / sqrt(d) ranking
// unchanged:
//  - translate: keys are shifted so their centroid equals the queries' centroid. For a fixed
//    query, k -> k + c adds the same constant <q, c> to all its logits, so its softmax is
//    unchanged.
//  - scale: queries are multiplied by a and keys by 1/a with a = sqrt(mean|k| / mean|q|), so both
//    sets have the same mean norm; <q, k> is unchanged.
// Returns the (n_k + n_q) x d stack: keys first, then queries.
struct JointOptions {
  bool translate = true;
  bool scale = true;
};
MatrixF joint_keys_queries(const MatrixF& keys, const MatrixF& queries,
                           const JointOptions& opt = {});

// Trustworthiness T(k) (Venna & Kaski 2001; sklearn.manifold.trustworthiness): 1 minus a penalty
// for points that are among the k nearest neighbours in the embedding but not in the input,
// weighted by how far down the input ranking they are. 1 = neighbourhoods preserved. O(n^2 log n):
// meant for tests and diagnostics on a few thousand points.
double trustworthiness(const MatrixF& high, const MatrixF& low, int k);

}  // namespace kvscope
