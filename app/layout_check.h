// Layout checks for the GUI test (tests/gui/test_layout.cpp): after a frame, every ImGui window
// that was drawn is asked whether its items fit. A window's DC.CursorMaxPos is the union of the
// rectangles of every item submitted to it this frame (ImGui grows it in ItemSize), so "items fit"
// is: that extent lies inside the window's visible inner rectangle, or the window can scroll along
// the axis where it does not (then the item is reachable). A control past the edge of a window
// without a scrollbar is clipped and unreachable: that is what this reports.
#pragma once

#include <string>
#include <vector>

namespace kvscope::app {

struct LayoutProblem {
  std::string window;  // ImGui window name (child windows: "Parent/##child_XXXX")
  std::string what;    // "items reach x = 1043 past the right edge 1000 (no horizontal scroll)"
};

// Call after ImGui::Render() (or EndFrame). Tooltips are ignored (they follow the mouse).
std::vector<LayoutProblem> find_clipped_items();

}  // namespace kvscope::app
