// Method view: method A (and B for the A/B comparison), keep ratio, each method's parameters
// generated from its ParamSpec list, seed, sink/eval overrides and backend. Every change re-runs
// the focused head at once and the whole grid in the background.
#include <imgui.h>

#include <cmath>
#include <cstdio>

#include "app/app_frame.h"
#include "app/app_state.h"
#include "app/colormap.h"
#include "app/plot.h"
#include "app/view.h"
#include "engine/backend.h"

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

bool method_combo(const char* label, std::string& name) {
  bool changed = false;
  if (ImGui::BeginCombo(label, name.c_str())) {
    const auto& all = all_methods();
    for (size_t i = 0; i < all.size(); ++i) {
      const Method* m = all[i];
      ImGui::PushID(static_cast<int>(i));
      legend_swatch(method_colour(static_cast<int>(i)), "");
      ImGui::SameLine();
      if (ImGui::Selectable(m->name().c_str(), m->name() == name)) {
        name = m->name();
        changed = true;
      }
      if (ImGui::IsItemHovered()) ImGui::SetTooltip("%s", m->summary().c_str());
      ImGui::PopID();
    }
    ImGui::EndCombo();
  }
  return changed;
}

// One ParamSpec as a widget; returns true when the value changed.
bool param_widget(const ParamSpec& p, ParamValues& values) {
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
      float fv = static_cast<float>(v);
      if (ImGui::SliderFloat(p.name.c_str(), &fv, static_cast<float>(p.min),
                             static_cast<float>(p.max), "%.4g",
                             p.log_scale ? ImGuiSliderFlags_Logarithmic : 0)) {
        v = fv;
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

void run_summary(const AppState& s, int slot) {
  const char* tag = slot == 0 ? "A" : "B";
  ImGui::PushID(slot);
  legend_swatch(kColSlot[slot], (std::string(tag) + ": " + s.method_name[slot]).c_str());
  if (!s.run_error[slot].empty()) {
    ImGui::PushStyleColor(ImGuiCol_Text, ImVec4(1, 0.45f, 0.45f, 1));
    ImGui::TextWrapped("%s", s.run_error[slot].c_str());
    ImGui::PopStyleColor();
  } else if (!s.run[slot]) {
    ImGui::TextDisabled("running...");
  } else {
    const HeadRun& r = *s.run[slot];
    ImGui::TextWrapped("relative error %.4f   normalised (Eq. 2) %.4g", r.mean_relative,
                       r.mean_normalized);
    size_t kept = r.selection.indices.size();
    ImGui::TextWrapped("kept %zu of %d middle tokens (m = %d)%s   attention mass %.3f", kept,
                       r.window.n_mid, r.window.budget,
                       r.selection.separate ? " [separate num/den sets]" : "", r.mean_mass);
    ImGui::TextDisabled("ran in %.1f ms on the focused head", s.run_ms[slot]);
    if (r.selection.saturation >= 0)
      ImGui::Text("walk saturation %.0f%% of steps (p clipped to 0 or 1)%s",
                  100.0 * r.selection.saturation,
                  r.selection.saturation >= 0.9 ? ": nearly deterministic (see temp, gamma)" : "");
    if (!r.selection.note.empty()) ImGui::TextWrapped("note: %s", r.selection.note.c_str());
    if (r.selection.trace && !r.selection.trace->note.empty())
      ImGui::TextWrapped("trace: %s", r.selection.trace->note.c_str());
  }
  ImGui::PopID();
}

class MethodView final : public View {
 public:
  const char* name() const override { return "method"; }
  const char* title() const override { return "Method"; }
  Panel panel() const override { return Panel::Left; }

  bool ready(const AppState& s) const override {
    return !s.capture || ((s.run[0] || !s.run_error[0].empty()) &&
                          (!s.ab_enabled || s.run[1] || !s.run_error[1].empty()));
  }

  void draw(AppState& s) override {
    bool changed = false;
    ImGui::SetNextItemWidth(fit_width(220, "method A"));
    changed |= method_combo("method A", s.method_name[0]);
    if (const Method* m = s.method(0)) ImGui::TextWrapped("%s", m->summary().c_str());
    changed |= ImGui::Checkbox("compare with method B", &s.ab_enabled);
    if (s.ab_enabled) {
      ImGui::SetNextItemWidth(fit_width(220, "method B"));
      changed |= method_combo("method B", s.method_name[1]);
    }
    ImGui::Separator();

    // Keep ratio: logarithmic slider plus the protocol's ratios as buttons.
    float kr = static_cast<float>(s.keep_ratio);
    ImGui::SetNextItemWidth(fit_width(220, "keep ratio"));
    if (ImGui::SliderFloat("keep ratio", &kr, 1.0f / 64, 1.0f, "%.4f",
                           ImGuiSliderFlags_Logarithmic)) {
      s.keep_ratio = std::clamp(static_cast<double>(kr), 1.0 / 64, 1.0);
      changed = true;
    }
    help_marker(
        "Fraction of the middle [s, n-E) a method keeps: m = round(ratio * n_mid). "
        "Every method gets the same m.");
    for (double r : {0.5, 0.25, 0.125, 0.0625}) {
      ImGui::SameLine(0, r == 0.5 ? 8 : 4);
      if (r == 0.5) ImGui::NewLine();
      std::string label = ratio_label(r);
      bool on = std::fabs(s.keep_ratio - r) < 1e-9;
      if (on)
        ImGui::PushStyleColor(ImGuiCol_Button, ImGui::GetStyleColorVec4(ImGuiCol_ButtonActive));
      if (ImGui::Button(label.c_str(), ImVec2(px(48), 0))) {
        s.keep_ratio = r;
        changed = true;
      }
      if (on) ImGui::PopStyleColor();
    }
    ImGui::SetNextItemWidth(120);
    if (ImGui::InputInt("seed", &s.seed)) {
      s.seed = std::max(0, s.seed);
      changed = true;
    }
    help_marker(
        "Seed of every random draw (Philox counters): the same seed gives the same "
        "selection on CPU and GPU.");

    ImGui::Separator();
    ImGui::TextUnformatted("focused head");
    ImGui::SameLine();
    ImGui::TextDisabled("layer %d, kv head %d", s.focus.layer, s.focus.kv_head);
    run_summary(s, 0);
    if (s.ab_enabled) run_summary(s, 1);

    // The background grid.
    auto jobs = s.worker.jobs();
    for (const auto& j : jobs)
      if (j.key == "grid") {
        float f = j.total > 0 ? static_cast<float>(j.done) / j.total : 0.0f;
        char ov[64];
        std::snprintf(ov, sizeof ov, "grid %d/%d", j.done, j.total);
        ImGui::ProgressBar(f, ImVec2(220, 0), j.running ? ov : "grid queued");
        ImGui::SameLine();
        if (ImGui::SmallButton("cancel grid")) s.worker.cancel("grid");
      }
    if (!s.grid_error.empty())
      ImGui::TextColored(ImVec4(1, 0.45f, 0.45f, 1), "grid: %s", s.grid_error.c_str());

    ImGui::Separator();
    // Parameters of each method in use.
    for (int slot = 0; slot < (s.ab_enabled ? 2 : 1); ++slot) {
      const Method* m = s.method(slot);
      if (!m) continue;
      if (slot == 1 && s.method_name[1] == s.method_name[0]) continue;
      std::string header = "parameters of " + m->name() + (slot == 0 ? " (A)" : " (B)");
      ImGui::PushID(slot);
      if (ImGui::CollapsingHeader(header.c_str(), ImGuiTreeNodeFlags_DefaultOpen)) {
        auto specs = m->params();
        if (specs.empty()) ImGui::TextDisabled("no parameters");
        ParamValues& pv = s.params[m->name()];
        for (const ParamSpec& p : specs) changed |= param_widget(p, pv);
        if (!pv.empty() && ImGui::Button("reset all to defaults")) {
          pv.clear();
          changed = true;
        }
        if (m->needs_queries() && s.info() && !s.info()->has_queries)
          ImGui::TextColored(ImVec4(1, 0.6f, 0.3f, 1), "needs queries; this capture has none");
      }
      ImGui::PopID();
    }

    if (ImGui::CollapsingHeader("evaluation protocol", ImGuiTreeNodeFlags_DefaultOpen)) {
      bool so = s.sink_override >= 0, eo = s.eval_override >= 0;
      EvalWindow def = EvalWindow::make(s.num_tokens(), s.keep_ratio);
      if (ImGui::Checkbox("override sinks s", &so)) {
        s.sink_override = so ? def.sink : -1;
        changed = true;
      }
      if (so) {
        ImGui::SameLine();
        ImGui::SetNextItemWidth(100);
        if (ImGui::InputInt("##sink", &s.sink_override)) {
          s.sink_override = std::clamp(s.sink_override, 0, std::max(0, s.num_tokens() / 2));
          changed = true;
        }
      }
      if (ImGui::Checkbox("override eval window E", &eo)) {
        s.eval_override = eo ? def.eval : -1;
        changed = true;
      }
      if (eo) {
        ImGui::SameLine();
        ImGui::SetNextItemWidth(100);
        if (ImGui::InputInt("##eval", &s.eval_override)) {
          s.eval_override = std::clamp(s.eval_override, 1, std::max(1, s.num_tokens() / 2));
          changed = true;
        }
      }
      if (s.info()) ImGui::TextWrapped("%s", s.window().describe().c_str());
      bool authors = s.estimator == Estimator::Authors;
      if (ImGui::Checkbox("authors' estimator", &authors)) {
        s.estimator = authors ? Estimator::Authors : Estimator::Weighted;
        changed = true;
      }
      help_marker(
          "The BalanceKV authors' notebook and forward pass: numerator weight w, denominator "
          "weight 2^T on every kept token (T = ceil(log2(1/ratio))). Off: both use w.");
      ImGui::SetNextItemWidth(120);
      if (ImGui::SliderInt("grid seeds", &s.grid_seeds, 1, 10)) changed = true;
      help_marker(
          "Seeds averaged in the background grid (the Capture view's cells). The paper "
          "uses 10; fewer keep the grid quick.");
    }

    if (ImGui::CollapsingHeader("backend", ImGuiTreeNodeFlags_DefaultOpen)) {
      const char* choices[] = {"cpu", "cuda", "auto"};
      int cur = 0;
      for (int i = 0; i < 3; ++i)
        if (s.backend_choice == choices[i]) cur = i;
      ImGui::SetNextItemWidth(120);
      if (ImGui::Combo("backend", &cur, choices, 3)) {
        std::string before = s.backend_active;
        s.set_backend(choices[cur]);
        changed = true;
      }
      ImGui::Text("active: %s", s.backend_active.c_str());
      ImGui::TextWrapped("%s", s.backend_note.c_str());
    }

    if (changed) s.settings_changed();
  }

  nlohmann::json export_json(const AppState& s) const override {
    nlohmann::json j = s.to_session();
    nlohmann::json runs = nlohmann::json::array();
    for (int slot = 0; slot < 2; ++slot) {
      if (!s.run[slot]) continue;
      const HeadRun& r = *s.run[slot];
      runs.push_back({{"slot", slot == 0 ? "A" : "B"},
                      {"method", s.method_name[slot]},
                      {"window", r.window.describe()},
                      {"relative_error", r.mean_relative},
                      {"normalized_error", r.mean_normalized},
                      {"mass", r.mean_mass},
                      {"kept", r.selection.indices.size()},
                      {"note", r.selection.note},
                      {"ms", s.run_ms[slot]}});
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
