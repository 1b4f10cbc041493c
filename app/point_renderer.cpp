#include "app/point_renderer.h"

#include <GL/glcorearb.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <type_traits>

#ifndef KVSCOPE_SOURCE_DIR
#define KVSCOPE_SOURCE_DIR "."
#endif

namespace kvscope::app {
namespace {

// The GL 3.3 entry points the renderer uses, resolved through glfwGetProcAddress.
struct GlApi {
  PFNGLGETERRORPROC GetError = nullptr;
  PFNGLGETINTEGERVPROC GetIntegerv = nullptr;
  PFNGLGETFLOATVPROC GetFloatv = nullptr;
  PFNGLISENABLEDPROC IsEnabled = nullptr;
  PFNGLENABLEPROC Enable = nullptr;
  PFNGLDISABLEPROC Disable = nullptr;
  PFNGLBLENDFUNCSEPARATEPROC BlendFuncSeparate = nullptr;
  PFNGLBLENDEQUATIONPROC BlendEquation = nullptr;
  PFNGLVIEWPORTPROC Viewport = nullptr;
  PFNGLCLEARCOLORPROC ClearColor = nullptr;
  PFNGLCLEARPROC Clear = nullptr;
  PFNGLGENTEXTURESPROC GenTextures = nullptr;
  PFNGLDELETETEXTURESPROC DeleteTextures = nullptr;
  PFNGLBINDTEXTUREPROC BindTexture = nullptr;
  PFNGLTEXIMAGE2DPROC TexImage2D = nullptr;
  PFNGLTEXPARAMETERIPROC TexParameteri = nullptr;
  PFNGLGENFRAMEBUFFERSPROC GenFramebuffers = nullptr;
  PFNGLDELETEFRAMEBUFFERSPROC DeleteFramebuffers = nullptr;
  PFNGLBINDFRAMEBUFFERPROC BindFramebuffer = nullptr;
  PFNGLFRAMEBUFFERTEXTURE2DPROC FramebufferTexture2D = nullptr;
  PFNGLCHECKFRAMEBUFFERSTATUSPROC CheckFramebufferStatus = nullptr;
  PFNGLCREATESHADERPROC CreateShader = nullptr;
  PFNGLSHADERSOURCEPROC ShaderSource = nullptr;
  PFNGLCOMPILESHADERPROC CompileShader = nullptr;
  PFNGLGETSHADERIVPROC GetShaderiv = nullptr;
  PFNGLGETSHADERINFOLOGPROC GetShaderInfoLog = nullptr;
  PFNGLDELETESHADERPROC DeleteShader = nullptr;
  PFNGLCREATEPROGRAMPROC CreateProgram = nullptr;
  PFNGLATTACHSHADERPROC AttachShader = nullptr;
  PFNGLLINKPROGRAMPROC LinkProgram = nullptr;
  PFNGLGETPROGRAMIVPROC GetProgramiv = nullptr;
  PFNGLGETPROGRAMINFOLOGPROC GetProgramInfoLog = nullptr;
  PFNGLDELETEPROGRAMPROC DeleteProgram = nullptr;
  PFNGLUSEPROGRAMPROC UseProgram = nullptr;
  PFNGLGETUNIFORMLOCATIONPROC GetUniformLocation = nullptr;
  PFNGLUNIFORM2FPROC Uniform2f = nullptr;
  PFNGLGENVERTEXARRAYSPROC GenVertexArrays = nullptr;
  PFNGLDELETEVERTEXARRAYSPROC DeleteVertexArrays = nullptr;
  PFNGLBINDVERTEXARRAYPROC BindVertexArray = nullptr;
  PFNGLGENBUFFERSPROC GenBuffers = nullptr;
  PFNGLDELETEBUFFERSPROC DeleteBuffers = nullptr;
  PFNGLBINDBUFFERPROC BindBuffer = nullptr;
  PFNGLBUFFERDATAPROC BufferData = nullptr;
  PFNGLVERTEXATTRIBPOINTERPROC VertexAttribPointer = nullptr;
  PFNGLENABLEVERTEXATTRIBARRAYPROC EnableVertexAttribArray = nullptr;
  PFNGLVERTEXATTRIBDIVISORPROC VertexAttribDivisor = nullptr;
  PFNGLDRAWARRAYSINSTANCEDPROC DrawArraysInstanced = nullptr;
};

using GetProcFn = void* (*)(const char*);
using CurrentContextFn = void* (*)();

// glfwGetProcAddress when this process is the windowed app with a current context, else null.
GetProcFn glfw_loader() {
  auto current = reinterpret_cast<CurrentContextFn>(dlsym(RTLD_DEFAULT, "glfwGetCurrentContext"));
  auto loader = reinterpret_cast<GetProcFn>(dlsym(RTLD_DEFAULT, "glfwGetProcAddress"));
  if (!current || !loader || !current()) return nullptr;
  return loader;
}

bool load_api(GetProcFn get, GlApi* api) {
  bool ok = true;
  auto load = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(get(name));
    ok = ok && fn != nullptr;
  };
  load(api->GetError, "glGetError");
  load(api->GetIntegerv, "glGetIntegerv");
  load(api->GetFloatv, "glGetFloatv");
  load(api->IsEnabled, "glIsEnabled");
  load(api->Enable, "glEnable");
  load(api->Disable, "glDisable");
  load(api->BlendFuncSeparate, "glBlendFuncSeparate");
  load(api->BlendEquation, "glBlendEquation");
  load(api->Viewport, "glViewport");
  load(api->ClearColor, "glClearColor");
  load(api->Clear, "glClear");
  load(api->GenTextures, "glGenTextures");
  load(api->DeleteTextures, "glDeleteTextures");
  load(api->BindTexture, "glBindTexture");
  load(api->TexImage2D, "glTexImage2D");
  load(api->TexParameteri, "glTexParameteri");
  load(api->GenFramebuffers, "glGenFramebuffers");
  load(api->DeleteFramebuffers, "glDeleteFramebuffers");
  load(api->BindFramebuffer, "glBindFramebuffer");
  load(api->FramebufferTexture2D, "glFramebufferTexture2D");
  load(api->CheckFramebufferStatus, "glCheckFramebufferStatus");
  load(api->CreateShader, "glCreateShader");
  load(api->ShaderSource, "glShaderSource");
  load(api->CompileShader, "glCompileShader");
  load(api->GetShaderiv, "glGetShaderiv");
  load(api->GetShaderInfoLog, "glGetShaderInfoLog");
  load(api->DeleteShader, "glDeleteShader");
  load(api->CreateProgram, "glCreateProgram");
  load(api->AttachShader, "glAttachShader");
  load(api->LinkProgram, "glLinkProgram");
  load(api->GetProgramiv, "glGetProgramiv");
  load(api->GetProgramInfoLog, "glGetProgramInfoLog");
  load(api->DeleteProgram, "glDeleteProgram");
  load(api->UseProgram, "glUseProgram");
  load(api->GetUniformLocation, "glGetUniformLocation");
  load(api->Uniform2f, "glUniform2f");
  load(api->GenVertexArrays, "glGenVertexArrays");
  load(api->DeleteVertexArrays, "glDeleteVertexArrays");
  load(api->BindVertexArray, "glBindVertexArray");
  load(api->GenBuffers, "glGenBuffers");
  load(api->DeleteBuffers, "glDeleteBuffers");
  load(api->BindBuffer, "glBindBuffer");
  load(api->BufferData, "glBufferData");
  load(api->VertexAttribPointer, "glVertexAttribPointer");
  load(api->EnableVertexAttribArray, "glEnableVertexAttribArray");
  load(api->VertexAttribDivisor, "glVertexAttribDivisor");
  load(api->DrawArraysInstanced, "glDrawArraysInstanced");
  return ok;
}

// shaders/<name>: next to the executable (installed), one level up (build tree), or the source
// tree; KVSCOPE_SHADER_DIR overrides.
std::string read_shader(const std::string& name, std::string* where) {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("KVSCOPE_SHADER_DIR")) dirs.emplace_back(env);
  char exe[4096];
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len > 0) {
    std::string dir(exe, static_cast<size_t>(len));
    dir = dir.substr(0, dir.find_last_of('/'));
    dirs.push_back(dir + "/shaders");
    dirs.push_back(dir + "/../shaders");
  }
  dirs.push_back(std::string(KVSCOPE_SOURCE_DIR) + "/shaders");
  for (const auto& d : dirs) {
    std::ifstream in(d + "/" + name);
    if (!in) continue;
    std::stringstream ss;
    ss << in.rdbuf();
    *where = d;
    return ss.str();
  }
  return {};
}

