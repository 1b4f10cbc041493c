// Capture view: what is open (model, shapes, tokens, synthetic label, resident bytes) and the
// layer x kv-head grid coloured by method A's error at the current keep ratio (or by attention
// entropy); clicking a cell focuses that head.
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
           "seeds; click it to focus that layer and kv head.";
  }
  Panel panel() const override { return Panel::Left; }

  bool ready(const AppState& s) const override {
    // The grid must show numbers (or the reason it cannot).
    if (!s.capture) return true;
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

    int metric = static_cast<int>(s.settings.grid_metric);
    // As wide as fits beside its label and the (?) marker, at most 240 px (x UI scale).
    ImGui::SetNextItemWidth(std::max(px(100), std::min(px(240), ImGui::GetContentRegionAvail().x -
                                                                    labelled_width(0, "colour by") -
                                                                    button_width("(?)") - px(12))));
    const char* metrics[] = {"error of method A", "attention entropy"};
    if (ImGui::Combo("colour by", &metric, metrics, 2))
      s.settings.grid_metric = static_cast<GridMetric>(metric);
    toolbar_next(ImGui::CalcTextSize("(?)").x);
    ImGui::TextDisabled("(?)");
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip(
          "Error: relative error ||z_j - Attn_j|| / ||Attn_j|| of method A at the current keep\n"
          "ratio, mean over the evaluation queries, the GQA group and %d seeds.\n"
          "Entropy: mean attention entropy (nats) of the evaluation queries.\n"
          "Click a cell to focus that layer and kv head.",
          s.grid_seeds());

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
    return j;
  }

  std::string export_csv(const AppState& s) const override { return grid_csv(s); }
};

}  // namespace

std::unique_ptr<View> make_capture_view() {
  return std::make_unique<CaptureView>();
}

}  // namespace kvscope::app
