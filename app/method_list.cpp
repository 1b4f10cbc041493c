#include "app/method_list.h"

#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "app/colormap.h"
#include "app/result_status.h"

namespace kvscope::app {

std::vector<const Method*> app_methods() {
  std::vector<const Method*> out = all_methods();
  for (const std::string& wrapper : wrapper_names())
    for (const Method* inner : all_methods()) {
      // A wrapper takes one of the engine's own score-ranking methods (never a wrapped one).
      if (!inner->ranks_with_scores() || inner->name().find('(') != std::string::npos) continue;
      const Method* m = find_method(wrapper + "(" + inner->name() + ")");
      if (m && std::find(out.begin(), out.end(), m) == out.end()) out.push_back(m);
    }
  return out;
}

namespace {

// A colour past the palette: hues a golden angle apart, light enough for the dark background.
ImU32 extra_colour(int k) {
  const float h = std::fmod(0.13f + 0.618034f * static_cast<float>(k), 1.0f);
  const float v = k % 2 == 0 ? 0.95f : 0.75f;
  float r = 0, g = 0, b = 0;
  ImGui::ColorConvertHSVtoRGB(h, 0.55f, v, r, g, b);
  return IM_COL32(static_cast<int>(r * 255), static_cast<int>(g * 255), static_cast<int>(b * 255),
                  255);
}

}  // namespace

MethodColours::MethodColours(const std::vector<std::string>& drawn) {
  const std::vector<const Method*> all = app_methods();
  auto place = [&](const std::string& name) {
    for (size_t i = 0; i < all.size(); ++i)
      if (all[i]->name() == name) return static_cast<int>(i);
    return static_cast<int>(all.size());  // unknown names after every known one
  };
  std::vector<std::string> order;
  for (const std::string& n : drawn)
    if (std::find(order.begin(), order.end(), n) == order.end()) order.push_back(n);
  std::stable_sort(order.begin(), order.end(),
                   [&](const std::string& a, const std::string& b) { return place(a) < place(b); });
  std::set<ImU32> taken;
  int extra = 0;
  for (const std::string& n : order) {
    ImU32 c = 0;
    const int home = place(n) % kMethodPaletteSize;
    for (int k = 0; k < kMethodPaletteSize && c == 0; ++k) {
      const ImU32 candidate = kMethodPalette[(home + k) % kMethodPaletteSize];
      if (!taken.count(candidate)) c = candidate;
    }
    while (c == 0 || taken.count(c)) c = extra_colour(extra++);
    taken.insert(c);
    colour_[n] = c;
  }
}

ImU32 MethodColours::operator()(const std::string& name) const {
  auto it = colour_.find(name);
  return it == colour_.end() ? IM_COL32(150, 150, 150, 255) : it->second;
}

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