// What the vertex shader reads per instance.
struct GpuPoint {
  float x, y, radius, shape;
  ImU32 colour;  // R, G, B, A bytes in memory (ImGui's IM_COL32 layout)
};

// Counts the renders into any point texture: a frame whose geometry is unchanged still shows new
// content when this moved (see points_texture_revision).
uint64_t g_points_revision = 0;

}  // namespace

struct PointRenderer::Gl {
  GlApi api;
  GLuint program = 0, vao = 0, vbo = 0, fbo = 0, texture = 0;
  GLint u_canvas = -1;
  int tex_w = 0, tex_h = 0;
  std::vector<GpuPoint> staging;
  std::vector<GpuPoint> rendered;  // what the texture holds now
  float rendered_w = 0, rendered_h = 0;
  ImU32 rendered_clear = 0;

  ~Gl() {
    // Only when a context is still current (the app destroys views before the window).
    if (!glfw_loader()) return;
    if (texture) api.DeleteTextures(1, &texture);
    if (fbo) api.DeleteFramebuffers(1, &fbo);
    if (vbo) api.DeleteBuffers(1, &vbo);
    if (vao) api.DeleteVertexArrays(1, &vao);
    if (program) api.DeleteProgram(program);
  }

  GLuint compile(GLenum type, const std::string& src, std::string* error) {
    GLuint sh = api.CreateShader(type);
    const char* text = src.c_str();
    api.ShaderSource(sh, 1, &text, nullptr);
    api.CompileShader(sh);
    GLint ok = 0;
    api.GetShaderiv(sh, GL_COMPILE_STATUS, &ok);
    if (!ok) {
      char log[1024] = {0};
      api.GetShaderInfoLog(sh, sizeof log, nullptr, log);
      *error = log;
      api.DeleteShader(sh);
      return 0;
    }
    return sh;
  }

