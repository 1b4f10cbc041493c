// Shared by the app's unit tests: the frame loop without a window, and the grid's cells checked
// against eval's figures.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "app/app_state.h"
#include "app/grid_cells.h"
#include "engine/eval/protocol.h"

namespace kvscope::app::testing {

// Runs reconcile() every 2 ms, as the frame loop would, until `done` holds; false after
// `seconds`.
template <typename Pred>
bool pump_until(AppState& s, Pred done, int seconds = 20) {
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    s.reconcile();
    if (done()) return true;
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(seconds)) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// A grid job of one method over every (layer, kv head) of `cap`, one seed, nothing in hand:
// the fields a test then changes are its own.
inline GridJob one_method_grid_job(std::shared_ptr<CaptureFile> cap, const std::string& method) {
  const CaptureInfo& ci = cap->info();
  GridJob job;
  job.capture = std::move(cap);
  job.base.ratios = {0.25};
  job.seeds = 1;
  job.layers = ci.num_layers;
  job.heads = ci.kv_heads;
  job.priority = std::make_shared<GridPriority>();
  job.slots[0].method = find_method(method);
  job.slots[0].name = method;
  for (int l = 0; l < ci.num_layers; ++l)
    for (int h = 0; h < ci.kv_heads; ++h) {
      GridJob::Need n;
      n.layer = l;
      n.head = h;
      n.key = std::to_string(l) + ":" + std::to_string(h);  // (GCC 12 warns on "L" + ...)
      job.needs.push_back(n);
    }
  return job;
}

// Every head of `want` has a fresh cell of `slot` in `g` with eval's figures, bit for bit.
inline void expect_grid_equals_eval(const GridReport& g, const EvalReport& want, int slot = 0) {
  for (const HeadEval& w : want.results) {
    const GridEntry* e = nullptr;
    const HeadEval* h = g.find(slot, w.layer, w.kv_head, &e);
    ASSERT_NE(h, nullptr) << "L" << w.layer << " H" << w.kv_head;
    EXPECT_EQ(e->state, CellState::Fresh);
    EXPECT_EQ(h->mean, w.mean) << "L" << w.layer << " H" << w.kv_head;
    EXPECT_EQ(h->std, w.std) << "L" << w.layer << " H" << w.kv_head;
    EXPECT_EQ(h->normalized_mean, w.normalized_mean);
    EXPECT_EQ(h->mass_mean, w.mass_mean);
    EXPECT_EQ(h->kept, w.kept);
  }
}

}  // namespace kvscope::app::testing
