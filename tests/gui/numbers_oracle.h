// The numbers oracle shared by the real-window tests that check the app's numbers
// (test_gui_oracle.cpp: a seeded walk through the controls; test_gui_soak.cpp: the sanitizer
// soak): every number the Method and Capture views export for the focused head and the grid,
// against `kvscope-cli eval` run on the same capture with the same settings (1e-9 relative), and
// nothing shown as fresh that is stale once the app is idle.
#pragma once

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <sstream>
#include <string>

#include "tests/gui/real_window.h"

namespace kvscope_gui_test {

class NumbersOracle : public RealWindow {
 protected:
  // `kvscope-cli eval` of one method on one head ("" layers: every head), as the app's settings
  // give it; cached by command line (the walk revisits settings).
  json eval(const std::string& capture, const std::string& method, const json& params, double ratio,
            int seeds, int base_seed, const std::string& layers, const std::string& heads,
            const json& session) {
    std::ostringstream cmd;
    cmd.precision(17);
    cmd << KVSCOPE_CLI << " eval '" << capture << "' --methods '" << method << "' --ratios "
        << ratio << " --seeds " << seeds << " --base-seed " << base_seed << " --threads 1";
    if (!layers.empty()) cmd << " --layers " << layers << " --heads " << heads;
    for (const auto& [k, v] : params.items())
      cmd << " --param '" << method << "." << k << "=" << v << "'";
    if (session["sink"].get<int>() >= 0) cmd << " --sink " << session["sink"].get<int>();
    if (session["eval"].get<int>() >= 0) cmd << " --eval " << session["eval"].get<int>();
    cmd << " --estimator " << session["estimator"].get<std::string>();
    const std::string key = cmd.str();
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    const fs::path out = dir_ / "eval.json";
    fs::remove(out);
    int rc = 0;
    const std::string text = sh(key + " --json '" + out.string() + "'", &rc);
    EXPECT_EQ(rc, 0) << "step " << step_ << ": " << key << "\n" << text;
    json j;
    if (rc == 0) {
      std::ifstream in(out);
      j = json::parse(in);
    }
    ++evals_;
    return cache_[key] = j;
  }

  static const json* head_result(const json& report, int layer, int head) {
    if (!report.contains("results")) return nullptr;
    for (const json& r : report["results"])
      if (r["layer"] == layer && r["kv_head"] == head) return &r;
    return nullptr;
  }

  // One number the app exports against eval's (relative 1e-9), counted for reports.
  void expect_close(double app, double cli, const std::string& what) {
    ++numbers_compared_;
    const bool same = std::fabs(app - cli) <= 1e-9 * std::max(1.0, std::fabs(cli));
    if (!same) ++numbers_differing_;
    EXPECT_NEAR(app, cli, 1e-9 * std::max(1.0, std::fabs(cli))) << what;
  }

