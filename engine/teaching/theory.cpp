// The scaling measurements of engine/teaching/theory.h; docs/theory.md says what each figure means
// and which equation of which paper it checks.
#include "engine/teaching/theory.h"

#include <Eigen/Eigenvalues>
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <sstream>

#include "engine/core/error.h"
#include "engine/core/random.h"
#include "engine/ops/backend.h"

namespace kvscope {

// ---------------------------------------------------------------------------------------------
// The fit (its interval: Student t, engine/core/student_t.h)

PowerFit fit_power_law(const std::vector<double>& x, const std::vector<double>& y, double level) {
  PowerFit f;
  f.level = level;
  std::vector<double> lx, ly;
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i)
    if (x[i] > 0 && y[i] > 0 && std::isfinite(x[i]) && std::isfinite(y[i])) {
      lx.push_back(std::log(x[i]));
      ly.push_back(std::log(y[i]));
    }
  const int n = static_cast<int>(lx.size());
  f.points = n;
  if (n < 3) return f;
  double mx = 0, my = 0;
  for (int i = 0; i < n; ++i) mx += lx[i], my += ly[i];
  mx /= n;
  my /= n;
  double sxx = 0, sxy = 0, syy = 0;
  for (int i = 0; i < n; ++i) {
    sxx += (lx[i] - mx) * (lx[i] - mx);
    sxy += (lx[i] - mx) * (ly[i] - my);
    syy += (ly[i] - my) * (ly[i] - my);
  }
  if (sxx <= 1e-300) return f;  // one distinct x
  f.slope = sxy / sxx;
  f.intercept = my - f.slope * mx;
  double sse = 0;
  for (int i = 0; i < n; ++i) {
    const double r = ly[i] - (f.intercept + f.slope * lx[i]);
    sse += r * r;
  }
  f.r2 = syy > 0 ? 1 - sse / syy : 1;
  f.se = std::sqrt(sse / (n - 2) / sxx);
  const double t = student_t_quantile(0.5 + level / 2, n - 2);
  f.ci_low = f.slope - t * f.se;
  f.ci_high = f.slope + t * f.se;
  f.ok = true;
  return f;
}

// ---------------------------------------------------------------------------------------------
// Norms of V's prefixes

std::vector<double> prefix_frobenius_norms(const MatrixF& V, int first, int last) {
  std::vector<double> out;
  double sq = 0;
  for (int i = 0; i <= last; ++i) {
    sq += V.row(i).cast<double>().squaredNorm();
    if (i >= first) out.push_back(std::sqrt(sq));
  }
  return out;
}

