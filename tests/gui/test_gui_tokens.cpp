// The Tokens view's overview strip and harm colour with the real app (issues 29 item 3, 26 item
// 6): the real kvscope window under Xvfb (tests/gui/real_window.h), a brush dragged across the
// overview by real mouse input zooms the detailed strip to the brushed bins, the exported bins
// account for every token and for method A's kept set, the harm checkbox shows the harm, the
// zoom is saved with the session (autosave.json), and a double click shows the whole sequence.
#include "tests/gui/real_window.h"

using namespace kvscope_gui_test;

namespace {

class TokensWindow : public RealWindow {
 protected:
  TokensWindow() { out_name_ = "tokens"; }

  // Presses the button at `from` of the overview's width, moves in steps to `to`, releases.
  void brush(const json& st, double from, double to) {
    note("brush the overview from " + std::to_string(from) + " to " + std::to_string(to));
    const json& it = st["ui_items"]["tokens:overview"];
    ASSERT_TRUE(it.is_array()) << "the overview was not drawn; drawn: " << widget_names(st);
    const double x0 = it[0].get<double>(), x1 = it[2].get<double>();
    const double y = (it[1].get<double>() + it[3].get<double>()) / 2;
    move_to(x0 + from * (x1 - x0), y);
    xdo("mousedown 1");
    pause_ms(80);
    for (int i = 1; i <= 6; ++i) move_to(x0 + (from + (to - from) * i / 6) * (x1 - x0), y);
    xdo("mouseup 1");
    pause_ms(150);
  }
};

TEST_F(TokensWindow, BrushZoomsTheStripAndTheBinsAccountForEveryToken) {
  step("open the Tokens view");
  json st = with_item("tab:tokens");
  click(st, "tab:tokens");
  st = wait_for(
      [](const json& s) {
        return (s["session"]["active_view"] == "tokens" || s["session"]["panels"][1] == "tokens") &&
               fresh(s, "focus.A") && fresh(s, "tokens.harm") &&
               s["ui_items"].contains("tokens:overview");
      },
      kComputeWaitS, "the Tokens view with method A's run and the harm");
  json tv = view_json("tokens");
  const int n = static_cast<int>(tv["tokens"].size());
  ASSERT_GT(n, 100);
  EXPECT_EQ(tv["zoom"]["first"], 0);
  EXPECT_EQ(tv["zoom"]["last"], n);

  step("brush 30% to 60% of the overview");
  brush(st, 0.3, 0.6);
  st = wait_for(
      [&](const json&) {
        tv = view_json("tokens");
        return tv["zoom"]["first"].get<int>() > 0;
      },
      kWaitS, "the zoom range to change");
  const int lo = tv["zoom"]["first"], hi = tv["zoom"]["last"];
  note("zoom " + std::to_string(lo) + "-" + std::to_string(hi) + " of " + std::to_string(n));
  // The brushed bins: about 30% to 60% of the sequence (a bin or two of slack at each end).
  const int columns = tv["overview"]["columns"];
  const double slack = 2.0 * n / columns + 2;
  EXPECT_NEAR(lo, 0.3 * n, slack + 0.02 * n);
  EXPECT_NEAR(hi, 0.6 * n, slack + 0.02 * n);
  EXPECT_LT(lo, hi);

  step("the bins cover every token once and hold method A's kept set");
  const json& bins = tv["overview"]["bins"];
  ASSERT_EQ(static_cast<int>(bins.size()), columns);
  int next = 0, kept_a = 0, kept_b = 0, middle = 0;
  bool lo_is_edge = false, hi_is_edge = false;
  for (const json& b : bins) {
    EXPECT_EQ(b["first"].get<int>(), next);
    next = b["last"];
    kept_a += b["kept_a"].get<int>();
    if (b.contains("kept_b")) kept_b += b["kept_b"].get<int>();
    middle += b["middle"].get<int>();
    lo_is_edge |= b["first"] == lo;
    hi_is_edge |= b["last"] == hi;
  }
  EXPECT_EQ(next, n);
  EXPECT_EQ(kept_a, tv["a_kept"].get<int>());
  if (tv.contains("b_kept")) {
    EXPECT_EQ(kept_b, tv["b_kept"].get<int>());
  }
  int kept_tokens = 0, middle_tokens = 0;
  double mass = 0;
  for (const json& t : tv["tokens"]) {
    kept_tokens += t["a_kind"] == "kept";
    middle_tokens += t["a_kind"] == "kept" || t["a_kind"] == "dropped";
    mass += t["mass"].get<double>();
  }
  EXPECT_EQ(kept_a, kept_tokens);
  EXPECT_EQ(middle, middle_tokens);
  EXPECT_NEAR(mass, 1.0, 1e-9);  // each evaluation query's exact attention sums to 1
  EXPECT_TRUE(lo_is_edge && hi_is_edge) << "the zoom is not on bin edges";

  step("show the harm");
  EXPECT_FALSE(tv["harm_shown"].get<bool>());
  st = state();
  click(st, "tokens:harm");
  st = wait_for(
      [&](const json&) {
        tv = view_json("tokens");
        return tv["harm_shown"].get<bool>();
      },
      kWaitS, "the harm to be shown");
  EXPECT_TRUE(tv["harm_fresh"].get<bool>());
  double harm_sum = 0;
  for (const json& b : tv["overview"]["bins"]) harm_sum += b["harm"].get<double>();
  EXPECT_NEAR(harm_sum,
              tv["a_harm"]["kept_sum"].get<double>() + tv["a_harm"]["dropped_sum"].get<double>(),
              1e-9 * harm_sum);
  EXPECT_GT(tv["a_harm"]["dropped_count"].get<int>(), 0);

  step("the zoom is in the saved session");
  {
    const fs::path p = dir_ / "autosave.json";
    json saved;
    for (int i = 0; i < 200; ++i) {
      if (fs::exists(p)) {
        try {
          std::ifstream in(p);
          saved = json::parse(in);
          if (saved["views"]["tokens"]["zoom"]["first"] == lo && saved["views"]["tokens"]["harm"])
            break;
        } catch (const json::exception&) {
        }
      }
      pause_ms(50);
    }
    EXPECT_EQ(saved["views"]["tokens"]["zoom"]["first"], lo) << saved.dump();
    EXPECT_EQ(saved["views"]["tokens"]["zoom"]["last"], hi);
  }

  step("double-click the overview: the whole sequence");
  st = state();
  double_click(st, "tokens:overview");
  st = wait_for(
      [&](const json&) {
        tv = view_json("tokens");
        return tv["zoom"]["first"] == 0 && tv["zoom"]["last"] == n;
      },
      kWaitS, "the zoom to reset");
}

}  // namespace