  // Every number the Method and Capture views export, against eval.
  void check_numbers(const json& st) {
    const std::string capture = st["capture_path"];
    const json method = view_json("method");
    // A capture too short for the protocol's window: the app fits the sink and E (and says so
    // in a note; the window reads "s set by hand; E set by hand"), where eval asks for them. The
    // window the app used is then what eval is given.
    json se = st["session"];
    if (!method["focused_runs"].empty()) {
      const std::string w = method["focused_runs"][0]["window"];
      auto value_of = [&](const std::string& key) {
        const size_t at = w.find(" " + key + "=");
        return at == std::string::npos ? -1 : std::atoi(w.c_str() + at + key.size() + 2);
      };
      if (se["sink"] == -1 && w.find("s set by hand") != std::string::npos)
        se["sink"] = value_of("s");
      if (se["eval"] == -1 && w.find("E set by hand") != std::string::npos)
        se["eval"] = value_of("E");
    }
    const int layer = se["focus"]["layer"], head = se["focus"]["kv_head"];
    const double ratio = se["keep_ratio"];
    const int seed = se["seed"];
    int checked = 0;
    for (const json& run : method["focused_runs"]) {
      const bool a = run["slot"] == "A";
      const std::string name = se[a ? "method_a" : "method_b"];
      const std::string what = "step " + step_ + ": focused run " + std::string(a ? "A" : "B") +
                               " (" + name + ") at L" + std::to_string(layer) + " H" +
                               std::to_string(head) + ", ratio " + std::to_string(ratio) +
                               ", seed " + std::to_string(seed);
      EXPECT_EQ(run["method"], name) << what;
      if (run["stale"].get<bool>()) {
        // The app is idle: nothing may stay stale once it has settled.
        ADD_FAILURE() << what << ": still marked stale after the app settled\n" << summary(st);
        continue;
      }
      const json rep = eval(capture, name, se[a ? "params_a" : "params_b"], ratio, 1, seed,
                            std::to_string(layer), std::to_string(head), se);
      const json* h = head_result(rep, layer, head);
      if (!h) {
        ADD_FAILURE() << what << ": eval has no result for the head";
        continue;
      }
      expect_close(run["relative_error"], (*h)["mean"], what + ": relative error");
      expect_close(run["normalized_error"], (*h)["normalized_mean"], what + ": normalised error");
      expect_close(run["mass"], (*h)["mass_mean"], what + ": kept attention mass");
      EXPECT_EQ(run["kept"], (*h)["kept"]) << what << ": kept tokens";
      ++checked;
    }
    EXPECT_EQ(checked, se["ab_enabled"].get<bool>() ? 2 : 1)
        << "step " << step_ << ": focused runs exported\n"
        << summary(st);

    // The grid: method A over every head, grid seeds from base seed; the focused cell and one
    // more cell picked by the walk are checked.
    const json grid = view_json("capture")["grid"];
    if (grid["stale"].get<bool>() || grid["error_grid"].empty()) {
      EXPECT_FALSE(grid["stale"].get<bool>()) << "step " << step_ << ": grid stale after settling";
      return;
    }
    const std::string name = se["method_a"];
    const json rep = eval(capture, name, se["params_a"], ratio, grid["seeds"], seed, "", "", se);
    const json capj = view_json("capture");
    std::uniform_int_distribution<int> pick_l(0, capj["layers"].get<int>() - 1),
        pick_h(0, capj["kv_heads"].get<int>() - 1);
    const std::pair<int, int> cells[] = {{layer, head}, {pick_l(rng_), pick_h(rng_)}};
    for (const auto& [l, h] : cells) {
      const std::string what = "step " + step_ + ": grid cell L" + std::to_string(l) + " H" +
                               std::to_string(h) + " (" + name + ")";
      const json* cell = nullptr;
      for (const json& c : grid["error_grid"])
        if (c["layer"] == l && c["kv_head"] == h) cell = &c;
      const json* want = head_result(rep, l, h);
      ASSERT_NE(cell, nullptr) << what << ": not in the export";
      ASSERT_NE(want, nullptr) << what << ": not in eval's report";
      EXPECT_EQ((*cell)["method"], name) << what;
      EXPECT_DOUBLE_EQ((*cell)["ratio"].get<double>(), ratio) << what;
      expect_close((*cell)["relative_error_mean"], (*want)["mean"], what + ": mean");
      expect_close((*cell)["relative_error_std"], (*want)["std"], what + ": std over seeds");
    }
  }

  // Waits until nothing runs and the focused runs and the grid answer the current settings.
  json quiet() {
    return wait_for(
        [](const json& s) {
          for (const auto& [name, r] : s["results"].items())
            if (r["running"].get<bool>()) return false;
          for (const char* n : {"focus.A", "grid"})
            if (s["results"].contains(n) && s["results"][n]["wanted"].get<bool>() &&
                !s["results"][n]["fresh"].get<bool>() &&
                !s["results"][n]["held_for_run"].get<bool>() &&
                s["results"][n]["error"].get<std::string>().empty())
              return false;
          return true;
        },
        settle_s_, "the app to settle on the current settings");
  }

  // Scrolls the active view (mouse wheel over it, as a user does) until `item` lies wholly
  // inside the view's area: a widget half under the tab bar is drawn, but a click on its centre
  // may land on the tab bar.
  json reveal(json st, const std::string& item) {
    auto where = [&](const json& s) {  // 0: inside, -1: above, 1: below, 2: not drawn
      if (!s["ui_items"].contains(item)) return 2;
      const json& r = s["ui_items"][item];
      const json& vr = s["view_rect"];
      if (r[1].get<double>() < vr[1].get<double>()) return -1;
      if (r[3].get<double>() > vr[3].get<double>()) return 1;
      return 0;
    };
    for (int turn = 0; turn < 40; ++turn) {
      const int w = where(st);
      if (w == 0) return st;
      const json& vr = st["view_rect"];
      move_to((vr[0].get<double>() + vr[2].get<double>()) / 2,
              (vr[1].get<double>() + vr[3].get<double>()) / 2);
      // Not drawn: down for a while, then up (the view may be scrolled either way).
      const bool up = w == -1 || (w == 2 && turn >= 15);
      xdo(up ? "click 4" : "click 5");
      pause_ms(80);
      st = state();
    }
    ADD_FAILURE() << "step " << step_ << ": scrolling did not bring '" << item
                  << "' wholly on screen";
    return st;
  }

  json show_tab(json st, const std::string& tab) {
    if (st["session"]["active_view"] == tab) return st;
    click(st, "tab:" + tab);
    return wait_for([&](const json& s) { return s["session"]["active_view"] == tab; }, kWaitS,
                    "the " + tab + " tab");
  }

  std::mt19937_64 rng_;
  std::map<std::string, json> cache_;
  int evals_ = 0;
  long numbers_compared_ = 0, numbers_differing_ = 0;
  double settle_s_ = kComputeWaitS;  // quiet()'s limit: the app computes until it settles
};

}  // namespace kvscope_gui_test