std::vector<double> prefix_operator_norms(const MatrixF& V, int first, int last) {
  const int dv = static_cast<int>(V.cols());
  std::vector<double> out;
  if (first > last || first < 0 || last >= V.rows()) return out;
  const MatrixD head = V.topRows(first + 1).cast<double>();
  MatrixD G = head.transpose() * head;
  auto solve = [&](VectorD* vec) {
    Eigen::SelfAdjointEigenSolver<MatrixD> es(G);
    *vec = es.eigenvectors().col(dv - 1);
    return std::max(0.0, es.eigenvalues()(dv - 1));
  };
  VectorD u;
  double lambda = solve(&u);
  out.push_back(std::sqrt(lambda));
  for (int j = first + 1; j <= last; ++j) {
    const VectorD r = V.row(j).cast<double>().transpose();
    G.noalias() += r * r.transpose();
    // Warm-started power iteration: the top eigenvector moves little with one row added.
    bool converged = false;
    double prev = lambda;
    for (int it = 0; it < 300; ++it) {
      VectorD w = G * u;
      const double nw = w.norm();
      if (!(nw > 0)) break;
      u = w / nw;
      const double rq = u.dot(G * u);
      if (std::fabs(rq - prev) <= 1e-14 * std::max(1.0, rq)) {
        lambda = rq;
        converged = true;
        break;
      }
      prev = rq;
    }
    if (!converged) lambda = solve(&u);
    out.push_back(std::sqrt(std::max(0.0, lambda)));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Curves

const char* disc_sizes_name(DiscSizes s) {
  return s == DiscSizes::Prefixes ? "prefixes" : "blocks";
}

std::vector<DiscWalk> default_disc_walks() {
  DiscWalk authors{"authors' parameters", BalanceParams{}};
  DiscWalk soft{"unsaturated", BalanceParams{}};
  soft.params.temp = 0.02;
  soft.params.gamma = 0.1;
  return {authors, soft};
}

std::vector<DiscWalk> disc_walks(double unsat_temp, double unsat_gamma) {
  std::vector<DiscWalk> walks = default_disc_walks();
  walks[1].params.temp = unsat_temp;
  walks[1].params.gamma = unsat_gamma;
  return walks;
}

const ScalingCurve* DiscRun::find(const std::string& instance, const std::string& measure,
                                  const std::string& signs) const {
  for (const ScalingCurve& c : curves)
    if (c.instance == instance && c.measure == measure && c.signs == signs) return &c;
  return nullptr;
}

const ScalingCurve* ErrorScaling::find(const std::string& measure) const {
  for (const ScalingCurve& c : curves)
    if (c.measure == measure) return &c;
  return nullptr;
}

void finish_curve(ScalingCurve& c, int min_fit_x) {
  const size_t P = c.x.size();
  c.mean.assign(P, std::numeric_limits<double>::quiet_NaN());
  c.lo = c.mean;
  c.hi = c.mean;
  std::vector<double> fx, fy;
  for (size_t p = 0; p < P && p < c.samples.size(); ++p) {
    double sum = 0, lo = std::numeric_limits<double>::infinity(), hi = -lo;
    int cnt = 0;
    for (double v : c.samples[p]) {
      if (!std::isfinite(v)) continue;
      sum += v;
      lo = std::min(lo, v);
      hi = std::max(hi, v);
      ++cnt;
      if (c.x[p] >= min_fit_x) {
        fx.push_back(c.x[p]);
        fy.push_back(v);
      }
    }
    if (cnt > 0) {
      c.mean[p] = sum / cnt;
      c.lo[p] = lo;
      c.hi[p] = hi;
    }
  }
  c.fit = fit_power_law(fx, fy);
}

namespace {

ScalingCurve& curve(std::vector<ScalingCurve>& curves, const std::string& instance,
                    const std::string& measure, const std::string& signs,
                    const std::vector<int>& sizes) {
  for (ScalingCurve& c : curves)
    if (c.instance == instance && c.measure == measure && c.signs == signs) return c;
  ScalingCurve c;
  c.instance = instance;
  c.measure = measure;
  c.signs = signs;
  for (int n : sizes) c.x.push_back(n);
  c.samples.resize(sizes.size());
  curves.push_back(std::move(c));
  return curves.back();
}

// Signs of the practical walk on rows [0, L) of `keys`/`vals` (one block, centred on its own
// mean), and how many of its steps 1.. were saturated.
std::vector<int8_t> walk_signs(const MatrixF& keys, const MatrixF& vals, int L,
                               const BalanceParams& bp, uint64_t seed, uint32_t layer,
                               uint32_t head, uint32_t round, uint32_t block, long* saturated) {
  const int d = static_cast<int>(keys.cols()), dv = static_cast<int>(vals.cols());
  MatrixF k = keys.topRows(L);
  const Eigen::RowVectorXf mean = k.colwise().mean();
  k.rowwise() -= mean;
  const MatrixF v = vals.topRows(L);
  std::vector<int8_t> sigma(static_cast<size_t>(L));
  std::vector<float> p(static_cast<size_t>(L)), partial(static_cast<size_t>(L));
  const int offsets[2] = {0, L};
  const uint32_t bh = head, bid = block;
  WalkBatch b = walk_batch_of(bp, seed, static_cast<int>(layer), static_cast<int>(round));
  b.d = d;
  b.dv = dv;
  b.num_blocks = 1;
  b.keys = k.data();
  b.values = v.data();
  b.block_offset = offsets;
  b.block_head = &bh;
  b.block_id = &bid;
  b.sigma = sigma.data();
  b.p = p.data();
  b.partial = partial.data();
  cpu_walk_blocks(b);
  long sat = 0;
  for (int i = 1; i < L; ++i)
    if (!(p[i] > 0 && p[i] < 1)) ++sat;
  if (saturated) *saturated += sat;
  return sigma;
}

}  // namespace

void measure_discrepancy(const MatrixF& keys, const MatrixF& values,
                         const std::vector<std::vector<float>>& queries,
                         const std::vector<int>& sizes, DiscSizes mode, int seeds,
                         uint64_t base_seed, uint32_t layer, uint32_t head, DiscRun& run,
                         long* sat_counts, long* walked_counts) {
  if (sizes.empty()) return;
  const int N = sizes.back();
  if (keys.rows() < N || values.rows() < N)
    throw std::invalid_argument("measure_discrepancy: fewer rows than the largest size");
  const int d = static_cast<int>(keys.cols()), dv = static_cast<int>(values.cols());
  const BalanceParams& bp = run.walk.params;
  // The geometry the walk balances (docs/theory.md): keys centred on the mean of the N rows,
  // the walk's temperature; terms in units of the largest one.
  const double scale = bp.temp / std::sqrt(static_cast<double>(d));
  MatrixD K = keys.topRows(N).cast<double>();
  const Eigen::RowVectorXd mu = K.colwise().mean();
  K.rowwise() -= mu;
  const MatrixD V = values.topRows(N).cast<double>();
  const MatrixF ones = MatrixF::Ones(N, 1);
  const MatrixD gram = K * K.transpose() * scale;
  VectorD vnorm(N);
  for (int i = 0; i < N; ++i) vnorm(i) = V.row(i).norm();

  // Kernels of the two instances in units of the largest ||u_i||^2: u_i = phi(k_i) (x) v_i for
  // the numerator (value term <v_i,v_j> + value_bias, as the walk has it), phi(k_i) for the
  // denominator; BalanceKV section 3.4, <phi(k), phi(q)> = exp(<k,q>/sqrt d).
  double Ld = -std::numeric_limits<double>::infinity(), Ln = Ld;
  for (int i = 0; i < N; ++i) {
    Ld = std::max(Ld, gram(i, i));
    const double vv = vnorm(i) * vnorm(i) + bp.value_bias;
    if (vv > 0) Ln = std::max(Ln, gram(i, i) + std::log(vv));
  }
  MatrixD kd(N, N), kn(N, N);
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < N; ++j) {
      kd(i, j) = std::exp(gram(i, j) - Ld);
      kn(i, j) = std::isfinite(Ln)
                     ? std::exp(gram(i, j) - Ln) * (V.row(i).dot(V.row(j)) + bp.value_bias)
                     : 0;
    }

  // Query terms exp(temp <k_i, q> / sqrt d) (v_i), in units of the largest term over the N rows
  // (per query; the centring is a per-query factor and cancels).
  const int Q = static_cast<int>(queries.size());
  std::vector<VectorD> qd(static_cast<size_t>(Q)), qn(static_cast<size_t>(Q));
  for (int q = 0; q < Q; ++q) {
    Eigen::Map<const Eigen::VectorXf> qv(queries[static_cast<size_t>(q)].data(), d);
    const VectorD l = K * qv.cast<double>() * scale;
    double md = -std::numeric_limits<double>::infinity(), mn = md;
    for (int i = 0; i < N; ++i) {
      md = std::max(md, l(i));
      if (vnorm(i) > 0) mn = std::max(mn, l(i) + std::log(vnorm(i)));
    }
    qd[static_cast<size_t>(q)] = (l.array() - md).exp();
    qn[static_cast<size_t>(q)] =
        std::isfinite(mn) ? VectorD((l.array() - mn).exp()) : VectorD::Zero(N);
  }

  // The measures of one sign vector at the sizes: prefix sums when `prefixes`, else only the
  // full length of `sigma` (one size, index `only`).
  auto measure = [&](const std::string& instance, const std::string& signs,
                     const std::vector<int8_t>& sigma, int only) {
    const bool num = instance == "numerator";
    const MatrixD& ker = num ? kn : kd;
    const int L = static_cast<int>(sigma.size());
    // Both curves first (creating one may move the other), then references.
    curve(run.curves, instance, "query", signs, sizes);
    curve(run.curves, instance, "kernel", signs, sizes);
    ScalingCurve& cq = curve(run.curves, instance, "query", signs, sizes);
    ScalingCurve& ck = curve(run.curves, instance, "kernel", signs, sizes);
    // Kernel norm sqrt(sigma^T K sigma) grown one step at a time.
    double quad = 0;
    std::vector<VectorD> acc(static_cast<size_t>(Q), VectorD::Zero(num ? dv : 1));
    size_t next = 0;
    for (int i = 0; i < L; ++i) {
      double cross = 0;
      for (int j = 0; j < i; ++j) cross += ker(i, j) * sigma[static_cast<size_t>(j)];
      quad += 2 * sigma[static_cast<size_t>(i)] * cross + ker(i, i);
      for (int q = 0; q < Q; ++q) {
        if (num)
          acc[static_cast<size_t>(q)] +=
              sigma[static_cast<size_t>(i)] * qn[static_cast<size_t>(q)](i) * V.row(i).transpose();
        else
          acc[static_cast<size_t>(q)](0) +=
              sigma[static_cast<size_t>(i)] * qd[static_cast<size_t>(q)](i);
      }
      const bool at_size = only >= 0 ? i == L - 1 : (next < sizes.size() && i + 1 == sizes[next]);
      if (!at_size) continue;
      const size_t slot = only >= 0 ? static_cast<size_t>(only) : next++;
      double mq = 0;
      for (int q = 0; q < Q; ++q) mq += acc[static_cast<size_t>(q)].norm();
      cq.samples[slot].push_back(Q > 0 ? mq / Q : std::numeric_limits<double>::quiet_NaN());
      ck.samples[slot].push_back(std::sqrt(std::max(0.0, quad)));
    }
  };

  for (int s = 0; s < seeds; ++s) {
    const uint64_t seed = base_seed + static_cast<uint64_t>(s);
    for (int inst = 0; inst < 2; ++inst) {
      const bool num = inst == 1;
      const std::string instance = num ? "numerator" : "denominator";
      const MatrixF& vals = num ? values : ones;
      long sat = 0, walked = 0;
      if (mode == DiscSizes::Prefixes) {
        measure(instance, "walk",
                walk_signs(keys, vals, N, run.walk.params, seed, layer, head,
                           static_cast<uint32_t>(inst), 0, &sat),
                -1);
        walked += N - 1;
      } else {
        for (size_t k = 0; k < sizes.size(); ++k) {
          measure(instance, "walk",
                  walk_signs(keys, vals, sizes[k], run.walk.params, seed, layer, head,
                             static_cast<uint32_t>(inst), static_cast<uint32_t>(k), &sat),
                  static_cast<int>(k));
          walked += sizes[k] - 1;
        }
      }
      if (sat_counts) sat_counts[inst] += sat;
      if (walked_counts) walked_counts[inst] += walked;
      // Random signs: fair coins, independent of the walk's draws; in whole-block mode a fresh
      // draw per size, so the sizes' samples are independent as the blocks' walks are.
      auto coins = [&](int len, uint32_t block) {
        std::vector<int8_t> rnd(static_cast<size_t>(len));
        for (int i = 0; i < len; ++i)
          rnd[static_cast<size_t>(i)] = counter_uniform(seed, kRandRandomSigns, layer, head,
                                                        100u + static_cast<uint32_t>(inst), block,
                                                        static_cast<uint32_t>(i)) < 0.5
                                            ? 1
                                            : -1;
        return rnd;
      };
      if (mode == DiscSizes::Prefixes) {
        measure(instance, "random", coins(N, 0), -1);
      } else {
        for (size_t k = 0; k < sizes.size(); ++k)
          measure(instance, "random", coins(sizes[k], static_cast<uint32_t>(k)),
                  static_cast<int>(k));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The whole run

namespace {

std::string label_of(const TheoryMethod& m) {
  if (m.params.empty()) return m.name;
  std::ostringstream os;
  os << m.name << " (";
  bool first = true;
  for (const auto& [k, v] : m.params) {
    os << (first ? "" : ", ") << k << " " << v;
    first = false;
  }
  os << ")";
  return os.str();
}

std::vector<int> scope_list(const std::vector<int>& wanted, int count, const char* what) {
  if (wanted.empty()) {
    std::vector<int> all(static_cast<size_t>(count));
    for (int i = 0; i < count; ++i) all[static_cast<size_t>(i)] = i;
    return all;
  }
  for (int v : wanted)
    if (v < 0 || v >= count)
      throw InputError(std::string(what) + " " + std::to_string(v) + ": the capture has " + what +
                       "s 0.." + std::to_string(count - 1));
  return wanted;
}

// The settings checked before any work; returns the methods, found by name.
std::vector<const Method*> check_settings(const TheorySpec& spec) {
  if (spec.seeds < 1 || spec.seeds > 1000)
    throw SettingError("seeds", "--seeds", "must be in [1, 1000]");
  if (spec.disc_seeds < 1 || spec.disc_seeds > 1000)
    throw SettingError("discrepancy seeds", "--disc-seeds", "must be in [1, 1000]");
  if (spec.max_n < 4 || spec.max_n > 4096)
    throw SettingError("largest n", "--max-n", "must be in [4, 4096]");
  for (double q : spec.ratios)
    if (!(q > 0 && q <= 1))
      throw SettingError("ratios", "--ratios", "every ratio must be in (0, 1]");
  std::vector<const Method*> methods;
  for (const TheoryMethod& m : spec.methods) {
    const Method* meth = find_method(m.name);
    if (!meth) throw SettingError("methods", "--methods", "unknown method '" + m.name + "'");
    validate_method_params(*meth, m.params);
    methods.push_back(meth);
  }
  return methods;
}

// "layer L kv head h" for one head, "all N heads" for the whole capture, "N heads" for a choice
// of layers.
std::string describe_scope(const TheorySpec& spec, int num_layers, const std::vector<int>& layers,
                           const std::vector<int>& heads, int num_heads) {
  std::string scope =
      num_heads == 1 ? "layer " + std::to_string(layers[0]) + " kv head " + std::to_string(heads[0])
                     : "all " + std::to_string(num_heads) + " heads";
  if (!spec.layers.empty() && num_heads > 1 && layers.size() < static_cast<size_t>(num_layers))
    scope = std::to_string(num_heads) + " heads";
  return scope;
}

// Sizes 2^k from min_n up to the largest power of two within the middle and max_n.
std::vector<int> discrepancy_sizes(const TheorySpec& spec, int n_mid) {
  std::vector<int> sizes;
  int top = 1;
  while (top * 2 <= std::min(spec.max_n, n_mid)) top *= 2;
  for (int n = std::max(2, spec.min_n); n <= top; n *= 2) sizes.push_back(n);
  return sizes;
}

// One ErrorScaling per method, with its three curves (relative, frobenius, operator) and an
// empty list of samples per ratio.
std::vector<ErrorScaling> empty_error_scalings(const TheorySpec& spec, size_t num_methods) {
  const size_t P = spec.ratios.size();
  std::vector<ErrorScaling> errors;
  for (size_t m = 0; m < num_methods; ++m) {
    ErrorScaling e;
    e.method = spec.methods[m].name;
    e.label = label_of(spec.methods[m]);
    e.ratios = spec.ratios;
    e.budgets.assign(P, 0);
    e.kept.assign(P, 0);
    for (const char* measure : {"relative", "frobenius", "operator"}) {
      ScalingCurve c;
      c.instance = e.method;
      c.measure = measure;
      c.samples.resize(P);
      e.curves.push_back(std::move(c));
    }
    errors.push_back(std::move(e));
  }
  return errors;
}

// Progress over work items (per head: one per walk, one per method and ratio); throws Cancelled
// once `cancel` is set.
class TheoryTicker {
 public:
  TheoryTicker(int total, const TheoryProgress& progress, const std::atomic<bool>* cancel)
      : total_(total), progress_(progress), cancel_(cancel) {}

  void tick() {
    ++done_;
    if (progress_) progress_(done_, total_);
    if (cancel_ && cancel_->load()) throw Cancelled();
  }
  // Items of a head that is not measured.
  void skip(int items) { done_ += items; }

 private:
  const int total_;
  const TheoryProgress& progress_;
  const std::atomic<bool>* cancel_;
  int done_ = 0;
};

// What the heads add up before the curves are finished.
struct TheoryTotals {
  TheoryTotals(size_t walks, size_t methods, int ratios)
      : sat(walks, {0, 0}),
        walked(walks, {0, 0}),
        kept_sum(methods, std::vector<long>(static_cast<size_t>(ratios), 0)),
        kept_cnt(methods, std::vector<int>(static_cast<size_t>(ratios), 0)),
        method_errors(methods) {}

  // Per walk, [0] denominator and [1] numerator: the saturated steps and the steps walked.
  std::vector<std::array<long, 2>> sat, walked;
  // Per method and ratio: middle tokens kept, summed over the runs, and the runs.
  std::vector<std::vector<long>> kept_sum;
  std::vector<std::vector<int>> kept_cnt;
  std::vector<std::string> method_errors;  // per method: the first error a run threw
};

// What every head's measurement reads and adds to.
struct TheoryWork {
  const TheorySpec& spec;
  const std::vector<const Method*>& methods;
  const EvalWindow& w0;  // the first head's window at the first ratio
  bool disc;             // discrepancy curves wanted, and the middle long enough for them
  TheoryResult& r;
  TheoryTotals totals;
  TheoryTicker ticker;
  const std::atomic<bool>* cancel;
  bool proxy = false;  // the keys stood in for missing queries
};

// Evaluation queries, evenly spaced over the window and the group.
std::vector<std::vector<float>> evaluation_queries(const std::vector<const MatrixF*>& group, int n,
                                                   int eval, int max_queries) {
  std::vector<std::vector<float>> qs;
  const int total_q = static_cast<int>(group.size()) * eval;
  const int take = std::min(max_queries, total_q);
  for (int t = 0; t < take; ++t) {
    const int idx = static_cast<int>(static_cast<long long>(t) * total_q / take);
    const MatrixF& Qm = *group[static_cast<size_t>(idx / eval)];
    const int row = n - eval + idx % eval;
    qs.emplace_back(Qm.row(row).data(), Qm.row(row).data() + Qm.cols());
  }
  return qs;
}

// One head's discrepancy under every walk, over the middle's first sizes.back() tokens.
void head_discrepancy(TheoryWork& work, const MatrixF& keys, const MatrixF& values,
                      const std::vector<const MatrixF*>& group, int n, int L, int h) {
  const TheorySpec& spec = work.spec;
  TheoryResult& r = work.r;
  const std::vector<std::vector<float>> qs =
      evaluation_queries(group, n, work.w0.eval, spec.max_queries);
  const MatrixF mk = keys.middleRows(work.w0.mid_begin, r.sizes.back());
  const MatrixF mv = values.middleRows(work.w0.mid_begin, r.sizes.back());
  for (size_t wi = 0; wi < r.discrepancy.size(); ++wi) {
    measure_discrepancy(mk, mv, qs, r.sizes, spec.sizes, spec.disc_seeds, spec.base_seed,
                        static_cast<uint32_t>(L), static_cast<uint32_t>(h), r.discrepancy[wi],
                        work.totals.sat[wi].data(), work.totals.walked[wi].data());
    work.ticker.tick();
  }
}

// Adds one run's errors, each averaged over the group's evaluation queries, as a sample of the
// relative, Frobenius and operator curves at ratio p; the operator measure rescales the
// Frobenius-normalised error by each prefix's ||V||_F / ||V||_2.
void add_error_samples(const HeadRun& run, const std::vector<double>& op,
                       const std::vector<double>& fro, ErrorScaling& e, size_t p) {
  double rel = 0, fr = 0, opn = 0;
  int cnt = 0;
  for (const auto& qh : run.per_query_head)
    for (size_t qi = 0; qi < qh.size(); ++qi) {
      rel += qh[qi].relative;
      fr += qh[qi].normalized;
      opn += op[qi] > 0 ? qh[qi].normalized * fro[qi] / op[qi] : 0;
      ++cnt;
    }
  if (cnt == 0) return;
  e.curves[0].samples[p].push_back(rel / cnt);
  e.curves[1].samples[p].push_back(fr / cnt);
  e.curves[2].samples[p].push_back(opn / cnt);
}

// Method m at ratio p on one head, once per seed. A run that throws (other than by a cancel)
// ends the method's seeds there; its first error becomes the method's note.
void errors_over_seeds(TheoryWork& work, const LayerData& layer, int h, size_t m, int p,
                       const std::vector<double>& op, const std::vector<double>& fro) {
  const TheorySpec& spec = work.spec;
  const size_t ps = static_cast<size_t>(p);
  MethodSettings ms;
  ms.method = work.methods[m];
  ms.keep_ratio = spec.ratios[ps];
  ms.params = spec.methods[m].params;
  ms.sink = spec.sink;
  ms.eval = spec.eval;
  ms.estimator = spec.estimator;
  ErrorScaling& e = work.r.errors[m];
  for (int s = 0; s < spec.seeds; ++s) {
    HeadRun run;
    try {
      run = run_head(layer, work.r.info.num_layers, h, ms,
                     spec.base_seed + static_cast<uint64_t>(s), false, nullptr, work.cancel);
    } catch (const Cancelled&) {
      throw;
    } catch (const std::exception& ex) {
      if (work.totals.method_errors[m].empty()) work.totals.method_errors[m] = ex.what();
      break;
    }
    e.budgets[ps] = run.window.budget;
    work.totals.kept_sum[m][ps] += static_cast<long>(run.selection.indices.size());
    ++work.totals.kept_cnt[m][ps];
    add_error_samples(run, op, fro, e, ps);
  }
}

// One head's error against the budget: every method at every ratio, over the seeds.
void head_errors(TheoryWork& work, const LayerData& layer, const MatrixF& values, int n, int h) {
  const TheorySpec& spec = work.spec;
  const EvalWindow we = EvalWindow::make(n, spec.ratios[0], spec.sink, spec.eval);
  const std::vector<double> op = prefix_operator_norms(values, n - we.eval, n - 1);
  const std::vector<double> fro = prefix_frobenius_norms(values, n - we.eval, n - 1);
  const int P = static_cast<int>(spec.ratios.size());
  for (size_t m = 0; m < work.methods.size(); ++m) {
    for (int p = 0; p < P; ++p) {
      errors_over_seeds(work, layer, h, m, p, op, fro);
      work.ticker.tick();
    }
  }
}

// One kv head of layer L: the discrepancy curves' samples, then the error curves'.
void measure_head(TheoryWork& work, const LayerData& layer, int L, int h) {
  const MatrixF& keys = layer.keys[static_cast<size_t>(h)];
  const MatrixF& values = layer.values[static_cast<size_t>(h)];
  std::vector<const MatrixF*> group = layer.group_queries(h);
  if (group.empty()) {
    group.push_back(&keys);
    work.proxy = true;
  }
  const int n = static_cast<int>(keys.rows());
  if (work.disc) head_discrepancy(work, keys, values, group, n, L, h);
  if (work.spec.want_error && !work.methods.empty()) head_errors(work, layer, values, n, h);
}

// The walks' saturation shares, and each discrepancy curve's mean, spread and fit.
void finish_discrepancy(TheoryResult& r, const TheoryTotals& totals) {
  for (size_t wi = 0; wi < r.discrepancy.size(); ++wi) {
    DiscRun& d = r.discrepancy[wi];
    const std::array<long, 2>& sat = totals.sat[wi];
    const std::array<long, 2>& walked = totals.walked[wi];
    d.saturation_denominator = walked[0] > 0 ? double(sat[0]) / walked[0] : 0;
    d.saturation_numerator = walked[1] > 0 ? double(sat[1]) / walked[1] : 0;
    for (ScalingCurve& c : d.curves) finish_curve(c, 8);
  }
}

// The mean middle tokens kept, each error curve against the budgets m, and the methods' errors.
void finish_errors(TheoryResult& r, const TheoryTotals& totals) {
  const int P = static_cast<int>(r.spec.ratios.size());
  for (size_t m = 0; m < r.errors.size(); ++m) {
    ErrorScaling& e = r.errors[m];
    for (int p = 0; p < P; ++p) {
      const size_t ps = static_cast<size_t>(p);
      e.kept[ps] =
          totals.kept_cnt[m][ps] > 0 ? double(totals.kept_sum[m][ps]) / totals.kept_cnt[m][ps] : 0;
    }
    for (ScalingCurve& c : e.curves) {
      c.x.clear();
      for (int b : e.budgets) c.x.push_back(b);
      finish_curve(c);
    }
    if (!totals.method_errors[m].empty()) e.note = totals.method_errors[m];
  }
}

}  // namespace

TheoryResult run_theory(CaptureFile& capture, const TheorySpec& spec,
                        const TheoryProgress& progress, const std::atomic<bool>* cancel) {
  TheoryResult r;
  r.info = capture.info();
  r.capture_path = r.info.path;
  r.spec = spec;
  if (r.spec.walks.empty()) r.spec.walks = default_disc_walks();
  const CaptureInfo& info = r.info;
  const std::vector<int> layers = scope_list(spec.layers, info.num_layers, "layer");
  const std::vector<int> heads = scope_list(spec.heads, info.kv_heads, "kv head");
  const std::vector<const Method*> methods = check_settings(spec);
  r.heads = static_cast<int>(layers.size() * heads.size());
  r.scope = describe_scope(spec, info.num_layers, layers, heads, r.heads);

  const EvalWindow w0 = EvalWindow::make(
      info.num_tokens, spec.ratios.empty() ? 0.5 : spec.ratios[0], spec.sink, spec.eval);
  r.window = w0.describe();
  r.sizes = discrepancy_sizes(spec, w0.n_mid);
  const bool disc = spec.want_discrepancy && r.sizes.size() >= 2;
  if (spec.want_discrepancy && !disc)
    r.notes.push_back("the middle (" + std::to_string(w0.n_mid) +
                      " tokens) is too short for a discrepancy curve");

  const int per_head_disc = disc ? static_cast<int>(r.spec.walks.size()) : 0;
  const int per_head_err =
      spec.want_error ? static_cast<int>(methods.size() * spec.ratios.size()) : 0;
  const int total = r.heads * (per_head_disc + per_head_err);
  if (disc)
    for (const DiscWalk& w : r.spec.walks) r.discrepancy.push_back(DiscRun{w, 0, 0, {}});
  if (spec.want_error) r.errors = empty_error_scalings(spec, methods.size());
  const int P = static_cast<int>(spec.ratios.size());
  TheoryWork work{spec,
                  methods,
                  w0,
                  disc,
                  r,
                  TheoryTotals(r.discrepancy.size(), r.errors.size(), P),
                  TheoryTicker(total, progress, cancel),
                  cancel};

  for (int L : layers) {
    if (cancel && cancel->load()) throw Cancelled();
    const std::shared_ptr<const LayerData> layer = capture.layer(L);
    for (int h : heads) {
      if (!layer->refused[static_cast<size_t>(h)].empty()) {
        r.notes.push_back("layer " + std::to_string(L) + " kv head " + std::to_string(h) +
                          " refused: " + layer->refused[static_cast<size_t>(h)]);
        work.ticker.skip(per_head_disc + per_head_err);
        continue;
      }
      measure_head(work, *layer, L, h);
    }
  }
  if (work.proxy) r.notes.push_back("the capture has no queries: the keys stand in for them");
  finish_discrepancy(r, work.totals);
  finish_errors(r, work.totals);
  return r;
}

// ---------------------------------------------------------------------------------------------
// Output

namespace {

nlohmann::json fit_json(const PowerFit& f) {
  if (!f.ok) return nullptr;
  return {{"slope", f.slope},   {"ci_low", f.ci_low},      {"ci_high", f.ci_high},
          {"se", f.se},         {"level", f.level},        {"r2", f.r2},
          {"points", f.points}, {"intercept", f.intercept}};
}

nlohmann::json curve_json(const ScalingCurve& c) {
  nlohmann::json pts = nlohmann::json::array();
  for (size_t p = 0; p < c.x.size(); ++p) {
    auto num = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); };
    pts.push_back({{"x", c.x[p]},
                   {"mean", num(c.mean[p])},
                   {"min", num(c.lo[p])},
                   {"max", num(c.hi[p])},
                   {"samples", c.samples[p].size()}});
  }
  return {{"points", pts}, {"fit", fit_json(c.fit)}};
}

}  // namespace

nlohmann::json TheoryResult::to_json() const {
  nlohmann::json j;
  j["capture"] = capture_path;
  j["model"] = info.model;
  j["synthetic"] = info.synthetic;
  j["scope"] = scope;
  j["heads"] = heads;
  j["window"] = window;
  j["fit_method"] =
      "ordinary least squares of log y on log x over every seed and head point; two-sided "
      "Student-t interval slope +- t(N-2) * se";
  nlohmann::json dj = nlohmann::json::array();
  for (const DiscRun& d : discrepancy) {
    nlohmann::json run;
    run["label"] = d.walk.label;
    run["params"] = {{"gamma", d.walk.params.gamma},
                     {"temp", d.walk.params.temp},
                     {"beta", d.walk.params.beta},
                     {"value_bias", d.walk.params.value_bias},
                     {"float32", d.walk.params.float32}};
    run["saturation"] = {{"denominator", d.saturation_denominator},
                         {"numerator", d.saturation_numerator}};
    nlohmann::json cs = nlohmann::json::array();
    for (const ScalingCurve& c : d.curves) {
      nlohmann::json cj = curve_json(c);
      cj["instance"] = c.instance;
      cj["measure"] = c.measure;
      cj["signs"] = c.signs;
      cs.push_back(cj);
    }
    run["curves"] = cs;
    dj.push_back(run);
  }
  j["discrepancy"] = {{"sizes", disc_sizes_name(spec.sizes)},
                      {"n", sizes},
                      {"seeds", spec.disc_seeds},
                      {"queries", spec.max_queries},
                      {"runs", dj}};
  nlohmann::json ej = nlohmann::json::array();
  for (const ErrorScaling& e : errors) {
    nlohmann::json m;
    m["method"] = e.method;
    m["label"] = e.label;
    m["ratios"] = e.ratios;
    m["budgets"] = e.budgets;
    m["kept"] = e.kept;
    for (const ScalingCurve& c : e.curves) {
      nlohmann::json cj = curve_json(c);
      // error ~ m^-alpha: alpha is minus the fitted slope.
      if (c.fit.ok)
        cj["alpha"] = {
            {"value", -c.fit.slope}, {"ci_low", -c.fit.ci_high}, {"ci_high", -c.fit.ci_low}};
      m[c.measure] = cj;
    }
    if (!e.note.empty()) m["note"] = e.note;
    ej.push_back(m);
  }
  j["error"] = {{"seeds", spec.seeds}, {"methods", ej}};
  j["bound"] =
      "not drawn: the theorems (BalanceKV Theorems 3.1-3.3, SubGen Theorem 1) state the budget "
      "with O*, O and Omega, whose constants are not given; only the rates m^-1 and m^-1/2 are";
  j["notes"] = notes;
  return j;
}

std::string TheoryResult::to_csv() const {
  std::ostringstream os;
  os.precision(9);
  os << "figure,run,instance,measure,signs,x,mean,min,max,samples\n";
  auto rows = [&](const std::string& fig, const std::string& run, const ScalingCurve& c) {
    for (size_t p = 0; p < c.x.size(); ++p)
      os << fig << ",\"" << run << "\"," << c.instance << "," << c.measure << "," << c.signs << ","
         << c.x[p] << "," << c.mean[p] << "," << c.lo[p] << "," << c.hi[p] << ","
         << c.samples[p].size() << "\n";
  };
  for (const DiscRun& d : discrepancy)
    for (const ScalingCurve& c : d.curves) rows("discrepancy", d.walk.label, c);
  for (const ErrorScaling& e : errors)
    for (const ScalingCurve& c : e.curves) rows("error", e.label, c);
  return os.str();
}

}  // namespace kvscope
