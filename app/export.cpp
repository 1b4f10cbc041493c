#include "app/export.h"

#include <stb_image_write.h>  // implementation in Debian's libstb

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <unordered_map>

#include "app/views/view.h"
#include "engine/core/error.h"

namespace kvscope::app {

void write_png(const std::string& path, const std::vector<uint8_t>& rgba, int width, int height,
               bool bottom_up, ScreenRect rect) {
  int x0 = 0, y0 = 0, x1 = width, y1 = height;
  if (!rect.empty()) {
    x0 = std::clamp(static_cast<int>(std::floor(rect.x0)), 0, width);
    y0 = std::clamp(static_cast<int>(std::floor(rect.y0)), 0, height);
    x1 = std::clamp(static_cast<int>(std::ceil(rect.x1)), 0, width);
    y1 = std::clamp(static_cast<int>(std::ceil(rect.y1)), 0, height);
  }
  const int w = x1 - x0, h = y1 - y0;
  if (w <= 0 || h <= 0 || rgba.size() < static_cast<size_t>(width) * height * 4)
    throw InputError(path + ": nothing to write (empty image region)");
  std::vector<uint8_t> out(static_cast<size_t>(w) * h * 4);
  for (int y = 0; y < h; ++y) {
    int src_row = bottom_up ? (height - 1 - (y0 + y)) : (y0 + y);
    const uint8_t* src = rgba.data() + (static_cast<size_t>(src_row) * width + x0) * 4;
    uint8_t* dst = out.data() + static_cast<size_t>(y) * w * 4;
    std::copy(src, src + static_cast<size_t>(w) * 4, dst);
    for (int x = 0; x < w; ++x) dst[x * 4 + 3] = 255;  // the window is opaque
  }
  if (!stbi_write_png(path.c_str(), w, h, 4, out.data(), w * 4))
    throw InputError(path + ": cannot write PNG (check the folder exists and is writable)");
}

namespace {

struct Rgba {
  int r, g, b;
  float a;
};

Rgba rgba_of(ImU32 c) {
  return {static_cast<int>((c >> IM_COL32_R_SHIFT) & 0xFF),
          static_cast<int>((c >> IM_COL32_G_SHIFT) & 0xFF),
          static_cast<int>((c >> IM_COL32_B_SHIFT) & 0xFF),
          static_cast<float>((c >> IM_COL32_A_SHIFT) & 0xFF) / 255.0f};
}

std::string colour_attr(const char* what, ImU32 c) {
  const Rgba k = rgba_of(c);
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s=\"#%02x%02x%02x\"", what, k.r, k.g, k.b);
  std::string out = buf;
  if (k.a < 0.999f) {
    std::snprintf(buf, sizeof buf, " %s-opacity=\"%.3f\"", what, k.a);
    out += buf;
  }
  return out;
}

std::string xml_escape(const std::string& t) {
  std::string out;
  for (char ch : t) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        if (static_cast<unsigned char>(ch) >= 0x20 || ch == '\t') out += ch;
    }
  }
  return out;
}

