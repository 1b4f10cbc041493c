// Tokens view: the capture's real token text as a wrapped strip, each token coloured by what the
// method did with it (sink, evaluation window, kept shaded by weight, dropped), with an A/B
// comparison of two methods (stacked bands or a difference colouring) and hover details. Above
// it, an overview of the whole sequence (one bin per pixel column: kept density of A and B, A's
// weight, the exact attention mass and the per-token harm) with brush-to-zoom: the detailed strip
// shows the brushed range. The harm (engine/eval/token_harm.h) is a planned result ("tokens.harm").
// docs/app.md, "Tokens view".
#include <imgui.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "app/app_state.h"
#include "app/colormap.h"
#include "app/plot.h"
#include "app/result_status.h"
#include "app/token_marks.h"
#include "app/ui_layout.h"
#include "app/views/view.h"
#include "app/views/view_jobs.h"
#include "engine/eval/token_harm.h"
#include "engine/io/json_fields.h"

namespace kvscope::app {
namespace {

enum class Mode { A = 0, Stacked = 1, Diff = 2 };

// The harm and exact attention mass of the focused head (engine/eval/token_harm.h).
constexpr const char* kHarm = "tokens.harm";
// Columns of the exported overview when the view was never drawn (headless exports).
constexpr int kDefaultColumns = 512;

// The harm of the focused head, window and capture only: another head's (while the new one
// computes) is not shown as this one's.
const TokenHarm* harm_of(const AppState& s) {
  const Result& r = s.result(kHarm);
  return r.key == r.want ? r.get<TokenHarm>() : nullptr;
}

// The per-head budget of a layer-level wrapper that varies it (adakv(...)): the head's own
// kept count against the uniform budget m. False for methods that keep m in every head.
bool varies_head_budget(const std::string& method) {
  return method.rfind("adakv(", 0) == 0;
}

nlohmann::json bins_json(const std::vector<OverviewBin>& bins, bool with_b) {
  nlohmann::json out = nlohmann::json::array();
  for (const OverviewBin& b : bins) {
    nlohmann::json j = {{"first", b.first},         {"last", b.last},     {"middle", b.middle},
                        {"sinks", b.sinks},         {"window", b.window}, {"kept_a", b.kept[0]},
                        {"weight_a", b.weight_sum}, {"mass", b.mass},     {"harm", b.harm}};
    if (with_b) j["kept_b"] = b.kept[1];
    out.push_back(j);
  }
  return out;
}

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

// What the harm job reads: the focused head (capture, layer, kv head) and the window (sinks and
// evaluation queries, as fitted to the capture).
struct HarmInput {
  uint64_t capture = 0;
  int layer = 0, kv_head = 0, sink = 0, eval = 0;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(HarmInput, capture, layer, kv_head, sink, eval)

std::shared_ptr<const TokenHarm> run_harm(const HarmInput& in, const LayerRef& h, JobContext& ctx,
                                          const JobPlan::PartialFn&) {
  const size_t kv = static_cast<size_t>(in.kv_head);
  return std::make_shared<TokenHarm>(token_harm(harm_queries(*h.layer, in.kv_head),
                                                h.layer->keys[kv], h.layer->values[kv], in.sink,
                                                in.eval, ctx.cancel_flag()));
}

class TokensView final : public View {
 public:
  const char* name() const override { return "tokens"; }
  const char* title() const override { return "Tokens"; }
  const char* help() const override {
    return "The capture's token text, each token coloured by what the method did with it: sinks "
           "amber, evaluation window blue, kept green (darker with more weight), dropped grey. "
           "Modes: A only, A / B stacked, A vs B difference. The overview strip on top shows the "
           "whole sequence, one bin per pixel column (kept density of A and B, A's weight, the "
           "exact attention mass, the harm): drag across it to show that range below, "
           "double-click it for the whole sequence. 'Harm' adds each middle token's harm, the "
           "exact relative output change of evicting it alone, as a band under it. Hover for "
           "weight, score, harm and attention; click a window token to select that query in the "
           "Error view.";
  }

