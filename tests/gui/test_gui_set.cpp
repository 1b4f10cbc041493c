// The Set view with the real app (docs/app.md, "Set view"): the real kvscope window under Xvfb
// (tests/gui/real_window.h) started on the bundled two-prompt set, its figures across prompts
// equal `kvscope-cli eval SET` to the last bit, the interval toggle recolours the grid, and a
// click on a prompt opens that capture in every view while the set stays open.
#include "tests/gui/real_window.h"

using namespace kvscope_gui_test;

namespace {

const std::string kSet = kSampleDir + "/stories260K_set.jsonl";

class SetWindow : public RealWindow {
 protected:
  SetWindow() {
    out_name_ = "set";
    capture_ = kSet;
  }
  // F10: a PNG of the active view, `view`.png, kept in the test's folder for a look.
  void take_png(const std::string& view) {
    const fs::path p = dir_ / (view + ".png");
    fs::remove(p);
    key("F10");
    wait_for([&](const json&) { return fs::exists(p) && fs::file_size(p) > 0; }, kWaitS,
             view + ".png");
  }
  // The view's export once `pred` holds of it (F9 writes it with the state).
  template <typename Pred>
  json wait_for_view(const std::string& view, Pred pred) {
    json v;
    wait_for(
        [&](const json&) {
          try {
            v = view_json(view);
          } catch (const json::exception&) {
            return false;
          }
          return v.is_object() && pred(v);
        },
        kWaitS, "the " + view + " view's figures");
    return v;
  }
};

TEST_F(SetWindow, FiguresAcrossPromptsEqualEvalAndAPromptOpensItsCapture) {
  step("the set opens in the Set view; its evaluation runs, after a Run click if it is held");
  json st = wait_for(
      [](const json& s) {
        const json& r = s["results"];
        return s["session"]["panels"][1] == "set" && fresh(s, "set.open") &&
               r.contains("set.eval") &&
               (r["set.eval"]["fresh"].get<bool>() || r["set.eval"]["held_for_run"].get<bool>());
      },
      kComputeWaitS, "the set's evaluation, or its Run button");
  if (st["results"]["set.eval"]["held_for_run"].get<bool>()) {
    note("held for Run at an estimate of " + st["results"]["set.eval"]["estimate_s"].dump() + " s");
    st = with_item("run:set.eval");
    click(st, "run:set.eval");
  }
  st = wait_for(
      [](const json& s) { return fresh(s, "set.eval") && s["ui_items"].contains("set:prompt:1"); },
      kComputeWaitS, "the set's evaluation");
  EXPECT_EQ(st["capture_path"], "") << "a set opens no capture until a prompt is chosen";
  json sv = view_json("set");
  ASSERT_TRUE(sv.is_object()) << sv.dump();
  EXPECT_TRUE(sv["fresh"].get<bool>());
  ASSERT_EQ(sv["entries"].size(), 2u);

  step("every figure equals kvscope-cli eval SET with the view's spec");
  const json& spec = sv["spec"];
  std::string methods, ratios;
  for (const json& m : spec["methods"])
    methods += (methods.empty() ? "" : ",") + m.get<std::string>();
  for (const json& r : spec["ratios"]) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", r.get<double>());
    ratios += (ratios.empty() ? "" : ",") + std::string(buf);
  }
  std::string params;
  for (const auto& [method, values] : spec["params"].items())
    for (const auto& [name, v] : values.items())
      params += " --param " + method + "." + name + "=" + v.dump();
  const fs::path cli_json = dir_ / "cli_set.json";
  int rc = 0;
  const std::string out =
      sh("\"" + std::string(KVSCOPE_CLI) + "\" eval \"" + kSet + "\" --methods " + methods +
             " --ratios " + ratios + " --seeds " + std::to_string(spec["seeds"].get<int>()) +
             " --base-seed " + std::to_string(spec["base_seed"].get<long long>()) + params +
             " --json \"" + cli_json.string() + "\"",
         &rc);
  ASSERT_EQ(rc, 0) << out;
  std::ifstream in(cli_json);
  const json cli = json::parse(in);
  ASSERT_EQ(cli["summary"].size(), sv["summary"].size());
  for (size_t i = 0; i < cli["summary"].size(); ++i)
    EXPECT_EQ(cli["summary"][i], sv["summary"][i]) << "row " << i;
  EXPECT_EQ(cli["worst_prompts"], sv["worst_prompts"]);
  note(std::to_string(sv["summary"].size()) + " rows compared");

