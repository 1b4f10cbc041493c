// Tokens view: the capture's real token text as a wrapped strip, each token coloured by what the
// method did with it (sink, evaluation window, kept shaded by weight, dropped), with an A/B
// comparison of two methods (stacked bands or a difference colouring) and hover details.
#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "app/app_frame.h"
#include "app/app_state.h"
#include "app/colormap.h"
#include "app/plot.h"
#include "app/token_marks.h"
#include "app/view.h"
#include "engine/json_fields.h"

namespace kvscope::app {
namespace {

enum class Mode { A = 0, Stacked = 1, Diff = 2 };

// Kept by both in difference mode: Okabe-Ito yellow, which stays apart from the window's blue,
// A's green and B's purple under the common colour-vision deficiencies (teal did not).
constexpr ImU32 kColBoth = IM_COL32(240, 228, 66, 255);

bool is_light(ImU32 c) {
  return 0.299f * ((c >> IM_COL32_R_SHIFT) & 0xFF) + 0.587f * ((c >> IM_COL32_G_SHIFT) & 0xFF) +
             0.114f * ((c >> IM_COL32_B_SHIFT) & 0xFF) >
         170;
}

std::string csv_escape(const std::string& s) {
  std::string o = "\"";
  for (char c : s) o += c == '"' ? std::string("\"\"") : std::string(1, c);
  return o + "\"";
}

class TokensView final : public View {
 public:
  const char* name() const override { return "tokens"; }
  const char* title() const override { return "Tokens"; }
  const char* help() const override {
    return "The capture's token text, each token coloured by what the method did with it: sinks "
           "amber, evaluation window blue, kept green (darker with more weight), dropped grey. "
           "Modes: A only, A / B stacked, A vs B difference. Hover for weight, score and "
           "attention; click a window token to select that query in the Error view.";
  }

  bool ready(const AppState& s) const override {
    return !s.capture || ((s.run(0) || !s.run_error(0).empty()) &&
                          (!s.settings.ab_enabled || s.run(1) || !s.run_error(1).empty()));
  }

