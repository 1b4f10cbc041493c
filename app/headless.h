// Headless rendering of one view to PNG, shared by `kvscope FILE --view NAME --screenshot OUT`
// (GL, app/main.cpp) and `kvscope-cli render` (software rasteriser, no window at all).
#pragma once

#include <string>

namespace kvscope::app {

struct AppState;
class AppUi;

struct HeadlessOptions {
  std::string capture;  // capture file to open
  std::string view = "capture";
  std::string out;         // PNG path, or SVG when it ends in .svg (vector figure)
  std::string session;     // optional session JSON applied first (its capture is overridden)
  std::string method;      // optional method A override
  std::string method_b;    // optional method B override
  double keep_ratio = -1;  // optional keep-ratio override
  std::string backend;     // optional backend override (cpu|cuda|auto)
  std::string then_open;   // scripted session: open this file once `capture` has loaded
  int width = 1600, height = 1000;
  double timeout_s = 300;    // give up waiting for the view's work after this long
  bool full_window = false;  // the whole window instead of the view's figure
  float ui_scale = 1.0f;     // UI scale (fonts and sizes, for a projector), 1 .. 2.5
  // Pixel density of the picture: the window is width x height at scale 1 and is drawn with
  // `density` times the pixels (UI scale and window size multiplied), so a 2x PNG has the 1x
  // layout with crisp text. 1 or 2 (or up to 2.5 / ui_scale).
  float density = 1.0f;
};

// Checks the options (view name, ratio, method names) and throws InputError naming the flag.
void validate_options(const HeadlessOptions& o);
// Applies the options to a fresh state and opens the capture.
void apply_options(AppState& s, AppUi& ui, const HeadlessOptions& o);

// Renders with the software rasteriser and writes the PNG. Returns 0 on success; throws
// InputError for bad input (unknown view, capture that fails to open, timeout).
int render_view_software(const HeadlessOptions& o);

}  // namespace kvscope::app