  // Returns "" on success, else why the GL path is not available.
  std::string init(GetProcFn get) {
    if (!load_api(get, &api)) return "OpenGL 3.3 entry points missing";
    std::string dir, vs_src = read_shader("points.vert", &dir),
                     fs_src = read_shader("points.frag", &dir);
    if (vs_src.empty() || fs_src.empty()) return "shaders/points.vert or points.frag not found";
    std::string error;
    GLuint vs = compile(GL_VERTEX_SHADER, vs_src, &error);
    if (!vs) return "points.vert: " + error;
    GLuint fs = compile(GL_FRAGMENT_SHADER, fs_src, &error);
    if (!fs) {
      api.DeleteShader(vs);
      return "points.frag: " + error;
    }
    program = api.CreateProgram();
    api.AttachShader(program, vs);
    api.AttachShader(program, fs);
    api.LinkProgram(program);
    api.DeleteShader(vs);
    api.DeleteShader(fs);
    GLint ok = 0;
    api.GetProgramiv(program, GL_LINK_STATUS, &ok);
    if (!ok) {
      char log[1024] = {0};
      api.GetProgramInfoLog(program, sizeof log, nullptr, log);
      return std::string("linking points shaders: ") + log;
    }
    u_canvas = api.GetUniformLocation(program, "u_canvas");

    GLint prev_vao = 0, prev_vbo = 0;
    api.GetIntegerv(GL_VERTEX_ARRAY_BINDING, &prev_vao);
    api.GetIntegerv(GL_ARRAY_BUFFER_BINDING, &prev_vbo);
    api.GenVertexArrays(1, &vao);
    api.GenBuffers(1, &vbo);
    api.BindVertexArray(vao);
    api.BindBuffer(GL_ARRAY_BUFFER, vbo);
    const GLsizei stride = sizeof(GpuPoint);
    api.VertexAttribPointer(0, 2, GL_FLOAT, GL_FALSE, stride, reinterpret_cast<void*>(0));
    api.VertexAttribPointer(1, 1, GL_FLOAT, GL_FALSE, stride,
                            reinterpret_cast<void*>(offsetof(GpuPoint, radius)));
    api.VertexAttribPointer(2, 1, GL_FLOAT, GL_FALSE, stride,
                            reinterpret_cast<void*>(offsetof(GpuPoint, shape)));
    api.VertexAttribPointer(3, 4, GL_UNSIGNED_BYTE, GL_TRUE, stride,
                            reinterpret_cast<void*>(offsetof(GpuPoint, colour)));
    for (GLuint a = 0; a < 4; ++a) {
      api.EnableVertexAttribArray(a);
      api.VertexAttribDivisor(a, 1);  // one quad per point
    }
    api.BindVertexArray(static_cast<GLuint>(prev_vao));
    api.BindBuffer(GL_ARRAY_BUFFER, static_cast<GLuint>(prev_vbo));
    return api.GetError() == GL_NO_ERROR ? "" : "OpenGL error while creating the point buffers";
  }