  void draw(AppState& s) override {
    if (!s.info()) {
      ImGui::TextDisabled("No capture open.");
      return;
    }
    std::array<std::unique_ptr<TokenMarks>, 2> marks;
    for (int k = 0; k < 2; ++k)
      if (s.run(k) && (k == 0 || s.settings.ab_enabled))
        marks[k] = std::make_unique<TokenMarks>(token_marks(*s.run(k)));

    // Header: mode, then the legend (the figure starts there); both wrap on narrow windows.
    int mode = static_cast<int>(mode_);
    if (!s.settings.ab_enabled) mode = 0;
    ImGui::BeginDisabled(!s.settings.ab_enabled);
    auto radio_w = [&](const char* t) {
      return ImGui::GetFrameHeight() + ImGui::GetStyle().ItemInnerSpacing.x +
             ImGui::CalcTextSize(t).x;
    };
    ImGui::RadioButton("A only", &mode, 0);
    toolbar_next(radio_w("A / B stacked (top A, bottom B)"));
    ImGui::RadioButton("A / B stacked (top A, bottom B)", &mode, 1);
    toolbar_next(radio_w("A vs B difference"));
    ImGui::RadioButton("A vs B difference", &mode, 2);
    ImGui::EndDisabled();
    if (s.settings.ab_enabled) mode_ = static_cast<Mode>(mode);
    mark_figure_top();  // figure exports: legend and strip, not the mode buttons
    const float sw = ImGui::GetTextLineHeight() + 4;  // swatch + gap before its text
    auto swatch_w = [&](const std::string& t) { return sw + ImGui::CalcTextSize(t.c_str()).x; };
    legend_swatch(kColSink, "sink");
    toolbar_next(swatch_w("eval window"));
    legend_swatch(kColWindow, "eval window");
    toolbar_next(swatch_w("kept, weight 1") + swatch_w("... max weight") + 8);
    legend_swatch(IM_COL32(150, 215, 165, 255), "kept, weight 1");
    ImGui::SameLine(0, 4);
    legend_swatch(IM_COL32(20, 150, 60, 255), "... max weight");
    toolbar_next(swatch_w("dropped"));
    legend_swatch(kColDropped, "dropped");
    toolbar_next(swatch_w("selected query"));
    ImVec2 p = ImGui::GetCursorScreenPos();
    float h = ImGui::GetTextLineHeight();
    ImGui::GetWindowDrawList()->AddRect(ImVec2(p.x, p.y + 1), ImVec2(p.x + h, p.y + h - 1),
                                        kColQuery, 0, 0, 2);
    ImGui::Dummy(ImVec2(h, h));
    ImGui::SameLine(0, 4);
    ImGui::TextUnformatted("selected query");

    if (mode == 2) {
      legend_swatch(kColBoth, "kept by both");
      const std::string only_a = "only A: " + s.method_name(0),
                        only_b = "only B: " + s.method_name(1);
      toolbar_next(swatch_w(only_a));
      legend_swatch(kColSlot[0], only_a.c_str());
      toolbar_next(swatch_w(only_b));
      legend_swatch(kColSlot[1], only_b.c_str());
      toolbar_next(swatch_w("neither"));
      legend_swatch(kColDropped, "neither");
    }

    for (int k = 0; k < (s.settings.ab_enabled ? 2 : 1); ++k) {
      legend_swatch(kColSlot[k], (std::string(k == 0 ? "A: " : "B: ") + s.method_name(k)).c_str());
      ImGui::SameLine();
      if (!s.run_error(k).empty())
        ImGui::TextColored(ImVec4(1, 0.45f, 0.45f, 1), "%s", s.run_error(k).c_str());
      else if (!s.run(k))
        ImGui::TextDisabled("running...");
      else {
        const HeadRun& r = *s.run(k);
        const bool stale = s.result(k == 0 ? kFocusA : kFocusB).stale();
        ImGui::TextDisabled("keeps %zu of %d middle tokens, weights up to %.3g, rel. error %.4f%s",
                            r.selection.indices.size(), r.window.n_mid, marks[k]->max_weight,
                            r.mean_relative, stale ? "  [stale: running for new settings]" : "");
      }
    }
    ImGui::Separator();
    draw_strip(s, marks, static_cast<Mode>(mode));
  }

  nlohmann::json export_json(const AppState& s) const override {
    if (!s.info() || !s.run(0)) return nullptr;
    nlohmann::json toks = nlohmann::json::array();
    std::array<std::unique_ptr<TokenMarks>, 2> marks;
    for (int k = 0; k < 2; ++k)
      if (s.run(k)) marks[k] = std::make_unique<TokenMarks>(token_marks(*s.run(k)));
    for (int i = 0; i < s.num_tokens(); ++i) {
      nlohmann::json t = {
          {"index", i},
          {"text", s.info()->tokens.size() > static_cast<size_t>(i) ? s.info()->tokens[i] : ""}};
      for (int k = 0; k < 2; ++k) {
        if (!marks[k]) continue;
        std::string pre = k == 0 ? "a_" : "b_";
        t[pre + "kind"] = token_kind_name(marks[k]->kind[i]);
        t[pre + "weight"] = marks[k]->weight[i];
        if (std::isfinite(marks[k]->score[i])) t[pre + "score"] = marks[k]->score[i];
      }
      toks.push_back(t);
    }
    return {{"layer", s.settings.focus.layer},     {"kv_head", s.settings.focus.kv_head},
            {"method_a", s.method_name(0)},        {"method_b", s.run(1) ? s.method_name(1) : ""},
            {"keep_ratio", s.settings.keep_ratio}, {"tokens", toks}};
  }