void append_utf8(std::string& out, unsigned int cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// A glyph found in the draw data: where its pen and line top were, its size and colour.
struct PlacedGlyph {
  const ImFontGlyph* glyph;
  float pen_x, line_y, scale;
  ImU32 col;
  int clip;
};

// Atlas texture rectangle -> glyph, for every font in the atlas.
struct GlyphIndex {
  struct Entry {
    const ImFont* font;
    const ImFontGlyph* glyph;
  };
  std::unordered_map<uint64_t, Entry> by_uv;
  static uint64_t key(float u0, float v0, float u1, float v1) {
    auto q = [](float f) { return static_cast<uint64_t>(std::lround(f * 65535.0f)) & 0xFFFF; };
    return q(u0) | q(v0) << 16 | q(u1) << 32 | q(v1) << 48;
  }
  GlyphIndex() {
    const ImFontAtlas* atlas = ImGui::GetIO().Fonts;
    for (const ImFont* f : atlas->Fonts)
      for (const ImFontGlyph& g : f->Glyphs)
        if (g.Visible) by_uv.emplace(key(g.U0, g.V0, g.U1, g.V1), Entry{f, &g});
  }
};

// The SVG font-size of an ImGui font: ImGui sizes a font by its pixel height (ascent - descent,
// stb_truetype's ScaleForPixelHeight), SVG by its em. em = FontSize * unitsPerEm /
// (ascent - descent), read from the TrueType 'head' and 'hhea' tables of the font data the atlas
// keeps. Falls back to FontSize when the data is not there.
float em_size(const ImFont* f) {
  const ImFontConfig* cfg = f->ConfigData;
  if (!cfg || !cfg->FontData || cfg->FontDataSize < 12) return f->FontSize;
  const auto* d = static_cast<const unsigned char*>(cfg->FontData);
  const size_t n = static_cast<size_t>(cfg->FontDataSize);
  auto u16 = [&](size_t at) { return at + 2 <= n ? (d[at] << 8 | d[at + 1]) : 0; };
  auto u32 = [&](size_t at) {
    return at + 4 <= n ? (static_cast<uint32_t>(u16(at)) << 16 | static_cast<uint32_t>(u16(at + 2)))
                       : 0u;
  };
  const int tables = u16(4);
  size_t head = 0, hhea = 0;
  for (int t = 0; t < tables; ++t) {
    const size_t e = 12 + 16 * static_cast<size_t>(t);
    if (e + 16 > n) break;
    if (std::memcmp(d + e, "head", 4) == 0) head = u32(e + 8);
    if (std::memcmp(d + e, "hhea", 4) == 0) hhea = u32(e + 8);
  }
  if (!head || !hhea || head + 20 > n || hhea + 8 > n) return f->FontSize;
  const int units_per_em = u16(head + 18);
  const int ascent = static_cast<int16_t>(u16(hhea + 4));
  const int descent = static_cast<int16_t>(u16(hhea + 6));
  if (units_per_em <= 0 || ascent - descent <= 0) return f->FontSize;
  return f->FontSize * static_cast<float>(units_per_em) / static_cast<float>(ascent - descent);
}

std::string num(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  std::string s = buf;
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s == "-0" ? "0" : s;
}

// The three corners of one triangle of a draw list.
using Triangle = std::array<const ImDrawVert*, 3>;

// A solid triangle's colour: flat, or the mean of a gradient's corners (colour bars are drawn in
// steps).
ImU32 triangle_colour(const Triangle& v) {
  ImU32 col = v[0]->col;
  if (v[1]->col != col || v[2]->col != col) {
    float acc[4] = {0, 0, 0, 0};
    for (const ImDrawVert* p : v)
      for (int c = 0; c < 4; ++c) acc[c] += static_cast<float>((p->col >> (8 * c)) & 0xFF);
    col = 0;
    for (int c = 0; c < 4; ++c) col |= static_cast<ImU32>(std::lround(acc[c] / 3.0f)) << (8 * c);
  }
  return col;
}

// Turns a frame's draw commands, in order, into SVG: solid triangles into paths, glyph quads into
// text runs, each under its clip rectangle; `rect` (window coordinates) is the SVG's frame.
class SvgBuilder {
 public:
  explicit SvgBuilder(ScreenRect rect)
      : rect_(rect), white_(ImGui::GetIO().Fonts->TexUvWhitePixel) {}
  void add_command(const ImDrawList* list, const ImDrawCmd& cmd);
  // Writes out the path and text run still open; call after the last command.
  void finish() {
    flush_text();
    flush_path();
  }
  std::string document(ImU32 background) const;

 private:
  int clip_id(const ImVec4& c);
  void flush_path();
  void flush_text();
  void add_triangle(const Triangle& v, const ImVec4& clip, int cid);
  void add_solid_triangle(const Triangle& v, int cid);
  void add_glyph_triangle(const Triangle& v, float x0, float y0, float x1, int cid);

  const ScreenRect rect_;
  const ImVec2 white_;  // the atlas's white pixel: the uv of untextured shapes
  const GlyphIndex glyphs_;
  std::ostringstream body_;
  std::vector<ImVec4> clips_;  // distinct clip rectangles, in the SVG's coordinates
  // Shapes of one colour under one clip rectangle accumulate into one path; a change of either
  // (or text in between, to keep the painter's order) flushes it.
  std::string path_d_;
  ImU32 path_col_ = 0;
  int path_clip_ = -1;
  std::vector<PlacedGlyph> run_;  // glyphs of one line of text, one colour and font
  const ImFont* run_font_ = nullptr;
};

// The index of clip rectangle `c`, added when it is new.
int SvgBuilder::clip_id(const ImVec4& c) {
  for (size_t i = 0; i < clips_.size(); ++i)
    if (clips_[i].x == c.x && clips_[i].y == c.y && clips_[i].z == c.z && clips_[i].w == c.w)
      return static_cast<int>(i);
  clips_.push_back(c);
  return static_cast<int>(clips_.size()) - 1;
}

// Writes the shapes gathered so far as one <path> element.
void SvgBuilder::flush_path() {
  if (!path_d_.empty())
    body_ << "<path clip-path=\"url(#c" << path_clip_ << ")\" " << colour_attr("fill", path_col_)
          << " d=\"" << path_d_ << "\"/>\n";
  path_d_.clear();
}

// Writes the glyph run gathered so far as one <text> element, with spaces where the pen moved
// on by a space or more between glyphs.
void SvgBuilder::flush_text() {
  if (run_.empty()) return;
  const PlacedGlyph& g0 = run_.front();
  std::string text;
  const ImFontGlyph* space = run_font_->FindGlyphNoFallback(' ');
  const float space_adv = space ? space->AdvanceX : run_font_->FontSize * 0.3f;
  float expected = g0.pen_x;
  for (const PlacedGlyph& g : run_) {
    const float gap = g.pen_x - expected;
    if (gap > space_adv * g.scale * 0.5f)
      text.append(static_cast<size_t>(std::lround(gap / (space_adv * g.scale))), ' ');
    append_utf8(text, g.glyph->Codepoint);
    expected = g.pen_x + g.glyph->AdvanceX * g.scale;
  }
  // textLength pins the run to the width ImGui laid it out with, so a viewer's font metrics
  // (kerning, hinting) cannot make labels run into their neighbours.
  const float width = expected - g0.pen_x;
  body_ << "<text clip-path=\"url(#c" << g0.clip << ")\" x=\"" << num(g0.pen_x - rect_.x0)
        << "\" y=\"" << num(g0.line_y + run_font_->Ascent * g0.scale - rect_.y0)
        << "\" font-size=\"" << num(em_size(run_font_) * g0.scale) << "\" textLength=\""
        << num(width) << "\" lengthAdjust=\"spacingAndGlyphs\" " << colour_attr("fill", g0.col)
        << " xml:space=\"preserve\">" << xml_escape(text) << "</text>\n";
  run_.clear();
}

// The command's triangles, clipped to its clip rectangle within the SVG's frame.
void SvgBuilder::add_command(const ImDrawList* list, const ImDrawCmd& cmd) {
  ImVec4 clip(std::max(cmd.ClipRect.x, rect_.x0), std::max(cmd.ClipRect.y, rect_.y0),
              std::min(cmd.ClipRect.z, rect_.x1), std::min(cmd.ClipRect.w, rect_.y1));
  if (clip.z <= clip.x || clip.w <= clip.y) return;
  const int cid =
      clip_id(ImVec4(clip.x - rect_.x0, clip.y - rect_.y0, clip.z - rect_.x0, clip.w - rect_.y0));
  for (unsigned int e = 0; e + 2 < cmd.ElemCount; e += 3) {
    const ImDrawIdx* idx = list->IdxBuffer.Data + cmd.IdxOffset + e;
    Triangle v;
    for (int k = 0; k < 3; ++k) v[k] = &list->VtxBuffer[static_cast<int>(cmd.VtxOffset + idx[k])];
    add_triangle(v, clip, cid);
  }
}

// A triangle inside the clip rectangle: untextured, it is a shape; textured, part of a glyph.
void SvgBuilder::add_triangle(const Triangle& v, const ImVec4& clip, int cid) {
  float x0 = v[0]->pos.x, x1 = x0, y0 = v[0]->pos.y, y1 = y0;
  for (const ImDrawVert* p : v) {
    x0 = std::min(x0, p->pos.x), x1 = std::max(x1, p->pos.x);
    y0 = std::min(y0, p->pos.y), y1 = std::max(y1, p->pos.y);
  }
  if (x1 < clip.x || x0 > clip.z || y1 < clip.y || y0 > clip.w) return;
  bool solid = true;
  for (const ImDrawVert* p : v)
    solid = solid && std::fabs(p->uv.x - white_.x) < 1e-6f && std::fabs(p->uv.y - white_.y) < 1e-6f;
  if (solid)
    add_solid_triangle(v, cid);
  else
    add_glyph_triangle(v, x0, y0, x1, cid);
}

// A visible, non-degenerate solid triangle joins the path of its colour and clip rectangle.
void SvgBuilder::add_solid_triangle(const Triangle& v, int cid) {
  const ImU32 col = triangle_colour(v);
  if ((col >> IM_COL32_A_SHIFT) == 0) return;
  if (std::fabs((v[1]->pos.x - v[0]->pos.x) * (v[2]->pos.y - v[0]->pos.y) -
                (v[1]->pos.y - v[0]->pos.y) * (v[2]->pos.x - v[0]->pos.x)) < 1e-4f)
    return;  // degenerate
  flush_text();
  if (col != path_col_ || cid != path_clip_) flush_path();
  path_col_ = col;
  path_clip_ = cid;
  for (int k = 0; k < 3; ++k) {  // appended piece by piece (GCC 12 -Wrestrict on a + b)
    path_d_.append(k == 0 ? "M" : "L");
    path_d_.append(num(v[k]->pos.x - rect_.x0));
    path_d_.append(" ");
    path_d_.append(num(v[k]->pos.y - rect_.y0));
  }
  path_d_.append("Z");
}

// A textured triangle whose texture rectangle is a glyph's joins the current text run, or
// starts a new one when it does not continue that run's line; (x0, y0, x1) are its screen bounds.
void SvgBuilder::add_glyph_triangle(const Triangle& v, float x0, float y0, float x1, int cid) {
  // A glyph quad is two triangles over the same texture rectangle; take it at the first.
  float u0 = v[0]->uv.x, u1 = u0, t0 = v[0]->uv.y, t1 = t0;
  for (const ImDrawVert* p : v) {
    u0 = std::min(u0, p->uv.x), u1 = std::max(u1, p->uv.x);
    t0 = std::min(t0, p->uv.y), t1 = std::max(t1, p->uv.y);
  }
  auto it = glyphs_.by_uv.find(GlyphIndex::key(u0, t0, u1, t1));
  if (it == glyphs_.by_uv.end()) return;  // clipped glyph or a non-font texture
  const ImFontGlyph* g = it->second.glyph;
  const float gw = g->X1 - g->X0;
  const float scale = gw > 0 ? (x1 - x0) / gw : 1.0f;
  PlacedGlyph pg{g, x0 - g->X0 * scale, y0 - g->Y0 * scale, scale, v[0]->col, cid};
  if (!run_.empty()) {
    const PlacedGlyph& last = run_.back();
    if (last.glyph == pg.glyph && std::fabs(last.pen_x - pg.pen_x) < 0.01f &&
        std::fabs(last.line_y - pg.line_y) < 0.01f)
      return;  // the quad's second triangle
    const bool same_line =
        std::fabs(last.line_y - pg.line_y) < 0.5f && last.col == pg.col && last.clip == pg.clip &&
        std::fabs(last.scale - pg.scale) < 0.01f && it->second.font == run_font_ &&
        pg.pen_x > last.pen_x &&
        pg.pen_x < last.pen_x + (last.glyph->AdvanceX + run_font_->FontSize * 2) * last.scale;
    if (!same_line) flush_text();
  }
  flush_path();
  run_font_ = it->second.font;
  run_.push_back(pg);
}

// The whole document: the clip rectangles, the background, then the body.
std::string SvgBuilder::document(ImU32 background) const {
  const float W = rect_.x1 - rect_.x0, H = rect_.y1 - rect_.y0;
  std::ostringstream svg;
  svg << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" << num(W)
      << "\" height=\"" << num(H) << "\" viewBox=\"0 0 " << num(W) << " " << num(H)
      << "\" font-family=\"DejaVu Sans, Verdana, sans-serif\">\n<defs>\n";
  for (size_t i = 0; i < clips_.size(); ++i)
    svg << "<clipPath id=\"c" << i << "\"><rect x=\"" << num(clips_[i].x) << "\" y=\""
        << num(clips_[i].y) << "\" width=\"" << num(clips_[i].z - clips_[i].x) << "\" height=\""
        << num(clips_[i].w - clips_[i].y) << "\"/></clipPath>\n";
  svg << "</defs>\n<rect x=\"0\" y=\"0\" width=\"" << num(W) << "\" height=\"" << num(H) << "\" "
      << colour_attr("fill", background) << "/>\n"
      << body_.str() << "</svg>\n";
  return svg.str();
}

}  // namespace

