// Method view: method A (and B for the A/B comparison), keep ratio, each method's parameters
// generated from its ParamSpec list (each slot its own values), seed, sink/eval overrides and
// backend. The view only edits AppState::settings; reconcile() re-runs what the change outdates.
#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "app/app_state.h"
#include "app/colormap.h"
#include "app/method_list.h"
#include "app/plot.h"
#include "app/result_status.h"
#include "app/ui_layout.h"
#include "app/views/view.h"
#include "engine/ops/backend.h"

namespace kvscope::app {
namespace {

void help_marker(const std::string& text) {
  if (text.empty()) return;
  toolbar_next(ImGui::CalcTextSize("(?)").x);
  ImGui::TextDisabled("(?)");
  if (ImGui::IsItemHovered()) {
    ImGui::BeginTooltip();
    ImGui::PushTextWrapPos(ImGui::GetFontSize() * 28);
    ImGui::TextUnformatted(text.c_str());
    ImGui::PopTextWrapPos();
    ImGui::EndTooltip();
  }
}

bool method_combo(AppState& s, const char* label, std::string& name, ParamValues& params) {
  bool changed = false;
  // As tall as the screen allows: every method at once.
  const bool open = ImGui::BeginCombo(label, name.c_str(), ImGuiComboFlags_HeightLargest);
  record_item(s, std::string("combo:") + label);
  if (open) {
    // Every method and wrapper the registry has (app_methods); one the capture cannot run is
    // greyed with the reason (criticalkv needs W_O), and a method that needs W_O is also offered
    // with W_O = I beside it.
    const std::vector<const Method*> all = app_methods();
    std::vector<std::string> names;
    for (const Method* m : all) names.push_back(m->name());
    const MethodColours colours(names);
    std::string family;  // the wrapper of the entries listed last ("" for plain methods)
    for (size_t i = 0; i < all.size(); ++i) {
      const Method* m = all[i];
      const size_t paren = m->name().find('(');
      const std::string wrapper = paren == std::string::npos ? "" : m->name().substr(0, paren);
      if (i > 0 && wrapper != family && !wrapper.empty()) ImGui::Separator();
      family = wrapper;
      ImGui::PushID(static_cast<int>(i));
      legend_swatch(colours(m->name()), "");
      ImGui::SameLine();
      // Greyed, with the reason on hover, when the capture cannot run it (app/method_list.h).
      if (method_selectable(s, *m, m->name() == name,
                            std::string("combo:") + label + ":" + m->name())) {
        name = m->name();
        changed = true;
      }
      // A method that needs W_O is also offered with W_O = I (criticalkv's projection=identity).
      if (const std::optional<ParamValues> alt = without_output_projection(*m)) {
        legend_swatch(colours(m->name()), "");
        ImGui::SameLine();
        const std::string approx = m->name() + " (W_O = I, approximate)";
        if (ImGui::Selectable(approx.c_str(), false)) {
          name = m->name();
          params = *alt;
          changed = true;
        }
        record_item(s, std::string("combo:") + label + ":" + m->name() + ":approximate");
      }
      ImGui::PopID();
    }
    ImGui::EndCombo();
  }
  return changed;
}

// One ParamSpec as a widget; returns true when the value changed.
bool param_widget(AppState& s, const std::string& item, const ParamSpec& p, ParamValues& values) {
  auto it = values.find(p.name);
  double v = it == values.end() ? p.default_value : it->second;
  bool changed = false;
  ImGui::PushID(p.name.c_str());
  // At most 200 px (x UI scale), narrower when the panel is: room for the name and the (?).
  ImGui::SetNextItemWidth(std::max(px(80), std::min(px(200), ImGui::GetContentRegionAvail().x -
                                                                 labelled_width(0, p.name.c_str()) -
                                                                 button_width("(?)") - px(12))));
  switch (p.type) {
    case ParamSpec::Type::Int: {
      int iv = static_cast<int>(std::lround(v));
      if (ImGui::SliderInt(p.name.c_str(), &iv, static_cast<int>(p.min), static_cast<int>(p.max),
                           "%d", p.log_scale ? ImGuiSliderFlags_Logarithmic : 0)) {
        v = iv;
        changed = true;
      }
      break;
    }
    case ParamSpec::Type::Float: {
      // A double slider: a value typed with Ctrl+click (0.05) is kept exactly as the CLI parses
      // it, never rounded through a float.
      double dv = v;
      if (ImGui::SliderScalar(p.name.c_str(), ImGuiDataType_Double, &dv, &p.min, &p.max, "%.4g",
                              p.log_scale ? ImGuiSliderFlags_Logarithmic : 0)) {
        v = dv;
        changed = true;
      }
      break;
    }
    case ParamSpec::Type::Bool: {
      bool b = v != 0;
      if (ImGui::Checkbox(p.name.c_str(), &b)) {
        v = b ? 1 : 0;
        changed = true;
      }
      break;
    }
    case ParamSpec::Type::Choice: {
      int idx = static_cast<int>(std::lround(v));
      const char* cur =
          idx >= 0 && idx < static_cast<int>(p.choices.size()) ? p.choices[idx].c_str() : "?";
      if (ImGui::BeginCombo(p.name.c_str(), cur)) {
        for (int c = 0; c < static_cast<int>(p.choices.size()); ++c)
          if (ImGui::Selectable(p.choices[c].c_str(), c == idx)) {
            v = c;
            changed = true;
          }
        ImGui::EndCombo();
      }
      break;
    }
  }
  std::string help = p.help;
  char range[128];
  if (p.type == ParamSpec::Type::Int || p.type == ParamSpec::Type::Float) {
    std::snprintf(range, sizeof range, "\nrange [%g, %g], default %g", p.min, p.max,
                  p.default_value);
    help += range;
  } else if (p.type == ParamSpec::Type::Bool) {
    help += p.default_value != 0 ? "\ndefault: on" : "\ndefault: off";
  } else if (!p.choices.empty()) {
    int d = static_cast<int>(p.default_value);
    if (d >= 0 && d < static_cast<int>(p.choices.size())) help += "\ndefault: " + p.choices[d];
  }
  record_item(s, item);  // the widget itself, before its help marker
  help_marker(help);
  if (v != p.default_value) {
    ImGui::SameLine();
    if (ImGui::SmallButton("reset")) {
      v = p.default_value;
      changed = true;
    }
  }
  if (changed) {
    if (v == p.default_value)
      values.erase(p.name);
    else
      values[p.name] = v;
  }
  ImGui::PopID();
  return changed;
}

void run_summary(AppState& s, int slot) {
  const char* tag = slot == 0 ? "A" : "B";
  ImGui::PushID(slot);
  legend_swatch(kColSlot[slot], (std::string(tag) + ": " + s.method_name(slot)).c_str());
  const char* name = slot == 0 ? kFocusA : kFocusB;
  const Result& res = s.result(name);
  draw_result_status(s, name, slot == 0 ? "focused run A" : "focused run B");
  if (const HeadRun* rp = s.run(slot)) {
    const HeadRun& r = *rp;
    if (res.stale()) ImGui::PushStyleColor(ImGuiCol_Text, ImVec4(0.6f, 0.6f, 0.6f, 1));
    ImGui::TextWrapped("relative error %.4f   normalised (Eq. 2) %.4g", r.mean_relative,
                       r.mean_normalized);
    size_t kept = r.selection.indices.size();
    ImGui::TextWrapped("kept %zu of %d middle tokens (m = %d)%s   attention mass %.3f", kept,
                       r.window.n_mid, r.window.budget,
                       r.selection.separate ? " [separate num/den sets]" : "", r.mean_mass);
    ImGui::TextDisabled("ran in %.1f ms on the focused head", res.seconds * 1000.0);
    if (r.selection.saturation >= 0)
      ImGui::TextWrapped(
          "walk saturation %.0f%% of steps (p clipped to 0 or 1)%s", 100.0 * r.selection.saturation,
          r.selection.saturation >= 0.9 ? ": nearly deterministic (see temp, gamma)" : "");
    if (!r.selection.note.empty()) ImGui::TextWrapped("note: %s", r.selection.note.c_str());
    // BalanceKV's trace repeats the selection's note; show the trace's only when it adds something.
    if (r.selection.trace && !r.selection.trace->note.empty() &&
        r.selection.trace->note != r.selection.note)
      ImGui::TextWrapped("trace: %s", r.selection.trace->note.c_str());
    if (res.stale()) ImGui::PopStyleColor();
  } else if (res.busy() || !res.waiting.empty()) {
    ImGui::TextDisabled("running...");
  }
  ImGui::PopID();
}

// Method A, its summary, and method B when the A/B comparison is on.
void draw_method_choice(AppState& s) {
  Settings& st = s.settings;
  ImGui::SetNextItemWidth(fit_width(220, "method A"));
  method_combo(s, "method A", st.method[0].name, st.method[0].params);
  if (const Method* m = s.method(0)) ImGui::TextWrapped("%s", m->summary().c_str());
  ImGui::Checkbox("compare with method B", &st.ab_enabled);
  if (st.ab_enabled) {
    ImGui::SetNextItemWidth(fit_width(220, "method B"));
    method_combo(s, "method B", st.method[1].name, st.method[1].params);
  }
}

// The budget as a number of middle tokens m, with the keep ratio and cache size it gives.
void draw_token_budget(AppState& s) {
  Settings& st = s.settings;
  const int n_mid = s.info() ? s.window().n_mid : 0;
  int b = st.budget_tokens;
  ImGui::SetNextItemWidth(fit_width(220, "middle tokens m"));
  if (ImGui::SliderInt("middle tokens m", &b, 1, std::max(1, n_mid), "%d",
                       ImGuiSliderFlags_Logarithmic | ImGuiSliderFlags_AlwaysClamp))
    st.budget_tokens = std::max(1, b);
  record_item(s, "slider:budget tokens");
  if (n_mid > 0) {
    const EvalWindow w = s.window();
    ImGui::TextDisabled("keep ratio %.4f; cache %d + %d + %d = %d entries", st.keep_ratio, w.sink,
                        st.budget_tokens, w.eval, w.sink + st.budget_tokens + w.eval);
  }
}

// Presets: the protocol's ratios, and kvpress's (it counts the fraction removed: 0.25,
// 0.5, 0.75, 0.875, i.e. keep 3/4, 1/2, 1/4, 1/8).
void draw_ratio_presets(AppState& s) {
  Settings& st = s.settings;
  const struct {
    const char* label;
    const std::vector<double>* ratios;
  } presets[] = {{"protocol", parse_ratio_preset("protocol")},
                 {"kvpress", parse_ratio_preset("kvpress")}};
  for (const auto& preset : presets) {
    ImGui::TextDisabled("%-8s", preset.label);
    for (double r : *preset.ratios) {
      ImGui::SameLine(0, 4);
      std::string label = ratio_label(r) + "##" + preset.label;
      bool on = std::fabs(st.keep_ratio - r) < 1e-9;
      if (on)
        ImGui::PushStyleColor(ImGuiCol_Button, ImGui::GetStyleColorVec4(ImGuiCol_ButtonActive));
      if (ImGui::Button(label.c_str(), ImVec2(px(48), 0))) st.keep_ratio = r;
      record_item(s, std::string("method:ratio:") + preset.label + ":" + ratio_label(r));
      if (on) ImGui::PopStyleColor();
    }
    if (preset.ratios == parse_ratio_preset("kvpress"))
      help_marker(
          "kvpress counts the fraction removed (compression_ratio 0.25, 0.5, 0.75, 0.875); "
          "these are the same points as keep ratios.");
  }
}

// The budget as a keep ratio: a logarithmic slider and the preset buttons.
void draw_ratio_budget(AppState& s) {
  Settings& st = s.settings;
  double kr = st.keep_ratio;
  const double kr_min = 1.0 / 64, kr_max = 1.0;
  ImGui::SetNextItemWidth(fit_width(220, "keep ratio"));
  if (ImGui::SliderScalar("keep ratio", ImGuiDataType_Double, &kr, &kr_min, &kr_max, "%.4f",
                          ImGuiSliderFlags_Logarithmic))
    st.keep_ratio = std::clamp(kr, kr_min, kr_max);
  record_item(s, "slider:keep ratio");
  help_marker(
      "Fraction of the middle [s, n-E) a method keeps: m = round(ratio * n_mid). "
      "Every method gets the same m.");
  draw_ratio_presets(s);
}

// The budget: a keep ratio (logarithmic slider, the protocol's and kvpress's ratios as
// buttons) or a number of middle tokens (docs/evaluation.md, "Budgets").
void draw_budget(AppState& s) {
  Settings& st = s.settings;
  int mode = st.budget_mode ? 1 : 0;
  ImGui::TextUnformatted("budget as");
  ImGui::SameLine();
  if (ImGui::RadioButton("keep ratio##mode", &mode, 0)) st.budget_mode = false;
  record_item(s, "method:budget:ratio");
  toolbar_next(ImGui::GetFrameHeight() + labelled_width(0, "tokens"));
  if (ImGui::RadioButton("tokens##mode", &mode, 1)) {
    // Start from the m the current ratio gives, so the switch changes nothing by itself.
    if (!st.budget_mode && s.info()) st.budget_tokens = std::max(1, s.window().budget);
    st.budget_mode = true;
  }
  record_item(s, "method:budget:tokens");
  help_marker(
      "A keep ratio r keeps m = round(r * n_mid) middle tokens; a token budget B keeps m = B "
      "exactly. Either way the s sinks and the E evaluation positions come on top: the cache "
      "holds s + m + E entries. Wrappers that vary the budget per head (adakv) keep m per "
      "head on average over a layer.");
  if (st.budget_mode)
    draw_token_budget(s);
  else
    draw_ratio_budget(s);
}

// The seed, shared by A and B.
void draw_seed(AppState& s) {
  Settings& st = s.settings;
  ImGui::SetNextItemWidth(px(120));
  if (ImGui::InputInt("seed", &st.seed)) st.seed = std::max(0, st.seed);
  record_item(s, "input:seed");
  help_marker(
      "Seed of every random draw (Philox counters): the same seed gives the same "
      "selection on CPU and GPU.");
}

// The focused head, the runs of A (and B) on it, and the background grid's status.
void draw_focused_head(AppState& s) {
  const Settings& st = s.settings;
  ImGui::TextUnformatted("focused head");
  ImGui::SameLine();
  ImGui::TextDisabled("layer %d, kv head %d", st.focus.layer, st.focus.kv_head);
  if (!s.capture) {
    ImGui::TextDisabled("No capture open: the settings apply once one is.");
  } else {
    run_summary(s, 0);
    if (st.ab_enabled) run_summary(s, 1);
    // The background grid.
    draw_result_status(s, kGrid, "grid");
  }
}

// Parameters of each slot: A and B each have their own values, even for the same method.
void draw_method_params(AppState& s) {
  Settings& st = s.settings;
  for (int slot = 0; slot < (st.ab_enabled ? 2 : 1); ++slot) {
    const Method* m = s.method(slot);
    if (!m) continue;
    std::string header = "parameters of " + m->name() + (slot == 0 ? " (A)" : " (B)");
    ImGui::PushID(slot);
    if (ImGui::CollapsingHeader(header.c_str(), ImGuiTreeNodeFlags_DefaultOpen)) {
      auto specs = m->params();
      if (specs.empty()) ImGui::TextDisabled("no parameters");
      ParamValues& pv = st.method[static_cast<size_t>(slot)].params;
      // Values of a method that is no longer in this slot are dropped.
      std::erase_if(pv, [&](const auto& kv) {
        return std::none_of(specs.begin(), specs.end(),
                            [&](const ParamSpec& p) { return p.name == kv.first; });
      });
      for (const ParamSpec& p : specs)
        param_widget(s, std::string("param:") + (slot == 0 ? "A:" : "B:") + p.name, p, pv);
      if (!pv.empty() && ImGui::Button("reset all to defaults")) pv.clear();
      const std::string why = method_unavailable_here(s, *m);
      if (!why.empty()) {
        ImGui::PushStyleColor(ImGuiCol_Text, ImVec4(1, 0.6f, 0.3f, 1));
        ImGui::TextWrapped("not available for this capture: %s", why.c_str());
        ImGui::PopStyleColor();
      }
    }
    ImGui::PopID();
  }
}

// The sink and evaluation-window overrides, and the window they give.
void draw_window_overrides(AppState& s) {
  Settings& st = s.settings;
  const int n = s.num_tokens();
  bool so = st.sink_override >= 0, eo = st.eval_override >= 0;
  EvalWindow def = fit_window(std::max(1, n), st.keep_ratio, -1, -1);
  if (ImGui::Checkbox("override sinks s", &so)) st.sink_override = so ? def.sink : -1;
  if (so) {
    toolbar_next(px(100));
    ImGui::SetNextItemWidth(px(100));
    if (ImGui::InputInt("##sink", &st.sink_override))
      st.sink_override = std::clamp(st.sink_override, 0, std::max(0, n / 2));
  }
  if (ImGui::Checkbox("override eval window E", &eo)) st.eval_override = eo ? def.eval : -1;
  if (eo) {
    toolbar_next(px(100));
    ImGui::SetNextItemWidth(px(100));
    if (ImGui::InputInt("##eval", &st.eval_override))
      st.eval_override = std::clamp(st.eval_override, 1, std::max(1, n / 2));
  }
  if (s.info()) {
    std::string note;
    EvalWindow w = s.window(&note);
    ImGui::TextWrapped("%s", w.describe().c_str());
    if (!note.empty()) ImGui::TextColored(ImVec4(1, 0.8f, 0.3f, 1), "%s", note.c_str());
  }
}

// The evaluation protocol: window overrides, the estimator and the grid's seeds.
void draw_eval_protocol(AppState& s) {
  if (!ImGui::CollapsingHeader("evaluation protocol", ImGuiTreeNodeFlags_DefaultOpen)) return;
  Settings& st = s.settings;
  draw_window_overrides(s);
  bool authors = st.estimator == Estimator::Authors;
  if (ImGui::Checkbox("authors' estimator", &authors))
    st.estimator = authors ? Estimator::Authors : Estimator::Weighted;
  help_marker(
      "The BalanceKV authors' notebook and forward pass: numerator weight w, denominator "
      "weight 2^T on every kept token (T = ceil(log2(1/ratio))). Off: both use w.");
  bool auto_seeds = st.grid_seeds == 0;
  if (ImGui::Checkbox("grid seeds by capture size", &auto_seeds))
    st.grid_seeds = auto_seeds ? 0 : s.grid_seeds();
  if (!auto_seeds) {
    toolbar_next(labelled_width(px(120), "grid seeds"));
    ImGui::SetNextItemWidth(fit_width(120, "grid seeds"));
    ImGui::SliderInt("grid seeds", &st.grid_seeds, 1, 10);
  } else {
    ImGui::SameLine();
    ImGui::TextDisabled("(%d)", s.grid_seeds());
  }
  help_marker(
      "Seeds averaged in the background grid (the Capture view's cells). The paper "
      "uses 10; by default 3 up to 1024 tokens, 2 up to 4096, 1 above, so the grid stays "
      "quick.");
}

// The backend to compute on, the one active and its note.
void draw_backend(AppState& s) {
  Settings& st = s.settings;
  // The header and the combo need IDs of their own: with one label for both, a click on the
  // combo toggled the header's state instead and the list never opened.
  if (!ImGui::CollapsingHeader("Backend##section", ImGuiTreeNodeFlags_DefaultOpen)) return;
  const std::vector<std::string> choices = backend_choices();
  ImGui::SetNextItemWidth(px(120));
  if (ImGui::BeginCombo("compute on##backend", st.backend.c_str())) {
    for (const std::string& c : choices) {
      if (ImGui::Selectable(c.c_str(), c == st.backend)) st.backend = c;
      record_item(s, "method:backend:" + c);
    }
    ImGui::EndCombo();
  }
  record_item(s, "method:backend");
  ImGui::Text("active: %s", s.backend_active.c_str());
  ImGui::TextWrapped("%s", s.backend_note.c_str());
}

class MethodView final : public View {
 public:
  const char* name() const override { return "method"; }
  const char* title() const override { return "Method"; }
  const char* help() const override {
    return "Method A (and B for an A/B comparison), the keep ratio, the seed, each method's own "
           "parameters (with their help, range and default), the evaluation protocol's sinks s "
           "and window E, and the backend. Below the methods: the focused head's error, kept "
           "count and notes, updated as you drag.";
  }
  Panel panel() const override { return Panel::Left; }

