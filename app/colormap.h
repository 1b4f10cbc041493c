// Colours used by every view, so that sink / window / kept / dropped and each method look the
// same everywhere, plus perceptual colormaps for heatmaps (viridis-like, sampled from matplotlib's
// published control points).
#pragma once

#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace kvscope::app {

// Token categories (docs/evaluation.md): sinks [0,s), the compressed middle (kept or dropped), and
// the evaluation window [n-E, n).
inline constexpr ImU32 kColSink = IM_COL32(229, 160, 46, 255);    // amber
inline constexpr ImU32 kColWindow = IM_COL32(86, 160, 229, 255);  // blue
inline constexpr ImU32 kColKept = IM_COL32(76, 190, 110, 255);    // green (shaded by weight)
inline constexpr ImU32 kColDropped = IM_COL32(70, 72, 80, 255);   // dark grey
inline constexpr ImU32 kColQuery = IM_COL32(240, 80, 80, 255);    // the selected query
inline constexpr ImU32 kColHover = IM_COL32(255, 255, 255, 255);
inline constexpr ImU32 kColSelect = IM_COL32(255, 230, 60, 255);
inline constexpr ImU32 kColRefused = IM_COL32(120, 40, 40, 255);
inline constexpr ImU32 kColExact = IM_COL32(220, 220, 220, 255);
inline constexpr ImU32 kColPlotBg = IM_COL32(24, 26, 30, 255);
inline constexpr ImU32 kColGrid = IM_COL32(60, 64, 72, 255);
inline constexpr ImU32 kColAxisText = IM_COL32(190, 194, 200, 255);

// Text colours: an error or refusal said in a view, and a warning (a synthetic capture).
inline const ImVec4 kTextError(1.0f, 0.5f, 0.4f, 1.0f);
inline const ImVec4 kTextWarning(1.0f, 0.55f, 0.3f, 1.0f);

// Slot colours of the A/B comparison.
inline constexpr ImU32 kColSlot[2] = {IM_COL32(76, 190, 110, 255), IM_COL32(200, 110, 230, 255)};

// The palette methods are drawn in (app/method_list.h, MethodColours, hands them out): one colour
// per method of the registry in its order, each apart from every other on the dark background.
inline constexpr ImU32 kMethodPalette[] = {
    IM_COL32(230, 230, 230, 255),  // light grey
    IM_COL32(100, 150, 255, 255),  // blue
    IM_COL32(255, 150, 40, 255),   // orange
    IM_COL32(235, 70, 70, 255),    // red
    IM_COL32(60, 205, 205, 255),   // cyan
    IM_COL32(160, 210, 70, 255),   // lime
    IM_COL32(170, 110, 70, 255),   // brown
    IM_COL32(140, 140, 140, 255),  // grey
    IM_COL32(255, 140, 190, 255),  // pink
    IM_COL32(120, 100, 200, 255),  // indigo
    IM_COL32(210, 210, 90, 255),   // khaki
    IM_COL32(0, 140, 200, 255),    // ocean
    IM_COL32(200, 60, 140, 255),   // magenta
    IM_COL32(240, 110, 240, 255),  // orchid
    IM_COL32(190, 130, 255, 255),  // lavender
    IM_COL32(255, 225, 60, 255),   // yellow
    IM_COL32(70, 220, 120, 255),   // green
    IM_COL32(30, 140, 80, 255),    // dark green
    IM_COL32(130, 230, 230, 255),  // light cyan
    IM_COL32(180, 255, 180, 255),  // mint
};
inline constexpr int kMethodPaletteSize = sizeof(kMethodPalette) / sizeof(kMethodPalette[0]);

inline ImU32 lerp_colour(ImU32 a, ImU32 b, float t) {
  t = std::clamp(t, 0.0f, 1.0f);
  auto ch = [&](int shift) {
    float x = static_cast<float>((a >> shift) & 0xFF), y = static_cast<float>((b >> shift) & 0xFF);
    return static_cast<ImU32>(std::lround(x + (y - x) * t)) << shift;
  };
  return ch(IM_COL32_R_SHIFT) | ch(IM_COL32_G_SHIFT) | ch(IM_COL32_B_SHIFT) | ch(IM_COL32_A_SHIFT);
}

inline ImU32 with_alpha(ImU32 c, float alpha) {
  ImU32 a = static_cast<ImU32>(std::clamp(alpha, 0.0f, 1.0f) * 255.0f + 0.5f);
  return (c & ~IM_COL32_A_MASK) | (a << IM_COL32_A_SHIFT);
}

enum class Colormap { Viridis, Magma };

// t in [0,1] -> colour (piecewise linear between 9 control points of matplotlib's maps).
inline ImU32 colormap(Colormap map, double t) {
  static constexpr unsigned char viridis[9][3] = {{68, 1, 84},    {71, 44, 122},  {59, 81, 139},
                                                  {44, 113, 142}, {33, 144, 141}, {39, 173, 129},
                                                  {92, 200, 99},  {170, 220, 50}, {253, 231, 37}};
  static constexpr unsigned char magma[9][3] = {{0, 0, 4},      {28, 16, 68},    {79, 18, 123},
                                                {129, 37, 129}, {181, 54, 122},  {229, 80, 100},
                                                {251, 135, 97}, {254, 194, 135}, {252, 253, 191}};
  const auto& cp = map == Colormap::Viridis ? viridis : magma;
  if (!std::isfinite(t)) return kColRefused;
  t = std::clamp(t, 0.0, 1.0) * 8.0;
  int i = std::min(7, static_cast<int>(t));
  double f = t - i;
  auto mix = [&](int c) {
    return static_cast<int>(std::lround(cp[i][c] + (cp[i + 1][c] - cp[i][c]) * f));
  };
  return IM_COL32(mix(0), mix(1), mix(2), 255);
}

}  // namespace kvscope::app
