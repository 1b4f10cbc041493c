// CurDKV (Sengupta et al., "Value-Guided KV Compression for LLMs via Approximated CUR
// Decomposition", 2025), ported from kvpress's CURPress (kvpress/presses/cur_press.py, the
// reference; docs/methods.md names the commit): approximate leverage scores of keys (|k|^2) and
// values (|v|^2), each normalised inside local windows of `local_window_size` tokens (aligned at
// position 0, the last window zero padded), combined (default: their product) and normalised over
// the context; the first `num_sinks` tokens score 1. Needs no queries.
//
// Mapping to the protocol (docs/methods.md, "kvpress presses"): the press sees the prefix
// [0, n-E); the top m of the middle are kept, weight 1. kvpress's `use_random_leverage` (a
// Gaussian projection to 20 dimensions before the norms, drawn from torch's generator) is not
// offered: the exact norms are what it approximates.
#include <cmath>

#include "engine/core/error.h"
#include "engine/methods/method.h"
#include "engine/methods/scoring.h"

namespace kvscope {
namespace {

std::vector<ParamSpec> cur_params() {
  return {
      param_spec("num_sinks", ParamSpec::Type::Int, 0, 4096, 4,
                 "first tokens of the context scored 1 (kept first)"),
      param_spec("leverage_type", ParamSpec::Type::Choice, 0, 3, 3,
                 "which leverage: of keys, of values, their mean, or their product (default)",
                 {"key", "value", "kv_avg", "kv_product"}),
      param_spec("use_local_approximation", ParamSpec::Type::Bool, 0, 1, 1,
                 "normalise the leverages inside local windows"),
      param_spec("local_window_size", ParamSpec::Type::Int, 1, 65536, 16,
                 "tokens per local window (aligned at position 0)"),
  };
}

class Cur final : public ScoreRankingMethod {
 public:
  std::string name() const override { return "cur"; }
  std::string summary() const override {
    return "kvpress CURPress: top m by |k|^2 |v|^2, each normalised in windows of 16";
  }
  std::vector<ParamSpec> params() const override { return cur_params(); }
  bool depends_on_seed() const override { return false; }
  Ranking rank(const MethodInput& in) const override {
    check_method_input(in, name(), false);
    validate_params(params(), in.params, name());
    const auto specs = params();
    const int sinks = static_cast<int>(param_value(specs, in.params, "num_sinks"));
    const int type = static_cast<int>(param_value(specs, in.params, "leverage_type"));
    const bool local = param_value(specs, in.params, "use_local_approximation") >= 0.5;
    const int w = static_cast<int>(param_value(specs, in.params, "local_window_size"));
    const int ctx = in.mid_end;
    std::vector<double> k2(ctx), v2(ctx);
    for (int t = 0; t < ctx; ++t) {
      k2[t] = in.keys->row(t).cast<double>().squaredNorm();
      v2[t] = in.values->row(t).cast<double>().squaredNorm();
    }
    if (local) {
      for (int b = 0; b < ctx; b += w) {
        const int e = std::min(ctx, b + w);
        double sk = 0, sv = 0;
        for (int t = b; t < e; ++t) sk += k2[t], sv += v2[t];
        for (int t = b; t < e; ++t) k2[t] /= sk, v2[t] /= sv;
      }
    }
    std::vector<double> s(ctx);
    double total = 0;
    for (int t = 0; t < ctx; ++t) {
      s[t] = type == 0   ? k2[t]
             : type == 1 ? v2[t]
             : type == 2 ? (k2[t] + v2[t]) / 2
                         : k2[t] * v2[t];
      total += s[t];
    }
    std::vector<double> scores(in.mid_end - in.mid_begin);
    for (int t = in.mid_begin; t < in.mid_end; ++t)
      scores[t - in.mid_begin] = t < sinks ? 1.0 : s[t] / total;
    return rank_by_scores(scores, scores);
  }
};

}  // namespace

std::unique_ptr<Method> make_cur() {
  return std::make_unique<Cur>();
}

}  // namespace kvscope
