// AdaKV (Feng et al., "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation for
// Efficient LLM Inference", 2024), ported from kvpress's AdaKVPress
// (kvpress/presses/adakv_press.py, the reference; docs/methods.md names the commit): the inner
// press scores every kv head of the layer; each head first keeps its own top
// floor(alpha_safeguard * budget) (the safeguard), and the rest of the layer's budget
// (kv_heads * budget in all) goes to the largest remaining scores across all heads, so heads
// whose scores are high keep more than the budget and others less.
//
// Mapping to the protocol (docs/methods.md, "kvpress presses"): per head the middle is what is
// ranked and `m` is the per-head budget (the press's n_kept is s + m with the sinks inside; here
// the sinks are kept outside the budget, so the safeguard is floor(alpha * m) of the middle).
// Equal scores go to the lower kv head, then the lower position. A head's selection is always a
// prefix of the inner method's own ordering, so this is a score-ranking method whose prefix
// length depends on the other heads: rank() scores every head once and ranked_selection()
// counts this head's share for each budget. The layer total is kv_heads * m; one head's count
// is not bounded by m (respects_budget() is false).
#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/core/error.h"
#include "engine/methods/scoring.h"
#include "engine/methods/wrapper_util.h"

namespace kvscope {
namespace {

class AdaKV final : public WrapperBase {
 public:
  explicit AdaKV(const Method& inner)
      : WrapperBase("adakv", inner,
                    {param_spec("alpha_safeguard", ParamSpec::Type::Float, 0, 1, 0.20,
                                "fraction of the budget every head keeps by its own scores")}) {}
  std::string summary() const override {
    return "kvpress AdaKV around " + inner_.name() +
           ": the layer's budget goes to the best scores across kv heads, each head keeping at "
           "least 20% of m";
  }
  bool respects_budget() const override { return false; }
  bool ranks_by_score() const override { return true; }
  bool needs_layer() const override { return true; }
  Selection select(const MethodInput& in) const override { return ranked_selection(in, rank(in)); }
  Ranking rank(const MethodInput& in) const override {
    check(in);
    Ranking r = inner_rank_of_head(in, in.kv_head);
    r.layer_scores = layer_scores(in, &r);
    return r;
  }
  Selection ranked_selection(const MethodInput& in, const Ranking& r) const override {
    const double alpha = own_param(in, "alpha_safeguard");
    const int m = in.budget;
    const int safe = static_cast<int>(std::floor(m * alpha));
    // Every (score, head, position) of the layer; safeguarded ones score +inf. NaN sorts last.
    struct Entry {
      double score;
      int head, pos;
    };
    std::vector<Entry> entries;
    int heads = 0;
    for (int h = 0; h < static_cast<int>(r.layer_scores.size()); ++h) {
      const std::vector<double>& s = r.layer_scores[h];
      if (s.empty()) continue;
      ++heads;
      const Ranking own = rank_by_scores(s, {});
      std::vector<double> boosted = s;
      for (int i = 0; i < std::min<int>(safe, static_cast<int>(own.order.size())); ++i)
        boosted[own.order[i]] = std::numeric_limits<double>::infinity();
      for (int i = 0; i < static_cast<int>(s.size()); ++i) entries.push_back({boosted[i], h, i});
    }
    const size_t total = std::min(entries.size(), static_cast<size_t>(heads) * m);
    auto better = [](const Entry& a, const Entry& b) {
      const bool an = std::isnan(a.score), bn = std::isnan(b.score);
      if (an != bn) return bn;
      if (!an && a.score != b.score) return a.score > b.score;
      return a.head != b.head ? a.head < b.head : a.pos < b.pos;
    };
    std::nth_element(entries.begin(), entries.begin() + total, entries.end(), better);
    int count = 0;
    for (size_t i = 0; i < total; ++i) count += entries[i].head == in.kv_head;
    Selection sel = prefix_selection(in, r, count);
    sel.note = "adakv: this head keeps " + std::to_string(count) +
               " (layer mean m = " + std::to_string(m) + ")";
    return sel;
  }
};

}  // namespace

std::unique_ptr<Method> make_adakv(const Method& inner) {
  return std::make_unique<AdaKV>(inner);
}

}  // namespace kvscope