  bool ensure_target(int w, int h) {
    if (w == tex_w && h == tex_h && fbo) return true;
    GLint prev_tex = 0;
    api.GetIntegerv(GL_TEXTURE_BINDING_2D, &prev_tex);
    if (!texture) api.GenTextures(1, &texture);
    api.BindTexture(GL_TEXTURE_2D, texture);
    api.TexImage2D(GL_TEXTURE_2D, 0, GL_RGBA8, w, h, 0, GL_RGBA, GL_UNSIGNED_BYTE, nullptr);
    api.TexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MIN_FILTER, GL_LINEAR);
    api.TexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MAG_FILTER, GL_LINEAR);
    api.TexParameteri(GL_TEXTURE_2D, GL_TEXTURE_WRAP_S, GL_CLAMP_TO_EDGE);
    api.TexParameteri(GL_TEXTURE_2D, GL_TEXTURE_WRAP_T, GL_CLAMP_TO_EDGE);
    api.BindTexture(GL_TEXTURE_2D, static_cast<GLuint>(prev_tex));
    if (!fbo) api.GenFramebuffers(1, &fbo);
    GLint prev_fbo = 0;
    api.GetIntegerv(GL_DRAW_FRAMEBUFFER_BINDING, &prev_fbo);
    api.BindFramebuffer(GL_FRAMEBUFFER, fbo);
    api.FramebufferTexture2D(GL_FRAMEBUFFER, GL_COLOR_ATTACHMENT0, GL_TEXTURE_2D, texture, 0);
    const bool complete = api.CheckFramebufferStatus(GL_FRAMEBUFFER) == GL_FRAMEBUFFER_COMPLETE;
    api.BindFramebuffer(GL_FRAMEBUFFER, static_cast<GLuint>(prev_fbo));
    tex_w = w;
    tex_h = h;
    return complete;
  }

  // Renders into the texture now (the frame's ImGui draw data is rendered later, into the
  // window), leaving every piece of GL state it touched as it found it.
  bool render(float canvas_w, float canvas_h, int fb_w, int fb_h, ImU32 clear,
              const std::vector<PointInstance>& points) {
    const bool resized = fb_w != tex_w || fb_h != tex_h || !fbo;
    if (!ensure_target(fb_w, fb_h)) return false;
    staging.resize(points.size());
    for (size_t i = 0; i < points.size(); ++i) {
      const PointInstance& p = points[i];
      staging[i] = GpuPoint{p.x, p.y, p.radius, static_cast<float>(p.shape), p.colour};
    }
    // The same points on the same canvas: the texture already holds them. Drawing them again
    // would cost a software rasteriser (Xvfb, a VM without a GPU) most of an idle app's CPU.
    if (!resized && canvas_w == rendered_w && canvas_h == rendered_h && clear == rendered_clear &&
        staging.size() == rendered.size() &&
        std::memcmp(staging.data(), rendered.data(), staging.size() * sizeof(GpuPoint)) == 0)
      return true;
    rendered = staging;
    rendered_w = canvas_w, rendered_h = canvas_h, rendered_clear = clear;
    ++g_points_revision;
    GLint prev_fbo = 0, prev_program = 0, prev_vao = 0, prev_vbo = 0, viewport[4];
    api.GetIntegerv(GL_DRAW_FRAMEBUFFER_BINDING, &prev_fbo);
    api.GetIntegerv(GL_CURRENT_PROGRAM, &prev_program);
    api.GetIntegerv(GL_VERTEX_ARRAY_BINDING, &prev_vao);
    api.GetIntegerv(GL_ARRAY_BUFFER_BINDING, &prev_vbo);
    api.GetIntegerv(GL_VIEWPORT, viewport);
    GLfloat prev_clear[4];
    GLint blend_src_rgb, blend_dst_rgb, blend_src_a, blend_dst_a, blend_eq;
    api.GetIntegerv(GL_BLEND_SRC_RGB, &blend_src_rgb);
    api.GetIntegerv(GL_BLEND_DST_RGB, &blend_dst_rgb);
    api.GetIntegerv(GL_BLEND_SRC_ALPHA, &blend_src_a);
    api.GetIntegerv(GL_BLEND_DST_ALPHA, &blend_dst_a);
    api.GetIntegerv(GL_BLEND_EQUATION_RGB, &blend_eq);
    api.GetFloatv(GL_COLOR_CLEAR_VALUE, prev_clear);
    const bool blend = api.IsEnabled(GL_BLEND), scissor = api.IsEnabled(GL_SCISSOR_TEST),
               depth = api.IsEnabled(GL_DEPTH_TEST), cull = api.IsEnabled(GL_CULL_FACE);

    api.BindFramebuffer(GL_FRAMEBUFFER, fbo);
    api.Viewport(0, 0, fb_w, fb_h);
    api.Disable(GL_SCISSOR_TEST);
    api.Disable(GL_DEPTH_TEST);
    api.Disable(GL_CULL_FACE);
    // Opaque background: the texture is composited by ImGui with plain alpha blending, so the
    // points are blended here, onto the plot's own background colour.
    const ImVec4 bg = ImGui::ColorConvertU32ToFloat4(clear);
    api.ClearColor(bg.x, bg.y, bg.z, 1.0f);
    api.Clear(GL_COLOR_BUFFER_BIT);
    api.Enable(GL_BLEND);
    api.BlendEquation(GL_FUNC_ADD);
    api.BlendFuncSeparate(GL_SRC_ALPHA, GL_ONE_MINUS_SRC_ALPHA, GL_ONE, GL_ONE_MINUS_SRC_ALPHA);
    api.UseProgram(program);
    api.Uniform2f(u_canvas, canvas_w, canvas_h);
    api.BindVertexArray(vao);
    api.BindBuffer(GL_ARRAY_BUFFER, vbo);
    api.BufferData(GL_ARRAY_BUFFER, static_cast<GLsizeiptr>(staging.size() * sizeof(GpuPoint)),
                   staging.data(), GL_STREAM_DRAW);
    api.DrawArraysInstanced(GL_TRIANGLE_STRIP, 0, 4, static_cast<GLsizei>(staging.size()));

    api.BindFramebuffer(GL_FRAMEBUFFER, static_cast<GLuint>(prev_fbo));
    api.Viewport(viewport[0], viewport[1], viewport[2], viewport[3]);
    api.UseProgram(static_cast<GLuint>(prev_program));
    api.BindVertexArray(static_cast<GLuint>(prev_vao));
    api.BindBuffer(GL_ARRAY_BUFFER, static_cast<GLuint>(prev_vbo));
    api.ClearColor(prev_clear[0], prev_clear[1], prev_clear[2], prev_clear[3]);
    api.BlendEquation(static_cast<GLenum>(blend_eq));
    api.BlendFuncSeparate(static_cast<GLenum>(blend_src_rgb), static_cast<GLenum>(blend_dst_rgb),
                          static_cast<GLenum>(blend_src_a), static_cast<GLenum>(blend_dst_a));
    auto restore = [&](GLenum cap, bool on) { on ? api.Enable(cap) : api.Disable(cap); };
    restore(GL_BLEND, blend);
    restore(GL_SCISSOR_TEST, scissor);
    restore(GL_DEPTH_TEST, depth);
    restore(GL_CULL_FACE, cull);
    return api.GetError() == GL_NO_ERROR;
  }
};

