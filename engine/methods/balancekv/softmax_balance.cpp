#include "engine/methods/balancekv/softmax_balance.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <tuple>

#include "engine/core/error.h"
#include "engine/core/random.h"
#include "engine/core/simd.h"
#include "engine/methods/balancekv/balance_walk.h"

namespace kvscope {

double softmax_balance_c(int n, double delta) {
  return 30.0 * std::log(static_cast<double>(std::max(n, 1)) / delta);
}

double softmax_balance_radius(double r_key, double r_value, int d) {
  return std::exp(r_key * r_key / (2.0 * std::sqrt(static_cast<double>(d)))) * r_value;
}

SoftmaxBalanceOutput softmax_balance(const MatrixF& keys, const MatrixF* values,
                                     const std::vector<int>& tokens,
                                     const SoftmaxBalanceConfig& cfg, uint32_t level,
                                     uint32_t call) {
  SoftmaxBalanceOutput out;
  const int len = static_cast<int>(tokens.size());
  if (len == 0) return out;
  const int d = static_cast<int>(keys.cols());
  // y_ji = exp(<k_j,k_i>/sqrt d) <v_j,v_i>. The walk reads i < j only, so without a trace only
  // that strict lower triangle is exponentiated and weighted (half the exps); traces need the
  // whole matrix. The products are the same Eigen expressions either way, so every entry the
  // walk reads is bit-identical. The buffers live on the thread: a protocol run makes thousands
  // of calls, and fresh MiB-sized matrices each time cost more in page faults than the walk.
  const bool full = !cfg.trace_query.empty();
  thread_local std::vector<double> kd_buf, vd_buf, kernel_buf, gv_buf;
  auto map = [](std::vector<double>& buf, int rows, int cols) {
    if (buf.size() < static_cast<size_t>(rows) * cols) buf.resize(static_cast<size_t>(rows) * cols);
    return Eigen::Map<MatrixD>(buf.data(), rows, cols);
  };
  Eigen::Map<MatrixD> kd = map(kd_buf, len, d);
  for (int i = 0; i < len; ++i) kd.row(i) = keys.row(tokens[i]).cast<double>();
  Eigen::Map<MatrixD> kernel = map(kernel_buf, len, len);
  kernel.noalias() = (kd * kd.transpose()) / std::sqrt(static_cast<double>(d));
  if (full)
    simd::kernels().exp_inplace(kernel.data(), static_cast<int>(kernel.size()));
  else
    for (int j = 1; j < len; ++j) simd::kernels().exp_inplace(&kernel(j, 0), j);
  if (values) {
    const int dv = static_cast<int>(values->cols());
    Eigen::Map<MatrixD> vd = map(vd_buf, len, dv);
    for (int i = 0; i < len; ++i) vd.row(i) = values->row(tokens[i]).cast<double>();
    Eigen::Map<MatrixD> gv = map(gv_buf, len, len);
    gv.noalias() = vd * vd.transpose();
    if (full)
      kernel.array() *= gv.array();
    else
      for (int j = 1; j < len; ++j)
        for (int i = 0; i < j; ++i) kernel(j, i) *= gv(j, i);
  }
  // Keep the buffers for the next call unless one huge batch would pin them on this thread.
  auto release_if_large = [] {
    if (kernel_buf.capacity() > (size_t{8} << 20)) {
      std::vector<double>().swap(kd_buf);
      std::vector<double>().swap(vd_buf);
      std::vector<double>().swap(kernel_buf);
      std::vector<double>().swap(gv_buf);
    }
  };
  const double cr2 = cfg.c * cfg.radius * cfg.radius;
  const uint32_t stream = (cfg.instance << 6) | (level & 63u);
  std::vector<int8_t> eta(len);
  std::vector<double> p(len), partial(len);
  int plus = 0;
  for (int j = 0; j < len; ++j) {
    double yeta = 0;
    for (int i = 0; i < j; ++i) yeta += kernel(j, i) * eta[i];
    if (std::abs(yeta) > cr2) ++out.fail_steps;
    p[j] = 0.5 - yeta / (2.0 * cr2);
    partial[j] = yeta;
    const double u = counter_uniform(cfg.seed, kRandMisc, cfg.layer, cfg.head, stream, call,
                                     static_cast<uint32_t>(j));
    eta[j] = u < std::clamp(p[j], 0.0, 1.0) ? int8_t{+1} : int8_t{-1};
    plus += eta[j] > 0;
  }
  const int8_t keep_sign = plus <= len - plus ? int8_t{+1} : int8_t{-1};
  for (int j = 0; j < len; ++j)
    if (eta[j] == keep_sign) out.kept.push_back(tokens[j]);
  std::sort(out.kept.begin(), out.kept.end());

  if (!cfg.trace_query.empty()) {
    out.traced = true;
    WalkBlockTrace& t = out.trace;
    t.round = static_cast<int>(level);
    t.block = static_cast<int>(call);
    t.tokens = tokens;
    t.p = p;
    t.partial = partial;
    t.sigma.assign(eta.begin(), eta.end());
    t.kept.resize(len);
    for (int j = 0; j < len; ++j) t.kept[j] = eta[j] == keep_sign;
    // Query terms exp(<k_j,q>/sqrt d) v_j in units of the largest one (see balance_walk.h).
    const Eigen::VectorXd q = Eigen::Map<const VectorF>(cfg.trace_query.data(), d).cast<double>();
    const Eigen::VectorXd logit = kd * q / std::sqrt(static_cast<double>(d));
    const double top = logit.maxCoeff();
    const int dv = values ? static_cast<int>(values->cols()) : 1;
    MatrixD z(len, dv);
    double biggest = 0;
    for (int j = 0; j < len; ++j) {
      const double e = std::exp(logit(j) - top);
      if (values)
        z.row(j) = e * values->row(tokens[j]).cast<double>();
      else
        z(j, 0) = e;
      biggest = std::max(biggest, z.row(j).norm());
    }
    if (biggest > 0) z /= biggest;
    fill_block_trace(t, kernel, z, cfg.seed, cfg.layer, cfg.head, stream, call);
  }
  release_if_large();
  return out;
}

MergeAndReduce::MergeAndReduce(int batch, int levels, Reduce reduce)
    : batch_(std::max(1, batch)),
      levels_(std::max(0, levels)),
      reduce_(std::move(reduce)),
      level_(levels_ + 1),
      calls_(levels_ + 1, 0) {}

void MergeAndReduce::push(int token) {
  level_[0].push_back(token);
  ++count_;
  if (count_ % batch_ != 0) return;
  long long p = count_ / batch_;
  for (int i = 0; i < levels_;) {
    std::vector<int> kept = reduce_(level_[i], i, calls_[i]++);
    level_[i + 1].insert(level_[i + 1].end(), kept.begin(), kept.end());
    level_[i].clear();
    ++i;
    if (p % 2 != 0) break;
    p /= 2;
  }
}

long long merge_and_reduce_bound(long long n, int batch, int levels) {
  batch = std::max(1, batch);
  levels = std::max(0, levels);
  std::vector<long long> c(levels + 1, 0);
  const long long batches = n / batch;
  for (long long b = 1; b <= batches; ++b) {
    c[0] += batch;
    long long p = b;
    for (int i = 0; i < levels;) {
      c[i + 1] += c[i] / 2;
      c[i] = 0;
      ++i;
      if (p % 2 != 0) break;
      p /= 2;
    }
  }
  c[0] += n - batches * batch;
  long long total = 0;
  for (long long v : c) total += v;
  return total;
}

// ---------------------------------------------------------------------------------------------
// The method.

std::vector<ParamSpec> balancekv_stream_param_specs() {
  std::vector<ParamSpec> s;
  s.push_back({"delta",
               ParamSpec::Type::Float,
               1e-12,
               0.5,
               0.01,
               "failure probability of each SoftmaxBalance call: c = 30 log(n/delta)",
               {},
               true});
  s.push_back({"c_scale",
               ParamSpec::Type::Float,
               1e-6,
               1,
               1,
               "multiplies c (1 = the theorem's constant; smaller makes the walk stronger and "
               "FAIL possible)",
               {},
               true});
  s.push_back({"max_batch",
               ParamSpec::Type::Int,
               2,
               4096,
               512,
               "largest MergeAndReduce batch t the budget search may pick (cost O(n t d))",
               {},
               true});
  return s;
}

namespace {

// Expected kept size of MergeAndReduce when each reduction keeps the smaller class of fair coin
// signs, E min(B, L - B) ~= L/2 - sqrt(L / (2 pi)) for B ~ Binomial(L, 1/2): with the theorem's c
// the walk's probabilities stay within a hair of 1/2, so this is what SoftmaxBalance keeps.
double merge_and_reduce_expected(long long n, int batch, int levels) {
  const double kPi = 3.14159265358979323846;
  std::vector<double> c(levels + 1, 0.0);
  const long long batches = n / batch;
  for (long long b = 1; b <= batches; ++b) {
    c[0] += batch;
    long long p = b;
    for (int i = 0; i < levels;) {
      c[i + 1] += std::max(0.0, c[i] / 2 - std::sqrt(c[i] / (2 * kPi)));
      c[i] = 0;
      ++i;
      if (p % 2 != 0) break;
      p /= 2;
    }
  }
  c[0] += static_cast<double>(n - batches * batch);
  double total = 0;
  for (double v : c) total += v;
  return total;
}

// The batch size t and level count T (shared by every instance of one side, as in Algorithm 1):
// among the plans whose hard bound (every reduction keeping floor(|C|/2)) does not exceed m, the
// one with the largest expected kept size. The hard bound guarantees the budget; the expectation
// picks larger batches, which keep closer to m and balance better.
struct Plan {
  int batch = 2, levels = 0;
  long long bound = 0;
  double expected = 0;
};
Plan plan_budget_uncached(const std::vector<long long>& sizes, long long m, int max_batch) {
  Plan best;
  bool found = false;
  long long n_max = 0;
  for (long long s : sizes) n_max = std::max(n_max, s);
  for (int t = 2; t <= max_batch; ++t) {
    int top_level = 1;
    while ((static_cast<long long>(t) << (top_level - 1)) < n_max && top_level < 40) ++top_level;
    for (int T = 0; T <= top_level; ++T) {
      long long bound = 0;
      double expected = 0;
      for (long long s : sizes) {
        bound += merge_and_reduce_bound(s, t, T);
        expected += merge_and_reduce_expected(s, t, T);
      }
      if (bound <= m && (!found || expected > best.expected)) {
        best = {t, T, bound, expected};
        found = true;
      }
    }
    if (t >= n_max) break;  // a larger batch than the stream changes nothing
  }
  return best;
}

// The plan depends only on the sizes, m and max_batch, not on the seed: the protocol's seeds
// and the GUI's reruns of one head ask for the same plans again, so they are remembered (per
// thread, a handful).
Plan plan_budget(const std::vector<long long>& sizes, long long m, int max_batch) {
  using Key = std::tuple<std::vector<long long>, long long, int>;
  thread_local std::map<Key, Plan> memo;
  Key key{sizes, m, max_batch};
  if (auto it = memo.find(key); it != memo.end()) return it->second;
  if (memo.size() >= 64) memo.clear();
  return memo[key] = plan_budget_uncached(sizes, m, max_batch);
}

}  // namespace

void balancekv_stream_den_plan(long long n, long long m, int max_batch, int* batch, int* levels) {
  const Plan plan = plan_budget({n}, m, max_batch);
  *batch = plan.batch;
  *levels = plan.levels;
}

Selection balancekv_stream_select(const MethodInput& in) {
  const std::vector<ParamSpec> specs = balancekv_stream_param_specs();
  validate_params(specs, in.params, "balancekv-stream");
  check_method_input(in, "balancekv-stream", false);
  const int n_mid = in.mid_end - in.mid_begin;
  const double delta = param_value(specs, in.params, "delta");
  const double c_scale = param_value(specs, in.params, "c_scale");
  const int max_batch = static_cast<int>(param_value(specs, in.params, "max_batch"));
  const int m = in.budget;

  Selection sel;
  sel.separate = true;
  if (m == 0 || m >= n_mid) {
    for (int t = in.mid_begin; m > 0 && t < in.mid_end; ++t) {
      sel.indices.push_back(t);
      sel.weights.push_back(1.0);
    }
    sel.den_indices = sel.indices;
    sel.den_weights = sel.weights;
    sel.note = m == 0 ? "budget 0: nothing kept from the middle"
                      : "budget covers the whole middle: nothing to compress";
    return sel;
  }

  const int d = static_cast<int>(in.keys->cols());
  // Radii: the theorem assumes known bounds on the norms; we take them from this head's middle
  // (the offline capture knows them). r_value is per numerator bucket.
  double r_key = 0;
  std::map<int, std::vector<int>> buckets;  // bucket i: 2^i <= ||v|| < 2^{i+1}
  int zero_values = 0;
  for (int t = in.mid_begin; t < in.mid_end; ++t) {
    r_key = std::max(r_key, static_cast<double>(in.keys->row(t).cast<double>().norm()));
    const double vn = in.values->row(t).cast<double>().norm();
    if (vn > 0)
      buckets[static_cast<int>(std::floor(std::log2(vn)))].push_back(t);
    else
      ++zero_values;  // contributes nothing to the numerator: no instance needs it
  }

  std::vector<long long> num_sizes;
  for (const auto& [b, toks] : buckets) num_sizes.push_back(static_cast<long long>(toks.size()));
  const Plan num_plan = plan_budget(num_sizes, m, max_batch);
  const Plan den_plan = plan_budget({n_mid}, m, max_batch);

  int trace_pos = -1;
  std::vector<float> trace_q;
  if (in.want_trace) trace_q = trace_query_vector(in, &trace_pos);
  auto trace = in.want_trace ? std::make_shared<WalkTrace>() : nullptr;
  int fails = 0, calls = 0;

  // Runs one MergeAndReduce instance over `tokens` and appends its levels with weight 2^l.
  auto run_instance = [&](const std::vector<int>& tokens, const MatrixF* values, double r_value,
                          uint32_t instance, const Plan& plan, std::vector<int>& idx,
                          std::vector<double>& w) {
    SoftmaxBalanceConfig cfg;
    cfg.c = c_scale * softmax_balance_c(n_mid, delta);
    cfg.radius = softmax_balance_radius(r_key, r_value, d);
    cfg.seed = in.seed;
    cfg.layer = static_cast<uint32_t>(in.layer);
    cfg.head = static_cast<uint32_t>(in.kv_head);
    cfg.instance = instance;
    // Traces show the denominator instance (one instance keeps (round, block) unambiguous).
    if (instance == 0) cfg.trace_query = trace_q;
    MergeAndReduce mr(
        plan.batch, plan.levels, [&](const std::vector<int>& batch, int level, int call) {
          if (in.cancel && in.cancel->load()) throw Cancelled();
          SoftmaxBalanceOutput o =
              softmax_balance(*in.keys, values, batch, cfg, static_cast<uint32_t>(level),
                              static_cast<uint32_t>(call));
          fails += o.fail_steps;
          ++calls;
          if (o.traced && trace) trace->blocks.push_back(std::move(o.trace));
          return o.kept;
        });
    for (int t : tokens) mr.push(t);
    for (size_t l = 0; l < mr.levels().size(); ++l)
      for (int t : mr.levels()[l]) {
        idx.push_back(t);
        w.push_back(std::ldexp(1.0, static_cast<int>(l)));
      }
  };

  std::vector<int> num_idx, den_idx;
  std::vector<double> num_w, den_w;
  uint32_t instance = 1;
  for (const auto& [b, toks] : buckets) {
    double r_value = 0;
    for (int t : toks)
      r_value = std::max(r_value, static_cast<double>(in.values->row(t).cast<double>().norm()));
    run_instance(toks, in.values, r_value, instance++, num_plan, num_idx, num_w);
  }
  std::vector<int> middle(n_mid);
  for (int i = 0; i < n_mid; ++i) middle[i] = in.mid_begin + i;
  run_instance(middle, nullptr, 1.0, 0, den_plan, den_idx, den_w);

  auto sorted = [](std::vector<int>& idx, std::vector<double>& w) {
    std::vector<std::pair<int, double>> v;
    for (size_t i = 0; i < idx.size(); ++i) v.push_back({idx[i], w[i]});
    std::sort(v.begin(), v.end());
    for (size_t i = 0; i < v.size(); ++i) idx[i] = v[i].first, w[i] = v[i].second;
  };
  sorted(num_idx, num_w);
  sorted(den_idx, den_w);
  sel.indices = std::move(num_idx);
  sel.weights = std::move(num_w);
  sel.den_indices = std::move(den_idx);
  sel.den_weights = std::move(den_w);

  std::ostringstream note;
  note << "numerator: " << buckets.size() << " value-norm bucket"
       << (buckets.size() == 1 ? "" : "s") << ", batch t=" << num_plan.batch
       << ", levels T=" << num_plan.levels << ", kept " << sel.indices.size() << " of m=" << m
       << "; denominator: t=" << den_plan.batch << ", T=" << den_plan.levels << ", kept "
       << sel.den_indices.size();
  if (zero_values > 0) note << "; " << zero_values << " zero values left out of the numerator";
  if (fails > 0)
    note << "; SoftmaxBalance FAIL (|y^T eta| > c R^2) at " << fails << " steps in " << calls
         << " calls: the walk went on with p clipped to [0, 1]";
  sel.note = note.str();
  if (trace) {
    int rounds = 0;
    for (const WalkBlockTrace& b : trace->blocks) rounds = std::max(rounds, b.round + 1);
    trace->rounds = rounds;
    trace->trace_query = trace_pos;
    trace->note =
        "denominator instance: round = MergeAndReduce level, block = call at that "
        "level; " +
        sel.note;
    sel.trace = std::move(trace);
  }
  return sel;
}

}  // namespace kvscope