bool is_svg_path(const std::string& path) {
  if (path.size() < 4) return false;
  std::string ext = path.substr(path.size() - 4);
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext == ".svg";
}

std::string draw_data_to_svg(const ImDrawData* dd, ScreenRect rect, ImU32 background) {
  if (!dd || !dd->Valid) throw InputError("svg: no frame has been drawn");
  if (rect.empty())
    rect = {dd->DisplayPos.x, dd->DisplayPos.y, dd->DisplayPos.x + dd->DisplaySize.x,
            dd->DisplayPos.y + dd->DisplaySize.y};
  SvgBuilder svg(rect);
  for (int l = 0; l < dd->CmdListsCount; ++l) {
    const ImDrawList* list = dd->CmdLists[l];
    for (const ImDrawCmd& cmd : list->CmdBuffer)
      if (!cmd.UserCallback) svg.add_command(list, cmd);
  }
  svg.finish();
  return svg.document(background);
}

void write_svg(const std::string& path, const ImDrawData* dd, ScreenRect rect, ImU32 background) {
  const std::string text = draw_data_to_svg(dd, rect, background);
  std::ofstream f(path, std::ios::binary);
  if (!f) throw InputError(path + ": cannot open for writing (check the folder exists)");
  f << text;
  if (!f) throw InputError(path + ": write failed");
}

void export_view_data(const View& view, const AppState& s, const std::string& path) {
  bool csv = path.size() >= 4 && path.substr(path.size() - 4) == ".csv";
  std::string text;
  if (csv) {
    text = view.export_csv(s);
  } else {
    nlohmann::json j = view.export_json(s);
    if (!j.is_null()) text = j.dump(2) + "\n";
  }
  if (text.empty())
    throw InputError(std::string("export: the ") + view.title() +
                     " view has no numbers to export yet (wait for its results)");
  std::ofstream f(path, std::ios::binary);
  if (!f) throw InputError(path + ": cannot open for writing");
  f << text;
  if (!f) throw InputError(path + ": write failed");
}

}  // namespace kvscope::app