  bool ready(const AppState& s) const override {
    return !s.capture || ((s.run(0) || !s.run_error(0).empty()) &&
                          (!s.settings.ab_enabled || s.run(1) || !s.run_error(1).empty()));
  }

  // The harm and mass of the focused head: they depend on the capture, head and window only.
  void plan(const AppState& s, std::vector<NamedPlan>& out) const override {
    JobPlan p;
    if (!s.capture) {
      out.emplace_back(kHarm, p);
      return;
    }
    const CaptureInfo& ci = *s.info();
    const Focus f = s.settings.focus;
    const EvalWindow w = s.window();
    std::shared_ptr<const LayerData> layer = s.focus_layer();
    p.derive(kHarm, HarmInput{s.capture_id, f.layer, f.kv_head, w.sink, w.eval},
             LayerRef{layer, nullptr}, &run_harm);
    std::string why;
    if (!layer)
      p.waiting = "loading layer " + std::to_string(f.layer);
    else if (s.focus_refused(&why))
      p.waiting = why;
    p.lane = Lane::Analysis;
    p.label = "token harm";
    p.cost_class = "tokens.harm";
    p.units = static_cast<double>(ci.num_tokens) * w.eval * std::max(1, ci.group_size()) *
              (2.0 * ci.head_dim);
    p.prior_per_unit = 2e-10;
    p.auto_limit_s = 20;
    out.emplace_back(kHarm, p);
  }

  void draw(AppState& s) override {
    const auto t0 = std::chrono::steady_clock::now();
    draw_view(s);
    // The view's own CPU time per frame (exported: the 20 ms frame budget at 128k tokens).
    draw_ms_[draw_count_++ % draw_ms_.size()] =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }

  // The mode radio buttons and the harm toggle.
  void draw_header(AppState& s) {
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
    toolbar_next(ImGui::GetFrameHeight() + ImGui::CalcTextSize("harm").x + px(8));
    ImGui::Checkbox("harm", &show_harm_);
    record_item(s, "tokens:harm");
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip(
          "Harm of a middle token: the exact relative change of the output when it alone is "
          "evicted, mean over the evaluation queries and the head's query heads of "
          "p/(1-p) ||o - v|| / ||o|| (docs/app.md)");
    if (show_harm_) {
      ImGui::SameLine();
      if (!draw_result_status(s, kHarm, "token harm")) ImGui::NewLine();  // undoes SameLine
    }
  }