  bool ready(const AppState& s) const override {
    if (!s.capture) return true;
    auto done = [&](const char* n) {
      const Result& r = s.result(n);
      return r.want.empty() || r.fresh() || (!r.held.empty() && r.held == r.want);
    };
    return done(kFocusA) && done(kFocusB);
  }

  void draw(AppState& s) override {
    draw_method_choice(s);
    ImGui::Separator();
    draw_budget(s);
    draw_seed(s);
    ImGui::Separator();
    draw_focused_head(s);
    ImGui::Separator();
    draw_method_params(s);
    draw_eval_protocol(s);
    draw_backend(s);
  }

  nlohmann::json export_json(const AppState& s) const override {
    nlohmann::json j = s.to_session();
    nlohmann::json runs = nlohmann::json::array();
    for (int slot = 0; slot < 2; ++slot) {
      const HeadRun* rp = s.run(slot);
      if (!rp) continue;
      const HeadRun& r = *rp;
      const Result& res = s.result(slot == 0 ? kFocusA : kFocusB);
      runs.push_back({{"slot", slot == 0 ? "A" : "B"},
                      {"method", s.method_name(slot)},
                      {"stale", res.stale()},
                      {"window", r.window.describe()},
                      {"relative_error", r.mean_relative},
                      {"normalized_error", r.mean_normalized},
                      {"mass", r.mean_mass},
                      {"kept", r.selection.indices.size()},
                      {"note", r.selection.note},
                      {"ms", res.seconds * 1000.0}});
    }
    j["focused_runs"] = runs;
    return j;
  }
};

}  // namespace

std::unique_ptr<View> make_method_view() {
  return std::make_unique<MethodView>();
}

}  // namespace kvscope::app
