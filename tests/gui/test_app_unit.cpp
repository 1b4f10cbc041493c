// Unit tests of the app framework without a window: the worker (results applied on the UI
// thread, newest request wins, cancellation, errors), sessions, token classification, the PNG
// writer and the software rasteriser.
#include <gtest/gtest.h>
#include <stb_image.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "app/app_state.h"
#include "app/export.h"
#include "app/plot.h"
#include "app/soft_render.h"
#include "app/token_marks.h"
#include "app/view.h"
#include "app/worker.h"
#include "engine/error.h"

namespace fs = std::filesystem;
using namespace kvscope;
using namespace kvscope::app;

namespace {

// Drains until `done` holds or 10 s pass.
template <typename Pred>
bool pump(AppState& s, Pred done) {
  auto t0 = std::chrono::steady_clock::now();
  while (!done()) {
    s.worker.drain(s);
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(10)) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

TEST(Worker, ResultIsAppliedOnTheCallingThread) {
  AppState s;
  std::thread::id ui = std::this_thread::get_id(), applied_on;
  int value = 0;
  s.worker.submit(Lane::Focus, "t.value", "test", [&](JobContext&) -> ApplyFn {
    EXPECT_NE(std::this_thread::get_id(), ui);  // computed on a worker thread
    return [&](AppState&) {
      applied_on = std::this_thread::get_id();
      value = 42;
    };
  });
  ASSERT_TRUE(pump(s, [&] { return value == 42; }));
  EXPECT_EQ(applied_on, ui);
  EXPECT_FALSE(s.worker.busy());
}

TEST(Worker, NewerRequestForTheSameKeyCancelsTheRunningOne) {
  AppState s;
  std::atomic<bool> first_started{false};
  std::atomic<bool> first_saw_cancel{false};
  int applied = 0;
  s.worker.submit(Lane::Grid, "t.same", "first", [&](JobContext& ctx) -> ApplyFn {
    first_started = true;
    while (!ctx.cancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    first_saw_cancel = true;
    ctx.check_cancel();  // throws Cancelled: nothing is applied
    return [&](AppState&) { applied = 1; };
  });
  ASSERT_TRUE(pump(s, [&] { return first_started.load(); }));
  s.worker.submit(Lane::Grid, "t.same", "second",
                  [&](JobContext&) -> ApplyFn { return [&](AppState&) { applied = 2; }; });
  ASSERT_TRUE(pump(s, [&] { return applied == 2; }));
  EXPECT_TRUE(first_saw_cancel);
  s.worker.drain(s);
  EXPECT_EQ(applied, 2);
}

TEST(Worker, FailuresAreReportedUnderTheJobKey) {
  AppState s;
  s.worker.submit(Lane::Analysis, "t.fail", "failing",
                  [](JobContext&) -> ApplyFn { throw InputError("x.safetensors: bad tensor"); });
  ASSERT_TRUE(pump(s, [&] { return s.job_errors.count("t.fail") == 1; }));
  EXPECT_EQ(s.job_errors["t.fail"], "x.safetensors: bad tensor");
  // A later success under the same key clears the message.
  s.worker.submit(Lane::Analysis, "t.fail", "ok", [](JobContext&) -> ApplyFn { return {}; });
  ASSERT_TRUE(pump(s, [&] { return s.job_errors.count("t.fail") == 0; }));
}

TEST(Worker, CancelByPrefixDropsQueuedJobs) {
  AppState s;
  std::atomic<bool> release{false};
  int ran = 0;
  s.worker.submit(Lane::Geometry, "g.block", "blocker", [&](JobContext&) -> ApplyFn {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return {};
  });
  for (int i = 0; i < 3; ++i)
    s.worker.submit(Lane::Geometry, "g.queued" + std::to_string(i), "queued",
                    [&](JobContext&) -> ApplyFn { return [&](AppState&) { ++ran; }; });
  EXPECT_TRUE(s.worker.busy("g.queued"));
  s.worker.cancel("g.queued");
  EXPECT_FALSE(s.worker.busy("g.queued"));
  release = true;
  ASSERT_TRUE(pump(s, [&] { return !s.worker.busy(); }));
  s.worker.drain(s);
  EXPECT_EQ(ran, 0);
}

// The app's own flow on the bundled capture, without a window: open, focused runs for A and B,
// the background grid, a focus change, a bad file that leaves the capture open.
TEST(AppFlow, OpenRunFocusAndBadFile) {
  const std::string sample =
      std::string(KVSCOPE_SOURCE_DIR) + "/sample_data/stories260K_lily.safetensors";
  if (!fs::exists(sample)) {
    GTEST_SKIP() << sample << " is missing";
  }
  AppState s;
  s.method_name = {"uniform", "streaming"};
  s.ab_enabled = true;
  s.keep_ratio = 0.25;
  s.grid_seeds = 1;
  s.request_open(sample);
  ASSERT_TRUE(pump(s, [&] { return s.run[0] && s.run[1] && s.grid; }))
      << s.load_error << s.run_error[0] << s.grid_error;
  const CaptureInfo& ci = *s.info();
  EXPECT_EQ(s.focus, (Focus{0, 0}));
  EXPECT_EQ(s.run[0]->selection.indices.size(), static_cast<size_t>(s.run[0]->window.budget));
  EXPECT_EQ(s.grid->results.size(), static_cast<size_t>(ci.num_layers * ci.kv_heads));
  for (const HeadEval& h : s.grid->results) EXPECT_EQ(h.method, "uniform");

  // Focus another head: its runs replace the old ones, for the new head.
  const uint64_t gen = s.run_generation;
  s.set_focus(Focus{ci.num_layers - 1, ci.kv_heads - 1});
  EXPECT_FALSE(s.run[0]);  // cleared at once, never showing the old head's result
  ASSERT_TRUE(pump(s, [&] { return s.run[0] && s.run[1] && s.focus_layer; }));
  EXPECT_GT(s.run_generation, gen);
  EXPECT_EQ(s.focus_layer->layer, ci.num_layers - 1);
  ASSERT_TRUE(pump(s, [&] { return s.query_cmp != nullptr; }));
  EXPECT_EQ(s.query_cmp->position, s.effective_query());
  double sum = 0;
  for (double w : s.query_cmp->approx_weights) sum += w;
  EXPECT_NEAR(sum, 1.0, 1e-9);

  // Every view of this framework exports its numbers once results are there.
  const fs::path dir = fs::temp_directory_path() / "kvscope_app_flow_export";
  fs::create_directories(dir);
  for (auto make : {make_capture_view, make_method_view, make_tokens_view}) {
    std::unique_ptr<View> v = make();
    const fs::path json = dir / (std::string(v->name()) + ".json");
    export_view_data(*v, s, json.string());
    std::ifstream jf(json);
    nlohmann::json parsed = nlohmann::json::parse(jf);
    EXPECT_FALSE(parsed.is_null()) << v->name();
    if (!v->export_csv(s).empty()) {
      const fs::path csv = dir / (std::string(v->name()) + ".csv");
      export_view_data(*v, s, csv.string());
      EXPECT_GT(fs::file_size(csv), 20u) << v->name();
    }
  }
  {
    // Tokens CSV: a header and one record per token (token text is quoted and may hold
    // newlines, so records are counted outside quotes).
    std::string csv = make_tokens_view()->export_csv(s);
    int records = 0;
    bool quoted = false;
    for (char c : csv) {
      if (c == '"') quoted = !quoted;
      if (c == '\n' && !quoted) ++records;
    }
    EXPECT_EQ(records, ci.num_tokens + 1);
  }
  fs::remove_all(dir);

  // A bad file: the message names it and the open capture stays.
  fs::path bad = fs::temp_directory_path() / "kvscope_app_flow_bad.safetensors";
  {
    std::ofstream f(bad, std::ios::binary);
    f << "nope";
  }
  auto cap = s.capture;
  s.request_open(bad.string());
  ASSERT_TRUE(pump(s, [&] { return !s.load_error.empty(); }));
  EXPECT_NE(s.load_error.find("kvscope_app_flow_bad.safetensors"), std::string::npos);
  EXPECT_EQ(s.capture, cap);
  fs::remove(bad);
}

TEST(Session, RoundTripsSettings) {
  AppState a;
  a.method_name = {"snapkv", "h2o"};
  a.ab_enabled = false;
  a.keep_ratio = 0.125;
  a.seed = 7;
  a.sink_override = 4;
  a.eval_override = 32;
  a.grid_seeds = 5;
  a.grid_metric = GridMetric::Entropy;
  a.params["balancekv"]["gamma"] = 0;
  nlohmann::json j = a.to_session();
  AppState b;
  b.apply_session(j);
  EXPECT_EQ(b.method_name, a.method_name);
  EXPECT_EQ(b.ab_enabled, false);
  EXPECT_DOUBLE_EQ(b.keep_ratio, 0.125);
  EXPECT_EQ(b.seed, 7);
  EXPECT_EQ(b.sink_override, 4);
  EXPECT_EQ(b.eval_override, 32);
  EXPECT_EQ(b.grid_seeds, 5);
  EXPECT_EQ(b.grid_metric, GridMetric::Entropy);
  EXPECT_DOUBLE_EQ(b.params["balancekv"]["gamma"], 0.0);
}

TEST(Session, BadSessionsAreInputErrors) {
  AppState s;
  EXPECT_THROW(s.apply_session(nlohmann::json{{"hello", 1}}), InputError);
  EXPECT_THROW(s.apply_session(nlohmann::json{{"kvscope_session", 1}, {"method_a", "nope"}}),
               InputError);
  EXPECT_THROW(s.apply_session(nlohmann::json{{"kvscope_session", 1}, {"keep_ratio", 3.0}}),
               InputError);
  EXPECT_THROW(s.apply_session(nlohmann::json{{"kvscope_session", 1}, {"seed", "seven"}}),
               InputError);
}

TEST(TokenMarks, ClassifiesSinksWindowKeptAndDropped) {
  HeadRun r;
  r.window = EvalWindow::make(64, 0.25);  // s = 2, E = 8, middle [2, 56)
  r.selection.indices = {10, 20};
  r.selection.weights = {2.0, 4.0};
  TokenMarks m = token_marks(r);
  ASSERT_EQ(m.kind.size(), 64u);
  EXPECT_EQ(m.kind[0], TokenKind::Sink);
  EXPECT_EQ(m.kind[r.window.sink], TokenKind::Dropped);
  EXPECT_EQ(m.kind[10], TokenKind::Kept);
  EXPECT_DOUBLE_EQ(m.weight[20], 4.0);
  EXPECT_EQ(m.kind[63], TokenKind::Window);
  EXPECT_DOUBLE_EQ(m.max_weight, 4.0);
  // The heavier kept token is drawn darker than the lighter one.
  auto lum = [](ImU32 c) { return ((c >> IM_COL32_G_SHIFT) & 0xFF); };
  EXPECT_LT(lum(token_colour(m, 20)), lum(token_colour(m, 10)));
}

TEST(Plot, RatioLabels) {
  EXPECT_EQ(ratio_label(0.25), "1/4");
  EXPECT_EQ(ratio_label(1.0), "1");
  EXPECT_EQ(ratio_label(0.3), "0.3");
}

TEST(SoftRender, FillsRectanglesAndRespectsClipping) {
  SoftTexture font = soft_init(200, 120);
  ImGui::NewFrame();
  ImDrawList* dl = ImGui::GetForegroundDrawList();
  dl->AddRectFilled(ImVec2(10, 10), ImVec2(60, 50), IM_COL32(255, 0, 0, 255));
  dl->PushClipRect(ImVec2(100, 0), ImVec2(150, 120));
  dl->AddRectFilled(ImVec2(80, 60), ImVec2(190, 100), IM_COL32(0, 0, 255, 255));
  dl->PopClipRect();
  ImGui::Render();
  std::vector<uint8_t> px;
  soft_render(ImGui::GetDrawData(), font, 200, 120, px, IM_COL32(0, 0, 0, 255));
  auto at = [&](int x, int y) { return &px[(static_cast<size_t>(y) * 200 + x) * 4]; };
  EXPECT_EQ(at(30, 30)[0], 255);
  EXPECT_EQ(at(30, 30)[1], 0);
  EXPECT_EQ(at(5, 5)[0], 0);       // outside the red rectangle
  EXPECT_EQ(at(120, 80)[2], 255);  // blue inside the clip rect
  EXPECT_EQ(at(90, 80)[2], 0);     // clipped away on the left
  EXPECT_EQ(at(170, 80)[2], 0);    // clipped away on the right

  // PNG writer: crop and orientation.
  fs::path png = fs::temp_directory_path() / "kvscope_soft_test.png";
  write_png(png.string(), px, 200, 120, false, ScreenRect{10, 10, 60, 50});
  int w = 0, h = 0, n = 0;
  unsigned char* img = stbi_load(png.string().c_str(), &w, &h, &n, 3);
  ASSERT_NE(img, nullptr);
  EXPECT_EQ(w, 50);
  EXPECT_EQ(h, 40);
  EXPECT_EQ(img[0], 255);  // the crop starts inside the red rectangle
  stbi_image_free(img);
  fs::remove(png);
  EXPECT_THROW(write_png("/nonexistent-dir/x.png", px, 200, 120, false), InputError);
  ImGui::DestroyContext();
}

}  // namespace
