// One line per derived result that says where it stands: running (progress, Cancel), waiting for
// a Run click with its estimated cost, cancelled (Run), failed, or stale (computed for other
// settings). Views draw it next to whatever value the result has.
#pragma once

#include <string>

namespace kvscope::app {

struct AppState;

// Draws the status of result `name` ("grid", "sweep", ...); `what` names it for users. Returns
// true when something was drawn.
bool draw_result_status(AppState& s, const std::string& name, const char* what);

}  // namespace kvscope::app

namespace kvscope::app {
// Remembers the screen rectangle of the last ImGui item under `name` (AppState::ui_items), so
// the GUI test can find widgets without hard-coded coordinates.
void record_item(AppState& s, const std::string& name);
}  // namespace kvscope::app
