// Set view: evidence across the prompts of a capture set (docs/app.md, "Set view";
// docs/evaluation.md, "Capture sets"). Methods A and B on every capture of the set: the mean over
// prompts with its 95% interval per layer and kv head and for the whole capture, error against
// keep ratio with the interval as a band, and the prompts ranked by how much A loses to B; a click
// on a prompt opens its capture in every view.
#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "app/app_state.h"
#include "app/colormap.h"
#include "app/grid_values.h"
#include "app/plot.h"
#include "app/result_status.h"
#include "app/ui_layout.h"
#include "app/views/view.h"
#include "app/views/set_figures.h"
#include "engine/eval/capture_set.h"
#include "engine/eval/set_eval.h"

namespace kvscope::app {
namespace {

class SetView final : public View {
 public:
  const char* name() const override { return "set"; }
  const char* title() const override { return "Set"; }
  const char* help() const override {
    return "Evidence across the prompts of a capture set (File > Open set, or a manifest .jsonl "
           "or folder on the command line): methods A and B run on every capture of the set. The "
           "table gives each method's mean relative error over the prompts with its 95% Student-t "
           "interval, its wins and mean rank; the plot, error against keep ratio with the "
           "interval as a band; the grid, method A's mean per layer and kv head (hover: interval "
           "and the spread over prompts; or colour by the interval's width). The prompt list "
           "ranks the prompts by how much A loses to B; click one to open its capture in every "
           "view. The set's evaluation waits for Run when it is long; it shows progress and "
           "cancels.";
  }

  // Screenshots wait for the set's figures (or the reason there are none).
  bool ready(const AppState& s) const override {
    if (!pending_.empty() || !s.set_request.empty()) return false;
    return s.set_path.empty() || set_eval_settled(s);
  }

  void plan(const AppState& s, std::vector<NamedPlan>& out) const override {
    plan_set_eval(s, out);
  }

  void draw(AppState& s) override {
    if (!pending_.empty()) s.request_open(pending_), pending_.clear();  // a session's set
    if (s.set_path != path_) {  // opened elsewhere (menu, command line, a drop)
      path_ = s.set_path;
      std::snprintf(path_buf_, sizeof path_buf_, "%s", path_.c_str());
      figures_ = {};
    }
    draw_header(s);
    // A set asked for that could not be opened: the one open (if any) stays.
    if (!s.set_error.empty()) {
      ImGui::PushStyleColor(ImGuiCol_Text, kTextError);
      ImGui::TextWrapped("%s", s.set_error.c_str());
      ImGui::PopStyleColor();
    }
    if (!s.set_request.empty()) {
      draw_result_status(s, kSetOpen, "the set");
      return;
    }
    if (path_.empty()) return;
    const Result& opened = s.result(kSetOpen);
    if (!opened.error.empty() && opened.key == opened.want) {
      ImGui::TextColored(kTextError, "%s", opened.error.c_str());
      return;
    }
    const CaptureSet* set = opened.get<CaptureSet>();
    if (!set) {
      draw_result_status(s, kSetOpen, "the set");
      return;
    }
    ImGui::TextWrapped(
        "%zu captures of %s: %d layers, %d query / %d kv heads, head dim %d", set->entries.size(),
        set->shape.model.empty() ? "a model not recorded" : set->shape.model.c_str(),
        set->shape.num_layers, set->shape.q_heads, set->shape.kv_heads, set->shape.head_dim);
    draw_result_status(s, kSetEval, "the set's evaluation");
    const Result& res = s.result(kSetEval);
    if (!res.error.empty() && res.key == res.want)
      ImGui::TextColored(kTextError, "%s", res.error.c_str());
    const std::shared_ptr<const SetEvalReport> rep = res.ptr<SetEvalReport>();
    if (!rep || rep->captures.empty()) {
      draw_prompt_list(s, *set, nullptr);
      return;
    }
    figures_.update(s);
    draw_summary(s);
    figures_.draw_plot(s, "##setplot");
    draw_grid_section(s);
    draw_prompt_list(s, *set, rep.get());
  }

