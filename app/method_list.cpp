#include "app/method_list.h"

#include <imgui.h>

#include "app/result_status.h"

namespace kvscope::app {

std::string method_unavailable_here(const AppState& s, const Method& method) {
  const CaptureInfo* ci = s.info();
  if (!ci) return {};
  // The parameters of the slot that runs it (A first), defaults otherwise.
  ParamValues params;
  for (int slot = 1; slot >= 0; --slot)
    if (s.method_name(slot) == method.name()) params = s.settings.method[slot].params;
  return method_unavailable(method, *ci, params);
}

std::optional<ParamValues> without_output_projection(const Method& method) {
  if (!method.needs_output_projection({})) return std::nullopt;
  for (const ParamSpec& p : method.params()) {
    if (p.type != ParamSpec::Type::Choice) continue;
    for (size_t c = 0; c < p.choices.size(); ++c)
      if (p.choices[c] == "identity") {
        ParamValues v{{p.name, static_cast<double>(c)}};
        if (!method.needs_output_projection(v)) return v;
      }
  }
  return std::nullopt;
}

namespace {

void reason_tooltip(const Method& method, const std::string& why) {
  if (!ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled)) return;
  ImGui::BeginTooltip();
  ImGui::PushTextWrapPos(ImGui::GetFontSize() * 30);
  ImGui::TextUnformatted(method.summary().c_str());
  if (!why.empty()) {
    ImGui::PushStyleColor(ImGuiCol_Text, ImVec4(1, 0.6f, 0.3f, 1));
    ImGui::TextUnformatted(("not available for this capture: " + why).c_str());
    ImGui::PopStyleColor();
  }
  ImGui::PopTextWrapPos();
  ImGui::EndTooltip();
}

}  // namespace

bool method_selectable(AppState& s, const Method& method, bool selected, const std::string& item) {
  const std::string why = method_unavailable_here(s, method);
  const bool picked =
      ImGui::Selectable(method.name().c_str(), selected,
                        why.empty() ? ImGuiSelectableFlags_None : ImGuiSelectableFlags_Disabled);
  record_item(s, item);
  if (!why.empty()) record_item(s, item + ":unavailable");
  reason_tooltip(method, why);
  return picked && why.empty();
}

bool method_checkbox(AppState& s, const Method& method, bool* on, const std::string& item) {
  const std::string why = method_unavailable_here(s, method);
  const bool disabled = !why.empty() && !*on;
  if (disabled) ImGui::BeginDisabled();
  const bool changed = ImGui::Checkbox(method.name().c_str(), on);
  if (disabled) ImGui::EndDisabled();
  record_item(s, item);
  if (!why.empty()) record_item(s, item + ":unavailable");
  reason_tooltip(method, why);
  return changed;
}

}  // namespace kvscope::app
