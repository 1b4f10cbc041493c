// Capture view: what is open (model, shapes, tokens, synthetic label, resident bytes) and the
// layer x kv-head grid coloured by method A's error at the current keep ratio (or by attention
// entropy, or, with a capture set open, by method A's mean over the set's prompts); clicking a
// cell focuses that head.
#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "app/app_state.h"
#include "app/colormap.h"
#include "app/grid_values.h"
#include "app/plot.h"
#include "app/result_status.h"
#include "app/ui_layout.h"
#include "app/views/set_figures.h"
#include "app/views/view.h"

namespace kvscope::app {
namespace {

std::string bytes_text(long long b) {
  char buf[64];
  if (b >= (1LL << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / (1LL << 30));
  else if (b >= (1LL << 20))
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(b) / (1LL << 20));
  else
    std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(b) / 1024.0);
  return buf;
}

void row(const char* key, const std::string& value) {
  ImGui::TableNextRow();
  ImGui::TableSetColumnIndex(0);
  ImGui::TextDisabled("%s", key);
  ImGui::TableSetColumnIndex(1);
  ImGui::TextWrapped("%s", value.c_str());
}

class CaptureView final : public View {
 public:
  const char* name() const override { return "capture"; }
  const char* title() const override { return "Capture"; }
  const char* help() const override {
    return "The open capture: model, shapes, token count and dtype, the evaluation protocol in "
           "use, and the layer x kv-head grid coloured by method A's relative error at the "
           "current keep ratio (or by attention entropy). Hover a cell for mean and spread over "
           "seeds; click it to focus that layer and kv head. With a capture set open (File > "
           "Open set), the grid can show method A's mean over the set's prompts instead, or the "
           "width of its 95% interval; hover a cell for the interval and the spread over "
           "prompts.";
  }
  Panel panel() const override { return Panel::Left; }

  bool ready(const AppState& s) const override {
    // The grid must show numbers (or the reason it cannot).
    if (!s.capture) return true;
    if (shows_set(s)) return set_eval_settled(s);
    const Result& r = s.result(s.settings.grid_metric == GridMetric::Entropy ? kEntropy : kGrid);
    return r.want.empty() || r.fresh() || (!r.held.empty() && r.held == r.want) ||
           (!r.cancelled.empty() && r.cancelled == r.want);
  }

  void draw(AppState& s) override {
    const CaptureInfo* ci = s.info();
    if (!ci) {
      ImGui::TextWrapped(
          "No capture open. Use File > Open capture, or drop a .safetensors / .npz "
          "file on the window.");
      if (!s.loading_path.empty()) ImGui::TextDisabled("opening %s ...", s.loading_path.c_str());
      return;
    }
    if (ci->synthetic) {
      ImGui::PushStyleColor(ImGuiCol_Text, kTextWarning);
      ImGui::TextWrapped("SYNTHETIC capture (generated data, not a model's real keys)");
      ImGui::PopStyleColor();
    }
    if (ImGui::BeginTable("##info", 2, ImGuiTableFlags_SizingFixedFit | ImGuiTableFlags_RowBg)) {
      ImGui::TableSetupColumn("k", ImGuiTableColumnFlags_WidthFixed, px(110));
      ImGui::TableSetupColumn("v", ImGuiTableColumnFlags_WidthStretch);
      row("file", std::filesystem::path(ci->path).filename().string() + " (" + ci->file_format +
                      ", " + bytes_text(ci->file_bytes) + ")");
      row("model", ci->model.empty() ? "(not recorded)" : ci->model);
      row("source", ci->source.empty() ? "(not recorded)" : ci->source);
      std::ostringstream shapes;
      shapes << ci->num_layers << " layers, " << ci->q_heads << " query / " << ci->kv_heads
             << " kv heads (GQA group " << ci->group_size() << "), head dim " << ci->head_dim;
      if (ci->value_dim != ci->head_dim) shapes << ", value dim " << ci->value_dim;
      row("shapes", shapes.str());
      row("tokens", std::to_string(ci->num_tokens) + " (" + std::string(dtype_name(ci->dtype)) +
                        (ci->has_queries ? ", with queries)" : ", no queries: key-only methods)"));
      row("resident", bytes_text(s.capture->resident_bytes()) + " of tensor data in memory");
      std::string note;
      row("protocol", s.window(&note).describe() + (note.empty() ? "" : "\n" + note));
      std::string prompt = ci->prompt;
      if (prompt.size() > 160) prompt = prompt.substr(0, 160) + "...";
      if (!prompt.empty()) row("prompt", prompt);
      ImGui::EndTable();
    }
    ImGui::Separator();

    // The set's mean is the third choice while a set is open (its own state: the capture's
    // metric stays as chosen underneath).
    int metric = shows_set(s) ? 2 : static_cast<int>(s.settings.grid_metric);
    // As wide as fits beside its label and the (?) marker, at most 240 px (x UI scale).
    ImGui::SetNextItemWidth(std::max(px(100), std::min(px(240), ImGui::GetContentRegionAvail().x -
                                                                    labelled_width(0, "colour by") -
                                                                    button_width("(?)") - px(12))));
    const char* metrics[] = {"error of method A", "attention entropy",
                             "method A over the set's prompts"};
    if (ImGui::BeginCombo("colour by", metrics[metric])) {
      for (int i = 0; i < (s.set_path.empty() ? 2 : 3); ++i) {
        if (ImGui::Selectable(metrics[i], i == metric)) {
          show_set_ = i == 2;
          if (i < 2) s.settings.grid_metric = static_cast<GridMetric>(i);
        }
        record_item(s, std::string("combo:colour by:") + metrics[i]);
      }
      ImGui::EndCombo();
    }
    record_item(s, "combo:colour by");
    toolbar_next(ImGui::CalcTextSize("(?)").x);
    ImGui::TextDisabled("(?)");
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip(
          "Error: relative error ||z_j - Attn_j|| / ||Attn_j|| of method A at the current keep\n"
          "ratio, mean over the evaluation queries, the GQA group and %d seeds.\n"
          "Entropy: mean attention entropy (nats) of the evaluation queries.\n"
          "Set: method A's mean relative error over the prompts of the capture set open, with\n"
          "its 95%% interval across prompts (the Set view has the whole table).\n"
          "Click a cell to focus that layer and kv head.",
          s.grid_seeds());

    if (shows_set(s)) {
      draw_set_grid(s);
      return;
    }
    draw_result_status(s, s.settings.grid_metric == GridMetric::Entropy ? kEntropy : kGrid,
                       s.settings.grid_metric == GridMetric::Entropy ? "entropy" : "grid");
    mark_figure_top();  // figure exports: the caption and the grid, not the controls above
    GridValues gv = grid_values(s, s.settings.grid_metric);
    ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
    ImGui::TextWrapped("%s", gv.caption.c_str());
    ImGui::PopStyleColor();
    draw_grid(s, gv, "##capgrid", 10000.0f);  // as tall as the panel allows
  }

