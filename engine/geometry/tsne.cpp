#include "engine/geometry/tsne.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>

#include "engine/core/error.h"
#include "engine/core/simd.h"
#include "engine/core/thread_pool.h"
#include "engine/geometry/knn.h"
#include "engine/geometry/pca.h"
#include "engine/ops/backend.h"
#include "engine/ops/tsne_box.h"
#include "engine/ops/tsne_gradient.h"
#include "engine/ops/tsne_gradient_fft.h"

namespace kvscope {
namespace {

bool is_set(const std::atomic<bool>* flag) {
  return flag && flag->load(std::memory_order_relaxed);
}

// sklearn's _binary_search_perplexity for one point: finds the precision beta so that
// p_j ~ exp(-beta d_j) has entropy log(perplexity). Distances are shifted by their minimum first
// (it cancels in the normalisation) so large raw distances do not underflow every exp().
void calibrate_row(const float* d2, int count, double log_perplexity, float* out) {
  constexpr double kTol = 1e-5;
  constexpr int kSteps = 100;
  double dmin = std::numeric_limits<double>::infinity();
  for (int j = 0; j < count; ++j) dmin = std::min(dmin, static_cast<double>(d2[j]));
  double mean_gap = 0;
  for (int j = 0; j < count; ++j) mean_gap += d2[j] - dmin;
  mean_gap /= count;
  // Start where the scale of the distances says, so the search needs few steps.
  double beta = mean_gap > 0 ? 1.0 / mean_gap : 1.0;
  double beta_min = -std::numeric_limits<double>::infinity();
  double beta_max = std::numeric_limits<double>::infinity();
  std::vector<double> p(count);
  const simd::Kernels& simd_kernels = simd::kernels();  // exp of a whole row in SIMD lanes
  for (int step = 0; step < kSteps; ++step) {
    for (int j = 0; j < count; ++j) p[j] = -(d2[j] - dmin) * beta;
    simd_kernels.exp_inplace(p.data(), count);
    double sum = 0;
    for (int j = 0; j < count; ++j) sum += p[j];
    double weighted = 0;
    for (int j = 0; j < count; ++j) {
      p[j] /= sum;
      weighted += (d2[j] - dmin) * p[j];
    }
    const double entropy = std::log(sum) + beta * weighted;
    const double diff = entropy - log_perplexity;
    if (std::abs(diff) <= kTol) break;
    if (diff > 0) {
      beta_min = beta;
      beta = std::isinf(beta_max) ? beta * 2 : (beta + beta_max) / 2;
    } else {
      beta_max = beta;
      beta = std::isinf(beta_min) ? beta / 2 : (beta + beta_min) / 2;
    }
  }
  for (int j = 0; j < count; ++j) out[j] = static_cast<float>(p[j]);
}

}  // namespace

// ---- affinities ----------------------------------------------------------------------------

TsneAffinities tsne_affinities(const MatrixF& x_in, double perplexity, int neighbours,
                               const std::atomic<bool>* cancel) {
  const int n = static_cast<int>(x_in.rows());
  if (n < 3) throw InputError("t-SNE: needs at least 3 points, got " + std::to_string(n));
  if (x_in.cols() < 1) throw InputError("t-SNE: the points have no features");
  if (!x_in.allFinite()) throw InputError("t-SNE: the points hold NaN or Inf");
  if (!(perplexity > 0)) throw SettingError("t-SNE perplexity", "--perplexity", "must be > 0");

  TsneAffinities out;
  out.n = n;
  // A perplexity near n cannot be reached; sklearn refuses it, we clamp (and say which we used).
  out.perplexity = std::min(perplexity, (n - 1) / 3.0);
  const double log_perp = std::log(out.perplexity);

  // Centre once: distances are unchanged, and the GEMM form |a|^2 + |b|^2 - 2ab loses far less
  // precision without the large common offset real keys carry.
  const Eigen::RowVectorXf mean = x_in.colwise().mean();
  const MatrixF x = x_in.rowwise() - mean;

  const bool all_pairs = neighbours <= 0 || neighbours >= n - 1;
  const double scale = 1.0 / (2.0 * n);
  if (all_pairs) {
    // Exact t-SNE: every other point is a neighbour. Dense conditional matrix, then
    // p_ij = (p_{j|i} + p_{i|j}) / (2n) for all j != i.
    const VectorF norms = x.rowwise().squaredNorm();
    const MatrixF dots = x * x.transpose();
    MatrixF pc = MatrixF::Zero(n, n);
    parallel_chunks(n, 64, [&](int b, int e) {
      std::vector<float> d2(n - 1), p(n - 1);
      for (int i = b; i < e; ++i) {
        if ((i & 63) == 0 && is_set(cancel)) return;
        for (int j = 0, w = 0; j < n; ++j)
          if (j != i) d2[w++] = std::max(0.f, norms(i) + norms(j) - 2.f * dots(i, j));
        calibrate_row(d2.data(), n - 1, log_perp, p.data());
        for (int j = 0, w = 0; j < n; ++j)
          if (j != i) pc(i, j) = p[w++];
      }
    });
    if (is_set(cancel)) throw Cancelled();
    out.rowptr.assign(n + 1, 0);
    out.col.reserve(static_cast<size_t>(n) * (n - 1));
    out.val.reserve(static_cast<size_t>(n) * (n - 1));
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) {
        if (j == i) continue;
        out.col.push_back(j);
        out.val.push_back(static_cast<float>((double(pc(i, j)) + pc(j, i)) * scale));
      }
      out.rowptr[i + 1] = static_cast<int>(out.col.size());
    }
    return out;
  }

  // Sparse (BH-SNE): the k nearest neighbours of each point carry all its affinity.
  const int k = neighbours;
  std::vector<int> nb;
  std::vector<float> d2;
  knn_exact(x, k, nb, d2, cancel);

  // Conditional p_{j|i} over each point's neighbour list.
  std::vector<float> pcond(static_cast<size_t>(n) * k);
  parallel_chunks(n, 256, [&](int b, int e) {
    for (int i = b; i < e; ++i)
      calibrate_row(&d2[static_cast<size_t>(i) * k], k, log_perp,
                    &pcond[static_cast<size_t>(i) * k]);
  });
  if (is_set(cancel)) throw Cancelled();

  // Symmetrise: p_ij = (p_{j|i} + p_{i|j}) / (2n), as CSR with sorted columns. Row i holds its own
  // k entries and one from every list it appears in, all in one array (sized by a count pass),
  // then each row is sorted and merged on its own thread. At most two entries share a column
  // (one each way), so the merged float sums do not depend on the order.
  std::vector<size_t> start(static_cast<size_t>(n) + 1, 0);
  for (const int j : nb) ++start[static_cast<size_t>(j) + 1];
  for (int i = 0; i < n; ++i) start[i + 1] += start[i] + k;
  std::vector<std::pair<int, float>> entries(start[n]);
  {
    std::vector<size_t> fill(start.begin(), start.end() - 1);
    for (int i = 0; i < n; ++i) {
      for (int r = 0; r < k; ++r) {
        const size_t at = static_cast<size_t>(i) * k + r;
        const int j = nb[at];
        entries[fill[i]++] = {j, pcond[at]};
        entries[fill[j]++] = {i, pcond[at]};
      }
    }
  }
  std::vector<int> merged(n);
  parallel_chunks(n, 1024, [&](int b, int e) {
    for (int i = b; i < e; ++i) {
      const auto first = entries.begin() + static_cast<std::ptrdiff_t>(start[i]);
      const auto last = entries.begin() + static_cast<std::ptrdiff_t>(start[i + 1]);
      std::sort(first, last, [](const auto& a, const auto& c) { return a.first < c.first; });
      auto w = first;
      for (auto r = first; r != last; ++r) {
        if (w != first && (w - 1)->first == r->first) {
          (w - 1)->second += r->second;
        } else {
          *w++ = *r;
        }
      }
      merged[i] = static_cast<int>(w - first);
    }
  });
  out.rowptr.assign(n + 1, 0);
  for (int i = 0; i < n; ++i) out.rowptr[i + 1] = out.rowptr[i] + merged[i];
  out.col.resize(out.rowptr[n]);
  out.val.resize(out.rowptr[n]);
  parallel_chunks(n, 1024, [&](int b, int e) {
    for (int i = b; i < e; ++i)
      for (int r = 0; r < merged[i]; ++r) {
        const auto& [j, v] = entries[start[i] + r];
        out.col[out.rowptr[i] + r] = j;
        out.val[out.rowptr[i] + r] = static_cast<float>(v * scale);
      }
  });
  return out;
}

