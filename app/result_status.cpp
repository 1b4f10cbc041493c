#include "app/result_status.h"

#include <imgui.h>

#include <algorithm>
#include <cstdio>

#include "app/app_frame.h"
#include "app/app_state.h"

namespace kvscope::app {

bool draw_result_status(AppState& s, const std::string& name, const char* what) {
  const Result& r = s.result(name);
  if (r.want.empty() && !r.has_value()) return false;
  ImGui::PushID(name.c_str());
  bool drew = true;
  const ImVec4 warn(1.0f, 0.8f, 0.3f, 1.0f), bad(1.0f, 0.45f, 0.45f, 1.0f);
  if (r.busy()) {
    auto [done, total] = s.progress(name);
    double left = -1;  // the job's time left, as the status bar says it
    for (const JobInfo& j : s.worker.jobs())
      if (j.key == name && j.running) left = time_left_s(j);
    char ov[160];
    if (total > 0 && left >= 0)
      std::snprintf(ov, sizeof ov, "%s %d/%d, about %s left", what, done, total,
                    fmt_seconds(left).c_str());
    else if (total > 0)
      std::snprintf(ov, sizeof ov, "%s %d/%d", what, done, total);
    else
      std::snprintf(ov, sizeof ov, "%s: running (%s)", what, r.estimate_text.c_str());
    if (ImGui::SmallButton("Cancel")) s.cancel_job(name);
    s.ui_items["cancel:" + name] = {ImGui::GetItemRectMin().x, ImGui::GetItemRectMin().y,
                                    ImGui::GetItemRectMax().x, ImGui::GetItemRectMax().y};
    ImGui::SameLine();
    // As wide as its text (at least 260 px) where the panel has room; else the text is cut to
    // what fits and the whole of it is the bar's tooltip.
    const float avail = ImGui::GetContentRegionAvail().x;
    const float text_w = ImGui::CalcTextSize(ov).x + 2 * ImGui::GetStyle().FramePadding.x;
    const bool cut = text_w > avail;
    char shown[160];
    if (cut && total > 0)
      std::snprintf(shown, sizeof shown, "%d/%d", done, total);
    else if (cut)
      std::snprintf(shown, sizeof shown, "running");
    else
      std::snprintf(shown, sizeof shown, "%s", ov);
    ImGui::ProgressBar(total > 0 ? static_cast<float>(done) / static_cast<float>(total) : 0.0f,
                       ImVec2(std::max(1.0f, std::min(std::max(px(260), text_w), avail)), 0),
                       shown);
    if (cut && ImGui::IsItemHovered()) ImGui::SetTooltip("%s", ov);
  } else if (!r.held.empty() && r.held == r.want) {
    // The button first: the line may be wider than the panel.
    if (ImGui::SmallButton("Run")) s.run_now(name);
    s.ui_items["run:" + name] = {ImGui::GetItemRectMin().x, ImGui::GetItemRectMin().y,
                                 ImGui::GetItemRectMax().x, ImGui::GetItemRectMax().y};
    ImGui::SameLine();
    ImGui::PushStyleColor(ImGuiCol_Text, warn);
    ImGui::TextWrapped("%s would take %s", what, r.estimate_text.c_str());
    ImGui::PopStyleColor();
  } else if (!r.cancelled.empty() && r.cancelled == r.want) {
    if (ImGui::SmallButton("Run")) s.run_now(name);
    s.ui_items["run:" + name] = {ImGui::GetItemRectMin().x, ImGui::GetItemRectMin().y,
                                 ImGui::GetItemRectMax().x, ImGui::GetItemRectMax().y};
    ImGui::SameLine();
    ImGui::PushStyleColor(ImGuiCol_Text, warn);
    ImGui::TextWrapped("%s cancelled (would take %s)", what, r.estimate_text.c_str());
    ImGui::PopStyleColor();
  } else if (!r.waiting.empty() && !r.fresh()) {
    ImGui::TextDisabled("%s: %s ...", what, r.waiting.c_str());
  } else if (!r.error.empty() && r.key == r.want) {
    if (ImGui::SmallButton("Re-run")) s.run_now(name);
    ImGui::SameLine();
    ImGui::PushStyleColor(ImGuiCol_Text, bad);
    ImGui::TextWrapped("%s failed: %s", what, r.error.c_str());
    ImGui::PopStyleColor();
  } else {
    drew = false;
  }
  if (r.stale() && r.has_value()) {
    ImGui::TextColored(warn, "[%s: stale, shown for earlier settings]", what);
    drew = true;
  } else if (r.partial && r.busy()) {
    // A job that posts intermediate frames (t-SNE, the grid's cells): what is shown is its
    // latest frame, not its answer yet.
    if (drew) ImGui::SameLine();
    ImGui::TextDisabled("[%s: an intermediate frame, still computing]", what);
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip("The job shows its work as it goes (a projection converging, cells\n"
                        "filling in); the figure is final when this line goes away.");
    drew = true;
  }
  ImGui::PopID();
  return drew;
}

}  // namespace kvscope::app

namespace kvscope::app {
void record_item(AppState& s, const std::string& name) {
  // Only what a user can click: an item scrolled out of its panel or clipped out of a combo's
  // list is not on the screen (a test must scroll to it, as a user would).
  if (!ImGui::IsItemVisible()) return;
  // The part inside the window's clip rectangle: ImGui hovers an item only there, so a click on
  // the clipped rest of an item cut by a list's bottom edge selects nothing. An item less than
  // half shown is left out: a user scrolls to it first.
  const ImVec2 full_min = ImGui::GetItemRectMin(), full_max = ImGui::GetItemRectMax();
  ImDrawList* draw = ImGui::GetWindowDrawList();
  const ImVec2 clip_min = draw->GetClipRectMin(), clip_max = draw->GetClipRectMax();
  const ImVec2 a(std::max(full_min.x, clip_min.x), std::max(full_min.y, clip_min.y));
  const ImVec2 b(std::min(full_max.x, clip_max.x), std::min(full_max.y, clip_max.y));
  if (b.y - a.y < 0.5f * (full_max.y - full_min.y) || b.x <= a.x) return;
  s.ui_items[name] = {a.x, a.y, b.x, b.y};
}
}  // namespace kvscope::app
