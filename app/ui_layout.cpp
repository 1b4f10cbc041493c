// Layout helpers (app/ui_layout.h).
#include "app/ui_layout.h"

#include <imgui.h>

#include <algorithm>

namespace kvscope::app {
namespace {
float g_ui_scale = 1.0f;
float g_figure_top = -1.0f;  // set by mark_figure_top() while a view draws
bool g_presenting = false;   // set by AppUi around a view's draw()
}  // namespace

void set_ui_scale(float scale) {
  g_ui_scale = scale;
}

float figure_top() {
  return g_figure_top;
}

void clear_figure_top() {
  g_figure_top = -1.0f;
}

float dialog_button_width(const char* widest) {
  return std::max(px(72), button_width(widest));
}

void fit_next_dialog_to_display() {
  // ImGui centres a modal only the first time it ever opens: opened again after a resize it
  // came back where the larger window had its centre, partly off the display.
  const ImGuiViewport* vp = ImGui::GetMainViewport();
  ImGui::SetNextWindowPos(vp->GetCenter(), ImGuiCond_Appearing, ImVec2(0.5f, 0.5f));
  ImGui::SetNextWindowSizeConstraints(ImVec2(0, 0), vp->Size);
}

void keep_dialog_on_screen() {
  const ImGuiViewport* vp = ImGui::GetMainViewport();
  const ImVec2 p = ImGui::GetWindowPos(), sz = ImGui::GetWindowSize();
  const ImVec2 q(std::clamp(p.x, vp->Pos.x, std::max(vp->Pos.x, vp->Pos.x + vp->Size.x - sz.x)),
                 std::clamp(p.y, vp->Pos.y, std::max(vp->Pos.y, vp->Pos.y + vp->Size.y - sz.y)));
  if (q.x != p.x || q.y != p.y) ImGui::SetWindowPos(q);
}

float px(float at_scale_1) {
  return at_scale_1 * g_ui_scale;
}

void toolbar_next(float item_width) {
  const ImGuiStyle& st = ImGui::GetStyle();
  const float last_x2 = ImGui::GetItemRectMax().x;
  const float right = ImGui::GetWindowPos().x + ImGui::GetWindowContentRegionMax().x;
  if (last_x2 + st.ItemSpacing.x + item_width <= right) ImGui::SameLine();
}

float button_width(const char* label) {
  return ImGui::CalcTextSize(label, nullptr, true).x + ImGui::GetStyle().FramePadding.x * 2;
}

float labelled_width(float w, const char* label) {
  const float text = ImGui::CalcTextSize(label, nullptr, true).x;
  return w + (text > 0 ? ImGui::GetStyle().ItemInnerSpacing.x + text : 0);
}

float fit_width(float at_scale_1, const char* label) {
  const float room = ImGui::GetContentRegionAvail().x - labelled_width(0, label) - px(4);
  return std::max(px(60), std::min(px(at_scale_1), room));
}

bool presenting_view() {
  return g_presenting;
}
void set_presenting_view(bool on) {
  g_presenting = on;
}

void mark_figure_top() {
  g_figure_top = ImGui::GetCursorScreenPos().y;
}

}  // namespace kvscope::app