// ---- the optimisation ----------------------------------------------------------------------

TsneRun::TsneRun(const MatrixF& x, const TsneParams& params, Backend* backend,
                 const std::atomic<bool>* cancel)
    : params_(params),
      backend_(backend ? backend : &cpu_backend()),
      external_cancel_(cancel),
      kl_(std::numeric_limits<double>::quiet_NaN()) {
  const int n = static_cast<int>(x.rows());
  if (params_.iterations < 0)
    throw SettingError("t-SNE iterations", "--iterations", "must be >= 0");
  if (params_.early_exaggeration <= 0) throw InputError("t-SNE: early exaggeration must be > 0");
  if (params_.exaggeration_iterations < 0)
    throw InputError("t-SNE: exaggeration iterations must be >= 0");
  theta_ = params_.theta >= 0 ? params_.theta : (n <= params_.exact_threshold ? 0.0 : 0.5);
  // Long inputs on the CPU: FFT-accelerated interpolation instead of Barnes-Hut (automatic mode
  // only; an explicit theta is obeyed, and a GPU backend keeps its own kernel).
  if (params_.theta < 0 && n > params_.fft_threshold && !backend_->parallel_in_one_call())
    fft_ = std::make_unique<TsneFftRepulsion>();
  const int neighbours =
      theta_ == 0 && n <= params_.exact_threshold
          ? 0
          : static_cast<int>(std::min<double>(n - 1, std::floor(3 * params_.perplexity + 1)));
  affinities_ = tsne_affinities(x, params_.perplexity, neighbours, cancel);
  // The CPU attraction reads P every iteration: 16-bit columns stream a quarter less of it.
  if (n <= 65536 && !backend_->parallel_in_one_call())
    col16_.assign(affinities_.col.begin(), affinities_.col.end());

  learning_rate_ = params_.learning_rate > 0 ? params_.learning_rate
                                             : std::max(n / params_.early_exaggeration / 4.0, 50.0);

  // PCA initialisation scaled to std 1e-4 along the first axis (sklearn's init="pca").
  y_ = pca_2d(x);
  const double mean0 = y_.col(0).cast<double>().mean();
  const double std0 = std::sqrt((y_.col(0).cast<double>().array() - mean0).square().mean());
  if (std0 > 0) {
    y_ *= static_cast<float>(1e-4 / std0);
  } else {
    // All points identical along every direction: spread them on a tiny deterministic spiral.
    for (int i = 0; i < n; ++i) {
      y_(i, 0) = static_cast<float>(1e-4 * std::cos(i * 2.399963));
      y_(i, 1) = static_cast<float>(1e-4 * std::sin(i * 2.399963) * (1.0 + i) / n);
    }
  }
  update_ = MatrixF::Zero(n, 2);
  gains_ = MatrixF::Ones(n, 2);
  grad_ = MatrixF::Zero(n, 2);
}

