#include "app/result_status.h"

#include <imgui.h>

#include <cstdio>

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
    char ov[160];
    if (total > 0)
      std::snprintf(ov, sizeof ov, "%s %d/%d", what, done, total);
    else
      std::snprintf(ov, sizeof ov, "%s: running (%s)", what, r.estimate_text.c_str());
    ImGui::ProgressBar(total > 0 ? static_cast<float>(done) / static_cast<float>(total) : 0.0f,
                       ImVec2(260, 0), ov);
    ImGui::SameLine();
    if (ImGui::SmallButton("Cancel")) s.cancel_job(name);
    s.ui_items["cancel:" + name] = {ImGui::GetItemRectMin().x, ImGui::GetItemRectMin().y,
                                    ImGui::GetItemRectMax().x, ImGui::GetItemRectMax().y};
  } else if (!r.held.empty() && r.held == r.want) {
    ImGui::TextColored(warn, "%s would take %s:", what, r.estimate_text.c_str());
    ImGui::SameLine();
    if (ImGui::SmallButton("Run")) s.run_now(name);
    s.ui_items["run:" + name] = {ImGui::GetItemRectMin().x, ImGui::GetItemRectMin().y,
                                 ImGui::GetItemRectMax().x, ImGui::GetItemRectMax().y};
  } else if (!r.cancelled.empty() && r.cancelled == r.want) {
    ImGui::TextColored(warn, "%s cancelled (%s).", what, r.estimate_text.c_str());
    ImGui::SameLine();
    if (ImGui::SmallButton("Run")) s.run_now(name);
  } else if (!r.waiting.empty() && !r.fresh()) {
    ImGui::TextDisabled("%s: %s ...", what, r.waiting.c_str());
  } else if (!r.error.empty() && r.key == r.want) {
    ImGui::TextColored(bad, "%s failed: %s", what, r.error.c_str());
    ImGui::SameLine();
    if (ImGui::SmallButton("Re-run")) s.run_now(name);
  } else {
    drew = false;
  }
  if (r.stale() && r.has_value()) {
    if (drew) ImGui::SameLine();
    ImGui::TextColored(warn, "[stale: shown for earlier settings]");
    drew = true;
  } else if (r.partial && r.busy()) {
    if (drew) ImGui::SameLine();
    ImGui::TextDisabled("[converging]");
    drew = true;
  }
  ImGui::PopID();
  return drew;
}

}  // namespace kvscope::app

namespace kvscope::app {
void record_item(AppState& s, const std::string& name) {
  const ImVec2 a = ImGui::GetItemRectMin(), b = ImGui::GetItemRectMax();
  s.ui_items[name] = {a.x, a.y, b.x, b.y};
}
}  // namespace kvscope::app
