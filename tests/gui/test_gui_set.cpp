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
      kWaitS, "the set's evaluation, or its Run button");
  if (st["results"]["set.eval"]["held_for_run"].get<bool>()) {
    note("held for Run at an estimate of " + st["results"]["set.eval"]["estimate_s"].dump() + " s");
    st = with_item("run:set.eval");
    click(st, "run:set.eval");
  }
  st = wait_for(
      [](const json& s) { return fresh(s, "set.eval") && s["ui_items"].contains("set:prompt:1"); },
      kWaitS, "the set's evaluation");
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
      kWaitS, "the dragon capture to open with the set still evaluated");
  EXPECT_EQ(st["session"]["panels"][1], "set");
}

}  // namespace
