// Exports: a rendered RGBA frame (or a rectangle of it) to PNG, and a view's numbers to CSV or
// JSON. The pixels come from glReadPixels (app/screenshot.cpp) or from the software rasteriser
// (app/soft_render.cpp); this file does not know which.
#pragma once

#include <imgui.h>

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

// A frame's draw lists as an SVG document of the rectangle `rect` (window coordinates; empty:
// the whole display): filled shapes become <path> elements (the triangles of one colour and clip
// rectangle merged into one path), text becomes <text> elements, so a figure stays editable and
// scales without pixels. Text is recovered from the glyph quads the font emitted (each glyph's
// texture rectangle identifies it in the atlas), which catches every string a view or widget
// drew. Expects a frame drawn with anti-aliasing off (AppUi::before_frame does that for SVG
// requests): anti-aliased lines are textured and their fringes translucent.
std::string draw_data_to_svg(const ImDrawData* dd, ScreenRect rect, ImU32 background);
void write_svg(const std::string& path, const ImDrawData* dd, ScreenRect rect, ImU32 background);

// True when the path ends in .svg (case-insensitive).
bool is_svg_path(const std::string& path);

// Writes the view's numbers: .csv -> View::export_csv, anything else -> View::export_json
// (pretty-printed). Throws InputError when the view has no numbers or the file cannot be written.
void export_view_data(const View& view, const AppState& s, const std::string& path);

}  // namespace kvscope::app
