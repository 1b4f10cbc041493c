// run_eval's layer on a backend that parallelises inside one call (a device; docs/design.md,
// "Backend ops" and docs/performance.md, "A layer's heads in one call"). Evaluated alone, each
// (kv head, point, method) group would score its selections one kv head per attention_errors call;
// here, seed by seed, every selection of the layer is made first (the methods on CPU threads, as
// before), then each (point, method, ratio) is scored with one call holding every kv head that
// has a selection for it. The runs then go into each item's figures in seed order, exactly as
// evaluate_group (engine/eval/protocol.cpp) sums them, so the report is the same.
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/eval/protocol_detail.h"
#include "engine/ops/backend.h"

namespace kvscope::protocol_detail {
namespace {

// One work item while its layer is evaluated.
struct ItemState {
  MethodSettings settings;
  bool active = false;                   // started, not refused, not failed, not finished
  SeedSums sums;                         // its seed runs so far
  std::optional<HeadRun> seed_free_run;  // the one run of a seed-independent method
  // The current seed:
  EvalWindow window;
  std::optional<Selection> selection;  // made, to be scored
  int alias = -1;                      // a budget-free method: the item whose run stands for it
  std::optional<HeadRun> run;          // scored
  std::string error;                   // what the method or the scoring threw
};

void throw_if_cancelled(const std::atomic<bool>* cancel) {
  if (cancel && cancel->load()) throw Cancelled();
}

// One layer's groups evaluated seed by seed: every selection first, then one scoring call per
// (point, method, ratio), then the runs into the items' figures.
class LayerBatchEval {
 public:
  LayerBatchEval(const LayerData& layer, int num_layers, const EvalSpec& spec,
                 const std::vector<WorkItem>& items, const std::vector<WorkGroup>& groups,
                 int threads, const std::atomic<bool>* cancel, Backend& backend,
                 const std::function<const TokenHarm*(size_t group)>& harm_of, HeadEval* results,
                 const std::function<void()>& item_done)
      : layer_(layer),
        num_layers_(num_layers),
        spec_(spec),
        items_(items),
        groups_(groups),
        threads_(threads),
        cancel_(cancel),
        backend_(backend),
        harm_of_(harm_of),
        results_(results),
        item_done_(item_done),
        base_(groups.front().first),
        state_(groups.back().first + groups.back().count - base_),
        shared_(groups.size()),
        group_count_(static_cast<int>(groups.size())) {}

  // Starts every item; a refused one is finished at once.
  void start_items(const std::vector<std::string>& refusals) {
    for (const WorkGroup& g : groups_)
      for (size_t i = g.first; i < g.first + g.count; ++i) {
        ItemState& st = at(i);
        st.active = start_item(layer_, spec_, items_[i], item_refusal(refusals, spec_, items_[i]),
                               results_[i], st.settings);
        if (!st.active) done();
      }
  }

  bool any_active() const {
    for (const ItemState& st : state_)
      if (st.active) return true;
    return false;
  }

  // 1. Every selection of the layer for this seed (the groups on CPU threads).
  void select_all(uint64_t seed) {
    parallel_for(group_count_, threads_, cancel_, [&](int k) { select_group(k, seed); });
  }

  // 2. One attention_errors call per (point, method, ratio) over the kv heads with a selection
  // (the groups run in head order, so each batch holds its heads in order).
  void score_all() {
    const std::vector<std::vector<size_t>> batches = scoring_batches();
    std::vector<char> rejected(batches.size(), 0);
    parallel_for(static_cast<int>(batches.size()), threads_, cancel_, [&](int k) {
      rejected[static_cast<size_t>(k)] = score(batches[static_cast<size_t>(k)]) ? 1 : 0;
    });
    throw_if_cancelled(cancel_);
    for (size_t k = 0; k < batches.size(); ++k)
      if (rejected[k])
        for (size_t i : batches[k]) score({i});
    take_budget_free_runs();
  }

  // 3. The runs into each item's figures in seed order (the groups on CPU threads: a head's
  // token harm is built here, by its first group).
  void add_runs(int r) {
    parallel_for(group_count_, threads_, cancel_, [&](int k) { add_group_runs(k, r); });
  }

 private:
  ItemState& at(size_t i) { return state_[i - base_]; }
  const ItemState& at(size_t i) const { return state_[i - base_]; }

  void done() const {
    if (item_done_) item_done_();
  }

  // Group k's selections for this seed. A method that ignores the seed made its one run at seed
  // 0; one that ignores the budget too makes it at its group's first ratio, and the other ratios
  // take that run.
  void select_group(int k, uint64_t seed) {
    const WorkGroup& g = groups_[static_cast<size_t>(k)];
    int budget_free_source = -1;
    for (size_t i = g.first; i < g.first + g.count; ++i) {
      ItemState& st = at(i);
      st.selection.reset();
      st.run.reset();
      st.alias = -1;
      st.error.clear();
      if (!st.active || st.seed_free_run) continue;
      const int kv = results_[i].kv_head;
      try {
        check_head(layer_, kv, *st.settings.method);
        st.window = EvalWindow::make(static_cast<int>(layer_.keys[kv].rows()),
                                     st.settings.keep_ratio, st.settings.sink, st.settings.eval);
        if (budget_free_source >= 0) {
          st.alias = budget_free_source;
          continue;
        }
        st.selection = group_selection(layer_, num_layers_, kv, st.settings, st.window, seed,
                                       &backend_, cancel_, shared_[static_cast<size_t>(k)]);
        if (budget_free(*st.settings.method, spec_.estimator))
          budget_free_source = static_cast<int>(i);
      } catch (const Cancelled&) {
        throw;
      } catch (const std::exception& e) {
        // A method that throws is reported, not fatal: the other methods' figures stand.
        st.error = e.what();
      }
    }
  }

