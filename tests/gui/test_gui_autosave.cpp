// Autosave and recovery with the real app: the real kvscope window under Xvfb
// (tests/gui/real_window.h), a setting changed by real input, the autosave waited for in the
// config folder, the app killed with SIGKILL, started again: the restore prompt is up, a real
// click on Restore brings the settings back.
#include <csignal>

#include "app/autosave.h"
#include "tests/gui/real_window.h"

using namespace kvscope_gui_test;

namespace {

class AutosaveWindow : public RealWindow {
 protected:
  AutosaveWindow() { out_name_ = "autosave"; }

  // The app again, on the same folders (SetUp's start without clearing them).
  void restart() { launch("app2.log"); }

  // The autosave once it holds `pred` (polled; the app writes it atomically).
  json wait_autosave(const std::function<bool(const json&)>& pred, double* waited) {
    const fs::path p = dir_ / "autosave.json";
    const auto t0 = std::chrono::steady_clock::now();
    json last;
    for (;;) {
      *waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (fs::exists(p)) {
        try {
          std::ifstream in(p);
          last = json::parse(in);
          if (pred(last)) return last;
        } catch (const json::exception& e) {
          ADD_FAILURE() << "autosave.json is not whole JSON: " << e.what();
          return last;
        }
      }
      if (*waited > kWaitS) {
        ADD_FAILURE() << "step " << step_ << ": no autosave as expected in " << kWaitS
                      << " s; last: " << last.dump();
        return last;
      }
      pause_ms(50);
    }
  }
};

TEST_F(AutosaveWindow, KilledAppOffersItsSessionAndRestoreBringsItBack) {
  step("1: the sample opens");
  json st =
      wait_for([](const json& s) { return fresh(s, "focus.A"); }, kComputeWaitS, "the first focused run");
  EXPECT_FALSE(st["restore_prompt"]["open"].get<bool>()) << "a prompt without an autosave";

  step("2: real input: Method tab, keep ratio dragged, method B switched to snapkv");
  click(st, "tab:method");
  st = wait_for([](const json& s) { return s["session"]["active_view"] == "method"; }, kWaitS,
                "the Method tab to be active");
  st = settled();
  drag(st, "slider:keep ratio", 0.8);
  st = settled();
  click(st, "combo:method B");
  st = with_item("combo:method B:snapkv");
  click(st, "combo:method B:snapkv");
  st = wait_for([](const json& s) { return s["session"]["method_b"] == "snapkv"; }, kWaitS,
                "method B to be snapkv");
  const auto changed = std::chrono::steady_clock::now();
  const double ratio = st["session"]["keep_ratio"].get<double>();
  ASSERT_NE(ratio, 0.25) << "the drag did nothing";

  step("3: the autosave holds them a few seconds later");
  double waited = 0;
  json saved = wait_autosave(
      [&](const json& j) {
        return j.value("method_b", "") == "snapkv" && j.value("keep_ratio", 0.0) == ratio &&
               j.value("active_view", "") == "method";
      },
      &waited);
  const double seen =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - changed).count();
  // The debounce as the app measured it: the test sees a change only when it next reads the
  // app's state, late by whatever else the machine runs (1.1 s "after the change" once, with a
  // build beside it), so its own clock cannot check the delay.
  st = state();
  const double delay = st["autosave"]["last_delay_s"].get<double>();
  note("autosave written " + std::to_string(delay) + " s after the last change (the app's clock; " +
       std::to_string(seen) + " s after the test saw the change)");
  EXPECT_EQ(saved["autosave"]["clean_exit"], false);
  EXPECT_TRUE(saved.contains("views"));
  EXPECT_GE(delay, kvscope::app::Autosave::kDelayS - 1e-9) << "written before the delay";

  step("4: kill -9, start again: the restore prompt is up");
  ASSERT_EQ(kill(pid_, SIGKILL), 0);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  fs::remove(dir_ / "state.json");
  restart();
  st = wait_for([](const json& s) { return s["restore_prompt"]["open"].get<bool>(); }, kWaitS,
                "the restore prompt");
  const std::string text = st["restore_prompt"]["text"];
  EXPECT_NE(text.find("stories260K_lily.safetensors"), std::string::npos) << text;
  EXPECT_NE(text.find("saved "), std::string::npos) << text;
  EXPECT_EQ(st["session"]["method_b"], "uniform") << "restored before the click";
  EXPECT_TRUE(st["autosave"]["held"].get<bool>());

  step("5: a click on Restore brings the settings back");
  st = with_item("button:Restore autosave");
  click(st, "button:Restore autosave");
  st = wait_for(
      [&](const json& s) {
        return !s["restore_prompt"]["open"].get<bool>() && s["session"]["method_b"] == "snapkv" &&
               s["session"]["keep_ratio"].get<double>() == ratio;
      },
      kWaitS, "the restored settings");
  EXPECT_EQ(st["session"]["active_view"], "method");
  EXPECT_EQ(st["load_error"], "");
  EXPECT_FALSE(st["autosave"]["held"].get<bool>());

  step("6: File > Quit (a clean exit) marks the autosave; the next start offers nothing");
  st = settled();
  click(st, "menu:File");
  st = with_item("menu:Quit");
  click(st, "menu:Quit");
  bool exited = false;
  for (int i = 0; i < 300 && !exited; ++i) {
    exited = waitpid(pid_, &status, WNOHANG) == pid_;
    if (!exited) pause_ms(100);
  }
  ASSERT_TRUE(exited) << "File > Quit did not end the app in 30 s";
  pid_ = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  saved = json::parse(std::ifstream(dir_ / "autosave.json"));
  EXPECT_EQ(saved["autosave"]["clean_exit"], true);
  EXPECT_EQ(saved["method_b"], "snapkv");
  fs::remove(dir_ / "state.json");
  restart();
  st = wait_for([](const json& s) { return fresh(s, "focus.A"); }, kComputeWaitS,
                "the first focused run after a clean exit");
  EXPECT_FALSE(st["restore_prompt"]["open"].get<bool>()) << "offered after a clean exit";
  EXPECT_EQ(st["session"]["method_b"], "uniform");
}

}  // namespace