  void draw_view(AppState& s) {
    if (!s.info()) {
      ImGui::TextDisabled("No capture open.");
      return;
    }
    // Marks, the harm's scale and the overview's bins: once per result, not per frame.
    std::array<std::shared_ptr<const HeadRun>, 2> runs;
    for (int k = 0; k < 2; ++k)
      if (k == 0 || s.settings.ab_enabled) runs[k] = s.run_ptr(k);
    std::shared_ptr<const TokenHarm> harm = harm_of(s) ? s.result(kHarm).ptr<TokenHarm>() : nullptr;
    if (harm && static_cast<int>(harm->mass.size()) != s.num_tokens()) harm = nullptr;
    for (int k = 0; k < 2; ++k)
      if (runs[k] != marks_run_[k]) {
        marks_run_[k] = runs[k];
        marks_[k] = runs[k] ? std::make_unique<TokenMarks>(token_marks(*runs[k])) : nullptr;
        bins_.clear();
      }
    if (harm != harm_) {
      harm_ = harm;
      if (harm_) harm_range(*harm_, &harm_lo_, &harm_hi_);
      bins_.clear();
    }
    const std::array<std::unique_ptr<TokenMarks>, 2>& marks = marks_;
    const bool show_harm = show_harm_ && harm_ != nullptr;

    // Header: mode, then the legend (the figure starts there); both wrap on narrow windows. A
    // presentation shows the legend and the strips only.
    if (!presenting_view()) draw_header(s);
    const int mode = s.settings.ab_enabled ? static_cast<int>(mode_) : 0;
    mark_figure_top();  // figure exports: legend and strips, not the mode buttons or the toggle
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

    if (show_harm_ && harm_) {
      char lo[32], hi[32];
      std::snprintf(lo, sizeof lo, "harm %.2g", harm_lo_);
      std::snprintf(hi, sizeof hi, "... %.2g", harm_hi_);
      toolbar_next(swatch_w(lo) + swatch_w(hi) + 8);
      legend_swatch(harm_colour(harm_lo_, harm_lo_, harm_hi_), lo);
      ImGui::SameLine(0, 4);
      legend_swatch(harm_colour(harm_hi_, harm_lo_, harm_hi_), hi);
    }

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
      else if (!s.run(k)) {
        // Running (progress, Cancel), or waiting for a Run click with its estimate.
        if (!draw_result_status(s, k == 0 ? kFocusA : kFocusB,
                                k == 0 ? "focused run A" : "focused run B"))
          ImGui::TextDisabled("waiting...");
      } else {
        const HeadRun& r = *s.run(k);
        const bool stale = s.result(k == 0 ? kFocusA : kFocusB).stale();
        // Pieces that wrap to the next line where the panel is too narrow (no sideways scroll).
        char buf[160];
        auto piece = [&](bool first) {
          if (!first) toolbar_next(ImGui::CalcTextSize(buf).x);
          ImGui::TextDisabled("%s", buf);
        };
        std::snprintf(buf, sizeof buf, "keeps %zu of %d middle tokens, weights up to %.3g,",
                      r.selection.indices.size(), r.window.n_mid, marks[k]->max_weight);
        piece(true);
        std::snprintf(buf, sizeof buf, "rel. error %.4f%s", r.mean_relative,
                      stale ? "  [stale: running for new settings]" : "");
        piece(false);
        if (varies_head_budget(s.method_name(k))) {
          const double kept = static_cast<double>(r.selection.indices.size());
          std::snprintf(
              buf, sizeof buf, "this head's budget %zu, uniform %d (%+.0f%%)",
              r.selection.indices.size(), r.window.budget,
              r.window.budget > 0 ? 100.0 * (kept - r.window.budget) / r.window.budget : 0.0);
          piece(false);
        }
        if (harm_) {
          const HarmSplit hs = harm_split(*harm_, r.selection);
          std::snprintf(buf, sizeof buf, "harm kept %.3g / dropped %.3g", hs.kept_sum,
                        hs.dropped_sum);
          piece(false);
        }
      }
    }
    draw_overview(s, marks, show_harm);
    ImGui::Separator();
    draw_strip(s, marks, static_cast<Mode>(mode), show_harm);
  }

