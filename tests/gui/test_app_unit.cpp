// Unit tests of the app framework without a window: the worker (results applied on the UI
// thread, newest request wins, cancellation, errors), sessions, token classification, the PNG
// writer, the software rasteriser, and the input queue (clicks and key chords that arrive
// between two slow frames, the Open dialog's double-click).
#include <gtest/gtest.h>
#include <stb_image.h>
#include <unistd.h>

#define GLFW_INCLUDE_NONE  // key and action codes only
#include <GLFW/glfw3.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "app/app_frame.h"
#include "app/app_state.h"
#include "app/colormap.h"
#include "app/export.h"
#include "app/file_browser.h"
#include "app/grid_values.h"
#include "app/headless.h"
#include "app/input_queue.h"
#include "app/method_list.h"
#include "app/overlap_grid.h"
#include "app/plot.h"
#include "app/recent_files.h"
#include "app/result_status.h"
#include "app/sides_record.h"
#include "app/soft_render.h"
#include "app/token_marks.h"
#include "app/views/view.h"
#include "app/walk_advice.h"
#include "app/worker.h"
#include "engine/attention/exact_attention.h"
#include "engine/core/error.h"
#include "engine/eval/reference_cache.h"
#include "engine/methods/scoring.h"
#include "engine/model/synth.h"
#include "engine/ops/backend.h"
#include "tests/gui/app_pump.h"

namespace fs = std::filesystem;
using namespace kvscope;
using namespace kvscope::app;

