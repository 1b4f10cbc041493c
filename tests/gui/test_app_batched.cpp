// The app's grid on a backend that parallelises inside one call (run_grid_job in
// app/grid_cells.cpp): the pending cells of a layer (one slot, one seed run) are computed by one
// run_eval over their heads, which scores them in one attention_errors call. A counting backend
// ("test-batch", tests/counting_backend.h) runs the CPU references and records every call; the
// app runs on it through settings.backend, as it would on "cuda". Every call names the loaded
// layer (ErrorBatch::layer_id), as the device's resident copies need.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "app/app_state.h"
#include "app/grid_cells.h"
#include "app/worker.h"
#include "engine/eval/protocol.h"
#include "engine/io/capture.h"
#include "engine/methods/method.h"
#include "engine/ops/backend.h"
#include "tests/counting_backend.h"
#include "tests/gui/app_pump.h"

using namespace kvscope;
using namespace kvscope::app;

namespace {

using kvscope::testing::counting;

const std::string kSample =
    std::string(KVSCOPE_SOURCE_DIR) + "/sample_data/stories260K_lily.safetensors";

bool grid_fresh(const AppState& s) {
  return s.result(kGrid).fresh();
}

// Calls of every kv head of the layer, and calls of some heads only.
std::pair<int, int> whole_and_partial(const std::vector<kvscope::testing::ErrorCall>& calls,
                                      int kv_heads) {
  int whole = 0, partial = 0;
  for (const auto& c : calls) (c.kv_heads == kv_heads ? whole : partial) += 1;
  return {whole, partial};
}

TEST(AppGridOnADevice, EachLayerOfTheGridIsScoredInOneCallPerSlotAndSeed) {
  ASSERT_TRUE(kvscope::testing::kCountingRegistered);
  AppState s;
  s.settings.backend = "test-batch";
  s.settings.method = {MethodChoice{"uniform", {}}, MethodChoice{"balancekv", {}}};
  s.settings.grid_seeds = 2;
  s.request_open(kSample);
  counting().take_calls();
  ASSERT_TRUE(kvscope::app::testing::pump_until(
      s, [&] { return grid_fresh(s); }, 120));
  ASSERT_EQ(s.backend(), &select_backend("test-batch"));
  const CaptureInfo& ci = s.capture->info();
  // The focused runs score one head each (run_head); every grid call holds a whole layer: both
  // methods depend on the seed, so layers x 2 slots x 2 seeds calls. Every call names the
  // loaded layer it reads (ErrorBatch::layer_id), so a device keeps the layer resident.
  const std::vector<kvscope::testing::ErrorCall> calls = counting().take_calls();
  for (const auto& c : calls) EXPECT_NE(c.layer_id, 0u) << "a grid call must name its layer";
  auto [whole, partial] = whole_and_partial(calls, ci.kv_heads);
  EXPECT_EQ(whole, ci.num_layers * 2 * 2);
  EXPECT_LE(partial, 2) << "only the two focused runs may score a head alone";
  EXPECT_EQ(s.grid_cells.computed(), static_cast<uint64_t>(ci.num_layers * ci.kv_heads * 2 * 2));

  // The cells are eval's figures on the same backend, bit for bit.
  EvalSpec spec;
  spec.methods = {find_method("uniform")};
  spec.ratios = {s.settings.keep_ratio};
  spec.seeds = 2;
  spec.base_seed = static_cast<uint64_t>(s.settings.seed);
  spec.threads = 1;
  const EvalReport want = run_eval(*s.capture, spec, {}, nullptr, s.backend());
  counting().take_calls();
  const GridReport* g = s.grid_report();
  ASSERT_NE(g, nullptr);
  kvscope::app::testing::expect_grid_equals_eval(*g, want);

  // A third seed: only the cells of the new seed run are missing, again a layer's heads per call.
  const uint64_t computed = s.grid_cells.computed();
  s.settings.grid_seeds = 3;
  ASSERT_TRUE(kvscope::app::testing::pump_until(
      s, [&] { return grid_fresh(s); }, 120));
  std::tie(whole, partial) = whole_and_partial(counting().take_calls(), ci.kv_heads);
  EXPECT_EQ(whole, ci.num_layers * 2);
  EXPECT_EQ(partial, 0);
  EXPECT_EQ(s.grid_cells.computed(),
            computed + static_cast<uint64_t>(ci.num_layers * ci.kv_heads * 2));
}

// Each thread of a device's grid holds a whole layer: no more layers at once than
// GridJob::layers_at_once (plan_grid: the capture's layer cache less the layer loaded ahead).
TEST(AppGridOnADevice, NoMoreLayersAtOnceThanTheJobAllows) {
  std::shared_ptr<CaptureFile> cap = CaptureFile::open(kSample);
  const CaptureInfo& ci = cap->info();
  GridJob job = kvscope::app::testing::one_method_grid_job(cap, "uniform");
  job.backend = &select_backend("test-batch");
  job.threads = 4;
  job.layers_at_once = 2;
  counting().take_calls();
  counting().take_max_active();
  counting().sleep_ms = 40;  // calls of layers computed at once overlap
  JobContext ctx;
  int cells = 0;
  const std::shared_ptr<GridReport> g =
      run_grid_job(
          job, ctx, [&](const GridJob::Need&, const HeadEval&, const CellTiming&) { ++cells; }, {});
  counting().sleep_ms = 0;
  EXPECT_EQ(cells, ci.num_layers * ci.kv_heads);
  EXPECT_TRUE(g->complete());
  auto [whole, partial] = whole_and_partial(counting().take_calls(), ci.kv_heads);
  EXPECT_EQ(whole, ci.num_layers);
  EXPECT_EQ(partial, 0);
  const int at_once = counting().take_max_active();
  EXPECT_GE(at_once, 1);
  EXPECT_LE(at_once, job.layers_at_once) << "layers computed at once";
}

}  // namespace
