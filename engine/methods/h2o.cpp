// H2O (Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large
// Language Models", NeurIPS 2023; github.com/FMInference/H2O): keep the "heavy hitters", the
// tokens with the largest accumulated attention.
//
// As docs/methods.md states it for a prefill capture: the score of middle token i is the
// attention it receives from every causal query before n-E (positions i..n-E-1), summed and
// divided by how many queries could see it (n-E-i) so early tokens are not favoured just for
// being seen more often; averaged over the GQA group's query heads. The top m are kept with
// weight 1. The original evicts greedily one token per decoding step and also keeps a recent
// window; here the protocol's sinks and evaluation window play those parts and the selection is
// made once, over the whole middle (a one-shot simplification, as in the SnapKV/PyramidKV
// re-implementations of H2O).
#include "engine/methods/method.h"
#include "engine/methods/scoring.h"

namespace kvscope {
namespace {

class H2O final : public ScoreRankingMethod {
 public:
  std::string name() const override { return "h2o"; }
  std::string summary() const override {
    return "heavy hitters: top m by attention received from all causal queries (mean per query)";
  }
  bool needs_queries() const override { return true; }
  bool depends_on_seed() const override { return false; }
  Ranking rank(const MethodInput& in) const override {
    check_method_input(in, name(), true);
    validate_params(params(), in.params, name());
    std::vector<double> scores = h2o_scores(in);
    return rank_by_scores(scores, scores);
  }
};

}  // namespace

std::unique_ptr<Method> make_h2o() {
  return std::make_unique<H2O>();
}

}  // namespace kvscope
