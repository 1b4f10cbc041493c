// Real input (xdotool under Xvfb, tests/gui/real_window.h) through the Theory view on
// kjv3M's sample capture: the tab by a click, a method added from "methods...", the
// scope switched to the whole capture; each time the exported figures (F9) must be fresh and the
// whole capture's fitted exponents must equal what kvscope-cli theory computes with the same
// settings.
#include <cmath>
#include <fstream>

#include "tests/gui/real_window.h"

using namespace kvscope_gui_test;

namespace {

struct TheoryWindow : RealWindow {
  TheoryWindow() {
    out_name_ = "theory";
    capture_ = kSampleDir + "/kjv3M_beginning.safetensors";
  }
};

TEST_F(TheoryWindow, MethodsScopeAndTheCliAgree) {
  step("1: the Theory tab by a click computes the focused head's figures");
  json st =
      wait_for([](const json& s) { return fresh(s, "focus.A"); }, kComputeWaitS, "the first focused run");
  click(st, "tab:theory");
  st = wait_for([](const json& s) { return fresh(s, "theory"); }, kComputeWaitS, "the theory result");
  json t = view_json("theory");
  ASSERT_EQ(t["scope"], "layer 0 kv head 0") << t.dump().substr(0, 400);
  ASSERT_EQ(t["discrepancy"]["runs"].size(), 2u);
  for (const json& run : t["discrepancy"]["runs"]) {
    ASSERT_TRUE(run["saturation"].contains("numerator"));
    EXPECT_EQ(run["curves"].size(), 8u);
  }
  ASSERT_EQ(t["error"]["methods"].size(), 3u);

  step("2: snapkv ticked in 'methods...' joins the error figure");
  st = with_item("theory:methods");
  click(st, "theory:methods");
  st = with_item("theory:method:snapkv");
  click(st, "theory:method:snapkv");
  st = wait_for(
      [&](const json&) {
        const json v = view_json("theory");
        return v.contains("view") && v["view"]["methods"].size() == 4;
      },
      kWaitS, "the snapkv checkbox to be ticked");
  key("Escape");
  st = wait_for(
      [&](const json& s) {
        return fresh(s, "theory") && view_json("theory")["error"]["methods"].size() == 4;
      },
      kComputeWaitS, "the theory result with four methods");
  t = view_json("theory");
  EXPECT_EQ(t["error"]["methods"][3]["method"], "snapkv");
  EXPECT_TRUE(t["error"]["methods"][3]["relative"].contains("alpha"));

  step("3: whole capture: all 8 heads, the same exponents as kvscope-cli theory");
  st = with_item("theory:whole capture");
  click(st, "theory:whole capture");
  st = wait_for(
      [&](const json& s) {
        if (!fresh(s, "theory")) {
          // Held for a Run click when the estimate is high on this machine: click Run.
          if (s["results"].contains("theory") && s["results"]["theory"]["held_for_run"] == true &&
              s["ui_items"].contains("run:theory"))
            click(s, "run:theory");
          return false;
        }
        return view_json("theory")["heads"] == 8;
      },
      4 * kComputeWaitS, "the whole-capture theory result");
  t = view_json("theory");
  ASSERT_EQ(t["heads"], 8) << t.dump().substr(0, 400);
  const fs::path cli_json = dir_ / "cli_theory.json";
  int rc = 0;
  const std::string out =
      sh(std::string("\"") + KVSCOPE_CLI + "\" theory \"" + capture_ +
             "\" --methods balancekv,uniform,subgen,snapkv --json \"" + cli_json.string() + "\"",
         &rc);
  ASSERT_EQ(rc, 0) << out;
  std::ifstream in(cli_json);
  const json c = json::parse(in);
  ASSERT_EQ(c["error"]["methods"].size(), 4u);
  for (size_t m = 0; m < 4; ++m)
    for (const char* meas : {"relative", "frobenius", "operator"}) {
      const double a = t["error"]["methods"][m][meas]["alpha"]["value"];
      const double b = c["error"]["methods"][m][meas]["alpha"]["value"];
      EXPECT_NEAR(a, b, 1e-9) << t["error"]["methods"][m]["method"] << " " << meas;
    }
  for (size_t k = 0; k < 2; ++k)
    EXPECT_NEAR(t["discrepancy"]["runs"][k]["saturation"]["numerator"].get<double>(),
                c["discrepancy"]["runs"][k]["saturation"]["numerator"].get<double>(), 1e-12);
}

}  // namespace
