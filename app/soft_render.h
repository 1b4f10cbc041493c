// A software rasteriser for ImDrawData (the "mock GL backend" of kvscope-cli render, in the
// Polyscope spirit): the very same view code runs without a window or GL context, and its
// triangles are filled on the CPU with the font atlas as the only texture.
#pragma once

#include <imgui.h>

#include <cstdint>
#include <vector>

namespace kvscope::app {

struct SoftTexture {
  const unsigned char* rgba = nullptr;  // width x height x 4
  int width = 0, height = 0;
};

// Rasterises `dd` into `out` (width x height RGBA8, row 0 = top), cleared to `clear` first.
// Blending is GL's SRC_ALPHA / ONE_MINUS_SRC_ALPHA, clipping follows each command's ClipRect,
// texture lookups are nearest-neighbour (ImGui places glyphs on whole pixels). Draw commands with
// a texture other than the font atlas are drawn with the atlas' white pixel (vertex colour only).
void soft_render(const ImDrawData* dd, const SoftTexture& font, int width, int height,
                 std::vector<uint8_t>& out, ImU32 clear = IM_COL32(0, 0, 0, 255));

// Creates an ImGui context sized `width` x `height` with the app's style and fonts at `ui_scale`,
// builds the font atlas and returns it (the texture the rasteriser samples). Call once per
// process.
SoftTexture soft_init(int width, int height, float ui_scale = 1.0f);
// The font atlas as it is now (after setup_style_and_fonts rebuilt it at another scale).
SoftTexture soft_font_texture();

}  // namespace kvscope::app