  nlohmann::json export_json(const AppState& s) const override {
    if (!s.info()) return nullptr;
    nlohmann::json j;
    const CaptureInfo& ci = *s.info();
    j["file"] = ci.path;
    j["model"] = ci.model;
    j["layers"] = ci.num_layers;
    j["q_heads"] = ci.q_heads;
    j["kv_heads"] = ci.kv_heads;
    j["head_dim"] = ci.head_dim;
    j["tokens"] = ci.num_tokens;
    j["synthetic"] = ci.synthetic;
    j["grid"] = grid_json(s);
    j["grid_source"] = shows_set(s) ? "set"
                       : s.settings.grid_metric == GridMetric::Entropy ? "entropy"
                                                                       : "error";
    if (shows_set(s)) {  // what the set's grid shows, in full
      SetFigures f;
      f.update(s);
      nlohmann::json cells = nlohmann::json::array();
      for (size_t i = 0; i < f.cell.size(); ++i)
        if (const SetRow* r = f.cell[i])
          cells.push_back({{"layer", r->layer},
                           {"kv_head", r->kv_head},
                           {"method", r->method},
                           {"mean", r->mean},
                           {"ci_low", r->ci_low},
                           {"ci_high", r->ci_high},
                           {"prompts", r->prompts},
                           {"min_over_prompts", f.lo[i]},
                           {"max_over_prompts", f.hi[i]}});
      j["set_grid"] = {{"cells", cells},
                       {"colour_by_interval", by_interval_},
                       {"fresh", s.result(kSetEval).fresh()}};
    }
    return j;
  }

  std::string export_csv(const AppState& s) const override { return grid_csv(s); }

  void plan(const AppState& s, std::vector<NamedPlan>& out) const override {
    if (shows_set(s)) plan_set_eval(s, out);
  }
  nlohmann::json save_state() const override {
    return {{"show_set", show_set_}, {"colour_by_interval", by_interval_}};
  }
  void load_state(const nlohmann::json& j) override {
    if (!j.is_object()) return;
    show_set_ = j.value("show_set", false);
    by_interval_ = j.value("colour_by_interval", false);
  }

 private:
  bool shows_set(const AppState& s) const { return show_set_ && !s.set_path.empty(); }

  // Method A's mean over the set's prompts per layer and kv head (or the width of its interval).
  void draw_set_grid(AppState& s) {
    draw_result_status(s, kSetEval, "the set's evaluation");
    const Result& r = s.result(kSetEval);
    if (!r.error.empty() && r.key == r.want) ImGui::TextColored(kTextError, "%s", r.error.c_str());
    ImGui::Checkbox("colour by the interval's width", &by_interval_);
    record_item(s, "capture:by_interval");
    mark_figure_top();
    set_figures_.update(s);
    const GridValues gv = set_figures_.grid(s, by_interval_);
    ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
    ImGui::TextWrapped("%s%s", gv.caption.c_str(), r.fresh() ? "" : " (stale: settings changed)");
    ImGui::PopStyleColor();
    draw_grid(s, gv, "##capsetgrid", 10000.0f);
  }

  bool show_set_ = false;     // colour by the set's figures (while a set is open)
  bool by_interval_ = false;  // ... by the width of their interval
  SetFigures set_figures_;
};

}  // namespace

std::unique_ptr<View> make_capture_view() {
  return std::make_unique<CaptureView>();
}

}  // namespace kvscope::app