  // The state positions with a selection, one batch per (point, method, ratio), kv heads in
  // order.
  std::vector<std::vector<size_t>> scoring_batches() const {
    std::map<std::tuple<int, int, int>, std::vector<size_t>> by_key;
    for (const WorkGroup& g : groups_)
      for (size_t i = g.first; i < g.first + g.count; ++i)
        if (at(i).selection)
          by_key[{items_[i].point, items_[i].method, items_[i].ratio}].push_back(i);
    std::vector<std::vector<size_t>> batches;
    for (auto& entry : by_key) batches.push_back(std::move(entry.second));
    return batches;
  }

  // Scores `batch` (state positions of one (point, method, ratio), kv heads in order) with one
  // call. When the op rejects the batch, each head is scored alone, so that the error lands on
  // the item it belongs to, as when evaluated alone: returns true when the batch is to be scored
  // head by head.
  bool score(const std::vector<size_t>& batch) {
    ErrorBatch b;
    std::vector<size_t> first_query;  // each head's first query head in the batch
    for (size_t i : batch) {
      first_query.push_back(static_cast<size_t>(b.q_heads));
      add_error_head(b, layer_, results_[i].kv_head, at(i).window, *at(i).selection);
    }
    first_query.push_back(static_cast<size_t>(b.q_heads));
    std::vector<std::vector<QueryError>> rows;
    try {
      rows = run_error_batch(backend_, b);
    } catch (const Cancelled&) {
      throw;
    } catch (const std::exception& e) {
      if (batch.size() == 1) {
        at(batch[0]).error = e.what();
        at(batch[0]).selection.reset();
        return false;
      }
      return true;  // score each head alone
    }
    for (size_t k = 0; k < batch.size(); ++k) {
      ItemState& st = at(batch[k]);
      HeadRun run;
      run.window = st.window;
      run.selection = std::move(*st.selection);
      st.selection.reset();
      run.per_query_head.assign(std::make_move_iterator(rows.begin() + first_query[k]),
                                std::make_move_iterator(rows.begin() + first_query[k + 1]));
      try {
        finish_head_run(run, layer_.layer, results_[batch[k]].kv_head);
        st.run = std::move(run);
      } catch (const std::exception& e) {
        st.error = e.what();
      }
    }
    return false;
  }

  // A budget-free method's other ratios take its first ratio's run (their own window).
  void take_budget_free_runs() {
    for (ItemState& st : state_) {
      if (st.alias < 0) continue;
      const ItemState& source = at(static_cast<size_t>(st.alias));
      if (!source.error.empty()) {
        st.error = source.error;
      } else {
        st.run = *source.run;
        st.run->window = st.window;
      }
    }
  }

  // Group k's runs of seed r into its items' figures; an item whose method or scoring threw is
  // failed, and each item is finished after the last seed.
  void add_group_runs(int k, int r) {
    const WorkGroup& g = groups_[static_cast<size_t>(k)];
    for (size_t i = g.first; i < g.first + g.count; ++i) {
      ItemState& st = at(i);
      if (!st.active) continue;
      HeadEval& he = results_[i];
      if (!st.seed_free_run) {
        if (!st.error.empty()) {
          fail_item(he, st.error);
          st.active = false;
          done();
          continue;
        }
        if (!st.settings.method->depends_on_seed()) {
          st.seed_free_run = std::move(st.run);
          st.run.reset();
        }
      }
      const TokenHarm* harm = harm_of_(static_cast<size_t>(k));
      add_seed_run(spec_, st.seed_free_run ? *st.seed_free_run : *st.run, r, harm, he, st.sums);
      st.run.reset();
      if (r == spec_.seeds - 1) {
        finish_item(spec_, st.sums, harm != nullptr, he);
        st.active = false;
        done();
      }
    }
  }

  const LayerData& layer_;
  const int num_layers_;
  const EvalSpec& spec_;
  const std::vector<WorkItem>& items_;
  const std::vector<WorkGroup>& groups_;
  const int threads_;
  const std::atomic<bool>* cancel_;
  Backend& backend_;
  const std::function<const TokenHarm*(size_t group)>& harm_of_;
  HeadEval* results_;
  const std::function<void()>& item_done_;
  const size_t base_;  // the first group's first item: state_[i - base_] is item i's
  std::vector<ItemState> state_;
  std::vector<SharedWork> shared_;  // per group
  const int group_count_;
};

}  // namespace

void evaluate_layer_batched(const LayerData& layer, int num_layers, const EvalSpec& spec,
                            const std::vector<WorkItem>& items,
                            const std::vector<WorkGroup>& groups,
                            const std::vector<std::string>& refusals, int threads,
                            const std::atomic<bool>* cancel, Backend& backend,
                            const std::function<const TokenHarm*(size_t group)>& harm_of,
                            HeadEval* results, const std::function<void()>& item_done) {
  if (groups.empty()) return;
  LayerBatchEval eval(layer, num_layers, spec, items, groups, threads, cancel, backend, harm_of,
                      results, item_done);
  eval.start_items(refusals);
  for (int r = 0; r < spec.seeds && eval.any_active(); ++r) {
    throw_if_cancelled(cancel);
    eval.select_all(spec.base_seed + static_cast<uint64_t>(r));
    throw_if_cancelled(cancel);
    eval.score_all();
    eval.add_runs(r);
    throw_if_cancelled(cancel);
  }
}

}  // namespace kvscope::protocol_detail