TsneRun::~TsneRun() = default;

std::string TsneRun::gradient_name() const {
  if (fft_) return "FFT interpolation";
  return theta_ > 0 ? "Barnes-Hut" : "exact gradient";
}

bool TsneRun::cancelled() const {
  return own_cancel_.load() || is_set(external_cancel_);
}

namespace {

// One step of gradient descent with momentum and sklearn's gains, for every coordinate c: gains
// grow by 0.2 where the gradient changed sign against the last update and shrink by 0.8 where it
// agrees (at least min_gain), then u = momentum u - lr gain g and y += u. The SIMD table's
// tsne_gradient_step (engine/core/simd.h; AVX2, with the t-SNE rows' switch) does the same float
// operations in the same order (bit for bit); GCC keeps the plain loop scalar (its selects are
// control flow under -ftrapping-math), which cost 3% of a 32k-point run on the caller's thread
// alone.
void gradient_step(const float* g, float* u, float* gain, float* y, long size, float momentum,
                   float lr, float min_gain) {
  long c = 0;
  if (cpu_tsne_avx2_in_use())
    if (const auto step = simd::kernels().tsne_gradient_step)
      c = step(g, u, gain, y, size, momentum, lr, min_gain);
  for (; c < size; ++c) {
    gain[c] = (u[c] * g[c] < 0) ? gain[c] + 0.2f : gain[c] * 0.8f;
    gain[c] = std::max(gain[c], min_gain);
    u[c] = momentum * u[c] - lr * gain[c] * g[c];
    y[c] += u[c];
  }
}

}  // namespace

