// LagKV (Liang et al., "LagKV: Lag-Relative Information of the KV Cache Tells Which Tokens Are
// Important", 2025), ported from kvpress's LagKVPress (kvpress/presses/lagkv_press.py, the
// reference; docs/methods.md names the commit). After `n_sink` sink tokens the context is cut
// into partitions of `lag_size` tokens; each partition is scored against the next one (its
// "lag"): every channel of a key is min-max scaled by the next partition's range of that
// channel, the standard deviation over channels (unbiased) is taken, and a softmax over the
// partition's tokens turns it into a score; keys and values are scored alike and averaged. The
// last partition and the remainder (the tail, which has no lag yet) score 1, like the sinks. By
// default (`cross_scoring` off) a token's score is its rank inside its partition / lag_size, so
// every partition loses tokens at the same rate. A context shorter than n_sink + 2 lag_size is
// scored by position (the most recent first). Needs no queries.
//
// Mapping to the protocol (docs/methods.md, "kvpress presses"): the press sees the prefix
// [0, n-E), so partitions start at position n_sink of the capture; the top m of the middle are
// kept, weight 1. Equal scores (the sinks and the tail all score 1, and ranks repeat across
// partitions) go to the lower position; rank ties inside a partition (equal scores) go to the
// lower position too (kvpress's argsort leaves them to torch).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/methods/method.h"
#include "engine/methods/scoring.h"

namespace kvscope {
namespace {

std::vector<ParamSpec> lagkv_params() {
  return {
      param_spec("n_sink", ParamSpec::Type::Int, 0, 4096, 4,
                 "first tokens of the context never scored (score 1)"),
      param_spec("lag_size", ParamSpec::Type::Int, 2, 65536, 128,
                 "tokens per partition; each is scored against the next one"),
      param_spec("cross_scoring", ParamSpec::Type::Bool, 0, 1, 0,
                 "rank by the raw score across partitions instead of the rank inside each"),
  };
}

// _get_states_score of one partition [b, b + lag) against its lag [b + lag, b + 2 lag): the
// softmax over the partition's tokens of the std over channels of the min-max scaled rows.
void partition_scores(const MatrixF& x, int b, int lag, double* out) {
  const int d = static_cast<int>(x.cols());
  std::vector<double> lo(d, INFINITY), hi(d, -INFINITY);
  for (int t = b + lag; t < b + 2 * lag; ++t)
    for (int c = 0; c < d; ++c) {
      lo[c] = std::min(lo[c], static_cast<double>(x(t, c)));
      hi[c] = std::max(hi[c], static_cast<double>(x(t, c)));
    }
  std::vector<double> z(d);
  double top = -INFINITY;
  for (int j = 0; j < lag; ++j) {
    double mean = 0;
    for (int c = 0; c < d; ++c) {
      z[c] = (x(b + j, c) - lo[c]) / (hi[c] - lo[c]);
      mean += z[c];
    }
    mean /= d;
    double ss = 0;
    for (int c = 0; c < d; ++c) ss += (z[c] - mean) * (z[c] - mean);
    out[j] = std::sqrt(ss / (d - 1));
    top = std::max(top, out[j]);
  }
  double sum = 0;
  for (int j = 0; j < lag; ++j) sum += (out[j] = std::exp(out[j] - top));
  for (int j = 0; j < lag; ++j) out[j] /= sum;
}

class LagKV final : public ScoreRankingMethod {
 public:
  std::string name() const override { return "lagkv"; }
  std::string summary() const override {
    return "kvpress LagKV: per 128-token partition, keys/values scaled by the next partition's "
           "range; most varied kept";
  }
  std::vector<ParamSpec> params() const override { return lagkv_params(); }
  bool depends_on_seed() const override { return false; }
  Ranking rank(const MethodInput& in) const override {
    check_method_input(in, name(), false);
    validate_params(params(), in.params, name());
    const auto specs = params();
    const int sink = static_cast<int>(param_value(specs, in.params, "n_sink"));
    const int lag = static_cast<int>(param_value(specs, in.params, "lag_size"));
    const bool cross = param_value(specs, in.params, "cross_scoring") >= 0.5;
    const int ctx = in.mid_end;
    std::vector<double> s(ctx, 1.0);
    if (ctx < sink + 2 * lag) {
      for (int t = sink; t < ctx; ++t) s[t] = static_cast<double>(t - sink) / (ctx - sink);
    } else {
      const int parts = (ctx - sink) / lag;
      std::vector<double> ks(lag), vs(lag);
      std::vector<int> order(lag);
      for (int p = 0; p + 1 < parts; ++p) {
        const int b = sink + p * lag;
        partition_scores(*in.keys, b, lag, ks.data());
        partition_scores(*in.values, b, lag, vs.data());
        for (int j = 0; j < lag; ++j) s[b + j] = (ks[j] + vs[j]) / 2;
        if (!cross) {
          std::iota(order.begin(), order.end(), 0);
          std::stable_sort(order.begin(), order.end(),
                           [&](int a, int c) { return s[b + a] < s[b + c]; });
          for (int r = 0; r < lag; ++r) s[b + order[r]] = static_cast<double>(r) / lag;
        }
      }
    }
    std::vector<double> scores(s.begin() + in.mid_begin, s.begin() + in.mid_end);
    return rank_by_scores(scores, scores);
  }
};

}  // namespace

std::unique_ptr<Method> make_lagkv() {
  return std::make_unique<LagKV>();
}

}  // namespace kvscope