namespace {

// Drains until `done` holds or `seconds` pass. Like the app's frame loop, every iteration runs
// reconcile() (which applies finished jobs and starts what the settings need).
template <typename Pred>
bool pump(AppState& s, Pred done, int seconds = 20) {
  return kvscope::app::testing::pump_until(s, done, seconds);
}

// A probe clock (AppState::probe_clock) running `scale` times as fast as the wall: a probe's
// verdict then follows the test's intent (a long job, a short one) on a machine of any speed or
// load instead of on how many units this machine gets through in a wall second.
std::function<std::chrono::steady_clock::time_point()> scaled_probe_clock(double scale) {
  const auto start = std::chrono::steady_clock::now();
  return [start, scale] {
    const auto real = std::chrono::steady_clock::now() - start;
    return start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(real * scale);
  };
}

const std::string kSample =
    std::string(KVSCOPE_SOURCE_DIR) + "/sample_data/stories260K_lily.safetensors";

// A synthetic capture of the "small" shape (2 layers, 4 q / 2 kv heads, d 16) with n tokens.
std::string synth_capture(int n) {
  const fs::path p =
      fs::temp_directory_path() / ("kvscope_app_unit_" + std::to_string(n) + "_tokens.safetensors");
  if (!fs::exists(p)) {
    SynthSpec spec = synth_preset("small");
    spec.num_tokens = n;
    write_synth_capture(p.string(), spec, DType::F16);
  }
  return p.string();
}

bool fresh(const AppState& s, const char* name) {
  const Result& r = s.result(name);
  return r.fresh();
}

// Draws every view for a few frames with the software renderer's ImGui context.
void draw_every_view(AppState& s) {
  AppUi ui(s);
  for (const auto& v : ui.views()) {
    ui.show_view(v->name());
    s.settings.active_view = v->name();
    for (int f = 0; f < 3; ++f) {
      ImGui::GetIO().DeltaTime = 1.0f / 60.0f;
      ImGui::NewFrame();
      ui.draw();
      ImGui::Render();
    }
  }
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

// A running job says how long it has run, and the time it has left at its own pace: the status
// bar shows "about N s left" beside its count.
// A job that says its own time left (the grid, app/grid_pace.h) is shown that, counted down by
// the wall clock until it says again, whatever its progress alone would say.
TEST(Worker, AJobsOwnTimeLeftCountsDownUntilItSaysAgain) {
  AppState s;
  std::atomic<int> step{0};
  s.worker.submit(Lane::Grid, "t.says", "says", [&](JobContext& ctx) -> ApplyFn {
    ctx.progress(1, 100);  // its pace alone would say 99 times what it ran
    ctx.time_left(50.0);
    step = 1;
    while (step == 1 && !ctx.cancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ctx.time_left(7.0);
    step = 3;
    while (step == 3 && !ctx.cancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return {};
  });
  auto left = [&] {
    for (const JobInfo& job : s.worker.jobs())
      if (job.key == "t.says" && job.running) return time_left_s(job);
    return -2.0;
  };
  ASSERT_TRUE(pump(s, [&] { return step == 1; }));
  const double first = left();
  EXPECT_LE(first, 50.0);
  EXPECT_GT(first, 0.0);  // (the wall between the job's word and this read is not bounded)
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_LT(left(), first);  // counted down by the wall clock
  step = 2;
  ASSERT_TRUE(pump(s, [&] { return step == 3; }));
  EXPECT_LE(left(), 7.0);
  EXPECT_GE(left(), 0.0);
  step = 4;
  ASSERT_TRUE(pump(s, [&] { return !s.worker.busy("t.says"); }));
}

// The grid job says its time left before its first cell (the cost model's classes: here one
// second a cell, no build) and after every cell (app/grid_pace.h).
TEST(Worker, TheGridSaysItsTimeLeftFromTheStart) {
  std::shared_ptr<CaptureFile> cap = CaptureFile::open(kSample);
  const CaptureInfo& ci = cap->info();
  GridJob job = kvscope::app::testing::one_method_grid_job(cap, "streaming");
  job.base.threads = 1;
  job.threads = 2;
  job.pace_prior.warm_s = {1.0, 1.0};
  job.exact_in_hand.assign(static_cast<size_t>(ci.num_layers * ci.kv_heads), 1);
  JobContext ctx;
  std::vector<double> said;
  run_grid_job(job, ctx,
               [&](const GridJob::Need&, const HeadEval&, const CellTiming& t) {
                 EXPECT_GE(t.seconds, t.build_seconds);
                 said.push_back(ctx.time_left_said());
               },
               {});
  ASSERT_EQ(said.size(), job.needs.size());
  // The first cell's call comes before its own time left: the cost model's, on two threads.
  EXPECT_DOUBLE_EQ(said[0], static_cast<double>(job.needs.size()) * 1.0 / 2);
  for (double v : said) EXPECT_GE(v, 0.0);
  EXPECT_DOUBLE_EQ(ctx.time_left_said(), 0.0);  // nothing left after the last cell
}

TEST(Worker, ARunningJobSaysItsTimeLeftAtItsOwnPace) {
  JobInfo j;
  j.running = true;
  j.done = 25;
  j.total = 100;
  j.elapsed_s = 10;
  EXPECT_DOUBLE_EQ(time_left_s(j), 30.0);
  j.elapsed_s = 0.5;  // under a second: its pace says nothing yet
  EXPECT_EQ(time_left_s(j), -1);
  j.elapsed_s = 10;
  j.done = 0;  // nothing done yet
  EXPECT_EQ(time_left_s(j), -1);

  AppState s;
  std::atomic<bool> release{false};
  s.worker.submit(Lane::Grid, "t.paced", "paced", [&](JobContext& ctx) -> ApplyFn {
    ctx.progress(1, 4);
    while (!release && !ctx.cancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return {};
  });
  JobInfo seen;
  ASSERT_TRUE(pump(s, [&] {
    for (const JobInfo& job : s.worker.jobs())
      if (job.key == "t.paced" && job.running && job.done == 1 && job.elapsed_s >= 1.0) seen = job;
    return seen.running;
  }));
  EXPECT_DOUBLE_EQ(time_left_s(seen), seen.elapsed_s * 3);
  release = true;
  ASSERT_TRUE(pump(s, [&] { return !s.worker.busy("t.paced"); }));
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
  ASSERT_TRUE(fs::exists(kSample)) << kSample;
  AppState s;
  s.settings.method = {MethodChoice{"uniform", {}}, MethodChoice{"streaming", {}}};
  s.settings.ab_enabled = true;
  s.settings.keep_ratio = 0.25;
  s.settings.grid_seeds = 1;
  s.request_open(kSample);
  ASSERT_TRUE(pump(s, [&] { return fresh(s, kFocusA) && fresh(s, kFocusB) && fresh(s, kGrid); }))
      << s.load_error << s.run_error(0) << s.result(kGrid).error;
  const CaptureInfo& ci = *s.info();
  EXPECT_EQ(s.settings.focus, (Focus{0, 0}));
  EXPECT_EQ(s.run(0)->selection.indices.size(), static_cast<size_t>(s.run(0)->window.budget));
  // A's cells and B's (app/grid_cells.h), every one computed.
  EXPECT_EQ(s.grid()->results.size(), static_cast<size_t>(2 * ci.num_layers * ci.kv_heads));
  for (size_t i = 0; i < s.grid()->results.size(); ++i) {
    EXPECT_EQ(s.grid()->results[i].method,
              s.grid_report()->entries[i].slot == 0 ? "uniform" : "streaming");
    EXPECT_EQ(s.grid_report()->entries[i].state, CellState::Fresh);
  }

  // Focus another head: the old runs are marked stale at once, then replaced.
  s.set_focus(Focus{ci.num_layers - 1, ci.kv_heads - 1});
  s.reconcile();
  EXPECT_FALSE(fresh(s, kFocusA));
  EXPECT_TRUE(s.result(kFocusA).stale());
  ASSERT_TRUE(pump(s, [&] { return fresh(s, kFocusA) && fresh(s, kFocusB) && s.focus_layer(); }));
  EXPECT_EQ(s.focus_layer()->layer, ci.num_layers - 1);
  ASSERT_TRUE(pump(s, [&] { return fresh(s, kQuery); }));
  EXPECT_EQ(s.query_cmp()->position, s.effective_query());
  double sum = 0;
  for (double w : s.query_cmp()->approx_weights) sum += w;
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

// Changing a parameter of method A or B must never hand the grid or the sweep a
// parameter of a method they do not run ("--param uniform.*: uniform is not among the evaluated
// methods"), and switching method B twice leaves both working.
TEST(AppFlow, GridAndSweepSurviveParameterAndMethodChanges) {
  AppState s;
  s.settings.method = {MethodChoice{"uniform", {}}, MethodChoice{"balancekv", {}}};
  s.settings.grid_seeds = 1;
  s.settings.sweep.methods = {"uniform", "streaming"};
  s.settings.sweep.ratios = {0.25, 0.125};
  s.settings.sweep.seeds = 1;
  s.request_open(kSample);
  ASSERT_TRUE(pump(s, [&] { return fresh(s, kGrid) && fresh(s, kSweep); }));
  // B's own parameter (the grid runs A only; the sweep does not run balancekv).
  s.settings.method[1].params["gamma"] = 0.5;
  // A parameter of A's method, as the slider in the Method view sets it.
  const std::vector<ParamSpec> specs = find_method("balancekv")->params();
  ASSERT_FALSE(specs.empty());
  s.reconcile();
  ASSERT_TRUE(pump(s, [&] { return fresh(s, kGrid) && fresh(s, kSweep) && fresh(s, kFocusB); }));
  EXPECT_EQ(s.result(kGrid).error, "");
  EXPECT_EQ(s.result(kSweep).error, "");
  EXPECT_EQ(s.run_error(1), "");
  // Switch B twice, then give A balancekv with its own parameter: everything recomputes.
  s.settings.method[1] = MethodChoice{"snapkv", {}};
  s.reconcile();
  s.settings.method[1] = MethodChoice{"streaming", {}};
  s.settings.method[0] = MethodChoice{"balancekv", {{specs[0].name, specs[0].min}}};
  s.reconcile();
  // The sweep runs A's method? No: its key changes only through methods it runs (streaming is
  // B's now, with default parameters), so it stays fresh; the grid is not fresh until rerun, and
  // at once none of its cells reads as fresh (both slots changed method: every cell is missing,
  // none of the earlier methods' values shown as the new ones').
  EXPECT_FALSE(s.result(kGrid).fresh());
  ASSERT_NE(s.grid_report(), nullptr);
  for (const GridEntry& e : s.grid_report()->entries)
    EXPECT_NE(e.state, CellState::Fresh) << "slot " << e.slot;
  EXPECT_FALSE(s.grid_report()->complete());
  ASSERT_TRUE(pump(s, [&] { return fresh(s, kGrid) && fresh(s, kFocusA) && fresh(s, kFocusB); }));
  EXPECT_EQ(s.result(kGrid).error, "");
  // Method A's cells are balancekv's (the grid holds B's too, app/grid_cells.h).
  ASSERT_NE(s.grid_report(), nullptr);
  for (size_t i = 0; i < s.grid()->results.size(); ++i) {
    const HeadEval& h = s.grid()->results[i];
    EXPECT_EQ(h.method, s.grid_report()->entries[i].slot == 0 ? "balancekv" : "streaming");
    EXPECT_EQ(h.error, "");
  }
  // A setting the sweep depends on (the seed): the old curves are marked stale, then replaced.
  s.settings.seed = 3;
  s.reconcile();
  EXPECT_TRUE(s.result(kSweep).stale());
  EXPECT_NE(s.sweep(), nullptr);  // still shown, marked stale
  // On a loaded machine the sweep's cost, estimated from the runs measured so far, can pass the
  // background limit and hold it for a Run click (1 run in 5 under load): click it as a user
  // would; what this test checks is that the stale curves are replaced.
  ASSERT_TRUE(pump(s, [&] {
    const Result& r = s.result(kSweep);
    if (!r.held.empty() && r.held == r.want) s.run_now(kSweep);
    return fresh(s, kSweep);
  }));
  EXPECT_EQ(s.result(kSweep).error, "");
  EXPECT_EQ(s.sweep()->spec.base_seed, 3u);
}

// The grid is cells keyed by what each depends on. A change of method A's
// parameter recomputes A's cells only (B's keep their serials); going back to an earlier value
// computes nothing; the figures are run_eval's to the last bit; a Cancel holds across changes
// until Run.
// Results are typed: a value is read only as the type its job returned.
TEST(Results, AValueIsReadOnlyAsTheTypeItsJobReturned) {
  JobPlan p;
  p.returns<HeadRun>([](JobContext&, const JobPlan::PartialFn&) {
    auto run = std::make_shared<HeadRun>();
    run->mean_relative = 0.25;
    return std::shared_ptr<const HeadRun>(run);
  });
  ASSERT_NE(p.value_type, nullptr);
  EXPECT_EQ(*p.value_type, typeid(HeadRun));
  JobContext ctx;
  Result r;
  r.value = p.compute(ctx, {});
  r.type = p.value_type;
  ASSERT_NE(r.get<HeadRun>(), nullptr);
  EXPECT_EQ(r.get<HeadRun>()->mean_relative, 0.25);
  EXPECT_EQ(r.get<EvalReport>(), nullptr);  // never reinterpreted as another type
  EXPECT_EQ(r.ptr<GridReport>(), nullptr);
  r.type = nullptr;  // a value of unknown type is not read at all
  EXPECT_EQ(r.get<HeadRun>(), nullptr);
}

namespace {

// Settings changes by name, for the key tests below.
using SettingChanges = std::vector<std::pair<const char*, std::function<void(Settings&)>>>;

// What one run of method A reads (the focused run and every grid cell of A).
SettingChanges method_a_run() {
  return {
      {"keep ratio", [](Settings& st) { st.keep_ratio = 0.125; }},
      {"seed", [](Settings& st) { st.seed = 7; }},
      {"A's parameter", [](Settings& st) { st.method[0].params["gamma"] = 2; }},
      {"A's method", [](Settings& st) { st.method[0].name = "uniform"; }},
      {"sink", [](Settings& st) { st.sink_override = 3; }},
      {"eval", [](Settings& st) { st.eval_override = 5; }},
      {"estimator", [](Settings& st) { st.estimator = Estimator::Authors; }},
  };
}
// The focused head.
const SettingChanges& focus() {
  static const SettingChanges f = {
      {"layer", [](Settings& st) { st.focus.layer = 1; }},
      {"kv head", [](Settings& st) { st.focus.kv_head = 1; }},
  };
  return f;
}

// Each of `reads` changes the key `result` wants, each of `ignores` leaves it, and the base
// settings give the same key again.
void expect_key_reads(AppState& s, const std::string& result, const SettingChanges& reads,
                      const SettingChanges& ignores = {}) {
  const std::string key0 = s.result(result).want;
  const Settings base = s.settings;
  for (const auto& [what, change] : reads) {
    s.settings = base;
    change(s.settings);
    s.reconcile();
    EXPECT_NE(s.result(result).want, key0) << what << " is read by " << result;
  }
  for (const auto& [what, change] : ignores) {
    s.settings = base;
    change(s.settings);
    s.reconcile();
    EXPECT_EQ(s.result(result).want, key0) << what << " is not read by " << result;
  }
  s.settings = base;
  s.reconcile();
  EXPECT_EQ(s.result(result).want, key0);
}

}  // namespace

// Keys are derived from what a job reads: every setting a focused run reads changes its key, and
// settings it does not read (the views shown) change no result's key.
TEST(Results, KeysChangeWithEverySettingTheJobReadsAndNothingElse) {
  AppState s;
  s.settings.method = {MethodChoice{"balancekv", {}}, MethodChoice{"uniform", {}}};
  s.request_open(kSample);
  ASSERT_TRUE(pump(s, [&] { return fresh(s, kFocusA); }));
  auto wants = [&] {
    std::map<std::string, std::string> out;
    for (const auto& [name, r] : s.results) out[name] = r.want;
    return out;
  };
  const std::string focus0 = s.result(kFocusA).want;
  EXPECT_EQ(focus0.rfind("focus|{", 0), 0u) << focus0;
  // Each of these is read by the focused run, so each gives another key.
  SettingChanges reads = method_a_run();
  reads.insert(reads.end(), focus().begin(), focus().end());
  expect_key_reads(s, kFocusA, reads);
  const auto before = wants();
  s.settings.active_view = "geometry";
  s.settings.panel_view = {"walk", "error"};
  s.reconcile();
  EXPECT_EQ(s.result(kFocusA).want, focus0);
  EXPECT_EQ(s.result(kFocusB).want, before.at(kFocusB));
  EXPECT_EQ(s.result(kLayer).want, before.at(kLayer));
}

// The grid's key is derived from its input (GridInput in app/app_plans.cpp) as every other
// job's: each setting a cell reads, which slots are in the grid and the seed count move it;
// the focus, the views shown and how the grid is coloured do not.
TEST(Results, TheGridKeyReadsWhatItsCellsReadAndNothingElse) {
  AppState s;
  s.settings.method = {MethodChoice{"balancekv", {}}, MethodChoice{"uniform", {}}};
  s.request_open(kSample);
  ASSERT_TRUE(pump(s, [&] { return fresh(s, kFocusA); }));
  const std::string grid0 = s.result(kGrid).want;
  EXPECT_EQ(grid0.rfind("grid|{", 0), 0u) << grid0;
  SettingChanges reads = method_a_run();
  reads.insert(reads.end(),
               {{"B's method", [](Settings& st) { st.method[1].name = "snapkv"; }},
                {"B's parameter", [](Settings& st) { st.method[1].params["x"] = 1; }},
                {"B off", [](Settings& st) { st.ab_enabled = false; }},
                {"grid seeds", [](Settings& st) { st.grid_seeds = st.grid_seeds + 2; }}});
  SettingChanges ignores = focus();
  ignores.insert(ignores.end(),
                 {{"query head", [](Settings& st) { st.selected_q_head = 1; }},
                  {"grid metric", [](Settings& st) { st.grid_metric = GridMetric::Entropy; }},
                  {"views shown", [](Settings& st) {
                     st.panel_view = {"walk", "theory"};
                   }}});
  expect_key_reads(s, kGrid, reads, ignores);
}

// A cell is keyed by its own seed, and a method that ignores the seed (streaming) by none: moving
// the first seed by one computes only method A's cells of the one seed that is new, and none of
// B's.
// Methods A and B on the sample capture, until its grid of `seeds` seeds is in.
void open_until_grid(AppState& s, const char* a, const char* b, int seeds) {
  s.settings.method = {MethodChoice{a, {}}, MethodChoice{b, {}}};
  s.settings.grid_seeds = seeds;
  s.request_open(kSample);
  ASSERT_TRUE(pump(
      s, [&] { return fresh(s, kGrid); }, 60));
}

TEST(AppFlow, ANewSeedRecomputesOnlyTheCellsOfTheSeedThatIsNew) {
  AppState s;
  ASSERT_NO_FATAL_FAILURE(open_until_grid(s, "balancekv", "streaming", 2));
  auto keys = [&](int slot) {
    std::set<std::string> out;
    for (const GridEntry& e : s.grid_report()->entries)
      if (e.slot == slot) out.insert(e.keys.begin(), e.keys.end());
    return out;
  };
  const CaptureInfo& ci = s.capture->info();
  const size_t heads = static_cast<size_t>(ci.num_layers * ci.kv_heads);
  const auto a0 = keys(0), b0 = keys(1);
  ASSERT_EQ(a0.size(), 2 * heads);
  ASSERT_EQ(b0.size(), heads);  // one cell per head for all seeds
  const uint64_t computed = s.grid_cells.computed();
  s.settings.seed += 1;
  ASSERT_TRUE(pump(
      s, [&] { return fresh(s, kGrid); }, 60));
  EXPECT_EQ(keys(1), b0);
  size_t fresh_keys = 0;
  for (const std::string& k : keys(0)) fresh_keys += a0.count(k) == 0;
  EXPECT_EQ(fresh_keys, heads);  // seed 1 is shared; seed 2 is new
  EXPECT_EQ(s.grid_cells.computed(), computed + heads);
}

TEST(AppFlow, TheGridRecomputesOnlyTheCellsAChangeOutdates) {
  AppState s;
  ASSERT_NO_FATAL_FAILURE(open_until_grid(s, "balancekv", "uniform", 2));
  auto serials = [&](int slot) {
    std::map<std::string, uint64_t> out;
    const GridReport* g = s.grid_report();
    for (const GridEntry& e : g->entries)
      if (e.slot == slot)
        for (const std::string& k : e.keys) {
          const GridCell* c = s.grid_cells.find(k);
          out[k] = c ? c->serial : 0;
        }
    return out;
  };
  const auto a0 = serials(0), b0 = serials(1);
  const CaptureInfo& ci = s.capture->info();
  ASSERT_EQ(a0.size(), static_cast<size_t>(ci.num_layers * ci.kv_heads * 2));  // 2 seeds
  ASSERT_EQ(b0.size(), static_cast<size_t>(ci.num_layers * ci.kv_heads * 2));
  uint64_t last = 0;
  for (const auto& [k, v] : a0) last = std::max(last, v);
  for (const auto& [k, v] : b0) last = std::max(last, v);

  s.settings.method[0].params["gamma"] = 2;
  ASSERT_TRUE(pump(
      s, [&] { return fresh(s, kGrid); }, 60));
  EXPECT_EQ(serials(1), b0);  // B's cells were not computed again
  const auto a1 = serials(0);
  ASSERT_EQ(a1.size(), a0.size());
  for (const auto& [k, v] : a1) {
    EXPECT_EQ(a0.count(k), 0u) << k;  // new keys: gamma is in them
    EXPECT_GT(v, last) << k;          // computed after the change
  }
  EXPECT_EQ(s.grid_cells.computed(), last + a1.size());

  // The figures are eval's for the same settings.
  EvalSpec spec;
  spec.methods = {find_method("balancekv")};
  spec.params["balancekv"] = {{"gamma", 2}};
  spec.ratios = {s.settings.keep_ratio};
  spec.seeds = 2;
  spec.threads = 1;
  const EvalReport want = run_eval(*s.capture, spec);
  const GridReport* g = s.grid_report();
  kvscope::app::testing::expect_grid_equals_eval(*g, want);

  // Back to the default: every cell is in the store, nothing is computed.
  const uint64_t computed = s.grid_cells.computed();
  s.settings.method[0].params.clear();
  ASSERT_TRUE(pump(
      s, [&] { return fresh(s, kGrid); }, 60));
  EXPECT_EQ(s.grid_cells.computed(), computed);
  EXPECT_EQ(serials(0), a0);

  // Cancel holds across a change until Run.
  s.settings.method[0].params["gamma"] = 8;
  s.reconcile();
  EXPECT_TRUE(s.result(kGrid).busy());
  s.cancel_job(kGrid);
  s.settings.keep_ratio = 0.125;
  for (int i = 0; i < 5; ++i) s.reconcile();
  EXPECT_FALSE(s.result(kGrid).busy());
  EXPECT_EQ(s.result(kGrid).cancelled, s.result(kGrid).want);
  s.run_now(kGrid);
  s.reconcile();
  EXPECT_TRUE(s.result(kGrid).busy());
  ASSERT_TRUE(pump(
      s, [&] { return fresh(s, kGrid); }, 60));
}

// A change outdates the grid's cells in the frame it is made: right after the reconcile that sees
// the new gamma, and before any job has posted, the grid (and its export) is not complete, every
// cell of method A is stale and the caption names the new gamma; method B's cells stay fresh.
TEST(AppFlow, AChangeMarksTheGridStaleInTheSameFrame) {
  AppState s;
  ASSERT_NO_FATAL_FAILURE(open_until_grid(s, "balancekv", "uniform", 1));
  nlohmann::json before = grid_json(s);
  ASSERT_TRUE(before["complete"].get<bool>());
  for (const auto& c : before["error_grid"]) ASSERT_EQ(c["state"], "fresh");

  s.settings.method[0].params["gamma"] = 2;
  s.reconcile();
  const nlohmann::json after = grid_json(s);
  EXPECT_FALSE(after["complete"].get<bool>()) << after["caption"];
  EXPECT_FALSE(s.result(kGrid).fresh());
  EXPECT_EQ(after["cells_done"], before["cells_done"].get<int>() / 2);  // B's cells only
  ASSERT_EQ(after["error_grid"].size(), before["error_grid"].size());
  for (const auto& c : after["error_grid"]) EXPECT_EQ(c["state"], "stale") << c.dump();
  for (const auto& c : after["error_grid_b"]) EXPECT_EQ(c["state"], "fresh") << c.dump();
  const std::string caption = after["caption"];
  EXPECT_NE(caption.find("gamma 2"), std::string::npos) << caption;
  EXPECT_NE(caption.find("so far"), std::string::npos) << caption;

  // Then the job fills it in as before.
  ASSERT_TRUE(pump(
      s, [&] { return fresh(s, kGrid); }, 60));
  const nlohmann::json done = grid_json(s);
  EXPECT_TRUE(done["complete"].get<bool>());
  for (const auto& c : done["error_grid"]) EXPECT_EQ(c["state"], "fresh");
}

// A click on a grid cell of another layer must run the focused methods on
// that layer. Planning the focused runs before the new focus's `want` was published handed them
// the previous layer (lily L2 H3 showed L0 H3's errors under L2 H3's key, so they stayed).
TEST(AppFlow, FocusOnAnotherLayerRunsTheMethodsOnThatLayer) {
  AppState s;
  s.settings.method = {MethodChoice{"balancekv", {}}, MethodChoice{"uniform", {}}};
  s.settings.keep_ratio = 0.25;
  s.settings.grid_seeds = 1;
  s.request_open(kSample);
  ASSERT_TRUE(pump(s, [&] { return fresh(s, kFocusA) && fresh(s, kFocusB) && fresh(s, kQuery); }))
      << s.load_error << s.run_error(0);
  const CaptureInfo& ci = *s.info();
  ASSERT_GE(ci.num_layers, 3);
  ASSERT_GE(ci.kv_heads, 4);
  for (const Focus f : {Focus{2, 3}, Focus{0, 1}, Focus{ci.num_layers - 1, 0}}) {
    s.set_focus(f);  // as a grid click does: the next frame's reconcile() sees the new focus
    ASSERT_TRUE(pump(s, [&] { return fresh(s, kFocusA) && fresh(s, kFocusB) && fresh(s, kQuery); }))
        << s.run_error(0);
    std::shared_ptr<const LayerData> layer = s.capture->layer(f.layer);
    for (int slot = 0; slot < 2; ++slot) {
      const HeadRun want = run_head(*layer, ci.num_layers, f.kv_head, s.method_settings(slot),
                                    static_cast<uint64_t>(s.settings.seed));
      EXPECT_EQ(s.run(slot)->mean_relative, want.mean_relative)
          << "slot " << slot << " at L" << f.layer << " H" << f.kv_head;
      EXPECT_EQ(s.run(slot)->selection.indices, want.selection.indices);
    }
    // The query comparison uses the focused layer's query and keys.
    const int qh = f.kv_head * ci.group_size() + s.settings.selected_q_head;
    EXPECT_EQ(s.query_cmp()->q_head, qh);
    const std::vector<double> exact =
        attention_row(layer->queries[static_cast<size_t>(qh)].row(s.query_cmp()->position).data(),
                      layer->keys[static_cast<size_t>(f.kv_head)], s.query_cmp()->position);
    EXPECT_EQ(s.query_cmp()->exact_weights, exact);
  }
}

// Every view draws without a capture (no EvalWindow::make throwing into a draw call), and with a
// capture of 4 tokens (the protocol window clamps to fit, with a note).
TEST(AppFlow, EveryViewDrawsWithNoCaptureAndWithATinyCapture) {
  [[maybe_unused]] SoftTexture font = soft_init(1280, 800);
  {
    AppState s;
    EXPECT_NO_THROW(draw_every_view(s));
  }
  {
    AppState s;
    s.request_open(synth_capture(4));
    ASSERT_TRUE(pump(s, [&] { return s.capture && fresh(s, kFocusA) && fresh(s, kFocusB); }))
        << s.load_error;
    std::string note;
    EvalWindow w = s.window(&note);
    EXPECT_GE(w.eval, 1);
    EXPECT_LE(w.sink + w.eval, 4);
    EXPECT_FALSE(note.empty());
    EXPECT_FALSE(s.notes.empty());  // said in the window
    EXPECT_NO_THROW(draw_every_view(s));
  }
  ImGui::DestroyContext();
}

// An override that does not fit a newly opened capture is adjusted and said.
TEST(AppFlow, OverridesThatDoNotFitTheNewCaptureAreAdjusted) {
  AppState s;
  s.settings.sink_override = 200;
  s.settings.eval_override = 64;
  s.request_open(synth_capture(64));
  ASSERT_TRUE(pump(s, [&] { return s.capture && fresh(s, kFocusA); })) << s.load_error;
  EXPECT_LE(s.settings.sink_override + s.settings.eval_override, 64);
  ASSERT_FALSE(s.notes.empty());
  EXPECT_NE(s.notes[0].find("sink override"), std::string::npos) << s.notes[0];
  EXPECT_EQ(s.run_error(0), "");
}

// A note is about the capture it was said for: opening another one clears it (a note that the
// focus was not in a capture stayed up across later captures), and the new one says its own.
TEST(AppFlow, NotesOfACaptureGoWhenAnotherOpens) {
  AppState s;
  s.settings.sink_override = 200;
  s.settings.eval_override = 64;
  s.request_open(synth_capture(64));
  ASSERT_TRUE(pump(s, [&] { return s.capture != nullptr; })) << s.load_error;
  ASSERT_FALSE(s.notes.empty());
  const uint64_t first = s.capture_id;
  s.request_open(kSample);  // the overrides, adjusted to 64 tokens, fit the sample
  ASSERT_TRUE(pump(s, [&] { return s.capture_id != first; })) << s.load_error;
  EXPECT_TRUE(s.notes.empty()) << s.notes.front();
  EXPECT_TRUE(s.exact_sides_seen.empty());
}

// Costs before work: on an 8192-token capture the sweep is estimated above the 3 s limit (its
// methods' evaluations measured as slow), so it starts and measures itself; it runs past its
// limit and waits for a Run click with its own estimate. Run starts it, Cancel stops it and it
// stays stopped until Run again. The probe's clock runs 100x the wall (3 s of probe is 30 ms of
// work), so "long" holds on a machine that does this sweep in 3 s (CI once did and saw it finish).
TEST(AppFlow, CostlyJobsWaitForRunAndCanBeCancelledAndRerun) {
  AppState s;
  s.probe_clock = scaled_probe_clock(100.0);
  s.settings.method = {MethodChoice{"uniform", {}}, MethodChoice{"streaming", {}}};
  s.settings.sweep.methods = {"uniform", "streaming", "snapkv"};
  s.settings.sweep.seeds = 10;
  for (const char* m : {"eval:uniform", "eval:streaming", "eval:snapkv"}) s.costs.record(m, 1, 1.0);
  // The focused runs are costed from their own class, not from those evaluations.
  for (const char* m : {"head:uniform", "head:streaming"}) s.costs.record(m, 1e9, 1e-3);
  s.request_open(synth_capture(8192));
  ASSERT_TRUE(pump(s, [&] { return s.capture != nullptr; })) << s.load_error;
  EXPECT_EQ(s.grid_seeds(), 1);  // scaled down for a long capture
  const Result& sweep = s.result(kSweep);
  ASSERT_TRUE(pump(
      s, [&] { return !sweep.want.empty() && (sweep.held == sweep.want || sweep.fresh()); }, 120));
  ASSERT_EQ(sweep.held, sweep.want) << "the sweep finished within its probe: make it larger";
  EXPECT_GT(sweep.estimate_s, 3.0);
  EXPECT_FALSE(sweep.busy());
  EXPECT_NE(sweep.estimate_text.find("measured here"), std::string::npos) << sweep.estimate_text;
  s.run_now(kSweep);
  s.reconcile();
  EXPECT_TRUE(s.result(kSweep).busy());
  s.cancel_job(kSweep);
  for (int i = 0; i < 5; ++i) s.reconcile();
  EXPECT_FALSE(s.result(kSweep).busy());
  EXPECT_EQ(s.result(kSweep).cancelled, s.result(kSweep).want);
  s.run_now(kSweep);
  s.reconcile();
  EXPECT_TRUE(s.result(kSweep).busy());
  s.cancel_job(kSweep);
  // The focused runs are one head: they start by themselves and measure this machine's cost.
  ASSERT_TRUE(pump(
      s, [&] { return fresh(s, kFocusA); }, 60));
  EXPECT_TRUE(s.costs.measured("head:uniform"));
  EXPECT_GT(s.result(kFocusA).seconds, 0.0);
}

// Opens the sample and runs frames until its sweep is fresh (at most 60 s): the sweep's first
// estimate, and whether it was ever held for a Run click on the way.
struct SweepSeen {
  bool fresh = false, held = false;
  double first_estimate = -1;
};
SweepSeen sweep_the_sample(AppState& s) {
  s.request_open(kSample);
  SweepSeen seen;
  // The result is looked up each time: it exists once the sweep was first planned.
  seen.fresh = pump(
      s,
      [&] {
        const Result& sweep = s.result(kSweep);
        if (seen.first_estimate < 0 && !sweep.want.empty() && sweep.estimate_s > 0)
          seen.first_estimate = sweep.estimate_s;
        seen.held = seen.held || (!sweep.held.empty() && sweep.held == sweep.want);
        return sweep.fresh();
      },
      60);
  return seen;
}

// An estimate from the prior holds nothing: a job estimated above the limit before anything was
// measured on this machine starts, and one whose own pace says it is short runs to the end
// without a Run click (the sample set's evaluation was held at "about 4 s" for 0.3 s of work).
// The probe's clock runs at a tenth of the wall, so a loaded machine's slower pace still reads
// as short.
TEST(AppFlow, AJobEstimatedLongByThePriorRunsWhenItsOwnPaceIsShort) {
  AppState s;
  s.probe_clock = scaled_probe_clock(0.1);
  s.settings.method = {MethodChoice{"uniform", {}}, MethodChoice{"uniform", {}}};
  s.settings.sweep.methods = {"uniform"};
  s.settings.sweep.seeds = 1;
  // A focused run measured as very slow makes the unmeasured evaluations' estimate huge.
  s.costs.record("head:uniform", 1, 1.0);
  const SweepSeen seen = sweep_the_sample(s);
  ASSERT_TRUE(seen.fresh) << s.result(kSweep).estimate_text;
  const Result& sweep = s.result(kSweep);
  EXPECT_GT(seen.first_estimate, 3.0) << "the prior's estimate should be above the limit";
  EXPECT_FALSE(seen.held) << "held for a Run click although it took " << sweep.seconds << " s";
  EXPECT_TRUE(sweep.measured.empty());
}

// Nor does an estimate from costs measured on this machine: a first measurement taken under load
// or cold (a build beside it) once held 0.55 s of work at "about 8.4 s". With every class the
// sweep reads measured as very slow, the sweep still starts, and its own pace lets it run on.
TEST(AppFlow, AnEstimateFromMeasuredCostsHoldsNothingThatRunsShort) {
  AppState s;
  s.probe_clock = scaled_probe_clock(0.1);
  s.settings.method = {MethodChoice{"uniform", {}}, MethodChoice{"uniform", {}}};
  s.settings.sweep.methods = {"uniform"};
  s.settings.sweep.seeds = 1;
  for (const char* cls : {"eval:uniform", "head:uniform", kExactCostClass})
    s.costs.record(cls, 1, 1.0);
  ASSERT_TRUE(s.costs.measured("eval:uniform"));
  const SweepSeen seen = sweep_the_sample(s);
  ASSERT_TRUE(seen.fresh) << s.result(kSweep).estimate_text;
  EXPECT_GT(seen.first_estimate, 3.0) << "the measured costs' estimate should be above the limit";
  EXPECT_FALSE(seen.held) << "held for a Run click although it took " << s.result(kSweep).seconds
                          << " s";
}

// A grid cell's time goes to two classes: the build of its head's exact side ("exact", cold)
// and the rest to its method's evaluations (warm). A second grid over the same heads (another
// keep ratio) builds nothing and costs no build in its estimate.
TEST(Costs, AGridSplitsColdBuildsFromWarmScoring) {
  AppState s;
  s.settings.method = {MethodChoice{"uniform", {}}, MethodChoice{"uniform", {}}};
  s.settings.ab_enabled = false;
  s.request_open(synth_capture(2048));
  ASSERT_TRUE(pump(
      s, [&] { return fresh(s, kGrid); }, 120))
      << s.load_error;
  EXPECT_TRUE(s.costs.measured(kExactCostClass));
  EXPECT_TRUE(s.costs.measured("eval:uniform"));
  const CaptureInfo& ci = s.capture->info();
  EXPECT_EQ(s.exact_sides_seen.size(), static_cast<size_t>(ci.num_layers * ci.kv_heads));
  const double built = ReferenceCache::global().stats().misses;
  s.settings.keep_ratio = s.settings.keep_ratio / 2;  // same window: same exact sides
  s.reconcile();
  const double warm_estimate = s.result(kGrid).estimate_s;
  const double cells = ci.num_layers * ci.kv_heads *
                       (find_method("uniform")->depends_on_seed() ? s.grid_seeds() : 1);
  EXPECT_NEAR(warm_estimate,
              cells * s.costs.per_unit("eval:uniform") * head_units(ci, s.window()) /
                  std::max(1u, std::thread::hardware_concurrency()),
              1e-9 * warm_estimate);
  ASSERT_TRUE(pump(
      s, [&] { return fresh(s, kGrid); }, 120));
  EXPECT_EQ(ReferenceCache::global().stats().misses, built) << "the second grid built a side";
}

// Reopening a capture reads its exact sides from the reference cache's disk tier: the app keeps a
// record of the sides it saw beside the tier's files (app/sides_record.h), so the reopened
// capture's first grid estimate costs no build (it said 25 s for a 13 s grid on a reopened
// 8192-token capture), and the grid indeed builds none.
TEST(Costs, AReopenedCaptureCostsNoBuildForTheSidesOnDisk) {
  const fs::path dir = fs::temp_directory_path() / ("kvscope_sides_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  ReferenceCache& cache = ReferenceCache::global();
  cache.set_disk(dir.string(), size_t{1} << 30);
  cache.clear();
  const std::string capture = synth_capture(2048);
  {
    AppState s;
    s.settings.method = {MethodChoice{"uniform", {}}, MethodChoice{"uniform", {}}};
    s.settings.ab_enabled = false;
    s.request_open(capture);
    ASSERT_TRUE(pump(
        s, [&] { return fresh(s, kGrid); }, 120))
        << s.load_error;
    const CaptureInfo& ci = s.capture->info();
    const size_t heads = static_cast<size_t>(ci.num_layers * ci.kv_heads);
    ASSERT_EQ(s.exact_sides_seen.size(), heads);
    EXPECT_EQ(s.sides_record, sides_record_file(dir.string(), capture));
    // The record is written in the background as the cells come in.
    ASSERT_TRUE(pump(
        s, [&] { return read_sides_record(s.sides_record).size() == heads; }, 30))
        << s.sides_record;
  }
  cache.clear();  // a new run of the app: only the disk holds the sides
  const long long missed = cache.stats().misses, read = cache.stats().disk_hits,
                  written = cache.stats().disk_writes;
  {  // (the app's writer of the record stops with it, before the folder is removed)
    AppState s;
    s.settings.method = {MethodChoice{"uniform", {}}, MethodChoice{"uniform", {}}};
    s.settings.ab_enabled = false;
    s.costs.record("eval:uniform", 1, 1e-9);
    s.costs.record(kExactCostClass, 1, 1e-9);
    s.request_open(capture);
    ASSERT_TRUE(pump(s, [&] { return s.capture != nullptr; })) << s.load_error;
    const CaptureInfo& ci = s.capture->info();
    EXPECT_EQ(s.exact_sides_on_disk.size(), static_cast<size_t>(ci.num_layers * ci.kv_heads));
    EXPECT_TRUE(s.exact_sides_seen.empty());
    // The estimate of the reconcile() that applied the opened capture and started the grid (a
    // later one counts only the cells still missing, which the grid's threads are filling in).
    const double cells = ci.num_layers * ci.kv_heads *
                         (find_method("uniform")->depends_on_seed() ? s.grid_seeds() : 1);
    const double warm = cells * s.costs.per_unit("eval:uniform") * head_units(ci, s.window()) /
                        std::max(1u, std::thread::hardware_concurrency());
    EXPECT_NEAR(s.result(kGrid).estimate_s, warm, 1e-9 * warm) << "the sides on disk cost a build";
    ASSERT_TRUE(pump(
        s, [&] { return fresh(s, kGrid); }, 120));
    // Every side the grid missed in memory came from the disk, none was built (a build is written).
    const ReferenceCacheStats after = cache.stats();
    EXPECT_EQ(after.disk_writes, written) << "the reopened capture's grid built a side";
    EXPECT_EQ(after.disk_hits - read, after.misses - missed);
    EXPECT_GE(after.disk_hits - read, ci.num_layers * ci.kv_heads);
  }
  cache.set_disk("", 0);
  fs::remove_all(dir);
}

// The record of a capture's sides: named by the capture file's path, size and modification time
// (an edited capture gets a new one); lines that are not four whole numbers joined by '|' are
// skipped, as a torn or foreign file's are.
TEST(SidesRecord, NamedByTheFileAndReadLineByLine) {
  const fs::path dir = fs::temp_directory_path() / ("kvscope_record_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path capture = dir / "c.safetensors";
  std::ofstream(capture) << "not read";
  const std::string file = sides_record_file(dir.string(), capture.string());
  ASSERT_FALSE(file.empty());
  EXPECT_EQ(fs::path(file).parent_path(), dir);
  EXPECT_EQ(sides_record_file(dir.string(), capture.string()), file);
  EXPECT_EQ(sides_record_file("", capture.string()), "") << "the disk tier off: no record";
  EXPECT_EQ(sides_record_file(dir.string(), (dir / "missing").string()), "");
  fs::last_write_time(capture, fs::last_write_time(capture) + std::chrono::seconds(5));
  EXPECT_NE(sides_record_file(dir.string(), capture.string()), file) << "an edited capture";
  EXPECT_TRUE(read_sides_record(file).empty()) << "no record yet";
  std::ofstream(file) << "0|128|0|1\n4|256|31|7\n\nx|1|2|3\n1|2|3\n1||2|3\n1|2|3|4|\n|1|2|3\n"
                      << "12|34|5|6";  // a torn last line still whole here
  EXPECT_EQ(read_sides_record(file),
            (std::set<std::string>{"0|128|0|1", "4|256|31|7", "12|34|5|6"}));
  {
    SidesRecordWriter writer;
    EXPECT_TRUE(writer.write(file, {"1|2|3|4", "5|6|7|8"}));
  }  // the destructor waits for the write
  EXPECT_EQ(read_sides_record(file), (std::set<std::string>{"1|2|3|4", "5|6|7|8"}));
  fs::remove_all(dir);
}

// A sweep's estimate costs each head's exact side once (the reference cache shares it between
// every method, ratio and seed) and each run its selection and scoring: three seeds of BalanceKV
// cost less than three times one seed. (Costing every run as a whole head run estimated the
// default sweep of a 32-layer 32768-token capture at 10 h.)
TEST(Costs, ASweepCostsTheExactSidesOnce) {
  AppState s;
  s.settings.method = {MethodChoice{"uniform", {}}, MethodChoice{"streaming", {}}};
  s.settings.sweep.methods = {"balancekv"};
  s.settings.sweep.ratios = {0.25};
  s.request_open(synth_capture(8192));
  // The grid first (its cells see every exact side), then costs of this test's own: a
  // measured build against a measured run depends on the machine and its load (under load the
  // runs once measured dearer than the builds), the estimates' shape does not.
  ASSERT_TRUE(pump(
      s, [&] { return fresh(s, kFocusA) && fresh(s, kFocusB) && fresh(s, kGrid); }, 120))
      << s.load_error;
  s.costs = CostModel{};
  s.costs.record("eval:balancekv", 1, 1e-10);
  s.costs.record(kExactCostClass, 1, 1e-10);
  auto estimate = [&](int seeds) {
    s.settings.sweep.seeds = seeds;
    s.reconcile();
    return s.result(kSweep).estimate_s;
  };
  // As on a fresh start, no exact side in hand: each is built once (a run of ratio 1/4 is
  // n d (E G / 4 + 64) units, a build n d E G: three seeds cost less than twice one).
  const std::set<std::string> seen = s.exact_sides_seen;
  s.exact_sides_seen.clear();
  const double one = estimate(1), three = estimate(3), five = estimate(5);
  ASSERT_GT(one, 0.0);
  EXPECT_LT(three, 2.0 * one);
  EXPECT_NEAR(five - three, three - one, 1e-9 * five);  // each seed's runs cost the same
  // Every side in hand (the grid's cells built them): the runs alone.
  s.exact_sides_seen = seen;
  ASSERT_EQ(seen.size(),
            static_cast<size_t>(s.capture->info().num_layers * s.capture->info().kv_heads));
  const double warm_one = estimate(1), warm_three = estimate(3);
  EXPECT_LT(warm_one, one);
  EXPECT_NEAR(warm_three, 3 * warm_one, 1e-9 * warm_three);
  s.cancel_job(kSweep);
}

// The Geometry view's t-SNE estimate: a map above the FFT threshold (10000 points) has its own
// cost class with its own prior (0.5 us per point and iteration, a third of Barnes-Hut's), so a
// measured Barnes-Hut map does not set it; both start to measure themselves (the estimate is the
// prior's) and are held for a Run click when their own pace says they take more than 3 s.
TEST(Costs, LongTsneMapsHaveTheirOwnCostClass) {
  [[maybe_unused]] SoftTexture font = soft_init(1280, 800);
  for (const auto& [tokens, per_unit] : {std::pair{8000, 1.5e-6}, std::pair{12000, 0.5e-6}}) {
    AppState s;
    s.settings.method = {MethodChoice{"uniform", {}}, MethodChoice{"uniform", {}}};
    // The probe's clock ten times as fast as the wall: the 12000-point map takes about 3 s
    // here, its limit, so on the wall clock it was held or ran on by how busy the machine was.
    s.probe_clock = scaled_probe_clock(10.0);
    s.request_open(synth_capture(tokens));
    ASSERT_TRUE(pump(s, [&] { return s.capture != nullptr; })) << s.load_error;
    AppUi ui(s);
    ui.show_view("geometry");
    s.settings.active_view = "geometry";
    // The map waits for the focused layer to load; then its plan has an estimate.
    for (int f = 0; f < 500 && s.result("geometry.projection").estimate_s < 0; ++f) {
      ImGui::GetIO().DeltaTime = 1.0f / 60.0f;
      ImGui::NewFrame();
      ui.draw();
      ImGui::Render();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const Result& map = s.result("geometry.projection");
    EXPECT_NEAR(map.estimate_s, tokens * 1000 * per_unit, 1e-6 * tokens) << tokens << " tokens";
    EXPECT_FALSE(map.want.empty());
    // An estimate from the prior starts the map to measure itself; its own pace (seconds for a
    // map of this size) then holds it for a Run click.
    EXPECT_EQ(map.probing, map.want) << tokens << " tokens";
    for (int f = 0; f < 6000 && map.held != map.want; ++f) {
      ImGui::GetIO().DeltaTime = 1.0f / 60.0f;
      ImGui::NewFrame();
      ui.draw();
      ImGui::Render();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(map.held, map.want) << tokens << " tokens";  // waits for a Run click
    EXPECT_NE(map.estimate_text.find("measured here"), std::string::npos) << map.estimate_text;
    EXPECT_FALSE(map.busy());
    s.cancel_job("geometry.projection");
  }
  ImGui::DestroyContext();
}

// Evaluations of a method not yet measured: other methods' evaluation cost per unit, but no more
// than the method's own focused run. (Costing every baseline like BalanceKV held the sample's
// five-method sweep for a Run click at 4.5 s; it runs in about 1 s.)
TEST(Costs, UnmeasuredEvaluationsCostNoMoreThanTheMethodsFocusedRun) {
  CostModel c;
  c.record("eval:balancekv", 1e6, 5e-3);  // 5e-9 s per unit
  c.record("head:balancekv", 1e6, 5e-2);  // the focused run also records the walk trace
  c.record("head:uniform", 1e6, 1e-3);
  EXPECT_DOUBLE_EQ(c.per_unit("eval:balancekv"), 5e-9);
  EXPECT_DOUBLE_EQ(c.per_unit("eval:uniform"), 1e-9);
  EXPECT_DOUBLE_EQ(c.per_unit("eval:snapkv"), 5e-9);  // nothing of its own measured
  EXPECT_FALSE(c.measured("eval:uniform"));
  CostModel fresh_machine;
  fresh_machine.record("head:streaming", 1e6, 2e-3);
  // Before any evaluation: the focused run's cost scaled down (a grid estimated at "about 3
  // min" once took 48 s), never above it.
  EXPECT_LT(fresh_machine.per_unit("eval:streaming"), 0.5 * 2e-9);
  EXPECT_GT(fresh_machine.per_unit("eval:streaming"), 0.1 * 2e-9);
}

// A focused run not yet measured, after evaluations were (the grid's cells start by themselves
// on opening): the method's evaluation cost per unit, else every method's, scaled up to a focused
// run's; the prior only when nothing was measured. (The prior held the focused head of a
// 32768-token capture for a Run click, about 27 s estimated, while it takes about a second.)
TEST(Costs, UnmeasuredFocusedRunsCostWhatTheEvaluationsMeasured) {
  CostModel c;
  EXPECT_DOUBLE_EQ(c.per_unit("head:balancekv", 0), kPriorPerUnit);
  c.record("eval:balancekv", 1e9, 0.36);  // 3.6e-10 s per unit
  EXPECT_NEAR(c.per_unit("head:balancekv"), 1.2e-9, 1e-20);
  c.record("eval:uniform", 1e9, 0.06);
  EXPECT_NEAR(c.per_unit("head:snapkv"), 0.21e-9 / 0.3, 1e-20);  // the evaluations' mean
  EXPECT_FALSE(c.measured("head:balancekv"));
  c.record("head:uniform", 1e9, 0.5);  // a focused run measured: it counts first
  EXPECT_DOUBLE_EQ(c.per_unit("head:balancekv"), 5e-10);
}

TEST(Session, RoundTripsSettings) {
  AppState a;
  a.settings.method = {MethodChoice{"balancekv", {{"gamma", 0.5}}},
                       MethodChoice{"balancekv", {{"gamma", 2.0}}}};
  a.settings.ab_enabled = false;
  a.settings.keep_ratio = 0.125;
  a.settings.seed = 7;
  a.settings.sink_override = 4;
  a.settings.eval_override = 32;
  a.settings.grid_seeds = 5;
  a.settings.grid_metric = GridMetric::Entropy;
  a.settings.active_view = "error";
  a.settings.panel_view = {"method", "error"};
  a.settings.sweep.methods = {"uniform"};
  nlohmann::json j = a.to_session();
  AppState b;
  b.apply_session(j);
  EXPECT_EQ(b.settings, a.settings);
  EXPECT_DOUBLE_EQ(b.settings.method[1].params.at("gamma"), 2.0);
}

TEST(Session, BadSessionsNameTheFieldAndChangeNothing) {
  AppState s;
  s.settings.seed = 11;
  const Settings before = s.settings;
  auto message = [&](const nlohmann::json& j) {
    try {
      s.apply_session(j);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(message({{"hello", 1}}).find("kvscope_session"), std::string::npos);
  EXPECT_NE(message({{"kvscope_session", 1}, {"method_a", "nope"}}).find("\"method_a\""),
            std::string::npos);
  EXPECT_NE(message({{"kvscope_session", 1}, {"keep_ratio", 3.0}}).find("\"keep_ratio\""),
            std::string::npos);
  // A valid field before the bad one must not be applied either.
  EXPECT_NE(message({{"kvscope_session", 1}, {"ab_enabled", false}, {"seed", "seven"}})
                .find("\"seed\": expected an integer"),
            std::string::npos);
  EXPECT_NE(message({{"kvscope_session", 1}, {"eval", 0}}).find("\"eval\""), std::string::npos);
  EXPECT_NE(message({{"kvscope_session", 1}, {"params_a", {{"gamma", "x"}}}}).find("params_a"),
            std::string::npos);
  EXPECT_NE(message({{"kvscope_session", 1}, {"params_a", {{"no_such", 1}}}}).find("params_a"),
            std::string::npos);
  EXPECT_NE(message({{"kvscope_session", 1}, {"focus", {{"layer", -1}}}}).find("focus.layer"),
            std::string::npos);
  // A backend that is not one of backend_choices() (engine/ops/backend.h): the field and the
  // choices.
  const std::string backend = message({{"kvscope_session", 1}, {"backend", "tpu"}});
  EXPECT_NE(backend.find("\"backend\""), std::string::npos) << backend;
  EXPECT_NE(backend.find(backend_choices_text()), std::string::npos) << backend;
  EXPECT_EQ(s.settings, before);
}

// Sessions saved by the window restore the tabs of both panels; a malformed view entry refuses
// the whole session with the field named, and nothing changes.
TEST(Session, WindowSessionsRestoreTabsAndRefuseMalformedViewEntries) {
  [[maybe_unused]] SoftTexture font = soft_init(1280, 800);
  const fs::path path = fs::temp_directory_path() / "kvscope_unit_session.json";
  {
    AppState s;
    AppUi ui(s);
    ui.show_view("method");
    ui.show_view("error");
    s.settings.active_view = "error";
    for (int f = 0; f < 3; ++f) {
      ImGui::NewFrame();
      ui.draw();
      ImGui::Render();
    }
    EXPECT_EQ(s.settings.panel_view[0], "method");
    EXPECT_EQ(s.settings.panel_view[1], "error");
    ui.save_session(path.string());
  }
  {
    AppState s;
    AppUi ui(s);
    ui.load_session(path.string());
    for (int f = 0; f < 3; ++f) {
      ImGui::NewFrame();
      ui.draw();
      ImGui::Render();
    }
    EXPECT_EQ(s.settings.panel_view[0], "method");
    EXPECT_EQ(s.settings.panel_view[1], "error");
    EXPECT_EQ(s.settings.active_view, "error");
  }
  {
    std::ifstream in(path);
    nlohmann::json j = nlohmann::json::parse(in);
    AppState s;
    AppUi ui(s);
    s.settings.seed = 5;
    const nlohmann::json tokens_before = ui.find_view("tokens")->save_state();
    auto refused = [&](const nlohmann::json& session, const std::string& field) {
      std::ofstream(path) << session.dump();
      try {
        ui.load_session(path.string());
        ADD_FAILURE() << "accepted " << session.dump();
      } catch (const InputError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find(path.string()), std::string::npos) << msg;
        EXPECT_NE(msg.find("session field \"" + field + "\""), std::string::npos) << msg;
      }
      EXPECT_EQ(s.settings.seed, 5) << field;
      EXPECT_EQ(ui.find_view("tokens")->save_state(), tokens_before) << field;
    };
    nlohmann::json bad = j;
    bad["seed"] = 9;  // a valid field before the bad ones: not applied either
    bad["views"] = {{"tokens", {{"mode", 0}}}, {"geometry", {{"perplexity", "high"}}}};
    refused(bad, "views.geometry.perplexity");
    bad["views"] = {{"tokens", {{"mode", 0}}}, {"error", 5}};
    refused(bad, "views.error");
    bad["views"] = {{"tokens", {{"mode", 0}}}, {"nonesuch", nlohmann::json::object()}};
    refused(bad, "views.nonesuch");
    // A bad view name is an error that changes nothing.
    bad = j;
    bad["active_view"] = "nonesuch";
    refused(bad, "active_view");
    bad = j;
    bad["panels"] = {"capture", "nonesuch"};
    refused(bad, "panels[1]");
    // Not JSON, or nested beyond the JSON limits: the file is named, nothing changes.
    std::ofstream(path) << std::string(200, '[');
    EXPECT_THROW(ui.load_session(path.string()), InputError);
    EXPECT_EQ(s.settings.seed, 5);
  }
  fs::remove(path);
  ImGui::DestroyContext();
}

// Every field the session reader reads is type-checked, and the message names
// the field's path. Each of these was accepted (silently ignored, or turned into a default)
// or refused without the field's name before.
TEST(Session, EveryWrongTypedSettingIsNamed) {
  AppState s;
  s.settings.seed = 11;
  const Settings before = s.settings;
  struct Case {
    nlohmann::json fields;  // merged into a valid session
    std::string field;      // the path the message must name
  };
  const std::vector<Case> cases = {
      {{{"kvscope_session", "two"}}, "kvscope_session"},
      {{{"kvscope_session", 7}}, "kvscope_session"},
      {{{"capture", 5}}, "capture"},
      {{{"focus", 3}}, "focus"},
      {{{"focus", {{"layer", "1"}}}}, "focus.layer"},
      {{{"focus", {{"kv_head", 1.5}}}}, "focus.kv_head"},
      {{{"method_a", 1}}, "method_a"},
      {{{"method_b", nullptr}}, "method_b"},
      {{{"params_a", 2}}, "params_a"},
      {{{"params_b", {1, 2}}}, "params_b"},
      {{{"params_a", {{"gamma", "x"}}}}, "params_a.gamma"},
      {{{"params_a", {{"gamma", nullptr}}}}, "params_a.gamma"},
      {{{"params_a", {{"gamma", {1}}}}}, "params_a.gamma"},
      {{{"params_a", {{"no_such", 1}}}}, "params_a.no_such"},
      {{{"params", 5}}, "params"},
      {{{"params", {{"balancekv", 3}}}}, "params.balancekv"},
      {{{"params", {{"balancekv", {{"gamma", "x"}}}}}}, "params.balancekv.gamma"},
      {{{"params", {{"no-such-method", nlohmann::json::object()}}}}, "params.no-such-method"},
      {{{"ab_enabled", "yes"}}, "ab_enabled"},
      {{{"keep_ratio", "0.5"}}, "keep_ratio"},
      {{{"seed", 1.5}}, "seed"},
      {{{"sink", "4"}}, "sink"},
      {{{"eval", true}}, "eval"},
      {{{"estimator", 1}}, "estimator"},
      {{{"backend", nlohmann::json::array()}}, "backend"},
      {{{"grid_seeds", "3"}}, "grid_seeds"},
      {{{"grid_metric", 2}}, "grid_metric"},
      {{{"selected_query", "1"}}, "selected_query"},
      {{{"selected_q_head", nlohmann::json::object()}}, "selected_q_head"},
      {{{"active_view", 3}}, "active_view"},
      {{{"panels", "capture"}}, "panels"},
      {{{"panels", {"capture", 2}}}, "panels[1]"},
      {{{"sweep", 1}}, "sweep"},
      {{{"sweep", {{"methods", "uniform"}}}}, "sweep.methods"},
      {{{"sweep", {{"methods", {"uniform", 1}}}}}, "sweep.methods[1]"},
      {{{"sweep", {{"ratios", {0.5, "x"}}}}}, "sweep.ratios[1]"},
      {{{"sweep", {{"seeds", "3"}}}}, "sweep.seeds"},
      {{{"sweep", {{"focused_layer_only", 1}}}}, "sweep.focused_layer_only"},
      {{{"views", 5}}, "views"},
      {{{"views", {{"geometry", 5}}}}, "views.geometry"},
      {{{"views", {{"tokens", "stacked"}}}}, "views.tokens"},
  };
  for (const Case& c : cases) {
    nlohmann::json j = {{"kvscope_session", 2}, {"seed", 3}};
    j.update(c.fields);
    try {
      s.apply_session(j);
      ADD_FAILURE() << "accepted " << j.dump();
    } catch (const InputError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("session field \"" + c.field + "\""), std::string::npos)
          << c.field << ": " << msg;
    }
    EXPECT_EQ(s.settings, before) << c.field;
  }
  // The example of the issue, word for word.
  try {
    s.parse_session({{"kvscope_session", 2}, {"views", {{"geometry", 5}}}}, nullptr);
    ADD_FAILURE() << "accepted views.geometry = 5";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "session field \"views.geometry\": expected an object, got an integer (5)");
  }
}

// The views' own states (View::load_state) are checked like the settings: the session is
// refused whole, naming the field, and neither the settings nor any view changes.
TEST(Session, EveryWrongTypedViewStateIsNamed) {
  [[maybe_unused]] SoftTexture font = soft_init(1280, 800);
  {
    AppState s;
    AppUi ui(s);
    s.settings.seed = 5;
    // What every view saves loads back (and is accepted by the check).
    nlohmann::json saved = s.to_session();
    for (const auto& v : ui.views())
      if (!v->save_state().is_null()) saved["views"][v->name()] = v->save_state();
    EXPECT_NO_THROW(ui.check_session(saved));
    struct Case {
      std::string view;
      nlohmann::json state;
      std::string field;
    };
    const std::vector<Case> cases = {
        {"tokens", {{"mode", "stacked"}}, "views.tokens.mode"},
        {"tokens", {{"mode", 7}}, "views.tokens.mode"},
        {"walk", {{"speed", "fast"}}, "views.walk.speed"},
        {"walk", {{"log_scales", 1}}, "views.walk.log_scales"},
        {"walk", {{"round", -2}}, "views.walk.round"},
        {"walk", {{"compare", nullptr}}, "views.walk.compare"},
        {"error", {{"tune", 3}}, "views.error.tune"},
        {"error", {{"tune", {{"seeds", "3"}}}}, "views.error.tune.seeds"},
        {"error", {{"tune", {{"row_values", {0, 1}}}}}, "views.error.tune.row_values"},
        {"error", {{"mode", 1}}, "views.error.mode"},
        {"error", {{"heatmap_ratio", "1/4"}}, "views.error.heatmap_ratio"},
        {"error", {{"log_attention", "no"}}, "views.error.log_attention"},
        {"geometry", {{"perplexity", "high"}}, "views.geometry.perplexity"},
        {"geometry", {{"projection", 2}}, "views.geometry.projection"},
        {"geometry", {{"projection", "umap"}}, "views.geometry.projection"},
        {"geometry", {{"point_px", "3"}}, "views.geometry.point_px"},
        {"geometry", {{"with_queries", 0}}, "views.geometry.with_queries"},
        {"teaching", {{"vectors", {{1, "a"}}}}, "views.teaching.vectors[0][1]"},
        {"teaching", {{"vectors", {{1, 2, 3}}}}, "views.teaching.vectors[0]"},
        {"teaching", {{"vectors", 4}}, "views.teaching.vectors"},
        {"teaching", {{"z", 5}}, "views.teaching.z"},
        {"teaching", {{"rule", true}}, "views.teaching.rule"},
        {"teaching", {{"seed", -1}}, "views.teaching.seed"},
        {"teaching", {{"steps", 3}}, "views.teaching.steps"},
        {"output", {{"prompt", 5}}, "views.output.prompt"},
        {"output", {{"steps", "64"}}, "views.output.steps"},
        {"output", {{"methods", "uniform"}}, "views.output.methods"},
        {"output", {{"methods", {"uniform", "nosuch"}}}, "views.output.methods[1]"},
        {"output", {{"ratios", {0.5, 0.3}}}, "views.output.ratios[1]"},
        {"output", {{"continuation", nullptr}}, "views.output.continuation"},
    };
    std::map<std::string, nlohmann::json> before;
    for (const auto& v : ui.views()) before[v->name()] = v->save_state();
    for (const Case& c : cases) {
      nlohmann::json j = saved;
      j["seed"] = 9;
      j["views"][c.view] = c.state;
      try {
        ui.load_session_json(j);
        ADD_FAILURE() << "accepted views." << c.view << " = " << c.state.dump();
      } catch (const InputError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("session field \"" + c.field + "\""), std::string::npos)
            << c.field << ": " << msg;
      }
      EXPECT_EQ(s.settings.seed, 5) << c.field;
      for (const auto& v : ui.views())
        EXPECT_EQ(v->save_state(), before[v->name()]) << c.field << " changed " << v->name();
    }
  }
  ImGui::DestroyContext();
}

// The Output view's controls (model, prompt, N, steps, methods, ratios, ...) are kept in
// sessions, and a session's choices stand when its capture opens (not that capture's defaults).
TEST(Session, OutputViewSettingsRoundTrip) {
  [[maybe_unused]] SoftTexture font = soft_init(1280, 800);
  const fs::path path = fs::temp_directory_path() / "kvscope_unit_output_session.json";
  const nlohmann::json state = {{"checkpoint", "/nonexistent/model.bin"},
                                {"tokenizer", "/nonexistent/tok.bin"},
                                {"prompt", "The quick brown fox"},
                                {"continuation", " jumps over"},
                                {"use_continuation", true},
                                {"compress_at", 12},
                                {"steps", 9},
                                {"recompress_every", 3},
                                {"seed", 42},
                                {"methods", {"snapkv", "uniform"}},
                                {"ratios", {0.5, 0.0625}}};
  {
    AppState s;
    AppUi ui(s);
    EXPECT_NE(ui.find_view("output")->save_state(), state);
    ui.find_view("output")->load_state(state);
    EXPECT_EQ(ui.find_view("output")->save_state(), state);
    ui.save_session(path.string());
  }
  {
    std::ifstream in(path);
    EXPECT_EQ(nlohmann::json::parse(in)["views"]["output"], state);
  }
  {
    AppState s;
    AppUi ui(s);
    ui.load_session(path.string());
    EXPECT_EQ(ui.find_view("output")->save_state(), state);
    s.request_open(synth_capture(64));
    ui.show_view("output");
    s.settings.active_view = "output";
    auto frame = [&] {
      ImGui::GetIO().DeltaTime = 1.0f / 60.0f;
      ImGui::NewFrame();
      ui.draw();
      ImGui::Render();
    };
    const auto t0 = std::chrono::steady_clock::now();
    while ((!s.capture || !s.loading_path.empty()) &&
           std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
      frame();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_TRUE(s.capture) << s.load_error;
    for (int f = 0; f < 3; ++f) frame();
    EXPECT_EQ(ui.find_view("output")->save_state(), state);
  }
  fs::remove(path);
  ImGui::DestroyContext();
}

// kvscope-cli render --session reads sessions through the same check (AppUi::load_session).
TEST(Session, RenderWithABadSessionNamesTheField) {
  const fs::path path = fs::temp_directory_path() / "kvscope_unit_render_session.json";
  std::ofstream(path)
      << nlohmann::json{{"kvscope_session", 2}, {"views", {{"tokens", {{"mode", "x"}}}}}}.dump();
  HeadlessOptions o;
  o.capture = synth_capture(64);
  o.session = path.string();
  o.view = "tokens";
  o.out = (fs::temp_directory_path() / "kvscope_unit_render_session.png").string();
  try {
    render_view_software(o);
    ADD_FAILURE() << "rendered with a bad session";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("session field \"views.tokens.mode\""), std::string::npos)
        << e.what();
  }
  if (ImGui::GetCurrentContext()) ImGui::DestroyContext();
  fs::remove(path);
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

// The Tokens view's overview: bins cover every token once, in order, and hold
// each method's kept set; fewer tokens than columns gives one token per bin.
TEST(TokenMarks, OverviewBinsCoverTheSequenceAndCountTheKeptSets) {
  HeadRun a, b;
  a.window = b.window = EvalWindow::make(64, 0.25);  // s = 2, E = 8, middle [2, 56)
  a.selection.indices = {10, 20, 21, 55};
  a.selection.weights = {1.0, 2.0, 4.0, 1.0};
  b.selection.indices = {2, 3};
  b.selection.weights = {1.0, 1.0};
  const TokenMarks ma = token_marks(a), mb = token_marks(b);
  TokenHarm h;
  h.sink = 2;
  h.eval = 8;
  h.harm.assign(54, 0.5);
  h.mass.assign(64, 1.0 / 64);
  for (int columns : {5, 7, 64, 512}) {
    const std::vector<OverviewBin> bins = overview_bins(64, columns, &ma, &mb, &h);
    ASSERT_EQ(static_cast<int>(bins.size()), std::min(64, columns)) << columns;
    int next = 0, kept_a = 0, kept_b = 0, middle = 0, sinks = 0, window = 0;
    double mass = 0, harm = 0, weight = 0;
    for (const OverviewBin& bin : bins) {
      EXPECT_EQ(bin.first, next);
      EXPECT_GT(bin.last, bin.first);
      next = bin.last;
      kept_a += bin.kept[0];
      kept_b += bin.kept[1];
      middle += bin.middle;
      sinks += bin.sinks;
      window += bin.window;
      mass += bin.mass;
      harm += bin.harm;
      weight += bin.weight_sum;
    }
    EXPECT_EQ(next, 64);
    EXPECT_EQ(kept_a, 4);
    EXPECT_EQ(kept_b, 2);
    EXPECT_EQ(middle, 54);
    EXPECT_EQ(sinks, 2);
    EXPECT_EQ(window, 8);
    EXPECT_NEAR(mass, 1.0, 1e-12);
    EXPECT_NEAR(harm, 27.0, 1e-12);
    EXPECT_DOUBLE_EQ(weight, 8.0);
  }
  // One token per bin: token 20's bin holds A's kept token with its weight.
  const std::vector<OverviewBin> one = overview_bins(64, 512, &ma, nullptr, nullptr);
  EXPECT_EQ(one[20].kept[0], 1);
  EXPECT_DOUBLE_EQ(one[20].weight_sum, 2.0);
  EXPECT_EQ(one[19].kept[0], 0);
  EXPECT_EQ(one[0].sinks, 1);
  EXPECT_EQ(one[63].window, 1);
  // Harm colours: darker (lower green channel in magma) for less harm.
  auto g = [](ImU32 c) { return (c >> IM_COL32_G_SHIFT) & 0xFF; };
  EXPECT_LT(g(harm_colour(1e-3, 1e-4, 1.0)), g(harm_colour(0.5, 1e-4, 1.0)));
  double lo = 0, hi = 0;
  harm_range(h, &lo, &hi);
  EXPECT_DOUBLE_EQ(hi, 0.5);
  EXPECT_DOUBLE_EQ(lo, 0.5e-4);
}

// An error curve between 0.1 and 0.6 had one labelled value (0.1).
TEST(Plot, LogAxesLabelAtLeastThreeValuesWhereTheyFit) {
  const std::vector<double> short_axis = log10_labels(0.1, 0.6, 300, 20);
  EXPECT_GE(short_axis.size(), 3u);
  EXPECT_EQ(short_axis.front(), 0.1);
  EXPECT_TRUE(std::is_sorted(short_axis.begin(), short_axis.end()));
  // Less than a decade, no power of ten inside: still labelled values inside the range.
  const std::vector<double> inner = log10_labels(0.15, 0.45, 400, 20);
  ASSERT_GE(inner.size(), 3u);
  for (double v : inner) EXPECT_TRUE(v >= 0.15 && v <= 0.45) << v;
  // Many decades: the powers of ten only, at least the gap apart.
  const std::vector<double> wide = log10_labels(1e-4, 1, 60, 20);
  EXPECT_EQ(wide, (std::vector<double>{1e-4, 1e-3, 1e-2, 1e-1, 1}));
  // Crowded: thinned to the gap.
  const std::vector<double> crowded = log10_labels(1e-6, 1, 10, 20);
  EXPECT_LE(crowded.size(), 4u);
}

// The numbers of a 32 x 8 grid at 1x were left out when they did not fit
// the cell; they are drawn smaller instead. Counted as glyph quads in the draw list.
TEST(Plot, HeatmapNumbersShrinkToFitInsteadOfVanishing) {
  [[maybe_unused]] SoftTexture font = soft_init(1000, 700);
  auto vertices = [](bool with_text) {
    ImGui::GetIO().DeltaTime = 1.0f / 60.0f;
    ImGui::NewFrame();
    ImGui::SetNextWindowPos(ImVec2(0, 0));
    ImGui::SetNextWindowSize(ImVec2(1000, 700));
    ImGui::Begin("grid", nullptr, ImGuiWindowFlags_NoDecoration);
    const int before = ImGui::GetWindowDrawList()->VtxBuffer.Size;
    // The Capture view's grid of a 32-layer, 8-kv-head capture in a narrow left panel.
    heatmap(
        "##cells", ImVec2(220, 32 * 14), 32, 8, [](int, int) { return IM_COL32(80, 80, 80, 255); },
        with_text ? std::function<std::string(int, int)>([](int, int) { return "0.123"; })
                  : nullptr);
    const int added = ImGui::GetWindowDrawList()->VtxBuffer.Size - before;
    ImGui::End();
    ImGui::Render();
    return added;
  };
  const int text_vertices = vertices(true) - vertices(false);
  EXPECT_GE(text_vertices, 32 * 8 * 5 * 4) << "every cell's five characters (4 vertices each)";
  ImGui::DestroyContext();
}

// A legend never sits on drawn data when a corner is free: a curve through the top right moves
// the asked top-right legend to a free corner; with data in every corner it takes the corner
// covering the least.
TEST(Plot, TheLegendGoesWhereNothingIsDrawn) {
  [[maybe_unused]] SoftTexture font = soft_init(1000, 700);
  ImGui::GetIO().DeltaTime = 1.0f / 60.0f;
  ImGui::NewFrame();
  ImGui::SetNextWindowPos(ImVec2(0, 0));
  ImGui::SetNextWindowSize(ImVec2(1000, 700));
  ImGui::Begin("plots", nullptr, ImGuiWindowFlags_NoDecoration);
  const std::vector<Plot::LegendEntry> entries = {{"walk", IM_COL32(100, 180, 255, 255)},
                                                  {"random signs", IM_COL32(200, 200, 200, 255)}};
  {
    Plot plot("##rising", ImVec2(400, 300), "rising", Axis{"x", 0, 1}, Axis{"y", 0, 1});
    std::vector<double> x, y;
    for (int i = 0; i <= 100; ++i) x.push_back(i / 100.0), y.push_back(i / 100.0);
    plot.line(x, y, IM_COL32(100, 180, 255, 255));  // bottom left to top right
    const ImVec4 box = plot.legend(entries, Plot::Corner::TopRight);
    ASSERT_GT(box.z, box.x);
    EXPECT_EQ(plot.drawn_in(ImVec2(box.x, box.y), ImVec2(box.z, box.w)), 0);
    const ImVec2 mid((plot.inner_min().x + plot.inner_max().x) / 2,
                     (plot.inner_min().y + plot.inner_max().y) / 2);
    EXPECT_TRUE(box.x < mid.x && box.y < mid.y) << "the top-left corner is the free one here";
  }
  {
    Plot plot("##full", ImVec2(400, 300), "full", Axis{"x", 0, 1}, Axis{"y", 0, 1});
    std::vector<double> x, y;
    for (int i = 0; i <= 40; ++i)
      for (int j = 0; j <= 40; ++j) x.push_back(i / 40.0), y.push_back(j / 40.0);
    plot.markers(x, y, IM_COL32(255, 255, 255, 255));
    // Fewer points under the bottom-left box: it is taken over the asked top right.
    plot.note_drawn(
        {plot.to_screen(0.95, 0.95), plot.to_screen(0.05, 0.95), plot.to_screen(0.95, 0.05)});
    const ImVec4 box = plot.legend(entries, Plot::Corner::TopRight);
    const int there = plot.drawn_in(ImVec2(box.x, box.y), ImVec2(box.z, box.w));
    for (const ImVec2& a :
         {ImVec2(plot.inner_max().x - (box.z - box.x) - 6, plot.inner_min().y + 6),
          ImVec2(plot.inner_min().x + 6, plot.inner_min().y + 6),
          ImVec2(plot.inner_max().x - (box.z - box.x) - 6,
                 plot.inner_max().y - (box.w - box.y) - 6)})
      EXPECT_LE(there, plot.drawn_in(a, ImVec2(a.x + box.z - box.x, a.y + box.w - box.y)));
  }
  ImGui::End();
  ImGui::Render();
  ImGui::DestroyContext();
}

// A legend with no free place inside its plot covers data in the first frame only: from the next
// frame on the plot keeps a band for it outside the data area (rows above it here, on a tall and
// on a short plot), which leaves the data area smaller and the legend over none of it.
TEST(Plot, ALegendWithNoFreePlaceMovesOutOfTheDataFromTheNextFrame) {
  [[maybe_unused]] SoftTexture font = soft_init(1000, 700);
  ImGui::GetIO().DeltaTime = 1.0f / 60.0f;
  const std::vector<Plot::LegendEntry> entries = {{"walk", IM_COL32(100, 180, 255, 255)},
                                                  {"random signs", IM_COL32(200, 200, 200, 255)}};
  for (const auto& [id, size] :
       {std::pair{"##tall", ImVec2(400, 300)}, std::pair{"##short", ImVec2(700, 140)}}) {
    ImVec4 box[2];
    ImVec2 inner_min[2], inner_max[2];
    int covered[2] = {0, 0};
    for (int frame = 0; frame < 2; ++frame) {
      ImGui::NewFrame();
      ImGui::SetNextWindowPos(ImVec2(0, 0));
      ImGui::SetNextWindowSize(ImVec2(1000, 700));
      ImGui::Begin("plots", nullptr, ImGuiWindowFlags_NoDecoration);
      Plot plot(id, size, "full", Axis{"x", 0, 1}, Axis{"y", 0, 1});
      std::vector<double> x, y;
      for (int i = 0; i <= 30; ++i)
        for (int j = 0; j <= 30; ++j) x.push_back(i / 30.0), y.push_back(j / 30.0);
      plot.markers(x, y, IM_COL32(255, 255, 255, 255));
      box[frame] = plot.legend(entries, Plot::Corner::TopRight);
      // (Inside the box by 4 px: drawn_in counts points within 3 px of the rectangle, and the
      // markers on the data area's top edge are drawn clipped to it, below a band that ends
      // there.)
      covered[frame] = plot.drawn_in(ImVec2(box[frame].x + 4, box[frame].y + 4),
                                     ImVec2(box[frame].z - 4, box[frame].w - 4));
      inner_min[frame] = plot.inner_min();
      inner_max[frame] = plot.inner_max();
      ImGui::End();
      ImGui::Render();
    }
    EXPECT_GT(covered[0], 0) << id << ": the grid of markers leaves no free place";
    EXPECT_EQ(covered[1], 0) << id;
    const bool above = box[1].w <= inner_min[1].y + 0.5f;
    const bool right = box[1].x >= inner_max[1].x - 0.5f;
    EXPECT_TRUE(above || right) << id << ": the legend is outside the data area";
    EXPECT_LT((inner_max[1].x - inner_min[1].x) * (inner_max[1].y - inner_min[1].y),
              (inner_max[0].x - inner_min[0].x) * (inner_max[0].y - inner_min[0].y))
        << id << ": the band is taken from the data area";
  }
  ImGui::DestroyContext();
}

// A band is kept only while the data leave no free place: once they do (a sweep filling in, so
// the first frames' data differ from the last's), the legend goes back inside from the next
// frame on and stays there; with data that still fill the plot, the band stays frame after frame.
// What a plot shows thus does not depend on the order its data arrived in (the Error view's SVG
// had its sweep legend in a band or inside, by the timing of the sweep's cells).
TEST(Plot, ALegendBandGoesOnceTheDataLeaveAFreePlace) {
  [[maybe_unused]] SoftTexture font = soft_init(1000, 700);
  ImGui::GetIO().DeltaTime = 1.0f / 60.0f;
  const std::vector<Plot::LegendEntry> entries = {{"walk", IM_COL32(100, 180, 255, 255)},
                                                  {"random signs", IM_COL32(200, 200, 200, 255)}};
  auto frame = [&](bool full, ImVec4* box, ImVec2* inner_min, ImVec2* inner_max) {
    ImGui::NewFrame();
    ImGui::SetNextWindowPos(ImVec2(0, 0));
    ImGui::SetNextWindowSize(ImVec2(1000, 700));
    ImGui::Begin("plots", nullptr, ImGuiWindowFlags_NoDecoration);
    Plot plot("##filling", ImVec2(400, 300), "filling", Axis{"x", 0, 1}, Axis{"y", 0, 1});
    std::vector<double> x, y;
    for (int i = 0; i <= 30; ++i)
      for (int j = 0; j <= 30; ++j)
        if (full || (i < 5 && j < 5)) x.push_back(i / 30.0), y.push_back(j / 30.0);
    plot.markers(x, y, IM_COL32(255, 255, 255, 255));
    *box = plot.legend(entries, Plot::Corner::TopRight);
    *inner_min = plot.inner_min();
    *inner_max = plot.inner_max();
    ImGui::End();
    ImGui::Render();
  };
  ImVec4 box;
  ImVec2 lo, hi;
  for (int f = 0; f < 5; ++f) {  // full data: the band from the second frame on, and it stays
    frame(true, &box, &lo, &hi);
    if (f > 0) {
      EXPECT_LE(box.w, lo.y + 0.5f) << "frame " << f << ": the legend is in its band above";
    }
  }
  for (int f = 0; f < 5; ++f) {  // the data now fill one corner only
    frame(false, &box, &lo, &hi);
    if (f > 0) {
      EXPECT_GT(box.y, lo.y) << "frame " << f << ": the legend is back inside the data area";
      EXPECT_LT(box.w, hi.y) << "frame " << f;
    }
  }
  ImGui::DestroyContext();
}

// A legend too large for its plot's data area (five long entries on the least plot) is neither
// left over the data nor left out: from the next frame on the plot grows by a band of rows above
// its data, which keep their height.
TEST(Plot, ALegendTooLargeForItsPlotGrowsThePlotByItsBand) {
  [[maybe_unused]] SoftTexture font = soft_init(1000, 700);
  ImGui::GetIO().DeltaTime = 1.0f / 60.0f;
  std::vector<Plot::LegendEntry> entries;
  for (const char* name :
       {"random signs, along query (dashed)", "kernel norm sqrt(s^T K s)",
        "random signs, kernel norm (dashed)", "along query 479 (walk)", "the halving cut"})
    entries.push_back({name, IM_COL32(200, 200, 200, 255)});
  ImVec4 box[2];
  ImVec2 inner_min[2], inner_max[2], item[2], item_min[2];
  for (int frame = 0; frame < 2; ++frame) {
    ImGui::NewFrame();
    ImGui::SetNextWindowPos(ImVec2(0, 0));
    ImGui::SetNextWindowSize(ImVec2(1000, 700));
    ImGui::Begin("plots", nullptr, ImGuiWindowFlags_NoDecoration);
    Plot plot("##least", min_plot_size(), "small", Axis{"x", 0, 1}, Axis{"y", 0, 1});
    item[frame] = ImGui::GetItemRectSize();
    item_min[frame] = ImGui::GetItemRectMin();
    plot.line({0, 1}, {0, 1}, IM_COL32(255, 255, 255, 255));
    box[frame] = plot.legend(entries);
    inner_min[frame] = plot.inner_min();
    inner_max[frame] = plot.inner_max();
    ImGui::End();
    ImGui::Render();
  }
  EXPECT_EQ(box[0].z - box[0].x, 0) << "the box would take half the data area: not drawn inside";
  ASSERT_GT(box[1].z - box[1].x, 0) << "the second frame draws the legend in its band";
  EXPECT_LE(box[1].w, inner_min[1].y + 0.5f) << "the band is above the data area";
  EXPECT_GE(box[1].y, item_min[1].y) << "the band is inside the plot's frame";
  EXPECT_GT(item[1].y, item[0].y) << "the plot grew by its band";
  EXPECT_NEAR(inner_max[1].y - inner_min[1].y, inner_max[0].y - inner_min[0].y, 0.5f)
      << "the data area kept its height";
  ImGui::DestroyContext();
}

// After "use temp 0.1, block 256" a still-saturated head must not get the same advice again, and
// no remedy switches the balancing off (gamma 0 made every p_i 1/2: near uniform's error).
TEST(WalkAdvice, RemediesChangeTheSettingsAndKeepTheWalkBalancing) {
  const Method& bkv = *find_method("balancekv");
  const auto& c = walk_comparisons();
  const std::vector<int> first = saturation_remedies(bkv, {});
  ASSERT_FALSE(first.empty());
  EXPECT_STREQ(c[static_cast<size_t>(first[0])].short_label, "temp 0.1, block 256");
  for (int i : first) {
    const ParamValues next = with_walk_overrides(bkv, {}, c[static_cast<size_t>(i)].overrides);
    EXPECT_GT(param_value(bkv.params(), next, "gamma"), 0) << c[static_cast<size_t>(i)].label;
  }
  // Taken: it is no longer offered; every other one changes the settings.
  const ParamValues taken =
      with_walk_overrides(bkv, {}, c[static_cast<size_t>(first[0])].overrides);
  for (int i : saturation_remedies(bkv, taken)) {
    EXPECT_NE(i, first[0]);
    EXPECT_TRUE(walk_overrides_change(bkv, taken, c[static_cast<size_t>(i)].overrides));
  }
  EXPECT_TRUE(saturation_remedies(*find_method("uniform"), {}).empty());
  // The one offered is the lowest error below the current one, or none.
  WalkAdvice a;
  a.effects = {{2, 0.30, 0.9}, {1, 0.27, 0.8}, {5, 0.29, 0.1}};
  EXPECT_EQ(best_remedy(a, 0.31), 1);
  EXPECT_EQ(best_remedy(a, 0.25), -1);
}

// Captions and legends name non-default parameters.
TEST(Plot, MethodLabelsNameNonDefaultParameters) {
  EXPECT_EQ(method_label("balancekv", {}), "balancekv");
  const ParamSpec first = find_method("balancekv")->params().front();  // params() is a copy
  EXPECT_EQ(method_label("balancekv", {{first.name, first.default_value}}), "balancekv");
  EXPECT_EQ(method_label("balancekv", {{"gamma", 2}, {"temp", 0.1}}),
            "balancekv (gamma 2, temp 0.1)");
  EXPECT_EQ(method_label("no-such-method", {{"x", 1}}), "no-such-method");
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

// ---- input queue (app/input_queue.h): what the app's frame loop does with GLFW's events, with
// frames 0.25 s apart as on a loaded machine rendering in software.
struct SeenFrame {
  bool clicked = false, double_clicked = false, released = false, ctrl_o = false;
  ImVec2 pos;
};
SeenFrame slow_frame(InputQueue& q, ImVec2 pointer, const std::function<void()>& draw = {}) {
  ImGuiIO& io = ImGui::GetIO();
  io.DeltaTime = 0.25f;
  io.MousePos = pointer;  // what the GLFW backend reads at the start of the frame
  q.feed(io);
  ImGui::NewFrame();
  q.after_new_frame(io);
  SeenFrame f;
  f.clicked = ImGui::IsMouseClicked(ImGuiMouseButton_Left);
  f.double_clicked = ImGui::IsMouseDoubleClicked(ImGuiMouseButton_Left);
  f.released = ImGui::IsMouseReleased(ImGuiMouseButton_Left);
  f.ctrl_o = io.KeyCtrl && ImGui::IsKeyPressed(GLFW_KEY_O, false);
  f.pos = io.MousePos;
  if (draw) draw();
  ImGui::Render();
  return f;
}
// xdotool's `click --repeat 2 --delay 80`: press, release, 80 ms, press, release.
void queue_double_click(InputQueue& q, ImVec2 at, double t) {
  q.cursor(at.x, at.y);
  q.button(GLFW_MOUSE_BUTTON_LEFT, GLFW_PRESS, t);
  q.button(GLFW_MOUSE_BUTTON_LEFT, GLFW_RELEASE, t + 0.012);
  q.button(GLFW_MOUSE_BUTTON_LEFT, GLFW_PRESS, t + 0.092);
  q.button(GLFW_MOUSE_BUTTON_LEFT, GLFW_RELEASE, t + 0.104);
}

TEST(InputQueue, TwoClicksBetweenTwoFramesAreTwoClicksAndADoubleClick) {
  soft_init(800, 600);
  InputQueue q;
  slow_frame(q, {100, 100});
  queue_double_click(q, {100, 100}, 1.0);
  int clicks = 0, doubles = 0, releases = 0;
  for (int f = 0; f < 8; ++f) {
    const SeenFrame s = slow_frame(q, {100, 100});
    clicks += s.clicked;
    releases += s.released;
    if (s.double_clicked) {
      ++doubles;
      EXPECT_EQ(clicks, 2) << "the double-click is the second click";
    }
  }
  EXPECT_FALSE(q.pending());
  EXPECT_EQ(clicks, 2);
  EXPECT_EQ(releases, 2);
  // The presses reach ImGui 0.5 s apart by its frame clock; by their arrival they are 92 ms.
  EXPECT_EQ(doubles, 1);

  // Clicks 0.8 s apart are two single clicks.
  q.button(GLFW_MOUSE_BUTTON_LEFT, GLFW_PRESS, 5.0);
  q.button(GLFW_MOUSE_BUTTON_LEFT, GLFW_RELEASE, 5.0);
  for (int f = 0; f < 3; ++f) doubles += slow_frame(q, {100, 100}).double_clicked;
  q.button(GLFW_MOUSE_BUTTON_LEFT, GLFW_PRESS, 5.8);
  q.button(GLFW_MOUSE_BUTTON_LEFT, GLFW_RELEASE, 5.8);
  for (int f = 0; f < 3; ++f) doubles += slow_frame(q, {100, 100}).double_clicked;
  EXPECT_EQ(doubles, 1);
  ImGui::DestroyContext();
}

TEST(InputQueue, APressCountsWhereItHappenedAndAChordSurvivesAFastRelease) {
  soft_init(800, 600);
  InputQueue q;
  slow_frame(q, {10, 10});
  // Pressed and released at (100, 100); the pointer is at (300, 300) by the next frame.
  q.cursor(100, 100);
  q.button(GLFW_MOUSE_BUTTON_LEFT, GLFW_PRESS, 1.0);
  q.button(GLFW_MOUSE_BUTTON_LEFT, GLFW_RELEASE, 1.05);
  q.cursor(300, 300);
  SeenFrame hover = slow_frame(q, {300, 300});  // the pointer shown where it pressed first
  EXPECT_FALSE(hover.clicked);
  EXPECT_EQ(hover.pos.x, 100);
  SeenFrame press = slow_frame(q, {300, 300});
  EXPECT_TRUE(press.clicked);
  EXPECT_EQ(press.pos.x, 100);
  SeenFrame release = slow_frame(q, {300, 300});
  EXPECT_TRUE(release.released);
  EXPECT_EQ(release.pos.x, 100);
  EXPECT_EQ(slow_frame(q, {300, 300}).pos.x, 300);

  // Ctrl+O as xdotool sends it: Ctrl arrives, then O's press, Ctrl's release and O's release
  // between two frames. Some frame must see O pressed with Ctrl held.
  q.key(GLFW_KEY_LEFT_CONTROL, GLFW_PRESS);
  bool chord = slow_frame(q, {300, 300}).ctrl_o;
  q.key(GLFW_KEY_O, GLFW_PRESS);
  q.key(GLFW_KEY_LEFT_CONTROL, GLFW_RELEASE);
  q.key(GLFW_KEY_O, GLFW_RELEASE);
  for (int f = 0; f < 4; ++f) chord |= slow_frame(q, {300, 300}).ctrl_o;
  EXPECT_TRUE(chord);
  EXPECT_FALSE(ImGui::GetIO().KeyCtrl);
  EXPECT_FALSE(ImGui::GetIO().KeysDown[GLFW_KEY_O]);
  ImGui::DestroyContext();
}

// The backend reports no pointer (the window has neither focus nor the pointer, as far as GLFW
// knows) while a click arrives: the click still comes, at its own position, and is not put off
// frame after frame (the frame before it showed the pointer there).
TEST(InputQueue, AClickArrivesWhenTheBackendReportsNoPointer) {
  soft_init(800, 600);
  InputQueue q;
  const ImVec2 nowhere(-FLT_MAX, -FLT_MAX);
  slow_frame(q, nowhere);
  q.cursor(100, 100);
  q.button(GLFW_MOUSE_BUTTON_LEFT, GLFW_PRESS, 1.0);
  q.button(GLFW_MOUSE_BUTTON_LEFT, GLFW_RELEASE, 1.1);
  int clicks = 0;
  for (int f = 0; f < 6; ++f) {
    const SeenFrame s = slow_frame(q, nowhere);
    if (s.clicked) {
      EXPECT_EQ(s.pos.x, 100);
    }
    clicks += s.clicked;
  }
  EXPECT_EQ(clicks, 1);
  EXPECT_FALSE(q.pending());
  ImGui::DestroyContext();
}

// The pointer jumps from one tab to another and clicks between two frames: the other tab opens.
// (ImGui takes a press on a tab only where the previous frame found the pointer.)
TEST(InputQueue, AClickRightAfterAJumpToAnotherTabOpensIt) {
  soft_init(800, 600);
  InputQueue q;
  ImVec2 centre[2];
  int open_tab = -1;
  auto draw = [&] {
    ImGui::SetNextWindowPos(ImVec2(0, 0));
    ImGui::SetNextWindowSize(ImVec2(800, 600));
    ImGui::Begin("tabs", nullptr, ImGuiWindowFlags_NoDecoration);
    if (ImGui::BeginTabBar("##bar")) {
      for (int t = 0; t < 2; ++t) {
        const bool open = ImGui::BeginTabItem(t == 0 ? "first tab" : "second tab");
        const ImVec2 a = ImGui::GetItemRectMin(), b = ImGui::GetItemRectMax();
        centre[t] = ImVec2((a.x + b.x) / 2, (a.y + b.y) / 2);
        if (open) {
          open_tab = t;
          ImGui::EndTabItem();
        }
      }
      ImGui::EndTabBar();
    }
    ImGui::End();
  };
  for (int f = 0; f < 3; ++f) slow_frame(q, {-1, -1}, draw);
  for (int f = 0; f < 2; ++f) slow_frame(q, centre[0], draw);  // hovering the first tab
  ASSERT_EQ(open_tab, 0);
  q.cursor(centre[1].x, centre[1].y);
  q.button(GLFW_MOUSE_BUTTON_LEFT, GLFW_PRESS, 3.0);
  q.button(GLFW_MOUSE_BUTTON_LEFT, GLFW_RELEASE, 3.1);
  for (int f = 0; f < 5; ++f) slow_frame(q, centre[1], draw);
  EXPECT_EQ(open_tab, 1);
  ImGui::DestroyContext();
}

// A path typed into a text field (xdotool types 60 characters in under a second) must not hold
// the Enter that follows for two frames per character; Ctrl+letter still waits its turn.
TEST(InputQueue, TypedTextDoesNotDelayTheKeysAfterIt) {
  soft_init(800, 600);
  InputQueue q;
  slow_frame(q, {10, 10});
  for (int i = 0; i < 60; ++i) {
    q.key(GLFW_KEY_A + i % 26, GLFW_PRESS);
    q.key(GLFW_KEY_A + i % 26, GLFW_RELEASE);
  }
  q.key(GLFW_KEY_ENTER, GLFW_PRESS);
  q.key(GLFW_KEY_ENTER, GLFW_RELEASE);
  int frames = 0;
  bool enter = false;
  for (; frames < 10 && !enter; ++frames) {
    ImGui::GetIO().WantTextInput = true;  // a text field has the keyboard
    slow_frame(q, {10, 10}, [&] { enter = ImGui::IsKeyPressed(GLFW_KEY_ENTER, false); });
  }
  EXPECT_TRUE(enter);
  EXPECT_LE(frames, 1);
  ImGui::DestroyContext();
}

// Ctrl+A in a text field, then a path typed at once: xdotool's `key ctrl+a` and `type` arrive
// between two slow frames. Every character counts, after the Ctrl+A that selects the old text
// (the soak test found the first characters lost: ImGui drops characters while it sees Ctrl
// held, and they reached it before Ctrl's release had left this queue).
TEST(InputQueue, TextTypedRightAfterACtrlChordIsKept) {
  soft_init(800, 600);
  ImGuiIO& io = ImGui::GetIO();
  io.KeyMap[ImGuiKey_A] = GLFW_KEY_A;  // as the GLFW backend maps it (select all)
  InputQueue q;
  char buf[256] = "old text";
  auto draw = [&] {
    ImGui::SetNextWindowPos(ImVec2(0, 0));
    ImGui::SetNextWindowSize(ImVec2(800, 600));
    ImGui::Begin("field", nullptr, ImGuiWindowFlags_NoDecoration);
    if (!ImGui::IsAnyItemActive()) ImGui::SetKeyboardFocusHere();
    ImGui::InputText("##path", buf, sizeof buf);
    ImGui::End();
  };
  for (int f = 0; f < 3; ++f) slow_frame(q, {-1, -1}, draw);  // the field takes the keyboard
  ASSERT_TRUE(io.WantTextInput);
  q.key(GLFW_KEY_LEFT_CONTROL, GLFW_PRESS);
  q.key(GLFW_KEY_A, GLFW_PRESS);
  q.key(GLFW_KEY_A, GLFW_RELEASE);
  q.key(GLFW_KEY_LEFT_CONTROL, GLFW_RELEASE);
  const std::string path = "/work/main/tests/x.safetensors";
  for (char c : path) {
    const int k = c == '/' ? GLFW_KEY_SLASH : c == '.' ? GLFW_KEY_PERIOD : GLFW_KEY_A + (c - 'a');
    q.key(k, GLFW_PRESS);
    q.character(static_cast<unsigned char>(c));
    q.key(k, GLFW_RELEASE);
  }
  for (int f = 0; f < 10; ++f) slow_frame(q, {-1, -1}, draw);
  EXPECT_FALSE(q.pending());
  EXPECT_EQ(std::string(buf), path);
  ImGui::DestroyContext();
}

// The Open dialog, drawn as in the app: a double-click on a file opens it, even when both clicks
// arrive between two slow frames.
TEST(InputQueue, OpenDialogDoubleClickOpensTheFile) {
  soft_init(1400, 900);
  InputQueue q;
  FileBrowser browser;
  std::string picked;
  browser.open("Open capture", std::string(KVSCOPE_SOURCE_DIR) + "/sample_data",
               {".safetensors", ".npz"}, [&](const std::string& p) { picked = p; });
  std::map<std::string, std::array<float, 4>> items;
  auto draw = [&] {
    items.clear();
    browser.draw(&items);
  };
  const std::string entry = "browser:stories260K_dragon.safetensors";
  for (int f = 0; f < 4; ++f) slow_frame(q, {-1, -1}, draw);  // the modal settles
  ASSERT_TRUE(items.count(entry)) << "the dialog lists the other sample";
  const auto& r = items[entry];
  const ImVec2 at((r[0] + r[2]) / 2, (r[1] + r[3]) / 2);
  queue_double_click(q, at, 10.0);
  for (int f = 0; f < 8 && picked.empty(); ++f) slow_frame(q, at, draw);
  EXPECT_EQ(fs::path(picked).filename(), "stories260K_dragon.safetensors");
  EXPECT_FALSE(browser.is_open());
  ImGui::DestroyContext();
}

}  // namespace

// The Method view's token budget. In budget mode the focused runs keep exactly
// budget_tokens middle tokens (keep_ratio is derived), a budget above the middle is clamped and
// said, and the setting survives a session.
TEST(Budgets, TokenBudgetKeepsExactlyThatManyAndPersists) {
  AppState s;
  s.settings.method = {MethodChoice{"snapkv", {}}, MethodChoice{"adakv(snapkv)", {}}};
  s.settings.ab_enabled = true;
  s.settings.grid_seeds = 1;
  s.settings.budget_mode = true;
  s.settings.budget_tokens = 77;
  s.request_open(kSample);
  ASSERT_TRUE(pump(s, [&] { return fresh(s, kFocusA) && fresh(s, kFocusB); }))
      << s.load_error << s.run_error(0) << s.run_error(1);
  EXPECT_EQ(s.run(0)->window.budget, 77);
  EXPECT_EQ(s.run(0)->selection.indices.size(), 77u);
  EXPECT_DOUBLE_EQ(s.settings.keep_ratio, 77.0 / 405);
  // The A/B overlap (app/overlap_grid.h): Jaccard of the kept sets, |A| = 77 on every head.
  const JobPlan p = plan_overlap(s);
  ASSERT_FALSE(p.key.empty());
  JobContext ctx;
  const auto g = std::static_pointer_cast<const OverlapGrid>(p.compute(ctx, {}));
  ASSERT_EQ(g->jaccard.size(), 20u);
  int adakv_layer0 = 0;
  for (size_t c = 0; c < g->jaccard.size(); ++c) {
    EXPECT_EQ(g->a_kept[c], 77);
    if (c < 4) adakv_layer0 += g->b_kept[c];  // adakv: per-head budgets, 4 x 77 over a layer
    EXPECT_DOUBLE_EQ(g->jaccard[c],
                     static_cast<double>(g->both[c]) / (g->a_kept[c] + g->b_kept[c] - g->both[c]));
    EXPECT_GT(g->jaccard[c], 0.0);
  }
  EXPECT_EQ(adakv_layer0, 4 * 77);
  // Above the middle: clamped to it, and said.
  s.settings.budget_tokens = 5000;
  s.notes.clear();
  s.reconcile();
  EXPECT_EQ(s.settings.budget_tokens, 405);
  AppState b;
  b.apply_session(s.to_session());
  EXPECT_TRUE(b.settings.budget_mode);
  EXPECT_EQ(b.settings.budget_tokens, 405);
  nlohmann::json bad = s.to_session();
  bad["budget_mode"] = "percent";
  EXPECT_THROW(b.parse_session(bad, nullptr), InputError);
}

// Item 3: a capture without RoPE metadata opens, and the methods that need it are listed
// unavailable with the reason (app/method_list.h); criticalkv needs W_O (layers.L.wo), which
// the sample carries and this copy drops.
TEST(Budgets, MethodsTheCaptureCannotRunSayWhy) {
  const fs::path p = fs::temp_directory_path() / "kvscope_app_unit_norope.safetensors";
  {
    CaptureData d;
    auto src = CaptureFile::open(kSample);
    d.info = src->info();
    d.info.metadata.erase("rope_theta");
    d.info.metadata.erase("rope_layout");
    d.info.metadata.erase("llama2c_config");  // nothing to derive RoPE from
    for (int l = 0; l < d.info.num_layers; ++l) {
      d.layers.push_back(*src->layer(l));
      d.layers.back().output_projection.clear();
    }
    write_capture(p.string(), d);
  }
  {
    AppState with_wo;
    with_wo.request_open(kSample);
    ASSERT_TRUE(pump(with_wo, [&] { return with_wo.info() != nullptr; })) << with_wo.load_error;
    EXPECT_EQ(method_unavailable_here(with_wo, *find_method("criticalkv(expected-attention)")), "");
  }
  AppState s;
  s.request_open(p.string());
  ASSERT_TRUE(pump(s, [&] { return s.info() != nullptr; })) << s.load_error;
  EXPECT_FALSE(s.info()->rope.known());
  EXPECT_NE(method_unavailable_here(s, *find_method("expected-attention")).find("rope_theta"),
            std::string::npos);
  EXPECT_NE(method_unavailable_here(s, *find_method("adakv(expected-attention)")).find("RoPE"),
            std::string::npos);
  EXPECT_EQ(method_unavailable_here(s, *find_method("snapkv")), "");
  EXPECT_NE(method_unavailable_here(s, *find_method("criticalkv(expected-attention)")).find("W_O"),
            std::string::npos);
  // The approximate entry the combo offers for criticalkv: projection = identity.
  const std::optional<ParamValues> alt =
      without_output_projection(*find_method("criticalkv(keydiff)"));
  ASSERT_TRUE(alt.has_value());
  EXPECT_FALSE(find_method("criticalkv(keydiff)")->needs_output_projection(*alt));
  s.settings.method[0] = MethodChoice{"criticalkv(keydiff)", *alt};
  EXPECT_EQ(method_unavailable_here(s, *find_method("criticalkv(keydiff)")), "");
  fs::remove(p);
}

// A method or a view added by its own code and one registration line is known
// everywhere the app lists them: a toy view registered here is in view_names() (the --view help
// of the app and of kvscope-cli render, which read view_names_text(), and the check of --view),
// gets a tab and draws; a toy method registered here is in the Method view's combo. docs/app.md
// names every view (its --view list). The engine's side: tests/test_registry.cpp.
namespace {
class ToyView final : public View {
 public:
  const char* name() const override { return "test-toy"; }
  const char* title() const override { return "Toy"; }
  void draw(AppState& s) override {
    ImGui::TextUnformatted("toy view");
    record_item(s, "toy:text");
  }
};
class ToyMethod final : public ScoreRankingMethod {
 public:
  std::string name() const override { return "test-app-oldest"; }
  std::string summary() const override { return "the m oldest middle tokens (a test's method)"; }
  Ranking rank(const MethodInput& in) const override {
    std::vector<double> scores(static_cast<size_t>(in.mid_end - in.mid_begin));
    for (size_t i = 0; i < scores.size(); ++i) scores[i] = -static_cast<double>(i);
    return rank_by_scores(scores, scores);
  }
};
bool has_name(const std::vector<std::string>& v, const std::string& n) {
  return std::find(v.begin(), v.end(), n) != v.end();
}
}  // namespace

TEST(Registry, AViewAndAMethodRegisteredInATestAppearInEveryList) {
  EXPECT_FALSE(has_name(view_names(), "test-toy"));
  HeadlessOptions bad;
  bad.view = "test-toy";
  EXPECT_THROW(validate_options(bad), InputError);
  register_view([] { return std::make_unique<ToyView>(); });
  register_method(std::make_unique<ToyMethod>());
  EXPECT_THROW(register_view([] { return std::make_unique<ToyView>(); }), std::invalid_argument);

  EXPECT_TRUE(has_name(view_names(), "test-toy"));
  EXPECT_EQ(view_names().back(), "test-toy");
  EXPECT_NE(view_names_text().find("test-toy"), std::string::npos);
  EXPECT_NO_THROW(validate_options(bad));  // --view test-toy is accepted

  [[maybe_unused]] SoftTexture font = soft_init(1280, 800);
  {
    AppState s;
    AppUi ui(s);
    ASSERT_NE(ui.find_view("test-toy"), nullptr);
    auto frame = [&](ImVec2 mouse, bool down) {
      ImGuiIO& io = ImGui::GetIO();
      io.DeltaTime = 1.0f / 60.0f;
      io.MousePos = mouse;
      io.MouseDown[0] = down;
      ImGui::NewFrame();
      ui.draw();
      ImGui::Render();
    };
    ui.show_view("test-toy");
    for (int f = 0; f < 4; ++f) frame(ImVec2(-1, -1), false);
    EXPECT_TRUE(s.ui_items.count("tab:test-toy")) << "no tab for the registered view";
    EXPECT_TRUE(s.ui_items.count("toy:text")) << "the registered view was not drawn";

    // The Method view's combo lists the registered method.
    ui.show_view("method");
    for (int f = 0; f < 4; ++f) frame(ImVec2(-1, -1), false);
    ASSERT_TRUE(s.ui_items.count("combo:method A"));
    EXPECT_FALSE(s.ui_items.count("combo:method A:test-app-oldest"));
    const auto r = s.ui_items.at("combo:method A");
    const ImVec2 at((r[0] + r[2]) / 2, (r[1] + r[3]) / 2);
    frame(at, true);
    frame(at, false);
    for (int f = 0; f < 3; ++f) frame(at, false);
    EXPECT_TRUE(s.ui_items.count("combo:method A:snapkv")) << "the combo did not open";
    EXPECT_TRUE(s.ui_items.count("combo:method A:test-app-oldest"))
        << "the registered method is not in the combo";
  }
  ImGui::DestroyContext();
  // Later tests of this binary see the built-in lists again.
  unregister_view("test-toy");
  EXPECT_FALSE(has_name(view_names(), "test-toy"));
}

TEST(Registry, DocsNameEveryView) {
  std::ifstream in(std::string(KVSCOPE_SOURCE_DIR) + "/docs/app.md");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str();
  const std::string lead = "`NAME` is one of `";
  const size_t at = doc.find(lead);
  ASSERT_NE(at, std::string::npos) << "docs/app.md lost its list of view names";
  const size_t b = at + lead.size(), e = doc.find('`', b);
  std::vector<std::string> listed;
  std::stringstream list(doc.substr(b, e - b));
  for (std::string item; std::getline(list, item, ',');) {
    item.erase(0, item.find_first_not_of(' '));
    listed.push_back(item);
  }
  std::vector<std::string> views = view_names();
  views.erase(std::remove(views.begin(), views.end(), "test-toy"), views.end());  // this file's
  EXPECT_EQ(listed, views) << "docs/app.md: " << doc.substr(b, e - b);
}

// Every method and wrapper the registry knows is in the list the method combos, the sweep and
// the Output and Theory views offer (app_methods), each once: all_methods() and every wrapper
// around every score-ranking method, chunkkv(...) and criticalkv(...) included.
TEST(MethodLists, EveryRegisteredMethodAndWrapperIsOffered) {
  const std::vector<const Method*> offered = app_methods();
  std::set<std::string> names;
  for (const Method* m : offered) EXPECT_TRUE(names.insert(m->name()).second) << m->name();
  for (const Method* m : all_methods()) EXPECT_EQ(names.count(m->name()), 1u) << m->name();
  size_t wrapped = 0;
  for (const std::string& w : wrapper_names())
    for (const Method* inner : all_methods()) {
      const Method* m = find_method(w + "(" + inner->name() + ")");
      if (!m) continue;
      EXPECT_EQ(names.count(m->name()), 1u) << m->name() << " cannot be chosen";
      ++wrapped;
    }
  EXPECT_GT(wrapped, 2 * wrapper_names().size());
  for (const char* must : {"chunkkv(snapkv)", "chunkkv(knorm)", "criticalkv(snapkv)",
                           "criticalkv(expected-attention)", "adakv(snapkv)"})
    EXPECT_EQ(names.count(must), 1u) << must;
}

// Methods drawn together never share a colour: the whole list at once (the combo), the defaults
// (uniform and subgen-kcenter were drawn alike), and the palette's colours stay well apart.
TEST(MethodLists, NoTwoMethodsDrawnTogetherShareAColour) {
  std::vector<std::string> all;
  for (const Method* m : app_methods()) all.push_back(m->name());
  auto distinct = [](const std::vector<std::string>& drawn) {
    const MethodColours colours(drawn);
    std::map<ImU32, std::string> seen;
    for (const std::string& n : drawn) {
      const auto [it, fresh] = seen.emplace(colours(n), n);
      EXPECT_TRUE(fresh || it->second == n) << n << " and " << it->second << " share a colour";
    }
  };
  distinct(all);
  distinct(default_methods().sweep);
  distinct(default_methods().theory);
  distinct(default_methods().output);
  distinct({"uniform", "subgen-kcenter", "balancekv", "chunkkv(snapkv)", "criticalkv(knorm)"});
  // A method keeps its colour when nothing before it claims it.
  EXPECT_EQ(MethodColours({"uniform"})("uniform"), MethodColours(all)("uniform"));
  for (int a = 0; a < kMethodPaletteSize; ++a)
    for (int b = a + 1; b < kMethodPaletteSize; ++b) {
      auto ch = [](ImU32 c, int shift) { return static_cast<int>((c >> shift) & 0xFF); };
      const ImU32 x = kMethodPalette[a], y = kMethodPalette[b];
      const int dr = ch(x, IM_COL32_R_SHIFT) - ch(y, IM_COL32_R_SHIFT),
                dg = ch(x, IM_COL32_G_SHIFT) - ch(y, IM_COL32_G_SHIFT),
                db = ch(x, IM_COL32_B_SHIFT) - ch(y, IM_COL32_B_SHIFT);
      EXPECT_GT(dr * dr + dg * dg + db * db, 40 * 40) << "palette colours " << a << " and " << b;
    }
}

// Settings are doubles end to end: a parameter of 0.05 stays 0.05 in the settings, the session
// and the export, and the Theory view's unsaturated walk at gamma 0.05 gives exactly the numbers
// kvscope-cli theory gives for --unsat-gamma 0.05 (through float, 104 of 1080 numbers differed).
TEST(Settings, ParametersStayDoublesAndTheTheoryViewEqualsTheCli) {
  [[maybe_unused]] SoftTexture font = soft_init(1280, 800);
  {
    AppState s;
    s.settings.method[0] = MethodChoice{"balancekv", {{"gamma", 0.05}}};
    s.request_open(kSample);
    AppUi ui(s);
    View* theory = ui.find_view("theory");
    ASSERT_NE(theory, nullptr);
    theory->load_state({{"unsat_gamma", 0.05}, {"unsat_temp", 0.02}});
    ui.show_view("theory");
    s.settings.active_view = "theory";
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      ImGui::GetIO().DeltaTime = 1.0f / 60.0f;
      ImGui::NewFrame();
      ui.draw();
      ImGui::Render();
      const Result& r = s.result("theory");
      if (!r.held.empty() && r.held == r.want) s.run_now("theory");
      if (r.fresh() || !r.error.empty()) break;
      ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(300));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(s.result("theory").error.empty()) << s.result("theory").error;
    EXPECT_EQ(s.settings.method[0].params.at("gamma"), 0.05);
    EXPECT_EQ(s.to_session()["params_a"]["gamma"].get<double>(), 0.05);
    nlohmann::json view = theory->export_json(s);
    ASSERT_TRUE(view.is_object());
    EXPECT_EQ(view["view"]["unsat_gamma"].get<double>(), 0.05);
    EXPECT_EQ(view["stale"], false);

    const fs::path out = fs::temp_directory_path() / "kvscope_unit_theory_cli.json";
    const std::string cmd = std::string("\"") + KVSCOPE_CLI + "\" theory \"" + kSample +
                            "\" --layers 0 --heads 0 --methods balancekv,uniform,subgen" +
                            " --param balancekv.gamma=0.05 --unsat-gamma 0.05 --unsat-temp 0.02" +
                            " --json \"" + out.string() + "\" > /dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::ifstream in(out);
    const nlohmann::json cli = nlohmann::json::parse(in);
    // Every number the CLI writes, at the same place in the view's export, equal to the bit.
    size_t numbers = 0, differ = 0;
    std::function<void(const nlohmann::json&, const nlohmann::json&, const std::string&)> walk =
        [&](const nlohmann::json& c, const nlohmann::json& v, const std::string& at) {
          if (c.is_object()) {
            for (auto it = c.begin(); it != c.end(); ++it) {
              if (!v.is_object() || !v.contains(it.key())) {
                ADD_FAILURE() << at << "/" << it.key() << " missing from the view's export";
                continue;
              }
              walk(it.value(), v[it.key()], at + "/" + it.key());
            }
          } else if (c.is_array()) {
            ASSERT_TRUE(v.is_array() && v.size() == c.size()) << at;
            for (size_t i = 0; i < c.size(); ++i) walk(c[i], v[i], at + "/" + std::to_string(i));
          } else if (c.is_number()) {
            ++numbers;
            if (!v.is_number() || v.get<double>() != c.get<double>()) {
              if (++differ <= 5) ADD_FAILURE() << at << ": app " << v << ", cli " << c;
            }
          }
        };
    walk(cli, view, "");
    EXPECT_GT(numbers, 500u);
    EXPECT_EQ(differ, 0u) << "of " << numbers << " numbers";
    fs::remove(out);
  }
  ImGui::DestroyContext();
}

// A start without a file reopens the capture opened last (not a session, not a file since
// removed); with none, main() falls back to the sample.
TEST(RecentFilesTest, TheLastCaptureStillThereIsReopened) {
  const fs::path dir = fs::temp_directory_path() / "kvscope_unit_last_capture";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path a = dir / "a.safetensors", b = dir / "b.safetensors", gone = dir / "gone.npz";
  std::ofstream(a) << "a";
  std::ofstream(b) << "b";
  RecentFiles recent(dir / "recent.json");
  EXPECT_EQ(recent.last_capture(), "");
  recent.add(a.string(), "capture");
  recent.add(b.string(), "capture");
  recent.add((dir / "s.json").string(), "session");
  recent.add(gone.string(), "capture");
  RecentFiles again(dir / "recent.json");
  ASSERT_EQ(again.load(), "");
  EXPECT_EQ(again.last_capture(), fs::absolute(b).string());
  fs::remove_all(dir);
}
