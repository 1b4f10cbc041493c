// What the protocol's files share (engine/eval/protocol.cpp: the window, the estimators and
// run_eval; engine/eval/protocol_batched.cpp: run_eval's layer on a backend that parallelises
// inside one call; engine/eval/protocol_report.cpp: the report's summary, JSON and merge): the work
// items in their canonical order, the steps of one item's runs that both ways of scoring share, and
// two text helpers.
#pragma once

#include <atomic>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "engine/core/printable.h"
#include "engine/eval/protocol.h"

namespace kvscope {
class Backend;
struct ErrorBatch;
struct TokenHarm;
}  // namespace kvscope

namespace kvscope::protocol_detail {

using kvscope::fmt_double;  // engine/core/printable.h

using kvscope::join;  // engine/core/printable.h

struct WorkItem {
  int method = 0, ratio = 0, layer = 0, head = 0;  // positions in the spec's lists
  int point = 0;                                   // position in spec.points (0 without)
};

// Work items in canonical order: layer, kv head, point, method, ratio (layer-major, so
// concurrent workers share the loader's layer cache). Results are always reported in this order.
inline std::vector<WorkItem> all_items(const EvalSpec& spec) {
  std::vector<WorkItem> items;
  const int points = std::max<int>(1, static_cast<int>(spec.points.size()));
  for (int l = 0; l < static_cast<int>(spec.layers.size()); ++l)
    for (int h = 0; h < static_cast<int>(spec.heads.size()); ++h)
      for (int pt = 0; pt < points; ++pt)
        for (int m = 0; m < static_cast<int>(spec.methods.size()); ++m)
          for (int r = 0; r < static_cast<int>(spec.ratios.size()); ++r)
            items.push_back({m, r, l, h, pt});
  return items;
}

// The parameters method `method` of the spec runs with at point `point`.
inline ParamValues item_params(const EvalSpec& spec, const Method& method, int point) {
  ParamValues params;
  if (auto p = spec.params.find(method.name()); p != spec.params.end()) params = p->second;
  if (!spec.points.empty())
    for (const auto& [name, v] : spec.points[point]) params[name] = v;
  return params;
}

// The work items of one (layer, kv head, point, method): its ratios in this shard, in order.
struct WorkGroup {
  size_t first = 0, count = 0;  // positions in the shard's item list
};

// What a group's runs share, so that nothing is computed twice: the ranking of a score-ranking
// method (one per head: it depends on neither seed nor budget), and the run of a method that
// ignores both seed and budget (exact).
struct SharedWork {
  std::optional<Ranking> ranking;
  std::optional<HeadRun> budget_free_run;
};

// Whether a method's one run on a head stands for every ratio of its group: it ignores both seed
// and budget, and the estimator does not scale with the ratio (the authors' 2^T does).
bool budget_free(const Method& method, Estimator estimator);

// The checks run_head makes before asking the method (they name the head and the method).
void check_head(const LayerData& layer, int kv_head, const Method& method);

// The selection of one run of s.method on one head for one (ratio, seed) over window `w`,
// checked, with the estimator applied; a score-ranking method ranks once per group (`shared`).
// Throws what the method throws, Cancelled when `cancel` is set.
Selection group_selection(const LayerData& layer, int num_layers, int kv_head,
                          const MethodSettings& s, const EvalWindow& w, uint64_t seed,
                          Backend* backend, const std::atomic<bool>* cancel, SharedWork& shared);

// Why each (point, method) of `spec` cannot run on a capture described by `info`: one entry per
// pair, point-major, "<method> <method_unavailable's reason>", or "" where it can run.
std::vector<std::string> method_refusals(const EvalSpec& spec, const CaptureInfo& info);
// The entry of method_refusals for item `it`.
inline const std::string& item_refusal(const std::vector<std::string>& refusals,
                                       const EvalSpec& spec, const WorkItem& it) {
  return refusals[static_cast<size_t>(it.point) * spec.methods.size() +
                  static_cast<size_t>(it.method)];
}

// Whether the budget keeps the whole middle (or there is none). Then every method has one
// answer whatever it would score, the whole middle at weight 1 (whole_middle), exact's figures,
// and it is not asked: a method may need more than such a capture holds to score at all (a
// minimum context, scores to compare). adakv, whose heads' budgets are not each bounded by m,
// still has m >= the middle on every head.
bool nothing_to_compress(const EvalWindow& w);
Selection whole_middle(const EvalWindow& w);

// Names `he` after item `it` (method, ratio, layer, kv head, point). Returns false when the item
// is refused (`refusal`, the item's entry of method_refusals, is not empty, or the head is
// refused): `he` then says why. Else fills the settings the item runs with.
bool start_item(const LayerData& layer, const EvalSpec& spec, const WorkItem& it,
                const std::string& refusal, HeadEval& he, MethodSettings& settings);

// A HeadEval's sums over seeds while its runs come in.
struct SeedSums {
  std::vector<double> norm, mass;
  double harm_kept = 0, harm_dropped = 0;  // spec.harm
};
// Adds seed run r (in seed order) of an item to `he` and `sums`.
void add_seed_run(const EvalSpec& spec, const HeadRun& run, int r, const TokenHarm* harm,
                  HeadEval& he, SeedSums& sums);
// The method threw on some seed: the item reports what it said, no figures.
void fail_item(HeadEval& he, const std::string& what);
// After the last seed: the means and spreads over seeds.
void finish_item(const EvalSpec& spec, const SeedSums& sums, bool harm, HeadEval& he);

// Adds kv head `kv_head` of `layer` with `sel` to `b`: its keys, values, the query heads of its
// group (after those already in the batch) and its numerator and denominator sets. The first head
// sets the batch's sizes from the window.
void add_error_head(ErrorBatch& b, const LayerData& layer, int kv_head, const EvalWindow& w,
                    const Selection& sel);
// Runs `b` through backend.attention_errors: the errors of every query head of the batch, in its
// order ([q head][E]).
std::vector<std::vector<QueryError>> run_error_batch(Backend& backend, ErrorBatch& b);
// The run's means over group heads and queries; throws InputError naming the head when one is not
// finite.
void finish_head_run(HeadRun& run, int layer, int kv_head);

// The `groups` of one layer (positions in `items`, whose results go to results[i]) on a backend
// that parallelises inside one call (docs/design.md, "Backend ops"): for each seed, every
// selection of the layer is made first (the groups on `threads` CPU threads), then scored with one
// attention_errors call per (point, method, ratio) holding every kv head that has a selection to
// score. The figures are those of evaluating each group alone. harm_of(group) gives the group's
// head's token harm (spec.harm) or null; item_done is called once per item when it is finished.
void evaluate_layer_batched(const LayerData& layer, int num_layers, const EvalSpec& spec,
                            const std::vector<WorkItem>& items,
                            const std::vector<WorkGroup>& groups,
                            const std::vector<std::string>& refusals, int threads,
                            const std::atomic<bool>* cancel, Backend& backend,
                            const std::function<const TokenHarm*(size_t group)>& harm_of,
                            HeadEval* results, const std::function<void()>& item_done);

}  // namespace kvscope::protocol_detail
