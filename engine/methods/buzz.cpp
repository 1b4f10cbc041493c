// BUZZ (Zhao et al., "BUZZ: Beehive-structured Sparse KV Cache with Segmented Heavy Hitters",
// 2024; reference code github.com/JunqiZhao888/buzz-llm, class BuzzKVCacheWithAccumulation in
// entry_function/eval_inside_forward/cache/cache_entity_collection.py): attention sinks, a sliding
// window, and a "beehive" of local heavy hitters in between. Algorithms 1 and 2 of the paper, run
// over the capture's prefix one token at a time, as the authors' eval_long_ppl.py feeds their
// class:
//
//   Each arriving token joins the cache, and its query's attention over the cache is added to
//   the accumulated scores A (accumulate = compressed-cache, the default and the authors' rule:
//   the softmax runs over the *current, already compressed* cache, the token itself included, and
//   a token gathers score only while it is cached; accumulate = full-prefix is KVScope's earlier
//   rule: the causal softmax over every key 0..t, whether evicted or not). The first k tokens are
//   sinks; the last w tokens are the window. A token that leaves the window joins the "new"
//   buffer. When old survivors + new buffer exceed the threshold T (the authors' test
//   `other_size > sample_threshold`), one eviction runs (Algorithm 1, line 15):
//     old <- interval_sample(old, s^)  ++  local_max_sample(new, s),   new <- []
//   with s^ = floor((s+1)/2) = ceil(s/2); interval_sample keeps old[0], old[s^], old[2 s^], ...;
//   local_max_sample (Algorithm 2) keeps argmax A over each chunk new[idx .. idx+s) (the first
//   maximum on ties, like torch's max).
//   At the end of the prefix, evictions repeat while sinks + old + new + window exceed the
//   budget m (the paper's Remark 2 for long prefills, "continuously conduct sampling until the
//   selected tokens can fit within a container of length T + k + w"; here the container is m).
//
// The paper's ablations are switches: swap_strides (Fig. 8(a): new tokens chunked with s^, old
// survivors re-sampled with stride s), local_max = 0 (Fig. 8(b), the authors' BuzzKVCacheNoMax:
// interval sampling new[0], new[s], ... for the new tokens too) and log_n (Eq. 7-8: the scores
// come from softmax(log_512(L) <q,k>/sqrt(d)), L the number of keys the query attends to, as the
// line left commented out in the authors' modify_llama_forward.py computes it; it changes which
// tokens are kept, while KVScope's error is still measured against the model's own attention).
//
// Mapping to the protocol and divergences (each shown in Selection::note when it applies):
// - The stream is the middle [s, n-E): the protocol's sinks are always kept and play BUZZ's
//   sinks; only when the protocol has fewer than k sinks are the first k - s middle tokens kept
//   as BUZZ sinks (they count toward m). The window is the most recent w middle tokens.
// - GQA: the authors' class keeps one score row per query head and has no GQA path (its masks
//   have the query heads' shape and are applied to the kv heads' tensors). KVScope's choice: the
//   softmax rows of the group's query heads (each over the kv head's cached keys) are averaged
//   into one score per kv head.
// - Defaults k = 4, w = 160, s = 5, T = 400 (the authors' eval config, T/w = 2.5). For budgets
//   where the window would take more than half of m, w = floor(m/2) and T follows the paper's
//   Theorem 3.1 (Eq. 6): T/w = (s^2+1)/(s+1) for odd s (4.33 for s = 5), s - 1 for even s, the
//   ratio at which the survivors after an eviction settle at about w (the steady state of
//   a = a/s^ + (T-a)/s). auto_scale = given-ratio keeps the given T/w instead (KVScope's earlier
//   rule: 2.5 with the defaults); auto_scale = off keeps w and T.
// - The repeated final evictions shrink the middle in jumps (by about s and s^), so the result
//   can land below m. To give BUZZ the same m as every other method, the remaining slots are
//   filled with the most recent dropped middle tokens (top_up = recent, the default: the window
//   grows backwards, following the paper's Remark 1 that sink and window have priority), or with
//   the dropped tokens of highest accumulated score (top_up = score). The note says how many of
//   the m slots the top-up filled. With top_up = off the selection keeps fewer than m and says so.
// - If even the window does not fit (auto_scale = off and w > m), its oldest tokens are dropped.
// The scores run on MethodInput::backend's ops (the CPU when none): full-prefix without log n on
// the attention-score op (engine/ops/attention_scores.h), the other rules on the cache-score op
// (engine/ops/cache_scores.h), one call per segment of rows between two evictions. The evictions
// themselves (interval sampling and each chunk's maximum, a few comparisons per token) run here.
// tests/test_buzz.cpp checks the default against kept sets from the authors' class
// (tests/data/buzz_authors.json, made by tools/buzz_golden.py).
#include <algorithm>
#include <cmath>
#include <deque>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/methods/method.h"
#include "engine/methods/scoring.h"
#include "engine/ops/backend.h"