uint64_t points_texture_revision() {
  return g_points_revision;
}

void request_next_frame() {
  using PostFn = void (*)();
  static const auto post = reinterpret_cast<PostFn>(dlsym(RTLD_DEFAULT, "glfwPostEmptyEvent"));
  if (post && glfw_loader()) post();
}

PointRenderer::PointRenderer() = default;
PointRenderer::~PointRenderer() = default;

void PointRenderer::draw(ImDrawList* dl, ImVec2 p0, ImVec2 p1,
                         const std::vector<PointInstance>& points) {
  const float w = p1.x - p0.x, h = p1.y - p0.y;
  if (w < 2 || h < 2) return;
  GetProcFn loader = allow_gl_ && !gl_failed_ ? glfw_loader() : nullptr;
  if (loader && !gl_) {
    gl_ = std::make_unique<Gl>();
    const std::string why = gl_->init(loader);
    if (!why.empty()) {
      gl_failed_ = true;
      fallback_reason_ = why;
      gl_.reset();
    }
  }
  if (loader && gl_) {
    const ImVec2 scale = ImGui::GetIO().DisplayFramebufferScale;
    const int fb_w = std::max(1, static_cast<int>(w * scale.x + 0.5f));
    const int fb_h = std::max(1, static_cast<int>(h * scale.y + 0.5f));
    if (gl_->render(w, h, fb_w, fb_h, IM_COL32(24, 26, 30, 255), points)) {
      // Texture row 0 is the bottom: flip v.
      dl->AddImage(reinterpret_cast<ImTextureID>(static_cast<intptr_t>(gl_->texture)), p0, p1,
                   ImVec2(0, 1), ImVec2(1, 0));
      description_ = "OpenGL instanced points";
      return;
    }
    gl_failed_ = true;
    fallback_reason_ = "OpenGL error while drawing points";
  }
  draw_imdrawlist(dl, p0, p1, points);
}