  nlohmann::json export_json(const AppState& s) const override {
    if (!s.info() || !s.run(0)) return nullptr;
    nlohmann::json toks = nlohmann::json::array();
    std::array<std::unique_ptr<TokenMarks>, 2> marks;
    for (int k = 0; k < 2; ++k)
      if (s.run(k)) marks[k] = std::make_unique<TokenMarks>(token_marks(*s.run(k)));
    const TokenHarm* harm = harm_of(s);
    if (harm && static_cast<int>(harm->mass.size()) != s.num_tokens()) harm = nullptr;
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
      if (harm) {
        t["mass"] = harm->mass[static_cast<size_t>(i)];
        const int m = i - harm->sink;
        if (m >= 0 && m < static_cast<int>(harm->harm.size()) &&
            std::isfinite(harm->harm[static_cast<size_t>(m)]))
          t["harm"] = harm->harm[static_cast<size_t>(m)];
      }
      toks.push_back(t);
    }
    nlohmann::json out = {{"layer", s.settings.focus.layer},
                          {"kv_head", s.settings.focus.kv_head},
                          {"method_a", s.method_name(0)},
                          {"method_b", s.run(1) ? s.method_name(1) : ""},
                          {"keep_ratio", s.settings.keep_ratio},
                          {"harm_shown", show_harm_},
                          {"harm_fresh", harm && s.result(kHarm).fresh()},
                          {"tokens", toks}};
    const auto [lo, hi] = zoom_range(s.num_tokens());
    out["zoom"] = {{"first", lo}, {"last", hi}};
    // The slowest of the view's last frames (its own drawing, CPU; not the GPU's rendering).
    const size_t frames = std::min(draw_count_, draw_ms_.size());
    out["draw_ms_max_recent"] =
        frames ? *std::max_element(draw_ms_.begin(), draw_ms_.begin() + static_cast<long>(frames))
               : 0.0;
    for (int k = 0; k < 2; ++k) {
      if (!s.run(k)) continue;
      const HeadRun& r = *s.run(k);
      const std::string pre = k == 0 ? "a_" : "b_";
      out[pre + "kept"] = r.selection.indices.size();
      out[pre + "head_budget"] = r.selection.indices.size();
      out[pre + "uniform_budget"] = r.window.budget;
      out[pre + "varies_head_budget"] = varies_head_budget(s.method_name(k));
      if (harm) {
        const HarmSplit hs = harm_split(*harm, r.selection);
        out[pre + "harm"] = {{"kept_sum", hs.kept_sum},     {"dropped_sum", hs.dropped_sum},
                             {"kept_mean", hs.kept_mean},   {"dropped_mean", hs.dropped_mean},
                             {"kept_count", hs.kept_count}, {"dropped_count", hs.dropped_count}};
      }
    }
    const int columns = columns_ > 0 ? columns_ : kDefaultColumns;
    const std::vector<OverviewBin> bins =
        overview_bins(s.num_tokens(), columns, marks[0].get(), marks[1].get(), harm);
    out["overview"] = {{"columns", static_cast<int>(bins.size())},
                       {"bins", bins_json(bins, marks[1] != nullptr)}};
    return out;
  }

  std::string export_csv(const AppState& s) const override {
    if (!s.info() || !s.run(0)) return {};
    std::array<std::unique_ptr<TokenMarks>, 2> marks;
    for (int k = 0; k < 2; ++k)
      if (s.run(k)) marks[k] = std::make_unique<TokenMarks>(token_marks(*s.run(k)));
    std::ostringstream o;
    const TokenHarm* harm = harm_of(s);
    if (harm && static_cast<int>(harm->mass.size()) != s.num_tokens()) harm = nullptr;
    o << "index,text,a_kind,a_weight,a_score,b_kind,b_weight,b_score,mass,harm\n";
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
      o << ",";
      if (harm) o << harm->mass[static_cast<size_t>(i)];
      o << ",";
      const int m = harm ? i - harm->sink : -1;
      if (harm && m >= 0 && m < static_cast<int>(harm->harm.size()))
        o << harm->harm[static_cast<size_t>(m)];
      o << "\n";
    }
    return o.str();
  }

