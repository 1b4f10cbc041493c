// PyramidKV (Cai et al., "PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information
// Funneling", 2024; github.com/Zefan-Cai/PyramidKV, pyramidkv_utils.py PyramidKVCluster): SnapKV
// scores (observation window 32, average pooling kernel 5; see snapkv.cpp), but the budget falls
// linearly from the bottom layer to the top one, because lower layers spread attention widely
// and upper layers concentrate it.
//
// Per-layer budget, with m the protocol's budget (the average per layer), L layers, beta = 20:
//   min = m / beta,  max = 2m - min          (so the mean of max and min is m)
//   if max > n_mid:  max = n_mid, min = 2m - n_mid          (as the reference code clamps)
//   if min < 1:      min = 1,     max = 2m - 1              (every layer keeps at least one)
//   m_l = max - l (max - min) / (L - 1),  l = 0 (bottom) .. L-1 (top);  m_0 = m when L = 1.
// The reference code floors the step to an integer, so its total misses L*m by up to L-1 tokens;
// here the real-valued m_l are rounded through their cumulative sums
// (budget_l = round(C_{l+1}) - round(C_l), C_l = m_0 + ... + m_{l-1}), which keeps every budget
// within one token of the line, inside [1, n_mid], and makes the total over layers exactly L*m:
// the protocol's "every method gets the same m" holds for the sum over layers.
#include <algorithm>
#include <cmath>

#include "engine/core/error.h"
#include "engine/methods/method.h"
#include "engine/methods/scoring.h"

namespace kvscope {
namespace {

// Budget of `layer` (0 = bottom) among `num_layers`, for an average budget m per layer.
int pyramid_budget(int m, int n_mid, int layer, int num_layers, double beta) {
  if (m <= 0) return 0;
  if (num_layers == 1) return m;
  double lo = m / beta, hi = 2.0 * m - lo;
  if (hi > n_mid) {
    hi = n_mid;
    lo = 2.0 * m - n_mid;
  }
  if (lo < 1) {
    lo = 1;
    hi = 2.0 * m - 1;
  }
  const double step = (hi - lo) / (num_layers - 1);
  // C_l = sum_{l' < l} (hi - l' step) = l hi - step l (l - 1) / 2
  auto cumulative = [&](int l) { return l * hi - step * l * (l - 1) / 2.0; };
  return static_cast<int>(std::llround(cumulative(layer + 1)) - std::llround(cumulative(layer)));
}

class PyramidKV final : public Method {
 public:
  std::string name() const override { return "pyramidkv"; }
  std::string summary() const override {
    return "snapkv scores, budget falling linearly from bottom to top layer (same total)";
  }
  std::vector<ParamSpec> params() const override {
    return {
        param_spec("window", ParamSpec::Type::Int, 1, 4096, 32,
                   "observation window: how many queries before the evaluation window vote"),
        param_spec("kernel", ParamSpec::Type::Int, 1, 63, 5,
                   "average-pooling kernel over neighbouring tokens (odd; 1 = no pooling)"),
        param_spec("beta", ParamSpec::Type::Float, 1, 1000, 20,
                   "top layer keeps m/beta, bottom layer 2m - m/beta (larger = steeper)", {}, true),
    };
  }
  bool needs_queries() const override { return true; }
  // A lower layer keeps up to 2m - m/beta tokens: the budget holds for the sum over layers, not
  // per head, so the protocol's per-head check does not apply.
  bool respects_budget() const override { return false; }
  bool depends_on_seed() const override { return false; }
  bool ranks_by_score() const override { return true; }
  // The scores are SnapKV's (beta only changes how many are kept), checked here once.
  Ranking rank(const MethodInput& in) const override {
    check_method_input(in, name(), true);
    validate_params(params(), in.params, name());
    const auto specs = params();
    const SnapKVWindow w = snapkv_window_params(specs, in.params, name());
    if (!(param_value(specs, in.params, "beta") >= 1))
      throw InputError("pyramidkv.beta must be >= 1");
    if (in.num_layers < 1 || in.layer < 0 || in.layer >= in.num_layers)
      throw InputError("pyramidkv: layer " + std::to_string(in.layer) + " is not inside the " +
                       std::to_string(in.num_layers) + " layers of the capture");
    std::vector<double> scores = snapkv_scores(in, w.window, w.kernel, false);
    return rank_by_scores(scores, scores);
  }
  Selection select(const MethodInput& in) const override { return ranked_selection(in, rank(in)); }
  Selection ranked_selection(const MethodInput& in, const Ranking& r) const override {
    const double beta = param_value(params(), in.params, "beta");
    const int n_mid = in.mid_end - in.mid_begin;
    const int layer_budget = pyramid_budget(in.budget, n_mid, in.layer, in.num_layers, beta);
    Selection sel = prefix_selection(in, r, layer_budget);
    sel.note = "layer " + std::to_string(in.layer) + " of " + std::to_string(in.num_layers) +
               " keeps " + std::to_string(layer_budget) +
               " (average m = " + std::to_string(in.budget) + " over layers)";
    return sel;
  }
};

}  // namespace

std::unique_ptr<Method> make_pyramidkv() {
  return std::make_unique<PyramidKV>();
}

}  // namespace kvscope