void PointRenderer::draw_imdrawlist(ImDrawList* dl, ImVec2 p0, ImVec2 p1,
                                    const std::vector<PointInstance>& points) {
  // Vertex cost per shape: 8-gon discs with their anti-aliased fringe (16), rings (32), squares
  // (4); in the compact style (squares for discs, square outlines for rings) 4 and 12.
  auto cost = [](const PointInstance& p, bool compact) -> size_t {
    if (p.shape == PointShape::Square) return 4;
    if (p.shape == PointShape::Ring) return compact ? 12 : 34;
    return compact ? 4 : 18;
  };
  // Without ImGuiBackendFlags_RendererHasVtxOffset (kvscope-cli render's rasteriser) one draw
  // list holds at most 65536 vertices: use the compact style, and if even that does not fit,
  // keep per cell of a grid about one point wide only the point drawn last (the visible one),
  // growing the cells until the points fit.
  const bool vtx_offset =
      (ImGui::GetIO().BackendFlags & ImGuiBackendFlags_RendererHasVtxOffset) != 0;
  const size_t used = static_cast<size_t>(dl->_VtxCurrentIdx);
  const size_t budget = vtx_offset ? SIZE_MAX : (used + 8000 < 65536 ? 65536 - 8000 - used : 0);
  size_t full = 0, compact_cost = 0;
  for (const PointInstance& p : points) full += cost(p, false), compact_cost += cost(p, true);
  // Compact also for speed with many points.
  const bool compact = points.size() > 20000 || full > budget;
  description_ = fallback_reason_.empty() ? "ImDrawList" : "ImDrawList (" + fallback_reason_ + ")";
  std::vector<const PointInstance*> shown;
  shown.reserve(points.size());
  if (compact_cost > budget) {
    float cell = 2.0f;
    for (const PointInstance& p : points) cell = std::max(cell, 2 * p.radius);
    const float w = p1.x - p0.x, h = p1.y - p0.y;
    while (true) {
      const int gx = std::max(1, static_cast<int>(w / cell) + 1);
      const int gy = std::max(1, static_cast<int>(h / cell) + 1);
      std::vector<int> top(static_cast<size_t>(gx) * gy, -1);
      for (size_t i = 0; i < points.size(); ++i) {
        const int cx = std::clamp(static_cast<int>(points[i].x / cell), 0, gx - 1);
        const int cy = std::clamp(static_cast<int>(points[i].y / cell), 0, gy - 1);
        top[static_cast<size_t>(cy) * gx + cx] = static_cast<int>(i);
      }
      std::vector<int> keep;
      size_t keep_cost = 0;
      for (int t : top)
        if (t >= 0) keep.push_back(t), keep_cost += cost(points[static_cast<size_t>(t)], true);
      if (keep_cost <= budget || cell > std::max(w, h)) {
        std::sort(keep.begin(), keep.end());  // the original draw order
        for (int t : keep) shown.push_back(&points[static_cast<size_t>(t)]);
        break;
      }
      cell *= 1.5f;
    }
    char buf[160];
    std::snprintf(buf, sizeof buf, ": %zu of %zu points drawn, the top one per %.0f px cell",
                  shown.size(), points.size(), cell);
    description_ += buf;
  } else {
    for (const PointInstance& p : points) shown.push_back(&p);
  }
  dl->PushClipRect(p0, p1, true);
  for (const PointInstance* pp : shown) {
    const PointInstance& p = *pp;
    const ImVec2 c(p0.x + p.x, p0.y + p.y);
    switch (p.shape) {
      case PointShape::Disc:
        if (compact)
          dl->AddRectFilled(ImVec2(c.x - p.radius, c.y - p.radius),
                            ImVec2(c.x + p.radius, c.y + p.radius), p.colour);
        else
          dl->AddCircleFilled(c, p.radius, p.colour, 8);
        break;
      case PointShape::Ring:
        if (compact)
          dl->AddRect(ImVec2(c.x - p.radius, c.y - p.radius),
                      ImVec2(c.x + p.radius, c.y + p.radius), p.colour);
        else
          dl->AddCircle(c, p.radius, p.colour, 8, 1.5f);
        break;
      case PointShape::Square:
        dl->AddRectFilled(ImVec2(c.x - p.radius, c.y - p.radius),
                          ImVec2(c.x + p.radius, c.y + p.radius), p.colour);
        break;
    }
  }
  dl->PopClipRect();
}

}  // namespace kvscope::app