namespace kvscope {
namespace {

constexpr int kDefaultWindow = 160;
constexpr int kDefaultThreshold = 400;

enum Accumulate { kCompressedCache = 0, kFullPrefix = 1 };
enum AutoScale { kScaleOff = 0, kScaleTheorem = 1, kScaleGivenRatio = 2 };

// Theorem 3.1 (Eq. 6) of the paper: the T/w at which the survivors of an eviction settle at w.
double theorem_ratio(int stride) {
  return stride % 2 ? (stride * stride + 1.0) / (stride + 1.0) : stride - 1.0;
}

// BUZZ's parameters, read and checked (k, w, s, T and the switches).
struct BuzzSettings {
  int sink = 0, window = 0, stride = 1, threshold = 1;
  int auto_scale = kScaleTheorem, top_up = 2, accumulate = kCompressedCache;
  bool swap_strides = false, local_max = true, log_n = false;
  // s for the new buffer's chunks and s^ = ceil(s/2) for the old survivors (swapped: the reverse).
  int new_stride = 1, old_stride = 1;
};

BuzzSettings read_settings(const std::vector<ParamSpec>& specs, const ParamValues& values) {
  BuzzSettings s;
  s.sink = static_cast<int>(param_value(specs, values, "sink"));
  s.window = static_cast<int>(param_value(specs, values, "window"));
  s.stride = static_cast<int>(param_value(specs, values, "stride"));
  s.threshold = static_cast<int>(param_value(specs, values, "threshold"));
  s.auto_scale = static_cast<int>(param_value(specs, values, "auto_scale"));
  s.top_up = static_cast<int>(param_value(specs, values, "top_up"));
  s.accumulate = static_cast<int>(param_value(specs, values, "accumulate"));
  s.swap_strides = param_value(specs, values, "swap_strides") >= 0.5;
  s.local_max = param_value(specs, values, "local_max") >= 0.5;
  s.log_n = param_value(specs, values, "log_n") >= 0.5;
  if (s.sink < 0) throw InputError("buzz.sink must be >= 0");
  if (s.window < 0) throw InputError("buzz.window must be >= 0");
  if (s.stride < 1) throw InputError("buzz.stride must be >= 1");
  if (s.threshold < 1) throw InputError("buzz.threshold must be >= 1");
  const int small_stride = (s.stride + 1) / 2;
  s.new_stride = s.swap_strides ? small_stride : s.stride;
  s.old_stride = s.swap_strides ? s.stride : small_stride;
  return s;
}

// Parameter estimation for budgets where the window would take more than half of m: w = m/2 and
// T/w by the paper's Theorem 3.1 (or the given T/w). Notes the window and threshold used.
void scale_to_budget(BuzzSettings& s, int m, std::ostringstream& note) {
  if (s.auto_scale != kScaleOff && 2 * s.window > m) {
    const int scaled_window = m / 2;
    const bool theorem = s.auto_scale == kScaleTheorem;
    // given-ratio: T scaled by the window's factor, as KVScope computed it before.
    const double factor = s.window > 0 ? static_cast<double>(scaled_window) / s.window : 0.0;
    const double ratio = theorem        ? theorem_ratio(s.stride)
                         : s.window > 0 ? static_cast<double>(s.threshold) / s.window
                                        : 0.0;
    const int scaled_threshold = std::max(
        s.stride,
        static_cast<int>(std::lround(theorem ? scaled_window * ratio : s.threshold * factor)));
    note << " window " << scaled_window << ", threshold " << scaled_threshold << " (window at "
         << "most half of m = " << m << ", T/w = " << std::setprecision(3) << ratio
         << (theorem ? " by the paper's Theorem 3.1 for stride " + std::to_string(s.stride)
                     : std::string(" as given"))
         << "; given " << s.window << "/" << s.threshold << ");";
    s.window = scaled_window;
    s.threshold = scaled_threshold;
  } else {
    note << " window " << s.window << ", threshold " << s.threshold << ";";
  }
}

// Notes the strides and the ablations and scoring rules in use.
void note_variant(const BuzzSettings& s, std::ostringstream& note) {
  note << " stride " << s.new_stride << "/" << s.old_stride
       << (s.swap_strides ? " (swapped: new/old, ablation)" : "") << ";";
  if (!s.local_max) note << " no local max (new tokens interval-sampled, ablation);";
  if (s.accumulate == kFullPrefix) note << " scores over the full prefix;";
  if (s.log_n) note << " log n scores;";
}

// The cache as BUZZ streams the middle (Algorithm 1): the sinks, the old survivors of the last
// eviction, the new buffer (tokens that left the sliding window since) and the sliding window,
// with the accumulated attention A per key.
struct BeehiveCache {
  BeehiveCache(const BuzzSettings& settings, int n) : s(settings), acc(n, 0.0) {}

