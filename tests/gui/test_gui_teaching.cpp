// Real input (xdotool under Xvfb, tests/gui/real_window.h) through the Teaching view's second
// half and the Geometry view's keys / values / both selector: every mode
// is chosen from its combo list by clicks, stepped and run by button clicks, and the exported
// JSON (F9) is checked against what each mode must show; Geometry "both" must export two maps
// with their k-center centres (points of the map) and their clusters vs n.
#include <cmath>

#include "tests/gui/real_window.h"

using namespace kvscope_gui_test;

namespace {

TEST_F(RealWindow, TeachingModesAndGeometryPoints) {
  step("1: the sample opens; the Teaching tab shows by a click");
  json st =
      wait_for([](const json& s) { return fresh(s, "focus.A"); }, kComputeWaitS, "the first focused run");
  click(st, "tab:teaching");
  st = wait_for([](const json& s) { return s["session"]["active_view"] == "teaching"; }, kWaitS,
                "the Teaching tab to be active");

  auto choose_mode = [&](const std::string& mode) {
    st = with_item("combo:teaching mode");
    click(st, "combo:teaching mode");
    const std::string item = "combo:teaching mode:" + mode;
    st = with_item(item);
    click(st, item);
    st = wait_for([&](const json&) { return view_json("teaching")["mode"] == mode; }, kWaitS,
                  "the Teaching mode to be " + mode);
  };

  step("2: exp kernel: three steps by clicks sign three tokens in both walks");
  choose_mode("exp-kernel");
  for (int i = 0; i < 3; ++i) {
    st = with_item("button:teaching step");
    click(st, "button:teaching step");
    const int want = i + 1;
    st = wait_for([&](const json&) { return view_json("teaching")["exp_kernel"]["step"] == want; },
                  kWaitS, "exp-kernel step " + std::to_string(want));
  }
  json t = view_json("teaching");
  ASSERT_EQ(t["mode"], "exp-kernel") << t.dump();
  ASSERT_EQ(t["result"]["steps"].size(), 3u);
  EXPECT_EQ(t["result"]["features"], "truncated Taylor");
  EXPECT_LT(t["result"]["feature_error"].get<double>(), 1e-6);
  {
    // The exported signed sums are the running sums of sigma_i exp(<k_i,q>/sqrt 2).
    double den = 0;
    for (const json& s : t["result"]["steps"]) {
      const double k0 = s["k"][0], k1 = s["k"][1];
      den += s["sigma_den"].get<int>() * std::exp((k0 * 0.9 + k1 * 0.45) / std::sqrt(2.0));
      EXPECT_NEAR(s["den_walk"].get<double>(), den, 1e-9);
    }
  }
  EXPECT_NE(t["narration"].get<std::string>().find("k3:"), std::string::npos) << t["narration"];

  step("3: the random-signs race run to n = 1024: the walk ends below fair coins");
  choose_mode("race");
  st = with_item("button:teaching run");
  click(st, "button:teaching run");
  st = wait_for([&](const json&) { return view_json("teaching")["race"]["n"] == 1024; }, kWaitS,
                "the race to reach n = 1024");
  t = view_json("teaching");
  EXPECT_EQ(t["result"]["n"], 1024);
  EXPECT_LT(t["result"]["walk"].get<double>(), t["result"]["random"].get<double>()) << t.dump();
  EXPECT_LT(t["result"]["walk_max"].get<double>(), t["result"]["sqrt_n"].get<double>());

  step("4: merge and reduce run to the end: kept within the budget and the bound");
  choose_mode("merge-reduce");
  st = with_item("button:teaching run");
  click(st, "button:teaching run");
  st = wait_for(
      [&](const json&) {
        const json t = view_json("teaching");
        return t["merge_reduce"]["step"] == t["merge_reduce"]["n"];
      },
      kWaitS, "every token to have arrived");
  t = view_json("teaching");
  const int budget = t["merge_reduce"]["budget"];
  EXPECT_LE(t["result"]["kept"].get<int>(), budget);
  EXPECT_LE(t["result"]["kept"].get<int>(), t["result"]["bound"].get<int>());
  EXPECT_GT(t["result"]["merges"].get<int>(), 0);
  size_t in_levels = 0;
  for (const json& l : t["result"]["level_sets"]) in_levels += l.size();
  EXPECT_EQ(in_levels, t["result"]["kept"].get<size_t>());

  step("5: Geometry: the points selector set to both by clicks; two maps with centres");
  click(st, "tab:geometry");
  st = wait_for([](const json& s) { return s["session"]["active_view"] == "geometry"; }, kWaitS,
                "the Geometry tab to be active");
  st = with_item("combo:geometry points");
  click(st, "combo:geometry points");
  st = with_item("combo:geometry points:both");
  click(st, "combo:geometry points:both");
  // A map whose measured cost is above 3 s waits for its Run button (on a busy machine the first
  // map's pace makes the second one's estimate long): the test clicks it, as a user would.
  st = wait_for(
      [&](const json& s) {
        for (const char* map : {"geometry.projection", "geometry.projection.values"})
          if (s["results"].contains(map) && s["results"][map]["held_for_run"].get<bool>() &&
              s["ui_items"].contains(std::string("run:") + map)) {
            click(s, std::string("run:") + map);
            return false;
          }
        return fresh(s, "geometry.projection") && fresh(s, "geometry.projection.values") &&
               fresh(s, "geometry.kcenter.keys") && fresh(s, "geometry.kcenter.values") &&
               view_json("geometry")["points"] == "both";
      },
      kComputeWaitS, "both maps and both k-center results");
  const json g = view_json("geometry");
  EXPECT_EQ(g["points"], "both");
  ASSERT_EQ(g["maps"].size(), 2u) << g.dump();
  EXPECT_EQ(g["maps"][0]["source"], "keys");
  EXPECT_EQ(g["maps"][1]["source"], "values");
  for (const json& m : g["maps"]) {
    const int n = m["num_points"];
    const int k = g["k"];
    ASSERT_EQ(m["centres"].size(), static_cast<size_t>(std::min(k, n))) << m.dump();
    ASSERT_EQ(m["centre_coords"].size(), m["centres"].size());
    for (const json& c : m["centres"]) {
      EXPECT_GE(c.get<int>(), 0);
      EXPECT_LT(c.get<int>(), n);
    }
    EXPECT_GE(m["radius"].get<double>(), 0.0);
    ASSERT_FALSE(m["clusters_vs_n"].empty());
    EXPECT_EQ(m["clusters_vs_n"].back()["n"], n);
    for (const json& c : m["clusters_vs_n"]) EXPECT_GE(c["clusters"].get<int>(), 1);
  }
  // The map's centres are rows of that map: the values' are not the keys' map coordinates.
  EXPECT_NE(g["maps"][0]["centre_coords"], g["maps"][1]["centre_coords"]);

  step("6: back to keys by clicks: one map");
  click(st, "combo:geometry points");
  st = with_item("combo:geometry points:keys");
  click(st, "combo:geometry points:keys");
  st = wait_for(
      [&](const json& s) {
        return fresh(s, "geometry.projection") && view_json("geometry")["points"] == "keys";
      },
      kComputeWaitS, "the points to be keys");
  EXPECT_EQ(view_json("geometry")["maps"].size(), 1u);
}

}  // namespace
