// BUZZ (Zhao et al., "BUZZ: Beehive-structured Sparse KV Cache with Segmented Heavy Hitters",
// 2024; github.com/JunqiZhao888/buzz-llm): attention sinks, a sliding window, and a "beehive" of
// local heavy hitters in between. Algorithms 1 and 2 of the paper, run over the capture's prefix:
//
//   Tokens stream in order; each new token's query adds its (causal, group-averaged) attention
//   row to the accumulated scores A. The first k tokens are sinks; the last w tokens are the
//   window. A token that leaves the window joins the "new" buffer. When old survivors + new
//   buffer exceed the threshold T (the authors' code tests `other_size > sample_threshold`), one
//   eviction runs (Algorithm 1, line 15):
//     old <- interval_sample(old, s^)  ++  local_max_sample(new, s),   new <- []
//   with s^ = floor((s+1)/2) = ceil(s/2); interval_sample keeps old[0], old[s^], old[2 s^], ...;
//   local_max_sample (Algorithm 2) keeps argmax A over each chunk new[idx .. idx+s) (the first
//   maximum on ties, like torch.argmax).
//   At the end of the prefix, evictions repeat while sinks + old + new + window exceed the
//   budget (the paper's Remark 2 for long prefills: "continuously conduct sampling until the
//   selected tokens fit").
//
// Mapping to the protocol and divergences (each shown in Selection::note when it applies):
// - The stream is the middle [s, n-E): the protocol's sinks are always kept and play BUZZ's
//   sinks; only when the protocol has fewer than k sinks are the first k - s middle tokens kept
//   as BUZZ sinks (they count toward m). The window is the most recent w middle tokens.
// - Scores are the attention each token has received from all queries so far, averaged over the
//   GQA group (the authors' code sums the heads; the argmax is the same).
// - Defaults k = 4, w = 160, s = 5, T = 400 (the authors' code). For budgets where the window
//   would take more than half of m, w and T are scaled by the same factor (w = floor(m/2),
//   T = max(s, round(T w_scaled / w))), keeping the given T/w ratio (2.5 for the defaults) and
//   the paper's Theorem 3.1 picture of a steady state with about as many samples as window
//   tokens (so the window should not take more than about half). Turn off with auto_scale = 0.
// - The repeated final evictions shrink the middle in jumps (by about s and s^), so the result
//   can land below m. To give BUZZ the same m as every other method, the remaining slots are
//   filled with the most recent dropped middle tokens (top_up = recent, the default: the window
//   grows backwards, following the paper's Remark 1 that sink and window have priority), or with
//   the dropped tokens of highest accumulated score (top_up = score). On the stories260K sample
//   captures "recent" gives the lower error (e.g. 0.077 vs 0.094 at ratio 1/8 on lily). With
//   top_up = off the selection keeps fewer than m and says so.
// - If even the window does not fit (auto_scale = 0 and w > m), its oldest tokens are dropped.
#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "engine/attention_scores.h"
#include "engine/error.h"
#include "engine/method.h"

namespace kvscope {
namespace {

constexpr int kDefaultWindow = 160;
constexpr int kDefaultThreshold = 400;

class Buzz final : public Method {
 public:
  std::string name() const override { return "buzz"; }
  std::string summary() const override {
    return "sinks + window + per-chunk local heavy hitters (beehive), old survivors re-strided";
  }
  std::vector<ParamSpec> params() const override {
    return {
        param_spec("sink", ParamSpec::Type::Int, 0, 64, 4,
                   "k: attention sink tokens (the protocol's sinks count toward them)"),
        param_spec("window", ParamSpec::Type::Int, 0, 8192, kDefaultWindow,
                   "w: most recent middle tokens always kept"),
        param_spec("stride", ParamSpec::Type::Int, 1, 64, 5,
                   "s: chunk size for new tokens (one local heavy hitter per chunk); old "
                   "survivors are re-sampled with stride ceil(s/2)"),
        param_spec("threshold", ParamSpec::Type::Int, 1, 65536, kDefaultThreshold,
                   "T: evict when old survivors + new buffer exceed T"),
        param_spec("auto_scale", ParamSpec::Type::Bool, 0, 1, 1,
                   "scale w and T down so the window takes at most half of the budget"),
        param_spec("top_up", ParamSpec::Type::Choice, 0, 2, 2,
                   "fill the slots left after the last eviction so BUZZ keeps exactly m: with "
                   "the highest-scoring dropped tokens, or the most recent ones (a longer "
                   "window)",
                   {"off", "score", "recent"}),
    };
  }
  bool needs_queries() const override { return true; }
  bool depends_on_seed() const override { return false; }

