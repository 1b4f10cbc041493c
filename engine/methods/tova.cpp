// TOVA (Oren et al., "Transformers are Multi-State RNNs", 2024; github.com/schwartz-lab-NLP/TOVA):
// token omission via attention. At each step TOVA drops the token with the lowest attention from
// the current (last) query, averaged over heads. For a one-shot selection this is the same as
// keeping the m middle tokens with the highest attention from the last query before the
// evaluation window (position n-E-1), averaged over the GQA group's query heads; weight 1.
// (Dropping one token at a time would renormalise nothing: the last query's softmax ranks the
// tokens identically over any subset, so the one-shot top m equals the greedy result.)
// `variant = kvpress` follows kvpress's TOVAPress (kvpress/presses/tova_press.py) instead: the
// attention is averaged over every query head of the layer (each on its own kv head; every kv
// head then ranks alike) and the last context token, the query's own, is kept first.
#include <algorithm>
#include <utility>
#include <vector>

#include "engine/core/error.h"
#include "engine/io/capture.h"
#include "engine/methods/method.h"
#include "engine/methods/scoring.h"
#include "engine/ops/backend.h"

namespace kvscope {
namespace {

class Tova final : public ScoreRankingMethod {
 public:
  std::string name() const override { return "tova"; }
  std::string summary() const override {
    return "top m by attention from the last query before the evaluation window";
  }
  std::vector<ParamSpec> params() const override {
    return {param_spec("variant", ParamSpec::Type::Choice, 0, 1, 0,
                       "kvpress: average over every query head of the layer and keep the last "
                       "context token first (kvpress's TOVAPress)",
                       {"kvscope", "kvpress"})};
  }
  bool needs_queries() const override { return true; }
  bool depends_on_seed() const override { return false; }
  Ranking rank(const MethodInput& in) const override {
    check_method_input(in, name(), true);
    validate_params(params(), in.params, name());
    // The (queries, keys) pairs averaged: the group on this head, or every query head of the
    // layer on its own kv head (the same share each: groups are equal).
    std::vector<std::pair<std::vector<const MatrixF*>, const MatrixF*>> parts = {
        {in.queries, in.keys}};
    const bool kvpress = param_value(params(), in.params, "variant") >= 0.5;
    if (kvpress) {
      if (!in.layer_data || in.layer_data->queries.empty())
        throw InputError(name() + ": variant = kvpress needs every query head of the layer");
      parts.clear();
      for (int kv = 0; kv < static_cast<int>(in.layer_data->keys.size()); ++kv)
        parts.push_back({in.layer_data->group_queries(kv), &in.layer_data->keys[kv]});
    }
    std::vector<double> scores(in.mid_end - in.mid_begin, 0.0);
    if (in.mid_end > in.mid_begin) {
      // The last row's probabilities of every part, in one call of the attention-score op.
      const int last = in.mid_end - 1;
      std::vector<std::vector<double>> rows(parts.size(), std::vector<double>(last + 1));
      ScoreBatch b;
      b.n = in.n;
      b.d = static_cast<int>(in.keys->cols());
      b.row_begin = last;
      b.row_end = last + 1;
      b.cancel = in.cancel;
      std::vector<const MatrixF*> arrays;
      for (size_t p = 0; p < parts.size(); ++p) {
        ScoreHead head;
        head.keys = parts[p].second->data();
        for (const MatrixF* q : parts[p].first) head.queries.push_back(q->data());
        head.scores = rows[p].data();
        b.heads.push_back(std::move(head));
        arrays.insert(arrays.end(), parts[p].first.begin(), parts[p].first.end());
        arrays.push_back(parts[p].second);
      }
      b.layer_id = layer_id_of(in, arrays);
      method_backend(in).attention_scores(b);
      for (const std::vector<double>& p : rows)
        for (int i = in.mid_begin; i < in.mid_end; ++i)
          scores[i - in.mid_begin] += p[i] / static_cast<double>(parts.size());
    }
    // kvpress pads the last token (the query's own) with the maximum + 1.
    if (kvpress && in.mid_end > in.mid_begin)
      scores.back() = *std::max_element(scores.begin(), scores.end()) + 1;
    return rank_by_scores(scores, scores);
  }
};

}  // namespace

std::unique_ptr<Method> make_tova() {
  return std::make_unique<Tova>();
}

}  // namespace kvscope
