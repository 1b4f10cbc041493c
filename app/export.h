// Exports: a rendered RGBA frame (or a rectangle of it) to PNG, and a view's numbers to CSV or
// JSON. The pixels come from glReadPixels (app/screenshot.cpp) or from the software rasteriser
// (app/soft_render.cpp); this file does not know which.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "app/app_frame.h"

namespace kvscope::app {

struct AppState;
class View;

// Writes rows [y0, y1) x cols [x0, x1) of an RGBA8 image (row 0 = top unless `bottom_up`).
// An empty rect writes the whole image. Throws InputError when the file cannot be written.
void write_png(const std::string& path, const std::vector<uint8_t>& rgba, int width, int height,
               bool bottom_up, ScreenRect rect = {});

// Writes the view's numbers: .csv -> View::export_csv, anything else -> View::export_json
// (pretty-printed). Throws InputError when the view has no numbers or the file cannot be written.
void export_view_data(const View& view, const AppState& s, const std::string& path);

}  // namespace kvscope::app