  Selection select(const MethodInput& in) const override {
    check_method_input(in, name(), true);
    check_params(params(), in.params, name());
    const auto specs = params();
    const int sink = static_cast<int>(param_value(specs, in.params, "sink"));
    int window = static_cast<int>(param_value(specs, in.params, "window"));
    const int stride = static_cast<int>(param_value(specs, in.params, "stride"));
    int threshold = static_cast<int>(param_value(specs, in.params, "threshold"));
    const bool auto_scale = param_value(specs, in.params, "auto_scale") >= 0.5;
    const int top_up = static_cast<int>(param_value(specs, in.params, "top_up"));
    if (sink < 0) throw InputError("buzz.sink must be >= 0");
    if (window < 0) throw InputError("buzz.window must be >= 0");
    if (stride < 1) throw InputError("buzz.stride must be >= 1");
    if (threshold < 1) throw InputError("buzz.threshold must be >= 1");
    const int m = in.budget;
    const int small_stride = (stride + 1) / 2;

    std::ostringstream note;  // parts start with a space; trimmed at the end
    if (auto_scale && 2 * window > m) {
      const int scaled_window = m / 2;
      const double factor = window > 0 ? static_cast<double>(scaled_window) / window : 0.0;
      const int scaled_threshold =
          std::max(stride, static_cast<int>(std::lround(threshold * factor)));
      note << " window " << scaled_window << ", threshold " << scaled_threshold << " (scaled from "
           << window << "/" << threshold << " so the window is at most half of m = " << m << ");";
      window = scaled_window;
      threshold = scaled_threshold;
    } else {
      note << " window " << window << ", threshold " << threshold << ";";
    }
    note << " stride " << stride << "/" << small_stride << ";";

    const int n_mid = in.mid_end - in.mid_begin;
    std::vector<double> acc(in.mid_end, 0.0);  // accumulated attention per key
    std::vector<int> sinks, old_kept, fresh;
    std::deque<int> recent;
    int evictions = 0;

    auto evict = [&]() {
      std::vector<int> next;
      for (size_t i = 0; i < old_kept.size(); i += small_stride) next.push_back(old_kept[i]);
      for (size_t c = 0; c < fresh.size(); c += stride) {
        const size_t end = std::min(fresh.size(), c + stride);
        int best = fresh[c];
        for (size_t i = c + 1; i < end; ++i)
          if (acc[fresh[i]] > acc[best]) best = fresh[i];
        next.push_back(best);
      }
      old_kept = std::move(next);
      fresh.clear();
      ++evictions;
    };

    for_each_attention_row(
        in.queries, *in.keys, in.mid_begin, in.mid_end,
        [&](int t, const double* p) {
          for (int i = in.mid_begin; i <= t; ++i) acc[i] += p[i];
          if (t < sink) {
            sinks.push_back(t);
            return;
          }
          recent.push_back(t);
          if (static_cast<int>(recent.size()) > window) {
            fresh.push_back(recent.front());
            recent.pop_front();
          }
          if (static_cast<int>(old_kept.size() + fresh.size()) > threshold) evict();
        },
        in.cancel);
    const int streamed_evictions = evictions;

    auto total = [&] {
      return static_cast<int>(sinks.size() + old_kept.size() + fresh.size() + recent.size());
    };
    // Remark 2: keep sampling until the middle fits. An eviction makes progress while the new
    // buffer is non-empty or the old survivors can still be thinned.
    while (total() > m && (!fresh.empty() || (old_kept.size() > 1 && small_stride > 1))) evict();
    if (total() > m) {
      // Only sinks and window are left and they do not fit: drop the window's oldest tokens,
      // then (degenerate budgets) the last sinks.
      while (total() > m && !old_kept.empty()) old_kept.pop_back();
      const int before = static_cast<int>(recent.size());
      while (total() > m && !recent.empty()) recent.pop_front();
      while (total() > m && !sinks.empty()) sinks.pop_back();
      note << " window cut from " << before << " to " << recent.size() << " to fit m;";
    }

    std::vector<char> kept(n_mid, 0);
    for (const auto* part : {&sinks, &old_kept, &fresh})
      for (int t : *part) kept[t - in.mid_begin] = 1;
    for (int t : recent) kept[t - in.mid_begin] = 1;
    note << " " << streamed_evictions << " evictions while streaming, "
         << evictions - streamed_evictions << " to fit m;";

    std::vector<double> scores(acc.begin() + in.mid_begin, acc.end());
    const int missing = m - total();
    if (missing > 0 && top_up != 0) {
      // Rank the dropped tokens by accumulated score (top_up = score) or by position (recent).
      std::vector<double> rank(n_mid);
      for (int i = 0; i < n_mid; ++i)
        rank[i] = kept[i] ? -std::numeric_limits<double>::infinity()
                          : (top_up == 1 ? scores[i] : static_cast<double>(i));
      for (int i : top_m_indices(rank, missing)) kept[i] = 1;
      note << " topped up " << missing << (top_up == 1 ? " by score;" : " with the most recent;");
    } else if (missing > 0) {
      note << " keeps " << total() << " < m = " << m << " (top_up off);";
    }

    Selection sel;
    for (int i = 0; i < n_mid; ++i)
      if (kept[i]) {
        sel.indices.push_back(in.mid_begin + i);
        sel.weights.push_back(1.0);
      }
    sel.middle_scores = std::move(scores);
    std::string text = note.str();
    if (!text.empty() && text.back() == ';') text.pop_back();
    sel.note = text.substr(text.empty() ? 0 : 1);
    return sel;
  }
};

}  // namespace

std::unique_ptr<Method> make_buzz() {
  return std::make_unique<Buzz>();
}

}  // namespace kvscope
