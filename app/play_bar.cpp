// The playback bar (app/play_bar.h).
#include "app/play_bar.h"

#include <imgui.h>

#include "app/result_status.h"
#include "app/ui_layout.h"

namespace kvscope::app {
namespace {

// "play" and "pause" share one width, so the buttons after it stay put when it toggles.
float play_width() {
  return ImGui::CalcTextSize("pause").x + ImGui::GetStyle().FramePadding.x * 2;
}

}  // namespace

float play_bar_width(const PlayBar& bar) {
  return button_width(bar.first_label) + button_width(bar.back_label) + play_width() +
         button_width(bar.forward_label) + button_width(bar.last_label) +
         4 * ImGui::GetStyle().ItemSpacing.x;
}

void draw_play_bar(AppState* s, const PlayBar& bar) {
  if (!bar.can_back) ImGui::BeginDisabled();
  if (ImGui::Button(bar.first_label) && bar.first) bar.first();
  ImGui::SameLine();
  if (ImGui::Button(bar.back_label) && bar.back) bar.back();
  if (!bar.can_back) ImGui::EndDisabled();
  ImGui::SameLine();
  const bool play_disabled = !bar.can_forward && !bar.playing;
  if (play_disabled) ImGui::BeginDisabled();
  if (ImGui::Button(bar.playing ? "pause" : "play", ImVec2(play_width(), 0)) && bar.toggle)
    bar.toggle();
  if (play_disabled) ImGui::EndDisabled();
  ImGui::SameLine();
  if (!bar.can_forward) ImGui::BeginDisabled();
  if (ImGui::Button(bar.forward_label) && bar.forward) bar.forward();
  if (s && !bar.record.empty()) record_item(*s, "button:" + bar.record + " step");
  ImGui::SameLine();
  if (ImGui::Button(bar.last_label) && bar.last) bar.last();
  if (s && !bar.record.empty()) record_item(*s, "button:" + bar.record + " run");
  if (!bar.can_forward) ImGui::EndDisabled();
  if (bar.hint && ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled))
    ImGui::SetTooltip("%s", bar.hint);
}

}  // namespace kvscope::app