  nlohmann::json save_state() const override {
    return {{"mode", static_cast<int>(mode_)},
            {"harm", show_harm_},
            {"zoom", {{"first", zoom_lo_}, {"last", zoom_hi_}}}};
  }
  void load_state(const nlohmann::json& j) override {
    // A wrong type or value throws InputError naming the field, e.g. "views.tokens.mode"
    // (AppUi::load_session); nothing changes then.
    const JsonField f(j, "session", "views.tokens");
    const int mode = f.get("mode", 1, 0, 2);
    const bool harm = f.get("harm", false);
    int lo = -1, hi = -1;  // -1: the whole sequence
    if (const std::optional<JsonField> z = f.find("zoom")) {
      lo = z->get("first", -1, -1, 1 << 30);
      hi = z->get("last", -1, -1, 1 << 30);
      if (lo >= 0 && hi >= 0 && hi <= lo) z->fail("last must be above first");
    }
    mode_ = static_cast<Mode>(mode);
    show_harm_ = harm;
    zoom_lo_ = lo;
    zoom_hi_ = hi;
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

  // The detailed strip's tokens: the brushed range, or the whole sequence.
  std::pair<int, int> zoom_range(int n) const {
    if (zoom_lo_ < 0 || zoom_hi_ <= zoom_lo_ || zoom_hi_ > n) return {0, n};
    return {zoom_lo_, zoom_hi_};
  }

  // The overview of the whole sequence: one bin per pixel column, rows for A's and B's kept
  // density, A's mean weight, the exact attention mass and (when shown) the harm; drag across it
  // to zoom the detailed strip, double-click for the whole sequence.
  void draw_overview(AppState& s, const std::array<std::unique_ptr<TokenMarks>, 2>& marks,
                     bool show_harm) {
    const int n = s.num_tokens();
    if (n <= 0) return;
    const bool with_b = marks[1] != nullptr;
    std::vector<std::pair<int, const char*>> rows = {{0, "A kept"}};
    if (with_b) rows.emplace_back(1, "B kept");
    rows.emplace_back(2, "A weight");
    rows.emplace_back(3, "attention");
    if (show_harm) rows.emplace_back(4, "harm");
    float label_w = 0;
    for (const auto& r : rows) label_w = std::max(label_w, ImGui::CalcTextSize(r.second).x);
    label_w += px(8);
    const float avail = ImGui::GetContentRegionAvail().x;
    const float plot_w = std::max(px(60), avail - label_w);
    const int columns = std::max(1, static_cast<int>(plot_w));
    if (bins_.empty() || columns != columns_) {
      columns_ = columns;
      bins_ = overview_bins(n, columns, marks[0].get(), marks[1].get(), harm_.get());
      max_mass_ = max_harm_ = 0;
      for (const OverviewBin& b : bins_) {
        max_mass_ = std::max(max_mass_, b.mass);
        if (std::isfinite(b.harm)) max_harm_ = std::max(max_harm_, b.harm);
      }
    }
    ImDrawList* dl = ImGui::GetWindowDrawList();
    const float lh = ImGui::GetTextLineHeight();
    const float row_h = std::max(px(7), std::round(lh * 0.75f)), row_gap = px(2);
    const ImVec2 o = ImGui::GetCursorScreenPos();
    const float x0 = o.x + label_w;
    const float total_h = static_cast<float>(rows.size()) * (row_h + row_gap);
    const double max_w = marks[0] ? marks[0]->max_weight : 1.0;
    auto x_of = [&](int token) {
      return x0 + static_cast<float>(static_cast<double>(token) / n * plot_w);
    };
    // Log scale over four decades below the largest bin: sinks hold much of the mass.
    auto log_t = [](double v, double mx) {
      return v > 0 && mx > 0 ? std::clamp(1.0 + std::log10(v / mx) / 4.0, 0.0, 1.0) : 0.0;
    };
    for (size_t r = 0; r < rows.size(); ++r) {
      const float y = o.y + static_cast<float>(r) * (row_h + row_gap);
      dl->AddText(ImVec2(o.x, y + (row_h - lh) / 2), kColAxisText, rows[r].second);
      dl->AddRectFilled(ImVec2(x0, y), ImVec2(x0 + plot_w, y + row_h), kColPlotBg);
      const int what = rows[r].first;
      if ((what == 3 || what == 4) && !harm_) continue;
      for (const OverviewBin& b : bins_) {
        const float xa = x_of(b.first), xb = std::max(x_of(b.last), xa + 1.0f);
        ImU32 c = 0;
        float top = y;
        if (what <= 1) {
          if (!marks[what]) continue;
          if (b.middle == 0)
            c = b.sinks > 0 ? kColSink : kColWindow;
          else
            c = lerp_colour(kColDropped, kColSlot[what],
                            static_cast<float>(b.kept[static_cast<size_t>(what)]) / b.middle);
        } else if (what == 2) {
          if (!marks[0] || b.kept[0] == 0) continue;
          const double mw = b.weight_sum / b.kept[0];
          const double t = max_w > 1 ? std::log(std::max(mw, 1e-9)) / std::log(max_w) : 1.0;
          c = lerp_colour(IM_COL32(150, 215, 165, 255), IM_COL32(20, 150, 60, 255),
                          static_cast<float>(std::clamp(t, 0.0, 1.0)));
        } else if (what == 3) {
          const double t = log_t(b.mass, max_mass_);
          if (t <= 0) continue;
          top = y + row_h * static_cast<float>(1 - t);
          c = kColExact;
        } else {
          if (b.middle == 0) continue;
          const double t = std::isfinite(b.harm) ? log_t(b.harm, max_harm_) : 1.0;
          if (t <= 0) continue;
          top = y + row_h * static_cast<float>(1 - t);
          c = colormap(Colormap::Magma, 0.12 + 0.88 * t);
        }
        dl->AddRectFilled(ImVec2(xa, top), ImVec2(xb, y + row_h), c);
      }
    }
    // The range the detailed strip shows, and the brush being dragged.
    const auto [lo, hi] = zoom_range(n);
    const float za = x_of(lo), zb = x_of(hi);
    const ImU32 dim = IM_COL32(0, 0, 0, 150);
    if (za > x0) dl->AddRectFilled(ImVec2(x0, o.y), ImVec2(za, o.y + total_h), dim);
    if (zb < x0 + plot_w)
      dl->AddRectFilled(ImVec2(zb, o.y), ImVec2(x0 + plot_w, o.y + total_h), dim);
    dl->AddRect(ImVec2(za, o.y - 1), ImVec2(zb, o.y + total_h), kColHover, 0, 0, 1.5f);
    ImGui::SetCursorScreenPos(ImVec2(x0, o.y));
    ImGui::InvisibleButton("##overview", ImVec2(plot_w, total_h));
    record_item(s, "tokens:overview");
    const float mx = ImGui::GetIO().MousePos.x;
    auto bin_at = [&](float x) {
      const int nb = static_cast<int>(bins_.size());
      const int t = std::clamp(static_cast<int>((x - x0) / plot_w * n), 0, n - 1);
      // the bin holding token t (bins are equal-width ranges of tokens)
      int c = std::clamp(static_cast<int>(static_cast<long long>(t) * nb / n), 0, nb - 1);
      while (c > 0 && bins_[static_cast<size_t>(c)].first > t) --c;
      while (c + 1 < nb && bins_[static_cast<size_t>(c)].last <= t) ++c;
      return c;
    };
    if (ImGui::IsItemActivated()) brush_x_ = mx;
    if (ImGui::IsItemActive() && std::abs(mx - brush_x_) >= 3) {
      const float a = std::clamp(std::min(mx, brush_x_), x0, x0 + plot_w),
                  b = std::clamp(std::max(mx, brush_x_), x0, x0 + plot_w);
      dl->AddRectFilled(ImVec2(a, o.y), ImVec2(b, o.y + total_h), IM_COL32(255, 230, 60, 60));
      dl->AddRect(ImVec2(a, o.y), ImVec2(b, o.y + total_h), kColSelect, 0, 0, 1.5f);
    }
    if (ImGui::IsItemDeactivated() && std::abs(mx - brush_x_) >= 3 && !bins_.empty()) {
      const int ca = bin_at(std::min(mx, brush_x_)), cb = bin_at(std::max(mx, brush_x_));
      zoom_lo_ = bins_[static_cast<size_t>(ca)].first;
      zoom_hi_ = bins_[static_cast<size_t>(cb)].last;
      if (zoom_lo_ == 0 && zoom_hi_ == n) zoom_lo_ = zoom_hi_ = -1;
      scroll_top_ = true;
    }
    if (ImGui::IsItemHovered() && ImGui::IsMouseDoubleClicked(ImGuiMouseButton_Left)) {
      zoom_lo_ = zoom_hi_ = -1;
      scroll_top_ = true;
    }
    if (ImGui::IsItemHovered() && !ImGui::IsItemActive() && !bins_.empty()) {
      const OverviewBin& b = bins_[static_cast<size_t>(bin_at(mx))];
      ImGui::BeginTooltip();
      ImGui::Text("tokens %d-%d", b.first, b.last - 1);
      if (b.middle > 0) {
        ImGui::Text("A keeps %d of %d middle tokens", b.kept[0], b.middle);
        if (with_b) ImGui::Text("B keeps %d of %d", b.kept[1], b.middle);
      }
      if (b.sinks) ImGui::Text("%d sink token%s", b.sinks, b.sinks == 1 ? "" : "s");
      if (b.window) ImGui::Text("%d evaluation window token%s", b.window, b.window == 1 ? "" : "s");
      if (harm_) {
        ImGui::Text("exact attention mass %.4g", b.mass);
        if (b.middle > 0) ImGui::Text("harm (sum) %.4g", b.harm);
      }
      ImGui::TextDisabled("drag: show a range below; double-click: the whole sequence");
      ImGui::EndTooltip();
    }
    ImGui::SetCursorScreenPos(ImVec2(o.x, o.y + total_h + px(2)));
    ImGui::TextDisabled("tokens %d-%d of %d%s", lo, hi - 1, n,
                        lo == 0 && hi == n ? "  (drag across the overview to zoom)"
                                           : "  (double-click the overview: all)");
  }

  void draw_strip(AppState& s, const std::array<std::unique_ptr<TokenMarks>, 2>& marks, Mode mode,
                  bool show_harm) {
    const int n = s.num_tokens();
    const CaptureInfo& ci = *s.info();
    // Token widths are cached per capture and font size (measuring text each frame costs with
    // many tokens); a UI scale change measures again (boxes would clip at 2x).
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
    if (scroll_top_) {
      ImGui::SetScrollY(0);
      scroll_top_ = false;
    }
    ImDrawList* dl = ImGui::GetWindowDrawList();
    const float avail = ImGui::GetContentRegionAvail().x;
    const float lh = ImGui::GetTextLineHeight();
    const float cell_h = lh + (mode == Mode::Stacked ? 12.0f : 6.0f);
    const float band_h = show_harm ? std::max(3.0f, px(5)) : 0.0f;  // the harm band under a token
    const float gap = 3.0f, row_h = cell_h + band_h + gap;
    const auto [lo, hi] = zoom_range(n);
    ImVec2 origin = ImGui::GetCursorScreenPos();
    const float clip_top = ImGui::GetWindowPos().y,
                clip_bottom = clip_top + ImGui::GetWindowSize().y;
    float x = 0, y = 0;
    int hovered = -1;
    ImVec2 mouse = ImGui::GetIO().MousePos;
    bool window_hovered = ImGui::IsWindowHovered();
    const int q = s.effective_query();
    for (int i = lo; i < hi; ++i) {
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
      if (show_harm && harm_) {
        const int m = i - harm_->sink;
        if (m >= 0 && m < static_cast<int>(harm_->harm.size()))
          dl->AddRectFilled(ImVec2(a.x, b.y + 1), ImVec2(b.x, b.y + band_h),
                            harm_colour(harm_->harm[static_cast<size_t>(m)], harm_lo_, harm_hi_));
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
    if (harm_) {
      const int m = i - harm_->sink;
      if (m >= 0 && m < static_cast<int>(harm_->harm.size()))
        ImGui::Text("harm of evicting it alone %.4g (mean exact attention %.4g)",
                    harm_->harm[static_cast<size_t>(m)], harm_->mass[static_cast<size_t>(i)]);
      else
        ImGui::Text("mean exact attention %.4g", harm_->mass[static_cast<size_t>(i)]);
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
  bool show_harm_ = false;
  std::array<double, 30> draw_ms_{};
  size_t draw_count_ = 0;
  int zoom_lo_ = -1, zoom_hi_ = -1;  // the detailed strip's tokens [lo, hi); -1: all
  float brush_x_ = 0;
  bool scroll_top_ = false;
  // Per result, not per frame: the marks of the runs shown, the harm's colour scale, the bins.
  std::array<std::shared_ptr<const HeadRun>, 2> marks_run_;
  std::array<std::unique_ptr<TokenMarks>, 2> marks_;
  std::shared_ptr<const TokenHarm> harm_;
  double harm_lo_ = 0, harm_hi_ = 0;
  std::vector<OverviewBin> bins_;
  int columns_ = 0;
  double max_mass_ = 0, max_harm_ = 0;
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