void TsneRun::iterate_once() {
  const bool early = iteration_ < params_.exaggeration_iterations;
  if (iteration_ == params_.exaggeration_iterations && iteration_ > 0) {
    // sklearn runs the two phases as separate descents: momentum state and gains start afresh.
    update_.setZero();
    gains_.setOnes();
  }
  TsneGradInput in;
  in.n = num_points();
  in.y = y_.data();
  in.p_rowptr = affinities_.rowptr.data();
  in.p_col = affinities_.col.data();
  in.p_col16 = col16_.empty() ? nullptr : col16_.data();
  in.p_val = affinities_.val.data();
  in.exaggeration = early ? params_.early_exaggeration : 1.0;
  in.theta = theta_;
  in.want_kl = params_.kl_every > 0 &&
               ((iteration_ + 1) % params_.kl_every == 0 || iteration_ + 1 == params_.iterations);
  const double kl =
      fft_ ? fft_tsne_gradient(in, grad_.data(), *fft_) : backend_->tsne_gradient(in, grad_.data());
  if (std::isfinite(kl)) kl_ = kl;

  const float momentum = static_cast<float>(early ? params_.momentum_early : params_.momentum_late);
  const float lr = static_cast<float>(learning_rate_);
  const float min_gain = static_cast<float>(params_.min_gain);
  gradient_step(grad_.data(), update_.data(), gains_.data(), y_.data(), y_.size(), momentum, lr,
                min_gain);
  const Eigen::RowVector2f centre = y_.colwise().mean();
  const float cx = centre(0), cy = centre(1);
  float* y = y_.data();
  for (Eigen::Index c = 0; c < y_.size(); c += 2) {
    y[c] -= cx;
    y[c + 1] -= cy;
  }
  ++iteration_;
}

int TsneRun::step(int iters) {
  int done_now = 0;
  while (done_now < iters && iteration_ < params_.iterations && !cancelled()) {
    iterate_once();
    ++done_now;
  }
  return done_now;
}

void TsneRun::run_to_end() {
  step(params_.iterations - iteration_);
  if (iteration_ < params_.iterations && cancelled()) throw Cancelled();
}

MatrixF tsne(const MatrixF& x, const TsneParams& params, Backend* backend,
             const std::atomic<bool>* cancel) {
  TsneRun run(x, params, backend, cancel);
  run.run_to_end();
  return run.embedding();
}

// ---- joint key/query space -----------------------------------------------------------------

MatrixF joint_keys_queries(const MatrixF& keys, const MatrixF& queries, const JointOptions& opt) {
  if (keys.cols() != queries.cols())
    throw InputError("joint embedding: keys have " + std::to_string(keys.cols()) +
                     " features but queries have " + std::to_string(queries.cols()));
  if (keys.rows() == 0 || queries.rows() == 0)
    throw InputError("joint embedding: keys or queries are empty");
  MatrixF k = keys, q = queries;
  if (opt.scale) {
    const double kn = k.rowwise().norm().cast<double>().mean();
    const double qn = q.rowwise().norm().cast<double>().mean();
    if (kn > 0 && qn > 0) {
      const float a = static_cast<float>(std::sqrt(kn / qn));
      q *= a;
      k /= a;
    }
  }
  if (opt.translate) {
    const Eigen::RowVectorXf shift = q.colwise().mean() - k.colwise().mean();
    k.rowwise() += shift;
  }
  MatrixF out(k.rows() + q.rows(), k.cols());
  out << k, q;
  return out;
}

// ---- trustworthiness -----------------------------------------------------------------------

double trustworthiness(const MatrixF& high, const MatrixF& low, int k) {
  const int n = static_cast<int>(high.rows());
  if (low.rows() != n) throw InputError("trustworthiness: the two point sets differ in size");
  if (k < 1 || k >= n / 2)
    throw InputError("trustworthiness: k must be in [1, n/2), got " + std::to_string(k));
  auto squared_distances = [](const MatrixF& m, int i) {
    return ((m.rowwise() - m.row(i)).cast<double>().rowwise().squaredNorm()).eval();
  };
  std::vector<double> penalty(n);
  parallel_chunks(n, 64, [&](int b, int e) {
    std::vector<int> order(n), rank(n);
    for (int i = b; i < e; ++i) {
      // Rank of every point in the input-space ordering around i (1 = nearest other point).
      const VectorD dh = squared_distances(high, i);
      order.resize(n);
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](int a, int c) {
        if (a == i || c == i) return c != i && a == i;  // i itself first, rank 0
        return dh(a) < dh(c) || (dh(a) == dh(c) && a < c);
      });
      for (int r = 0; r < n; ++r) rank[order[r]] = r;
      // The k nearest in the embedding.
      const VectorD dl = squared_distances(low, i);
      order.resize(n);
      std::iota(order.begin(), order.end(), 0);
      order.erase(order.begin() + i);
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int a, int c) { return dl(a) < dl(c) || (dl(a) == dl(c) && a < c); });
      double p = 0;
      for (int r = 0; r < k; ++r) p += std::max(0, rank[order[r]] - k);
      penalty[i] = p;
    }
  });
  double total = 0;
  for (double p : penalty) total += p;
  return 1.0 - total * 2.0 / (double(n) * k * (2.0 * n - 3.0 * k - 1.0));
}

}  // namespace kvscope