  const BuzzSettings& s;
  std::vector<double> acc;  // accumulated attention per key
  std::vector<int> sinks, old_kept, fresh;
  std::deque<int> recent;
  int evictions = 0;

  // The streamed step of the current arrival, and (in the full-prefix rule's dry run) where
  // evict() records the step at which each new-buffer token's score was compared.
  int step = 0;
  std::vector<int>* record_stops = nullptr;
  std::vector<char>* record_evictions = nullptr;  // the compressed-cache rule's dry run

  // One eviction (Algorithm 1, line 15): old <- interval_sample(old) ++ local_max_sample(new).
  void evict() {
    if (record_stops)
      for (int f : fresh) (*record_stops)[f] = step + 1;
    if (record_evictions) (*record_evictions)[step] = 1;
    std::vector<int> next;
    interval_sample(next);
    local_max_sample(next);
    old_kept = std::move(next);
    fresh.clear();
    ++evictions;
  }

  // The old survivors old[0], old[s^], old[2 s^], ...
  void interval_sample(std::vector<int>& next) const {
    for (size_t i = 0; i < old_kept.size(); i += s.old_stride) next.push_back(old_kept[i]);
  }

  // Algorithm 2: the local heavy hitter (argmax A, the first maximum on ties) of each chunk
  // new[idx .. idx+s) of the new buffer; without local max, the chunk's first token.
  void local_max_sample(std::vector<int>& next) const {
    for (size_t c = 0; c < fresh.size(); c += s.new_stride) {
      const size_t end = std::min(fresh.size(), c + s.new_stride);
      int best = fresh[c];
      if (s.local_max)
        for (size_t i = c + 1; i < end; ++i)
          if (acc[fresh[i]] > acc[best]) best = fresh[i];
      next.push_back(best);
    }
  }

  // Token t arrives (after its scores were added): a sink, or the window's newest token.
  void arrive(int t) {
    step = t;
    if (t < s.sink) {
      sinks.push_back(t);
      return;
    }
    recent.push_back(t);
    if (static_cast<int>(recent.size()) > s.window) {
      fresh.push_back(recent.front());
      recent.pop_front();
    }
    if (static_cast<int>(old_kept.size() + fresh.size()) > s.threshold) evict();
  }

  // Empties the cache after a dry run (the scores stay).
  void restart() {
    sinks.clear();
    old_kept.clear();
    fresh.clear();
    recent.clear();
    evictions = 0;
  }

