#include "engine/teaching/teaching_modes.h"

#include <algorithm>
#include <cmath>

#include "engine/core/error.h"
#include "engine/core/random.h"
#include "engine/methods/balancekv/softmax_balance.h"

namespace kvscope {
namespace {

constexpr double kPi = 3.14159265358979323846;

// A standard normal for (seed, stream, index): Box-Muller on two counter uniforms.
double normal(uint64_t seed, uint32_t stream, uint32_t index) {
  const double u1 = counter_uniform(seed, kRandMisc, 0, 0, stream, 2 * index, 0xB0u);
  const double u2 = counter_uniform(seed, kRandMisc, 0, 0, stream, 2 * index + 1, 0xB0u);
  return std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(2.0 * kPi * u2);
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

// ---- ExpFeatures2D

ExpFeatures2D::ExpFeatures2D(int degree) : degree_(degree) {
  if (degree < 0 || degree > 40)
    throw InputError("exp-kernel features: degree must be in [0, 40], got " +
                     std::to_string(degree));
  const double sqrt_d = std::sqrt(static_cast<double>(kDim));
  for (int j = 0; j <= degree; ++j) {
    // C(j, a) / (j! d^(j/2)) = 1 / (a! (j-a)! d^(j/2)).
    for (int a = 0; a <= j; ++a) {
      const double log_c = -std::lgamma(a + 1.0) - std::lgamma(j - a + 1.0) - j * std::log(sqrt_d);
      coef_.push_back(std::exp(0.5 * log_c));
      power1_.push_back(a);
      total_.push_back(j);
    }
  }
}

std::vector<double> ExpFeatures2D::phi(TeachVec2 x) const {
  std::vector<double> out(coef_.size());
  for (size_t i = 0; i < coef_.size(); ++i)
    out[i] = coef_[i] * std::pow(x[0], power1_[i]) * std::pow(x[1], total_[i] - power1_[i]);
  return out;
}

double ExpFeatures2D::kernel(TeachVec2 k, TeachVec2 q) {
  return std::exp((k[0] * q[0] + k[1] * q[1]) / std::sqrt(static_cast<double>(kDim)));
}

double ExpFeatures2D::truncation_bound(double t, int degree) {
  t = std::abs(t);
  // The tail sum_{j>p} t^j/j! summed until the terms stop mattering.
  double term = 1, tail = 0;
  for (int j = 1; j <= degree + 200; ++j) {
    term *= t / j;
    if (j > degree) {
      tail += term;
      if (term < 1e-18 * std::max(tail, 1e-300)) break;
    }
  }
  return tail;
}

// ---- ExpKernelWalk

ExpKernelWalk::ExpKernelWalk(int n, uint64_t seed, double c_factor, double key_scale, int degree)
    : features_(degree), seed_(seed) {
  if (n < 1 || n > 256)
    throw InputError("exp-kernel walk: n must be in [1, 256], got " + std::to_string(n));
  if (!(c_factor > 0) || !std::isfinite(c_factor))
    throw InputError("exp-kernel walk: c must be > 0");
  if (!(key_scale > 0) || !(key_scale <= 4))
    throw InputError("exp-kernel walk: key scale must be in (0, 4]");
  double max_den = 0, max_num = 0;
  for (int i = 0; i < n; ++i) {
    const uint32_t u = static_cast<uint32_t>(i);
    keys_.push_back(
        {key_scale * normal(seed, 0xE1, 2 * u), key_scale * normal(seed, 0xE1, 2 * u + 1)});
    values_.push_back({normal(seed, 0xE2, 2 * u), normal(seed, 0xE2, 2 * u + 1)});
    phi_.push_back(features_.phi(keys_.back()));
    e_.push_back(ExpFeatures2D::kernel(keys_.back(), q_));
    const double sq = dot(phi_.back(), phi_.back());
    const double vv = values_.back()[0] * values_.back()[0] + values_.back()[1] * values_.back()[1];
    max_den = std::max(max_den, sq);
    max_num = std::max(max_num, sq * vv);
  }
  c_den_ = c_factor * max_den;
  c_num_ = c_factor * std::max(max_num, 1e-12);
  reset();
}

void ExpKernelWalk::reset() {
  steps_.clear();
  w_den_.assign(features_.dim(), 0.0);
  w_num_.assign(2 * static_cast<size_t>(features_.dim()), 0.0);  // phi (x) v, v in R^2
}

bool ExpKernelWalk::step() {
  if (done()) return false;
  Step s;
  s.index = static_cast<int>(steps_.size());
  const int j = s.index;
  const std::vector<double>& u = phi_[j];
  const TeachVec2 v = values_[j];
  const int dim = features_.dim();
  // <w, phi(k_j)> and <w_num, phi(k_j) (x) v_j> (entry (f, c) of the tensor at f * 2 + c).
  s.den_inner = dot(w_den_, u);
  for (int f = 0; f < dim; ++f)
    s.num_inner += u[f] * (w_num_[2 * f] * v[0] + w_num_[2 * f + 1] * v[1]);
  for (int i = 0; i < j; ++i) {
    const double kij = ExpFeatures2D::kernel(keys_[i], keys_[j]);
    s.den_inner_kernel += steps_[i].sigma_den * kij;
    s.num_inner_kernel += steps_[i].sigma_num * kij * (values_[i][0] * v[0] + values_[i][1] * v[1]);
  }
  s.p_den = 0.5 - s.den_inner / (2.0 * c_den_);
  s.p_num = 0.5 - s.num_inner / (2.0 * c_num_);
  s.uniform = counter_uniform(seed_, kRandMisc, 0, 0, 0, 0xE4u, static_cast<uint32_t>(j));
  s.sigma_den = s.uniform < std::clamp(s.p_den, 0.0, 1.0) ? +1 : -1;
  s.sigma_num = s.uniform < std::clamp(s.p_num, 0.0, 1.0) ? +1 : -1;
  s.sigma_random = s.uniform < 0.5 ? +1 : -1;
  for (int f = 0; f < dim; ++f) {
    w_den_[f] += s.sigma_den * u[f];
    w_num_[2 * f] += s.sigma_num * u[f] * v[0];
    w_num_[2 * f + 1] += s.sigma_num * u[f] * v[1];
  }
  s.e = e_[j];
  const Step prev = steps_.empty() ? Step{} : steps_.back();
  s.den_walk = prev.den_walk + s.sigma_den * s.e;
  s.den_random = prev.den_random + s.sigma_random * s.e;
  for (int c = 0; c < 2; ++c) {
    s.num_walk[c] = prev.num_walk[c] + s.sigma_num * s.e * v[c];
    s.num_random[c] = prev.num_random[c] + s.sigma_random * s.e * v[c];
  }
  steps_.push_back(s);
  return true;
}

void ExpKernelWalk::run() {
  while (step()) {
  }
}

double ExpKernelWalk::exact_den() const {
  double s = 0;
  for (double e : e_) s += e;
  return s;
}

TeachVec2 ExpKernelWalk::exact_num() const {
  TeachVec2 s{0, 0};
  for (size_t i = 0; i < e_.size(); ++i)
    for (int c = 0; c < 2; ++c) s[c] += e_[i] * values_[i][c];
  return s;
}

double ExpKernelWalk::feature_error() const {
  const std::vector<double> pq = features_.phi(q_);
  double worst = 0;
  for (size_t i = 0; i < keys_.size(); ++i)
    worst = std::max(worst, std::abs(dot(phi_[i], pq) - e_[i]));
  return worst;
}

// ---- DiscrepancyRace

double DiscrepancyRace::max_upto(const std::vector<double>& disc, int n) {
  double m = 0;
  for (int i = 0; i < n && i < static_cast<int>(disc.size()); ++i) m = std::max(m, disc[i]);
  return m;
}

DiscrepancyRace run_discrepancy_race(int n_max, int dim, double c, uint64_t seed) {
  if (n_max < 1 || n_max > (1 << 16))
    throw InputError("random-signs race: n must be in [1, 65536], got " + std::to_string(n_max));
  if (dim < 1 || dim > 64)
    throw InputError("random-signs race: dimension must be in [1, 64], got " + std::to_string(dim));
  if (!(c > 0) || !std::isfinite(c)) throw InputError("random-signs race: c must be > 0");
  DiscrepancyRace r;
  r.dim = dim;
  r.c = c;
  std::vector<double> w(dim, 0.0), rnd(dim, 0.0), u(dim);
  for (int i = 0; i < n_max; ++i) {
    double norm2 = 0;
    for (int k = 0; k < dim; ++k) {
      u[k] = normal(seed, 0xACE0u + 1, static_cast<uint32_t>(i * dim + k));
      norm2 += u[k] * u[k];
    }
    const double norm = std::sqrt(norm2);
    for (int k = 0; k < dim; ++k) u[k] = norm > 0 ? u[k] / norm : (k == 0 ? 1.0 : 0.0);
    const double p = 0.5 - dot(w, u) / (2.0 * c);
    const double uw = counter_uniform(seed, kRandMisc, 0, 0, 1, 0xACEu, static_cast<uint32_t>(i));
    const double ur = counter_uniform(seed, kRandMisc, 0, 0, 2, 0xACEu, static_cast<uint32_t>(i));
    const int sw = uw < std::clamp(p, 0.0, 1.0) ? +1 : -1;
    const int sr = ur < 0.5 ? +1 : -1;
    for (int k = 0; k < dim; ++k) {
      w[k] += sw * u[k];
      rnd[k] += sr * u[k];
    }
    r.walk.push_back(std::sqrt(dot(w, w)));
    r.random.push_back(std::sqrt(dot(rnd, rnd)));
    r.clipped.push_back(p < 0 || p > 1 ? 1 : 0);
  }
  return r;
}

// ---- MergeReduceTeaching

MergeReduceTeaching::MergeReduceTeaching(int n, int budget, uint64_t seed, double c_scale,
                                         double delta, double key_scale)
    : n_(n), budget_(budget), seed_(seed), c_scale_(c_scale), delta_(delta) {
  if (n < 2 || n > 4096)
    throw InputError("merge-and-reduce: n must be in [2, 4096], got " + std::to_string(n));
  if (budget < 1 || budget >= n)
    throw InputError("merge-and-reduce: budget must be in [1, " + std::to_string(n - 1) +
                     "], got " + std::to_string(budget));
  if (!(c_scale > 0) || c_scale > 1)
    throw InputError("merge-and-reduce: c_scale must be in (0, 1]");
  if (!(delta > 0) || delta > 0.5) throw InputError("merge-and-reduce: delta must be in (0, 0.5]");
  if (!(key_scale > 0) || !(key_scale <= 4))
    throw InputError("merge-and-reduce: key scale must be in (0, 4]");
  keys_.resize(n, 2);
  double r_key = 0;
  for (int i = 0; i < n; ++i) {
    keys_(i, 0) = static_cast<float>(key_scale * normal(seed, 0xE5, 2 * static_cast<uint32_t>(i)));
    keys_(i, 1) =
        static_cast<float>(key_scale * normal(seed, 0xE5, 2 * static_cast<uint32_t>(i) + 1));
    // As balancekv-stream: the norm of the float key in double.
    r_key = std::max(r_key, static_cast<double>(keys_.row(i).cast<double>().norm()));
  }
  balancekv_stream_den_plan(n, budget, 512, &batch_, &levels_);
  c_ = c_scale * softmax_balance_c(n, delta);
  radius_ = softmax_balance_radius(r_key, 1.0, 2);
  reset();
}

MergeReduceTeaching::~MergeReduceTeaching() = default;

void MergeReduceTeaching::reset() {
  pushed_ = 0;
  last_first_ = 0;
  merges_.clear();
  mr_ = std::make_unique<MergeAndReduce>(
      batch_, levels_, [this](const std::vector<int>& tokens, int level, int call) {
        SoftmaxBalanceConfig cfg;
        cfg.c = c_;
        cfg.radius = radius_;
        cfg.seed = seed_;
        cfg.layer = 0;
        cfg.head = 0;
        cfg.instance = 0;
        cfg.trace_query = {1.0f, 0.0f};  // records the signs; the walk reads the same entries
        const SoftmaxBalanceOutput o = softmax_balance(
            keys_, nullptr, tokens, cfg, static_cast<uint32_t>(level), static_cast<uint32_t>(call));
        Merge m;
        m.after_token = pushed_ - 1;
        m.level = level;
        m.call = call;
        m.input = tokens;
        m.sigma.assign(o.trace.sigma.begin(), o.trace.sigma.end());
        m.p = o.trace.p;
        m.kept = o.kept;
        m.fail_steps = o.fail_steps;
        merges_.push_back(std::move(m));
        return o.kept;
      });
}

bool MergeReduceTeaching::step() {
  if (done()) return false;
  last_first_ = static_cast<int>(merges_.size());
  ++pushed_;
  mr_->push(pushed_ - 1);
  return true;
}

void MergeReduceTeaching::run() {
  while (step()) {
  }
}

const std::vector<std::vector<int>>& MergeReduceTeaching::level_sets() const {
  return mr_->levels();
}

std::vector<std::pair<int, double>> MergeReduceTeaching::kept_with_weights() const {
  std::vector<std::pair<int, double>> out;
  const auto& lv = mr_->levels();
  for (size_t l = 0; l < lv.size(); ++l)
    for (int t : lv[l]) out.push_back({t, std::ldexp(1.0, static_cast<int>(l))});
  std::sort(out.begin(), out.end());
  return out;
}

long long MergeReduceTeaching::size_bound() const {
  return merge_and_reduce_bound(n_, batch_, levels_);
}

}  // namespace kvscope
