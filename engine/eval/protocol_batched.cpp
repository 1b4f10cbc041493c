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

}  // namespace

void evaluate_layer_batched(const LayerData& layer, int num_layers, const EvalSpec& spec,
                            const std::vector<WorkItem>& items,
                            const std::vector<WorkGroup>& groups,
                            const std::vector<std::string>& refusals, int threads,
                            const std::atomic<bool>* cancel, Backend& backend,
                            const std::function<const TokenHarm*(size_t group)>& harm_of,
                            HeadEval* results, const std::function<void()>& item_done) {
  if (groups.empty()) return;
  const size_t base = groups.front().first;
  std::vector<ItemState> state(groups.back().first + groups.back().count - base);
  auto at = [&](size_t i) -> ItemState& { return state[i - base]; };
  auto done = [&] {
    if (item_done) item_done();
  };
  for (const WorkGroup& g : groups)
    for (size_t i = g.first; i < g.first + g.count; ++i) {
      ItemState& st = at(i);
      st.active = start_item(layer, spec, items[i], item_refusal(refusals, spec, items[i]),
                             results[i], st.settings);
      if (!st.active) done();
    }
  std::vector<SharedWork> shared(groups.size());
  const int group_count = static_cast<int>(groups.size());

  // Scores `batch` (state positions of one (point, method, ratio), kv heads in order) with one
  // call. When the op rejects the batch, each head is scored alone, so that the error lands on
  // the item it belongs to, as when evaluated alone.
  auto score = [&](const std::vector<size_t>& batch) {
    ErrorBatch b;
    std::vector<size_t> first_query;  // each head's first query head in the batch
    for (size_t i : batch) {
      first_query.push_back(static_cast<size_t>(b.q_heads));
      add_error_head(b, layer, results[i].kv_head, at(i).window, *at(i).selection);
    }
    first_query.push_back(static_cast<size_t>(b.q_heads));
    std::vector<std::vector<QueryError>> rows;
    try {
      rows = run_error_batch(backend, b);
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
        finish_head_run(run, layer.layer, results[batch[k]].kv_head);
        st.run = std::move(run);
      } catch (const std::exception& e) {
        st.error = e.what();
      }
    }
    return false;
  };

  auto any_active = [&] {
    for (const ItemState& st : state)
      if (st.active) return true;
    return false;
  };
  for (int r = 0; r < spec.seeds && any_active(); ++r) {
    throw_if_cancelled(cancel);
    const uint64_t seed = spec.base_seed + static_cast<uint64_t>(r);
    // 1. Every selection of the layer for this seed (the groups on CPU threads). A method that
    // ignores the seed made its one run at seed 0; one that ignores the budget too makes it at
    // its group's first ratio, and the other ratios take that run.
    parallel_for(group_count, threads, cancel, [&](int k) {
      const WorkGroup& g = groups[static_cast<size_t>(k)];
      int budget_free_source = -1;
      for (size_t i = g.first; i < g.first + g.count; ++i) {
        ItemState& st = at(i);
        st.selection.reset();
        st.run.reset();
        st.alias = -1;
        st.error.clear();
        if (!st.active || st.seed_free_run) continue;
        const int kv = results[i].kv_head;
        try {
          check_head(layer, kv, *st.settings.method);
          st.window = EvalWindow::make(static_cast<int>(layer.keys[kv].rows()),
                                       st.settings.keep_ratio, st.settings.sink, st.settings.eval);
          if (budget_free_source >= 0) {
            st.alias = budget_free_source;
            continue;
          }
          st.selection = group_selection(layer, num_layers, kv, st.settings, st.window, seed,
                                         &backend, cancel, shared[static_cast<size_t>(k)]);
          if (budget_free(*st.settings.method, spec.estimator))
            budget_free_source = static_cast<int>(i);
        } catch (const Cancelled&) {
          throw;
        } catch (const std::exception& e) {
          // A method that throws is reported, not fatal: the other methods' figures stand.
          st.error = e.what();
        }
      }
    });
    throw_if_cancelled(cancel);

    // 2. One attention_errors call per (point, method, ratio) over the kv heads with a selection
    // (the groups run in head order, so each batch holds its heads in order).
    std::map<std::tuple<int, int, int>, std::vector<size_t>> by_key;
    for (const WorkGroup& g : groups)
      for (size_t i = g.first; i < g.first + g.count; ++i)
        if (at(i).selection) by_key[{items[i].point, items[i].method, items[i].ratio}].push_back(i);
    std::vector<std::vector<size_t>> batches;
    for (auto& entry : by_key) batches.push_back(std::move(entry.second));
    std::vector<char> rejected(batches.size(), 0);
    parallel_for(static_cast<int>(batches.size()), threads, cancel, [&](int k) {
      rejected[static_cast<size_t>(k)] = score(batches[static_cast<size_t>(k)]) ? 1 : 0;
    });
    throw_if_cancelled(cancel);
    for (size_t k = 0; k < batches.size(); ++k)
      if (rejected[k])
        for (size_t i : batches[k]) score({i});
    // A budget-free method's other ratios take its first ratio's run (their own window).
    for (ItemState& st : state) {
      if (st.alias < 0) continue;
      const ItemState& source = at(static_cast<size_t>(st.alias));
      if (!source.error.empty()) {
        st.error = source.error;
      } else {
        st.run = *source.run;
        st.run->window = st.window;
      }
    }

    // 3. The runs into each item's figures in seed order (the groups on CPU threads: a head's
    // token harm is built here, by its first group).
    parallel_for(group_count, threads, cancel, [&](int k) {
      const WorkGroup& g = groups[static_cast<size_t>(k)];
      for (size_t i = g.first; i < g.first + g.count; ++i) {
        ItemState& st = at(i);
        if (!st.active) continue;
        HeadEval& he = results[i];
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
        const TokenHarm* harm = harm_of(static_cast<size_t>(k));
        add_seed_run(spec, st.seed_free_run ? *st.seed_free_run : *st.run, r, harm, he, st.sums);
        st.run.reset();
        if (r == spec.seeds - 1) {
          finish_item(spec, st.sums, harm != nullptr, he);
          st.active = false;
          done();
        }
      }
    });
    throw_if_cancelled(cancel);
  }
}

}  // namespace kvscope::protocol_detail
