// CriticalKV (Feng et al., "Identify Critical KV Cache in LLM Inference from an Output
// Perturbation Perspective", 2025), ported from kvpress's CriticalKVPress
// (kvpress/presses/criticalkv_press.py, the reference; docs/methods.md names the commit): stage
// one keeps the inner press's top floor(first_stage_ratio * budget); stage two ranks the rest by
// (score + epsilon) * |W_O v|_1, the L1 norm of each value through the query head's slice of the
// output projection W_O, averaged over the GQA group.
//
// Mapping to the protocol (docs/methods.md, "kvpress presses"): stage one takes
// floor(first_stage_ratio * m) of the middle, stage two the remaining m - that. Because stage
// one's size follows the budget, the kept set is not a prefix of one ordering: select() runs per
// budget. `projection` = `wo` (the press) takes W_O from the capture (`layers.L.wo`,
// docs/capture-format.md) and refuses a capture without it, naming what is missing;
// `projection` = `identity` takes W_O = I (|v|_1), an approximation of the press, said so in
// every selection's note.
#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/core/error.h"
#include "engine/io/capture.h"
#include "engine/methods/scoring.h"
#include "engine/methods/wrapper_util.h"

namespace kvscope {
namespace {

class CriticalKV final : public WrapperBase {
 public:
  explicit CriticalKV(const Method& inner)
      : WrapperBase("criticalkv", inner,
                    {param_spec("epsilon", ParamSpec::Type::Float, 0, 1, 1e-4,
                                "added to the inner score before the |W_O v|_1 scaling"),
                     param_spec("first_stage_ratio", ParamSpec::Type::Float, 0, 1, 0.5,
                                "fraction of the budget kept by the inner score alone"),
                     param_spec("projection", ParamSpec::Type::Choice, 0, 1, 0,
                                "W_O of the capture (the press: needs layers.L.wo) or the identity "
                                "(|v|_1: an approximation)",
                                {"wo", "identity"})}) {}
  std::string summary() const override {
    return "kvpress CriticalKV around " + inner_.name() +
           ": half the budget by its score, the rest by score x |W_O v|_1 (needs W_O)";
  }
  bool ranks_by_score() const override { return false; }
  // projection = wo (the press) needs W_O; identity does without.
  bool needs_output_projection(const ParamValues& params) const override {
    for (size_t i = 0; i < own_.size(); ++i)
      if (own_kvpress_names_[i] == "projection")
        return param_value(own_, params, own_[i].name) < 0.5;
    return true;
  }
  Selection select(const MethodInput& in) const override {
    check(in);
    const double eps = own_param(in, "epsilon");
    const double first = own_param(in, "first_stage_ratio");
    const bool identity = own_param(in, "projection") >= 0.5;
    const std::vector<double> norms = identity ? value_l1_norms(in) : projected_l1_norms(in);
    const Ranking r = inner_.rank(inner_input(in));
    const std::vector<double>& s = scores_of(r);
    const int m = in.budget, n_mid = static_cast<int>(s.size());
    const int stage1 = std::min(m, static_cast<int>(std::floor(first * m)));
    std::vector<double> scores(n_mid);
    for (int i = 0; i < n_mid; ++i) scores[i] = (s[i] + eps) * norms[i];
    for (int i = 0; i < stage1; ++i) scores[r.order[i]] = std::numeric_limits<double>::max();
    Selection sel = prefix_selection(in, rank_by_scores(scores, r.hover), m);
    if (identity)
      sel.note = name() + ": W_O taken as the identity (|v|_1), an approximation of the press";
    return sel;
  }

 private:
  // |v_i|_1 of each middle token: W_O = I.
  static std::vector<double> value_l1_norms(const MethodInput& in) {
    std::vector<double> out(static_cast<size_t>(in.mid_end - in.mid_begin));
    for (int i = in.mid_begin; i < in.mid_end; ++i)
      out[static_cast<size_t>(i - in.mid_begin)] = in.values->row(i).cast<double>().lpNorm<1>();
    return out;
  }

  // The press's vwl1norm: |v_i W_O[h]|_1 over the model's hidden units, for each query head h of
  // the kv head's group, averaged over the group.
  std::vector<double> projected_l1_norms(const MethodInput& in) const {
    const LayerData* layer = in.layer_data;
    if (!layer || layer->output_projection.empty())
      throw InputError(name() +
                       ": needs the output projection W_O of every query head (the capture's "
                       "layers.L.wo), and this capture does not carry it (the parameter " +
                       name() + ".projection = identity takes W_O = I, an approximation)");
    const int kv_heads = static_cast<int>(layer->keys.size());
    const int group = static_cast<int>(layer->output_projection.size()) / kv_heads;
    const Eigen::MatrixXd v =
        in.values->middleRows(in.mid_begin, in.mid_end - in.mid_begin).cast<double>();
    std::vector<double> out(static_cast<size_t>(v.rows()), 0.0);
    // In blocks of rows: a whole head's projection at 8192 tokens and a 4096-wide model would be
    // a 256 MiB temporary.
    constexpr Eigen::Index kRows = 256;
    for (int g = 0; g < group; ++g) {
      const Eigen::MatrixXd wo =
          layer->output_projection[static_cast<size_t>(in.kv_head * group + g)].cast<double>();
      for (Eigen::Index r0 = 0; r0 < v.rows(); r0 += kRows) {
        const Eigen::Index rows = std::min(kRows, v.rows() - r0);
        const Eigen::MatrixXd projected = v.middleRows(r0, rows) * wo;
        for (Eigen::Index i = 0; i < rows; ++i)
          out[static_cast<size_t>(r0 + i)] += projected.row(i).lpNorm<1>();
      }
    }
    for (double& x : out) x /= group;
    return out;
  }
};

}  // namespace

std::unique_ptr<Method> make_criticalkv(const Method& inner) {
  return std::make_unique<CriticalKV>(inner);
}

}  // namespace kvscope