  step("colour the grid by the interval's width");
  st = with_item("set:by_interval");
  click(st, "set:by_interval");
  wait_for([&](const json&) { return json(view_json("set"))["colour_by_interval"] == true; },
           kWaitS, "the grid coloured by the interval's width");

  step("click the dragon prompt: its capture opens, the set stays");
  st = settled();
  click(st, "set:prompt:1");
  st = wait_for(
      [](const json& s) {
        const std::string p = s["capture_path"];
        return p.find("stories260K_dragon") != std::string::npos && fresh(s, "set.eval");
      },
      kComputeWaitS, "the dragon capture to open with the set still evaluated");
  EXPECT_EQ(st["session"]["panels"][1], "set");

  // The set's rows of method A at the current keep ratio (cli's "column"), by layer and head.
  const std::string method_a = spec["methods"][0];
  int column = -1;
  for (size_t i = 0; i < spec["ratios"].size(); ++i)
    if (spec["ratios"][i] == st["session"]["keep_ratio"]) column = static_cast<int>(i);
  ASSERT_GE(column, 0) << "the keep ratio is among the set's ratios";

  step("the Capture grid colours by method A over the set's prompts: cli's rows to the bit");
  st = with_item("tab:capture");
  click(st, "tab:capture");  // shown on the left already: the click makes it the active view
  wait_for([](const json& s) { return s["session"]["active_view"] == "capture"; }, kWaitS,
           "the Capture view to be the active view");
  st = with_item("combo:colour by");
  click(st, "combo:colour by");
  st = with_item("combo:colour by:method A over the set's prompts");
  click(st, "combo:colour by:method A over the set's prompts");
  json cv = wait_for_view("capture", [](const json& v) {
    return v["grid_source"] == "set" && v.contains("set_grid") &&
           v["set_grid"]["fresh"].get<bool>() && !v["set_grid"]["cells"].empty();
  });
  int cells = 0;
  for (const json& c : cv["set_grid"]["cells"]) {
    const json* want = nullptr;
    for (const json& r : cli["summary"])
      if (r["method"] == method_a && r["column"] == column && r["layer"] == c["layer"] &&
          r["kv_head"] == c["kv_head"])
        want = &r;
    ASSERT_NE(want, nullptr) << c.dump();
    EXPECT_EQ(c["method"], method_a);
    EXPECT_EQ(c["mean"], (*want)["mean"]) << c.dump();
    EXPECT_EQ(c["ci_low"], (*want)["ci_low"]) << c.dump();
    EXPECT_EQ(c["ci_high"], (*want)["ci_high"]) << c.dump();
    ++cells;
  }
  EXPECT_EQ(cells, cv["layers"].get<int>() * cv["kv_heads"].get<int>());
  st = with_item("capture:by_interval");
  click(st, "capture:by_interval");
  wait_for_view("capture",
                [](const json& v) { return v["set_grid"]["colour_by_interval"] == true; });
  note(std::to_string(cells) + " set cells compared in the Capture view");
  take_png("capture");

  step("the Error view's sweep panel over the set's prompts: cli's whole-capture rows");
  st = with_item("tab:error");
  click(st, "tab:error");
  st = with_item("sweep:y");
  click(st, "sweep:y");
  st = with_item("combo:sweep y:over the set's prompts");
  click(st, "combo:sweep y:over the set's prompts");
  const json ev = wait_for_view("error", [](const json& v) {
    return v.contains("set_sweep") && v["set_sweep"]["fresh"].get<bool>();
  });
  int rows = 0;
  for (const json& r : ev["set_sweep"]["rows"]) {
    const json* want = nullptr;
    for (const json& w : cli["summary"])
      if (w["method"] == r["method"] && w["layer"] == "all" &&
          spec["ratios"][w["column"].get<size_t>()] == r["ratio"])
        want = &w;
    ASSERT_NE(want, nullptr) << r.dump();
    EXPECT_EQ(r["mean"], (*want)["mean"]) << r.dump();
    EXPECT_EQ(r["ci_low"], (*want)["ci_low"]) << r.dump();
    EXPECT_EQ(r["ci_high"], (*want)["ci_high"]) << r.dump();
    ++rows;
  }
  EXPECT_EQ(rows, static_cast<int>(spec["methods"].size() * spec["ratios"].size()));
  note(std::to_string(rows) + " set rows compared in the Error view");
  take_png("error");  // the sweep panel over the set (kept for a look)
}

}  // namespace
