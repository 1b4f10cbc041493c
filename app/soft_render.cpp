#include "app/soft_render.h"

#include <algorithm>
#include <cmath>

#include "app/app_frame.h"

namespace kvscope::app {
namespace {

struct Vec4f {
  float r, g, b, a;
};

Vec4f unpack(ImU32 c) {
  return {static_cast<float>((c >> IM_COL32_R_SHIFT) & 0xFF) / 255.0f,
          static_cast<float>((c >> IM_COL32_G_SHIFT) & 0xFF) / 255.0f,
          static_cast<float>((c >> IM_COL32_B_SHIFT) & 0xFF) / 255.0f,
          static_cast<float>((c >> IM_COL32_A_SHIFT) & 0xFF) / 255.0f};
}

// Twice the signed area of (a, b, p): which side of edge a->b the point p is on.
inline float edge(const ImVec2& a, const ImVec2& b, float px, float py) {
  return (b.x - a.x) * (py - a.y) - (b.y - a.y) * (px - a.x);
}

// Top-left fill rule, so that pixels on an edge shared by two triangles are blended once (the
// anti-aliased fringes of ImGui's shapes would otherwise show seams).
inline bool is_top_left(const ImVec2& a, const ImVec2& b, bool ccw) {
  float dx = b.x - a.x, dy = b.y - a.y;
  if (!ccw) {
    dx = -dx;
    dy = -dy;
  }
  return (dy == 0 && dx < 0) || dy > 0;
}

void draw_triangle(const ImDrawVert& v0, const ImDrawVert& v1, const ImDrawVert& v2,
                   const SoftTexture& tex, bool use_tex, const ImVec4& clip, int width, int height,
                   std::vector<uint8_t>& out) {
  float area = edge(v0.pos, v1.pos, v2.pos.x, v2.pos.y);
  if (std::fabs(area) < 1e-8f) return;
  const bool ccw = area > 0;
  int x0 = std::max({0, static_cast<int>(std::floor(clip.x)),
                     static_cast<int>(std::floor(std::min({v0.pos.x, v1.pos.x, v2.pos.x})))});
  int y0 = std::max({0, static_cast<int>(std::floor(clip.y)),
                     static_cast<int>(std::floor(std::min({v0.pos.y, v1.pos.y, v2.pos.y})))});
  int x1 = std::min({width, static_cast<int>(std::ceil(clip.z)),
                     static_cast<int>(std::ceil(std::max({v0.pos.x, v1.pos.x, v2.pos.x})))});
  int y1 = std::min({height, static_cast<int>(std::ceil(clip.w)),
                     static_cast<int>(std::ceil(std::max({v0.pos.y, v1.pos.y, v2.pos.y})))});
  if (x0 >= x1 || y0 >= y1) return;
  const Vec4f c0 = unpack(v0.col), c1 = unpack(v1.col), c2 = unpack(v2.col);
  const bool flat = v0.col == v1.col && v1.col == v2.col;
  const bool tl0 = is_top_left(v1.pos, v2.pos, ccw), tl1 = is_top_left(v2.pos, v0.pos, ccw),
             tl2 = is_top_left(v0.pos, v1.pos, ccw);
  const float inv = 1.0f / area;
  for (int y = y0; y < y1; ++y) {
    const float py = static_cast<float>(y) + 0.5f;
    uint8_t* row = out.data() + static_cast<size_t>(y) * width * 4;
    for (int x = x0; x < x1; ++x) {
      const float px = static_cast<float>(x) + 0.5f;
      float w0 = edge(v1.pos, v2.pos, px, py) * inv;
      float w1 = edge(v2.pos, v0.pos, px, py) * inv;
      float w2 = edge(v0.pos, v1.pos, px, py) * inv;
      if (w0 < 0 || w1 < 0 || w2 < 0) continue;
      if ((w0 == 0 && !tl0) || (w1 == 0 && !tl1) || (w2 == 0 && !tl2)) continue;
      Vec4f c = flat ? c0
                     : Vec4f{w0 * c0.r + w1 * c1.r + w2 * c2.r, w0 * c0.g + w1 * c1.g + w2 * c2.g,
                             w0 * c0.b + w1 * c1.b + w2 * c2.b, w0 * c0.a + w1 * c1.a + w2 * c2.a};
      if (use_tex) {
        float u = w0 * v0.uv.x + w1 * v1.uv.x + w2 * v2.uv.x;
        float v = w0 * v0.uv.y + w1 * v1.uv.y + w2 * v2.uv.y;
        int tx = std::clamp(static_cast<int>(u * static_cast<float>(tex.width)), 0, tex.width - 1);
        int ty =
            std::clamp(static_cast<int>(v * static_cast<float>(tex.height)), 0, tex.height - 1);
        const unsigned char* t = tex.rgba + (static_cast<size_t>(ty) * tex.width + tx) * 4;
        c.r *= t[0] / 255.0f;
        c.g *= t[1] / 255.0f;
        c.b *= t[2] / 255.0f;
        c.a *= t[3] / 255.0f;
      }
      if (c.a <= 0.0f) continue;
      uint8_t* d = row + x * 4;
      const float ia = 1.0f - c.a;
      d[0] = static_cast<uint8_t>(
          std::lround(std::clamp(c.r * c.a * 255.0f + d[0] * ia, 0.0f, 255.0f)));
      d[1] = static_cast<uint8_t>(
          std::lround(std::clamp(c.g * c.a * 255.0f + d[1] * ia, 0.0f, 255.0f)));
      d[2] = static_cast<uint8_t>(
          std::lround(std::clamp(c.b * c.a * 255.0f + d[2] * ia, 0.0f, 255.0f)));
      d[3] = 255;
    }
  }
}

}  // namespace

void soft_render(const ImDrawData* dd, const SoftTexture& font, int width, int height,
                 std::vector<uint8_t>& out, ImU32 clear) {
  out.assign(static_cast<size_t>(width) * height * 4, 0);
  const Vec4f cc = unpack(clear);
  for (size_t i = 0; i < out.size(); i += 4) {
    out[i] = static_cast<uint8_t>(cc.r * 255);
    out[i + 1] = static_cast<uint8_t>(cc.g * 255);
    out[i + 2] = static_cast<uint8_t>(cc.b * 255);
    out[i + 3] = 255;
  }
  if (!dd || !dd->Valid) return;
  const ImVec2 off = dd->DisplayPos;
  for (int l = 0; l < dd->CmdListsCount; ++l) {
    const ImDrawList* list = dd->CmdLists[l];
    for (const ImDrawCmd& cmd : list->CmdBuffer) {
      if (cmd.UserCallback) continue;  // no render-state callbacks in the app
      ImVec4 clip(cmd.ClipRect.x - off.x, cmd.ClipRect.y - off.y, cmd.ClipRect.z - off.x,
                  cmd.ClipRect.w - off.y);
      if (clip.z <= clip.x || clip.w <= clip.y) continue;
      const bool use_tex = font.rgba && cmd.TextureId == ImGui::GetIO().Fonts->TexID;
      for (unsigned int e = 0; e + 2 < cmd.ElemCount; e += 3) {
        const ImDrawIdx* idx = list->IdxBuffer.Data + cmd.IdxOffset + e;
        ImDrawVert a = list->VtxBuffer[static_cast<int>(cmd.VtxOffset + idx[0])];
        ImDrawVert b = list->VtxBuffer[static_cast<int>(cmd.VtxOffset + idx[1])];
        ImDrawVert c = list->VtxBuffer[static_cast<int>(cmd.VtxOffset + idx[2])];
        for (ImDrawVert* v : {&a, &b, &c}) {
          v->pos.x -= off.x;
          v->pos.y -= off.y;
        }
        draw_triangle(a, b, c, font, use_tex, clip, width, height, out);
      }
    }
  }
}

SoftTexture soft_font_texture() {
  ImGuiIO& io = ImGui::GetIO();
  SoftTexture t;
  unsigned char* px = nullptr;
  io.Fonts->GetTexDataAsRGBA32(&px, &t.width, &t.height);
  t.rgba = px;
  io.Fonts->SetTexID(reinterpret_cast<ImTextureID>(static_cast<intptr_t>(1)));
  return t;
}

SoftTexture soft_init(int width, int height, float ui_scale) {
  IMGUI_CHECKVERSION();
  ImGui::CreateContext();
  ImGuiIO& io = ImGui::GetIO();
  io.DisplaySize = ImVec2(static_cast<float>(width), static_cast<float>(height));
  io.DeltaTime = 1.0f / 60.0f;
  setup_style_and_fonts(ui_scale);
  // Textured anti-aliased lines expect bilinear filtering; the rasteriser samples nearest, so
  // let ImGui build line fringes from geometry instead.
  ImGui::GetStyle().AntiAliasedLinesUseTex = false;
  SoftTexture t = soft_font_texture();
  // The mouse is nowhere: no hover highlights in headless pictures.
  io.MousePos = ImVec2(-FLT_MAX, -FLT_MAX);
  return t;
}

}  // namespace kvscope::app
