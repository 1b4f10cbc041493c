#include "app/layout_check.h"

#include <imgui.h>
#include <imgui_internal.h>

#include <cstdio>

namespace kvscope::app {

std::vector<LayoutProblem> find_clipped_items() {
  std::vector<LayoutProblem> out;
  ImGuiContext& g = *GImGui;
  const ImVec2 display = g.IO.DisplaySize;
  constexpr float kSlack = 1.0f;  // sub-pixel rounding of item sizes
  for (ImGuiWindow* w : g.Windows) {
    if (!w->WasActive || w->Hidden || (w->Flags & ImGuiWindowFlags_Tooltip)) continue;
    char buf[256];
    // Top-level windows (menus, popups, the main window) must be on screen.
    if (!(w->Flags & ImGuiWindowFlags_ChildWindow)) {
      if (w->Pos.x < -kSlack || w->Pos.y < -kSlack || w->Pos.x + w->Size.x > display.x + kSlack ||
          w->Pos.y + w->Size.y > display.y + kSlack) {
        std::snprintf(buf, sizeof buf,
                      "window [%.0f, %.0f]-[%.0f, %.0f] leaves the %.0fx%.0f display", w->Pos.x,
                      w->Pos.y, w->Pos.x + w->Size.x, w->Pos.y + w->Size.y, display.x, display.y);
        out.push_back({w->Name, buf});
      }
    }
    // Items: the extent of this frame's items against the visible inner rectangle. Scrolling
    // along an axis makes what lies beyond reachable.
    const ImVec2 reach = w->DC.CursorMaxPos;
    const ImRect inner = w->InnerRect;
    // Only a visible scrollbar counts: without one (NoScrollbar, or no HorizontalScrollbar flag)
    // nothing tells the user that more is there.
    const bool can_scroll_x = w->ScrollbarX;
    const bool can_scroll_y = w->ScrollbarY;
    if (!can_scroll_x && reach.x > inner.Max.x + kSlack) {
      std::snprintf(buf, sizeof buf,
                    "items reach x = %.0f past the right edge %.0f (no horizontal scroll)", reach.x,
                    inner.Max.x);
      out.push_back({w->Name, buf});
    }
    if (!can_scroll_y && reach.y > inner.Max.y + kSlack) {
      std::snprintf(buf, sizeof buf,
                    "items reach y = %.0f past the bottom edge %.0f (no vertical scroll)", reach.y,
                    inner.Max.y);
      out.push_back({w->Name, buf});
    }
  }
  return out;
}

}  // namespace kvscope::app