  std::string export_csv(const AppState& s) const override {
    if (!s.info() || !s.run(0)) return {};
    std::array<std::unique_ptr<TokenMarks>, 2> marks;
    for (int k = 0; k < 2; ++k)
      if (s.run(k)) marks[k] = std::make_unique<TokenMarks>(token_marks(*s.run(k)));
    std::ostringstream o;
    o << "index,text,a_kind,a_weight,a_score,b_kind,b_weight,b_score\n";
    const char* kinds[] = {"sink", "window", "kept", "dropped"};
    for (int i = 0; i < s.num_tokens(); ++i) {
      o << i << ","
        << csv_escape(i < static_cast<int>(s.info()->tokens.size()) ? s.info()->tokens[i] : "");
      for (int k = 0; k < 2; ++k) {
        if (!marks[k]) {
          o << ",,,";
          continue;
        }
        o << "," << kinds[static_cast<int>(marks[k]->kind[i])] << "," << marks[k]->weight[i] << ",";
        if (std::isfinite(marks[k]->score[i])) o << marks[k]->score[i];
      }
      o << "\n";
    }
    return o.str();
  }

  nlohmann::json save_state() const override { return {{"mode", static_cast<int>(mode_)}}; }
  void load_state(const nlohmann::json& j) override {
    // A wrong type or value throws InputError naming "views.tokens.mode" (AppUi::load_session).
    mode_ = static_cast<Mode>(JsonField(j, "session", "views.tokens").get("mode", 1, 0, 2));
  }

 private:
  ImU32 diff_colour(const std::array<std::unique_ptr<TokenMarks>, 2>& m, int i) const {
    TokenKind a = m[0]->kind[i], b = m[1]->kind[i];
    if (a == TokenKind::Sink) return kColSink;
    if (a == TokenKind::Window) return kColWindow;
    bool ka = a == TokenKind::Kept, kb = b == TokenKind::Kept;
    if (ka && kb) return kColBoth;
    if (ka) return kColSlot[0];
    if (kb) return kColSlot[1];
    return kColDropped;
  }

  void draw_strip(AppState& s, const std::array<std::unique_ptr<TokenMarks>, 2>& marks, Mode mode) {
    const int n = s.num_tokens();
    const CaptureInfo& ci = *s.info();
    // Token widths are cached per capture and font size (measuring text each frame costs with
    // many tokens); a UI scale change measures again (issue 24: boxes clipped at 2x).
    if (cached_path_ != ci.path || static_cast<int>(widths_.size()) != n ||
        cached_font_px_ != ImGui::GetFontSize()) {
      cached_path_ = ci.path;
      cached_font_px_ = ImGui::GetFontSize();
      widths_.resize(static_cast<size_t>(n));
      texts_.resize(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) {
        std::string t = s.token_text(i);
        if (t.empty()) t = std::string("#").append(std::to_string(i));  // GCC 12 -Wrestrict
        texts_[static_cast<size_t>(i)] = t;
        widths_[static_cast<size_t>(i)] = std::max(px(8), ImGui::CalcTextSize(t.c_str()).x + px(6));
      }
    }
    ImGui::BeginChild("##strip", ImVec2(0, 0), false);
    ImDrawList* dl = ImGui::GetWindowDrawList();
    const float avail = ImGui::GetContentRegionAvail().x;
    const float lh = ImGui::GetTextLineHeight();
    const float cell_h = lh + (mode == Mode::Stacked ? 12.0f : 6.0f);
    const float gap = 3.0f, row_h = cell_h + gap;
    ImVec2 origin = ImGui::GetCursorScreenPos();
    const float clip_top = ImGui::GetWindowPos().y,
                clip_bottom = clip_top + ImGui::GetWindowSize().y;
    float x = 0, y = 0;
    int hovered = -1;
    ImVec2 mouse = ImGui::GetIO().MousePos;
    bool window_hovered = ImGui::IsWindowHovered();
    const int q = s.effective_query();
    for (int i = 0; i < n; ++i) {
      float w = widths_[static_cast<size_t>(i)];
      if (x + w > avail && x > 0) {
        x = 0;
        y += row_h;
      }
      ImVec2 a(origin.x + x, origin.y + y), b(a.x + w, a.y + cell_h);
      x += w + gap;
      if (b.y < clip_top || a.y > clip_bottom) continue;
      ImU32 top, bottom;
      if (!marks[0]) {
        top = bottom = IM_COL32(45, 48, 54, 255);
      } else if (mode == Mode::Diff && marks[1]) {
        top = bottom = diff_colour(marks, i);
      } else {
        top = token_colour(*marks[0], i);
        bottom = (mode == Mode::Stacked && marks[1]) ? token_colour(*marks[1], i, 1) : top;
      }
      if (top == bottom) {
        dl->AddRectFilled(a, b, top, 2.0f);
      } else {
        float mid = (a.y + b.y) / 2;
        dl->AddRectFilled(a, ImVec2(b.x, mid), top, 2.0f, ImDrawFlags_RoundCornersTop);
        dl->AddRectFilled(ImVec2(a.x, mid), b, bottom, 2.0f, ImDrawFlags_RoundCornersBottom);
      }
      // Light text with a dark shadow reads on every category colour.
      const char* t = texts_[static_cast<size_t>(i)].c_str();
      ImVec2 tp(a.x + 3, (a.y + b.y - lh) / 2);
      if (is_light(top) && is_light(bottom)) {
        dl->AddText(tp, IM_COL32(15, 15, 15, 255), t);  // dark on light cells (kept by both)
      } else {
        dl->AddText(ImVec2(tp.x + 1, tp.y + 1), IM_COL32(0, 0, 0, 200), t);
        dl->AddText(tp, IM_COL32(250, 250, 250, 255), t);
      }
      if (i == q) dl->AddRect(a, b, kColQuery, 2.0f, 0, 2.5f);
      if (s.selected_tokens.count(i)) dl->AddRect(a, b, kColSelect, 2.0f, 0, 2.0f);
      if (i == s.selected_token) dl->AddRect(a, b, kColSelect, 2.0f, 0, 1.0f);
      if (window_hovered && mouse.x >= a.x && mouse.x < b.x && mouse.y >= a.y && mouse.y < b.y)
        hovered = i;
      if (i == s.hovered_token && hovered != i) dl->AddRect(a, b, kColHover, 2.0f, 0, 2.0f);
    }
    ImGui::SetCursorScreenPos(origin);
    ImGui::Dummy(ImVec2(avail, y + row_h));
    if (hovered >= 0) {
      s.hovered_token = hovered;
      tooltip(s, marks, hovered);
      if (ImGui::IsMouseClicked(ImGuiMouseButton_Left)) {
        s.selected_token = hovered;
        EvalWindow w = s.window();
        if (hovered >= w.n - w.eval) {
          s.settings.selected_query = hovered;
        }
      }
    }
    ImGui::EndChild();
  }