  nlohmann::json export_json(const AppState& s) const override {
    const SetEvalReport* rep = s.result(kSetEval).get<SetEvalReport>();
    if (!s.set_error.empty() && (path_.empty() || !rep))
      return {{"set", s.set_path}, {"error", s.set_error}};
    if (path_.empty() || !rep) return nullptr;
    nlohmann::json j = rep->to_json();
    // The spec the set ran with (methods, ratios, seeds, params): every capture's is the same.
    j["spec"] = j["captures"].at(0)["spec"];
    j.erase("captures");  // every capture's own report: `kvscope-cli eval SET --json` has them
    j["fresh"] = s.result(kSetEval).fresh();
    j["colour_by_interval"] = by_interval_;
    j["error"] = s.set_error;  // the last set asked for that could not be opened
    return j;
  }
  std::string export_csv(const AppState& s) const override {
    const SetEvalReport* rep = s.result(kSetEval).get<SetEvalReport>();
    return rep ? rep->summary_csv() : std::string();
  }

  nlohmann::json save_state() const override {
    return {{"path", path_}, {"colour_by_interval", by_interval_}};
  }
  void load_state(const nlohmann::json& j) override {
    if (!j.is_object()) return;
    pending_ = j.value("path", std::string());  // opened by the next frame (request_open)
    by_interval_ = j.value("colour_by_interval", false);
  }

 private:
  void draw_header(AppState& s) {
    ImGui::SetNextItemWidth(fit_width(420, "set"));
    ImGui::InputTextWithHint("set", "manifest.jsonl or a folder of captures", path_buf_,
                             sizeof path_buf_);
    record_item(s, "set:path");
    toolbar_next(button_width("Open set"));
    if (ImGui::Button("Open set") || (ImGui::IsItemDeactivatedAfterEdit() && path_buf_[0]))
      s.request_open(path_buf_);
    record_item(s, "set:open");
    mark_figure_top();  // figure exports: what is below the set's field, not the field
    if (path_.empty())
      ImGui::TextWrapped(
          "No set open. A set is a manifest.jsonl (one {\"path\": ...} per line) or a folder of "
          ".safetensors captures of one model: kvscope-cli capture --prompts FILE.jsonl "
          "--out-dir DIR makes one (docs/evaluation.md, \"Capture sets\").");
  }

  void draw_summary(AppState& s) {
    const Result& res = s.result(kSetEval);
    if (figures_.column < 0) {
      ImGui::TextDisabled("keep ratio %s is not among the set's ratios: Run the set again",
                          ratio_label(s.settings.keep_ratio).c_str());
      return;
    }
    ImGui::Text("At keep ratio %s, over %zu prompts%s:", ratio_label(s.settings.keep_ratio).c_str(),
                figures_.report->entries.size(), res.fresh() ? "" : " (stale: settings changed)");
    if (!ImGui::BeginTable("##setsummary", 5,
                           ImGuiTableFlags_RowBg | ImGuiTableFlags_SizingFixedFit))
      return;
    for (const char* h : {"method", "mean", "95% interval", "wins", "mean rank"})
      ImGui::TableSetupColumn(h);
    ImGui::TableHeadersRow();
    for (const SetRow& r : figures_.rows) {
      if (r.layer != kAllLayers || r.column != figures_.column) continue;
      ImGui::TableNextRow();
      ImGui::TableSetColumnIndex(0);
      ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(set_slot_colour(s, r.method)), "%s",
                         r.method.c_str());
      ImGui::TableSetColumnIndex(1);
      ImGui::Text("%.6g", r.mean);
      ImGui::TableSetColumnIndex(2);
      if (std::isnan(r.ci_low))
        ImGui::TextDisabled("one prompt");
      else
        ImGui::Text("[%.6g, %.6g]", r.ci_low, r.ci_high);
      ImGui::TableSetColumnIndex(3);
      ImGui::Text("%d of %d", r.wins, r.prompts);
      ImGui::TableSetColumnIndex(4);
      ImGui::Text("%.3g", r.mean_rank);
    }
    ImGui::EndTable();
  }

