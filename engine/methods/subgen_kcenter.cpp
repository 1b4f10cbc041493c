// subgen-kcenter: the variant the SubGen paper (Zandieh et al. 2024) runs in its experiments
// (section 3.2): "we apply the greedy k-center clustering algorithm once to compress the entire
// KV caches", keeping the most recent tokens plus k centres selected from the remaining tokens.
// Here the protocol's sinks and evaluation window play the recent part, and greedy k-center
// (Gonzalez; engine/geometry/kcenter.h) on the middle's keys picks m centres, starting from the
// first middle token.
//
// Weights. The paper keeps the centres as ordinary cache entries -- attention over the reduced
// cache with no reweighting -- so the default weight is 1 (weighting = "paper"). The option
// weighting = "cluster size" weights each centre by the number of middle tokens whose nearest
// centre it is (Voronoi assignment), the natural estimator of the softmax sums when each
// cluster's keys are close to its centre; it is not what the paper ran.
// Selection::cluster holds each middle token's centre (pick order), for the Geometry view.
// Runs on MethodInput::backend's kcenter when one is given (the CUDA kernel), else on the CPU.
#include <algorithm>

#include "engine/core/error.h"
#include "engine/geometry/kcenter.h"
#include "engine/methods/method.h"
#include "engine/methods/scoring.h"
#include "engine/ops/backend.h"

namespace kvscope {
namespace {

class SubGenKCenter final : public Method {
 public:
  std::string name() const override { return "subgen-kcenter"; }
  std::string summary() const override {
    return "greedy k-center on the middle's keys, keep the m centres (SubGen's experiment)";
  }
  std::vector<ParamSpec> params() const override {
    return {param_spec("weighting", ParamSpec::Type::Choice, 0, 1, 0,
                       "centre weight: 1 as in the paper's experiment, or its cluster's size",
                       {"paper (1)", "cluster size"})};
  }

  // Greedy k-center from the first middle token: no randomness.
  bool depends_on_seed() const override { return false; }

  Selection select(const MethodInput& in) const override {
    check_method_input(in, name(), false);
    validate_params(params(), in.params, name());
    const bool by_size = param_value(params(), in.params, "weighting") >= 0.5;
    const int n_mid = in.mid_end - in.mid_begin;
    Selection sel;
    sel.cluster.assign(n_mid, -1);
    if (in.budget == 0 || n_mid == 0) return sel;
    const MatrixF keys = in.keys->middleRows(in.mid_begin, n_mid);
    // The k-center op (engine/ops/kcenter.h) on the method's backend, the CPU when none.
    Backend& backend = in.backend ? *in.backend : cpu_backend();
    const std::vector<int> centres =
        backend.kcenter(keys.data(), n_mid, static_cast<int>(keys.cols()), in.budget, 0);
    const std::vector<int> owner = assign_to_centres(keys, centres);
    std::vector<int> cluster_size(centres.size(), 0);
    for (int i = 0; i < n_mid; ++i) {
      sel.cluster[i] = owner[i];
      ++cluster_size[owner[i]];
    }
    // Hover score: the pick order (0 = first centre); dropped tokens get their distance rank -1.
    sel.middle_scores.assign(n_mid, -1.0);
    std::vector<int> order(centres.size());
    for (size_t c = 0; c < centres.size(); ++c) {
      order[c] = static_cast<int>(c);
      sel.middle_scores[centres[c]] = static_cast<double>(c);
    }
    std::sort(order.begin(), order.end(), [&](int a, int b) { return centres[a] < centres[b]; });
    for (int c : order) {
      sel.indices.push_back(in.mid_begin + centres[c]);
      // Every centre owns at least itself, so cluster sizes are >= 1 (positive weights).
      sel.weights.push_back(by_size ? std::max(1, cluster_size[c]) : 1.0);
    }
    sel.note = std::to_string(centres.size()) + " centres, weight " +
               (by_size ? "= cluster size" : "1 (paper)");
    return sel;
  }
};

}  // namespace

std::unique_ptr<Method> make_subgen_kcenter() {
  return std::make_unique<SubGenKCenter>();
}

}  // namespace kvscope
