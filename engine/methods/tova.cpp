// TOVA (Oren et al., "Transformers are Multi-State RNNs", 2024; github.com/schwartz-lab-NLP/TOVA):
// token omission via attention. At each step TOVA drops the token with the lowest attention from
// the current (last) query, averaged over heads. For a one-shot selection this is the same as
// keeping the m middle tokens with the highest attention from the last query before the
// evaluation window (position n-E-1), averaged over the GQA group's query heads; weight 1.
// (Dropping one token at a time would renormalise nothing: the last query's softmax ranks the
// tokens identically over any subset, so the one-shot top m equals the greedy result.)
#include "engine/attention_scores.h"
#include "engine/method.h"

namespace kvscope {
namespace {

class Tova final : public Method {
 public:
  std::string name() const override { return "tova"; }
  std::string summary() const override {
    return "top m by attention from the last query before the evaluation window";
  }
  bool needs_queries() const override { return true; }
  bool depends_on_seed() const override { return false; }
  bool ranks_by_score() const override { return true; }
  Selection select(const MethodInput& in) const override { return ranked_selection(in, rank(in)); }
  Selection ranked_selection(const MethodInput& in, const Ranking& r) const override {
    return prefix_selection(in, r, in.budget);
  }
  Ranking rank(const MethodInput& in) const override {
    check_method_input(in, name(), true);
    check_params(params(), in.params, name());
    std::vector<double> scores(in.mid_end - in.mid_begin, 0.0);
    if (in.mid_end > in.mid_begin) {
      const int last = in.mid_end - 1;
      for_each_attention_row(
          in.queries, *in.keys, last, last + 1,
          [&](int, const double* p) {
            for (int i = in.mid_begin; i < in.mid_end; ++i) scores[i - in.mid_begin] = p[i];
          },
          in.cancel);
    }
    return rank_by_scores(scores, scores);
  }
};

}  // namespace

std::unique_ptr<Method> make_tova() {
  return std::make_unique<Tova>();
}

}  // namespace kvscope