  int total() const {
    return static_cast<int>(sinks.size() + old_kept.size() + fresh.size() + recent.size());
  }
};

// KVScope's earlier rule, on the backend's attention-score op. When an eviction compares the new
// buffer's tokens at step t, each token's score is its running sum up to row t. Which tokens an
// eviction compares, and when, depends on counts only, so a dry run of the stream (whose picks
// are discarded) records each token's stop row; the op returns the running sums at those rows (a
// token never compared while streaming stops at the end, with its full sum) and the stream runs
// again on them. Returns each middle token's attention summed over every causal row of the
// middle (for the hover and top_up = score).
std::vector<double> stream_full_prefix(const MethodInput& in, BeehiveCache& cache) {
  std::vector<int> stop_rows(in.mid_end, in.mid_end);
  cache.record_stops = &stop_rows;
  for (int t = in.mid_begin; t < in.mid_end; ++t) cache.arrive(t);
  cache.record_stops = nullptr;
  cache.restart();
  std::vector<double> full_scores = head_attention_scores(
      in, in.mid_begin, in.mid_end, ScoreReduce::sum, stop_rows.data(), &cache.acc);
  for (int t = in.mid_begin; t < in.mid_end; ++t) cache.arrive(t);
  return full_scores;
}

// The keys the rows t..last attend to: the cache before t arrives (ascending positions), then
// t..last as they arrive (compressed-cache); every key 0..last (full-prefix).
void segment_key_ids(const MethodInput& in, const BeehiveCache& cache, int t, int last,
                     std::vector<int>& ids) {
  ids.clear();
  if (cache.s.accumulate == kCompressedCache) {
    for (int i = 0; i < in.mid_begin; ++i) ids.push_back(i);
    ids.insert(ids.end(), cache.sinks.begin(), cache.sinks.end());
    ids.insert(ids.end(), cache.old_kept.begin(), cache.old_kept.end());
    ids.insert(ids.end(), cache.fresh.begin(), cache.fresh.end());
    ids.insert(ids.end(), cache.recent.begin(), cache.recent.end());
  }
  for (int i = cache.s.accumulate == kFullPrefix ? 0 : t; i <= last; ++i) ids.push_back(i);
}

// One row per step over the keys the query attends to: the cache as it stands with the new token
// in it (compressed-cache), or every key 0..t (full-prefix with log n), on the backend's
// cache-score op (engine/ops/cache_scores.h). The cache's members change only at an eviction, and
// which steps evict depends on counts only, so a dry run of the stream records them; the op then
// scores each segment of rows up to and including an eviction's step in one call (the cache as
// it stood at the segment's start plus the tokens arriving in it, each row seeing those up to
// itself), and the stream arrives through the segment, its last arrival evicting on the scores so
// far. Full-prefix (with log n) segments the same way, its rows seeing every key up to themselves.
void stream_cache_scores(const MethodInput& in, BeehiveCache& cache) {
  std::vector<char> evicts_at(in.mid_end, 0);
  cache.record_evictions = &evicts_at;
  for (int t = in.mid_begin; t < in.mid_end; ++t) cache.arrive(t);
  cache.record_evictions = nullptr;
  cache.restart();
  CacheScoreBatch b;
  b.keys = in.keys->data();
  for (const MatrixF* q : in.queries) b.queries.push_back(q->data());
  b.n = in.mid_end;
  b.d = static_cast<int>(in.keys->cols());
  b.log_n = cache.s.log_n;
  b.acc = cache.acc.data();
  b.cancel = in.cancel;
  std::vector<const MatrixF*> arrays = in.queries;
  arrays.push_back(in.keys);
  b.layer_id = layer_id_of(in, arrays);
  std::vector<int> ids;
  for (int t = in.mid_begin; t < in.mid_end;) {
    int last = t;  // the segment's last row
    while (last < in.mid_end - 1 && !evicts_at[last]) ++last;
    segment_key_ids(in, cache, t, last, ids);
    b.key_ids = ids.data();
    b.num_keys = static_cast<int>(ids.size());
    b.row_begin = t;
    b.row_end = last + 1;
    method_backend(in).cache_scores(b);
    for (; t <= last; ++t) cache.arrive(t);
  }
}

// Remark 2: keep sampling until the middle fits m. An eviction makes progress while the new
// buffer is non-empty or the old survivors can still be thinned.
void fit_budget(BeehiveCache& cache, int m, std::ostringstream& note) {
  while (cache.total() > m &&
         (!cache.fresh.empty() || (cache.old_kept.size() > 1 && cache.s.old_stride > 1)))
    cache.evict();
  if (cache.total() > m) {
    // Only sinks and window are left and they do not fit: drop the window's oldest tokens,
    // then (degenerate budgets) the last sinks.
    while (cache.total() > m && !cache.old_kept.empty()) cache.old_kept.pop_back();
    const int before = static_cast<int>(cache.recent.size());
    while (cache.total() > m && !cache.recent.empty()) cache.recent.pop_front();
    while (cache.total() > m && !cache.sinks.empty()) cache.sinks.pop_back();
    note << " window cut from " << before << " to " << cache.recent.size() << " to fit m;";
  }
}

// The middle tokens the cache holds, by middle index.
std::vector<char> kept_middle(const BeehiveCache& cache, int mid_begin, int n_mid) {
  std::vector<char> kept(n_mid, 0);
  for (const auto* part : {&cache.sinks, &cache.old_kept, &cache.fresh})
    for (int t : *part) kept[t - mid_begin] = 1;
  for (int t : cache.recent) kept[t - mid_begin] = 1;
  return kept;
}

// Fills the m - fitted slots the fit left with dropped middle tokens so BUZZ keeps exactly m;
// top_up = off keeps fewer than m and says so.
void top_up_dropped(std::vector<char>& kept, const std::vector<double>& scores, int fitted, int m,
                    int top_up, std::ostringstream& note) {
  const int n_mid = static_cast<int>(kept.size());
  const int missing = m - fitted;
  if (missing > 0 && top_up != 0) {
    // Rank the dropped tokens by accumulated score (top_up = score) or by position (recent).
    std::vector<double> rank(n_mid);
    for (int i = 0; i < n_mid; ++i)
      rank[i] = kept[i] ? -std::numeric_limits<double>::infinity()
                        : (top_up == 1 ? scores[i] : static_cast<double>(i));
    for (int i : top_m_indices(rank, missing)) kept[i] = 1;
    note << " the fit left " << fitted << " of m = " << m << ": topped up " << missing << " ("
         << std::lround(100.0 * missing / m) << "% of m)"
         << (top_up == 1 ? " by score;" : " with the most recent dropped tokens;");
  } else if (missing > 0) {
    note << " keeps " << fitted << " < m = " << m << " (top_up off);";
  }
}

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
        param_spec("auto_scale", ParamSpec::Type::Choice, 0, 2, kScaleTheorem,
                   "when the window would take more than half of the budget, w = m/2 and T/w "
                   "from the paper's Theorem 3.1 ((s^2+1)/(s+1) for odd s, s-1 for even s), or "
                   "the given T/w (KVScope's earlier rule); off keeps w and T",
                   {"off", "theorem", "given-ratio"}),
        param_spec("top_up", ParamSpec::Type::Choice, 0, 2, 2,
                   "fill the slots left after the last eviction so BUZZ keeps exactly m: with "
                   "the highest-scoring dropped tokens, or the most recent ones (a longer "
                   "window)",
                   {"off", "score", "recent"}),
        param_spec("accumulate", ParamSpec::Type::Choice, 0, 1, kCompressedCache,
                   "scores: each query's softmax over the current compressed cache, a token "
                   "scoring only while cached (the authors' code), or over the full causal "
                   "prefix (KVScope's earlier rule)",
                   {"compressed-cache", "full-prefix"}),
        param_spec("swap_strides", ParamSpec::Type::Bool, 0, 1, 0,
                   "ablation (paper Fig. 8a): new tokens chunked with ceil(s/2), old survivors "
                   "re-sampled with stride s"),
        param_spec("local_max", ParamSpec::Type::Bool, 0, 1, 1,
                   "1: the heavy hitter of each chunk of new tokens; 0: its first token "
                   "(ablation, paper Fig. 8b, the authors' BuzzKVCacheNoMax)"),
        param_spec("log_n", ParamSpec::Type::Bool, 0, 1, 0,
                   "BUZZ with log n (paper Eq. 7-8): scores from softmax(log_512(L) q.k/sqrt(d)), "
                   "L = keys attended; the error is still against the model's attention"),
    };
  }
  bool needs_queries() const override { return true; }
  bool depends_on_seed() const override { return false; }

  Selection select(const MethodInput& in) const override {
    check_method_input(in, name(), true);
    validate_params(params(), in.params, name());
    BuzzSettings s = read_settings(params(), in.params);
    const int m = in.budget;
    std::ostringstream note;  // parts start with a space; trimmed at the end
    scale_to_budget(s, m, note);
    note_variant(s, note);

    // Stream the middle one token at a time, accumulating the scores and evicting.
    const int n_mid = in.mid_end - in.mid_begin;
    BeehiveCache cache(s, in.mid_end);
    // The scores of the full-prefix rule without log n (for the hover and top_up = score).
    std::vector<double> full_scores;
    if (s.accumulate == kFullPrefix && !s.log_n)
      full_scores = stream_full_prefix(in, cache);
    else
      stream_cache_scores(in, cache);
    const int streamed_evictions = cache.evictions;

    fit_budget(cache, m, note);
    std::vector<char> kept = kept_middle(cache, in.mid_begin, n_mid);
    note << " " << streamed_evictions << " evictions while streaming, "
         << cache.evictions - streamed_evictions << " to fit m;";

    const std::vector<double>& final_acc = full_scores.empty() ? cache.acc : full_scores;
    std::vector<double> scores(final_acc.begin() + in.mid_begin, final_acc.end());
    top_up_dropped(kept, scores, cache.total(), m, s.top_up, note);

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