  void draw_grid_section(AppState& s) {
    if (figures_.layers == 0 || figures_.column < 0) return;
    ImGui::Checkbox("colour by the interval's width", &by_interval_);
    record_item(s, "set:by_interval");
    const GridValues gv = figures_.grid(s, by_interval_);
    ImGui::TextDisabled("%s", gv.caption.c_str());
    draw_grid(s, gv, "##setgrid", px(260));
  }

  void draw_prompt_list(AppState& s, const CaptureSet& set, const SetEvalReport* rep) {
    const bool ranked = rep && !figures_.prompts.empty();
    ImGui::TextDisabled(ranked ? "prompts, by how much A loses to B (click: open the capture)"
                               : "prompts (click: open the capture)");
    if (!ImGui::BeginTable(
            "##setprompts", ranked ? 5 : 2,
            ImGuiTableFlags_RowBg | ImGuiTableFlags_ScrollY | ImGuiTableFlags_SizingStretchProp,
            ImVec2(0, std::max(px(120), ImGui::GetContentRegionAvail().y))))
      return;
    ImGui::TableSetupScrollFreeze(0, 1);
    ImGui::TableSetupColumn("prompt");
    ImGui::TableSetupColumn("tokens");
    if (ranked) {
      // The columns name the methods, so the table reads without the toolbar.
      const std::string a = "A: " + s.method_name(0), b = "B: " + s.method_name(1);
      ImGui::TableSetupColumn(a.c_str());
      ImGui::TableSetupColumn(b.c_str());
      ImGui::TableSetupColumn("A - B");
    }
    ImGui::TableHeadersRow();
    std::vector<PromptRow> order = figures_.prompts;
    if (!ranked)
      for (size_t i = 0; i < set.entries.size(); ++i) order.push_back({static_cast<int>(i)});
    for (const PromptRow& p : order) {
      const CaptureSetEntry& e = set.entries[static_cast<size_t>(p.entry)];
      ImGui::TableNextRow();
      ImGui::TableSetColumnIndex(0);
      const bool open = s.capture_path == e.resolved;
      const std::string label = e.label + (e.prompt.empty() ? "" : ": " + e.prompt);
      ImGui::PushID(p.entry);
      if (ImGui::Selectable(elide(label, px(360)).c_str(), open,
                            ImGuiSelectableFlags_SpanAllColumns) &&
          !open)
        s.request_open(e.resolved);
      record_item(s, "set:prompt:" + std::to_string(p.entry));
      if (ImGui::IsItemHovered() && !e.prompt.empty()) ImGui::SetTooltip("%s", e.prompt.c_str());
      ImGui::PopID();
      ImGui::TableSetColumnIndex(1);
      ImGui::Text("%d", e.num_tokens);
      if (!ranked) continue;
      ImGui::TableSetColumnIndex(2);
      ImGui::Text("%.6g", p.a);
      ImGui::TableSetColumnIndex(3);
      ImGui::Text("%.6g", p.b);
      ImGui::TableSetColumnIndex(4);
      ImGui::Text("%+.6g", p.loss());
    }
    ImGui::EndTable();
  }

  std::string path_;     // the set shown (AppState::set_path), for sessions
  std::string pending_;  // a session's set, opened by the next frame
  char path_buf_[1024] = {};
  bool by_interval_ = false;
  SetFigures figures_;
};

}  // namespace

std::unique_ptr<View> make_set_view() {
  return std::make_unique<SetView>();
}

}  // namespace kvscope::app