  void tooltip(const AppState& s, const std::array<std::unique_ptr<TokenMarks>, 2>& marks, int i) {
    ImGui::BeginTooltip();
    ImGui::Text("token %d: \"%s\"", i, s.token_text(i).c_str());
    for (int k = 0; k < 2; ++k) {
      if (!marks[k]) continue;
      const TokenMarks& m = *marks[k];
      ImGui::Text("%s %s: %s", k == 0 ? "A" : "B", s.method_name(k).c_str(),
                  token_kind_name(m.kind[i]));
      if (m.kind[i] == TokenKind::Kept) {
        if (m.separate)
          ImGui::Text("   weight: numerator %.4g, denominator %.4g", m.weight[i], m.den_weight[i]);
        else
          ImGui::Text("   weight %.4g", m.weight[i]);
      }
      if (std::isfinite(m.score[i])) ImGui::Text("   score %.4g", m.score[i]);
    }
    if (s.query_cmp() && i <= s.query_cmp()->position) {
      const QueryComparison& qc = *s.query_cmp();
      ImGui::Text("attention from query %d (q head %d): exact %.4g, approx (A) %.4g", qc.position,
                  qc.q_head, qc.exact_weights[static_cast<size_t>(i)],
                  qc.approx_weights[static_cast<size_t>(i)]);
    }
    EvalWindow w = s.window();
    if (i >= w.n - w.eval) ImGui::TextDisabled("click: use this query in the Error view");
    ImGui::EndTooltip();
  }

  Mode mode_ = Mode::Stacked;
  std::string cached_path_;
  float cached_font_px_ = 0;
  std::vector<float> widths_;
  std::vector<std::string> texts_;
};

}  // namespace

std::unique_ptr<View> make_tokens_view() {
  return std::make_unique<TokensView>();
}

}  // namespace kvscope::app
