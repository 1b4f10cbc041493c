// Reads back the frame the GL app just rendered (before the buffer swap) and writes it, or a
// rectangle of it, as PNG. The only GL-dependent export code; everything else is in export.cpp.
#pragma once

#include <string>

#include "app/app_frame.h"

namespace kvscope::app {

// `rect` in window (ImGui) coordinates, scaled by `fb_scale` to framebuffer pixels; empty: all.
// Throws InputError when the file cannot be written.
void save_framebuffer_png(const std::string& path, int fb_width, int fb_height, float fb_scale_x,
                          float fb_scale_y, ScreenRect rect);

}  // namespace kvscope::app
