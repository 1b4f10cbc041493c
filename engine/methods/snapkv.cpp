// SnapKV (Li et al., "SnapKV: LLM Knows What You are Looking for Before Generation", 2024;
// github.com/FasterDecoding/SnapKV, and its re-implementation in github.com/Zefan-Cai/PyramidKV,
// pyramidkv_utils.py SnapKVCluster): the last `window` queries of the prompt (the observation
// window) vote for the keys they attend to; the votes (softmax rows summed over the window) are
// smoothed by 1-D pooling (avg_pool1d, kernel 5, stride 1, padding 2, zero padded, divisor 5) so
// that neighbours of a heavy hitter survive with it, and the top m are kept with weight 1.
//
// Mapping to the protocol: the observation window is the w_obs = 32 queries just before the
// evaluation window, [n-E-32, n-E); the votes are averaged over the GQA group's query heads
// (the reference code runs per query head); pooling runs over the prefix [0, n-E) and the top m
// are taken over the middle. In the reference code the observation window's own tokens are
// always kept; here they belong to the middle and compete for the budget like every other token
// (they only get votes from the later window queries). `variant = kvpress` follows kvpress's
// SnapKVPress (kvpress/presses/snapkv_press.py) instead: the window's tokens come first and the
// pooling runs over the keys before the window (docs/methods.md, "kvpress presses").
#include <algorithm>

#include "engine/core/error.h"
#include "engine/methods/method.h"
#include "engine/methods/scoring.h"

namespace kvscope {
namespace {

std::vector<ParamSpec> snapkv_params() {
  return {
      param_spec("window", ParamSpec::Type::Int, 1, 4096, 32,
                 "observation window: how many queries before the evaluation window vote"),
      param_spec("kernel", ParamSpec::Type::Int, 1, 63, 5,
                 "pooling kernel over neighbouring tokens (odd; 1 = no pooling)"),
      param_spec("pooling", ParamSpec::Type::Choice, 0, 1, 0,
                 "how votes are smoothed over neighbours (SnapKV default: average)",
                 {"avg", "max"}),
      param_spec("variant", ParamSpec::Type::Choice, 0, 1, 0,
                 "kvpress: the window's own tokens are kept first and pooling stops before them "
                 "(kvpress's SnapKVPress; its window is 64)",
                 {"kvscope", "kvpress"}),
  };
}

class SnapKV final : public ScoreRankingMethod {
 public:
  std::string name() const override { return "snapkv"; }
  std::string summary() const override {
    return "top m by attention from the last 32 queries, pooled over neighbours (kernel 5)";
  }
  std::vector<ParamSpec> params() const override { return snapkv_params(); }
  bool needs_queries() const override { return true; }
  bool depends_on_seed() const override { return false; }
  Ranking rank(const MethodInput& in) const override {
    check_method_input(in, name(), true);
    validate_params(params(), in.params, name());
    const auto specs = params();
    const SnapKVWindow w = snapkv_window_params(specs, in.params, name());
    const bool max_pool = param_value(specs, in.params, "pooling") >= 0.5;
    if (param_value(specs, in.params, "variant") >= 0.5) {
      // kvpress/presses/snapkv_press.py: votes for the keys before the window only, pooled over
      // them (zero padded at both ends), the window's keys padded with the maximum + 1.
      const int cut = std::max(0, in.mid_end - w.window);
      std::vector<double> votes = observation_window_scores(in, w.window);
      votes.resize(cut);
      const std::vector<double> pooled =
          max_pool ? max_pool_same(votes, w.kernel) : avg_pool_same(votes, w.kernel);
      const double top = pooled.empty() ? 0.0 : *std::max_element(pooled.begin(), pooled.end());
      std::vector<double> scores(in.mid_end - in.mid_begin);
      for (int t = in.mid_begin; t < in.mid_end; ++t)
        scores[t - in.mid_begin] = t < cut ? pooled[t] : top + 1;
      return rank_by_scores(scores, scores);
    }
    std::vector<double> scores = snapkv_scores(in, w.window, w.kernel, max_pool);
    return rank_by_scores(scores, scores);
  }
};

}  // namespace

std::unique_ptr<Method> make_snapkv() {
  return std::make_unique<SnapKV>();
}

}  // namespace kvscope
