// Big scatter plots (the Geometry view's up to 32k+ points, the Walk view's paths): one call
// draws a set of points into a canvas rectangle of the current ImGui window.
//
// Two paths with the same picture:
//  - GL: when the host is the windowed app (a GLFW window with an OpenGL 3.3 context is current),
//    points are drawn as instanced quads by shaders/points.vert + points.frag (round discs, rings
//    and squares with anti-aliased edges) into an offscreen framebuffer, and the framebuffer's
//    texture is shown with ImDrawList::AddImage. One draw call per frame, however many points.
//  - ImDrawList: everywhere else (kvscope-cli render's software rasteriser, no GL context,
//    shaders not found, or GL errors): the same points as ImGui primitives.
// GL entry points are resolved at run time through glfwGetProcAddress (looked up with dlsym),
// so kvscope_ui links no GL library and the headless CLI keeps working without one.
#pragma once

#include <imgui.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvscope::app {

enum class PointShape : uint8_t { Disc = 0, Ring = 1, Square = 2 };

struct PointInstance {
  float x = 0, y = 0;  // pixels from the canvas' top-left corner
  ImU32 colour = 0;
  float radius = 3;  // pixels
  PointShape shape = PointShape::Disc;
};

class PointRenderer {
 public:
  PointRenderer();
  ~PointRenderer();
  PointRenderer(const PointRenderer&) = delete;
  PointRenderer& operator=(const PointRenderer&) = delete;

  // Draws `points` (in order: later ones on top) clipped to [p0, p1] of `dl`.
  void draw(ImDrawList* dl, ImVec2 p0, ImVec2 p1, const std::vector<PointInstance>& points);

  // "OpenGL instanced points" or "ImDrawList" (and why), for the view's status line.
  const std::string& path_description() const { return description_; }
  // Disables the GL path (e.g. for A/B checks of the two pictures).
  void set_allow_gl(bool allow) { allow_gl_ = allow; }

 private:
  struct Gl;
  std::unique_ptr<Gl> gl_;
  bool allow_gl_ = true;
  bool gl_failed_ = false;
  std::string description_ = "ImDrawList";
  std::string fallback_reason_;  // why the GL path is off, when it failed
  void draw_imdrawlist(ImDrawList* dl, ImVec2 p0, ImVec2 p1,
                       const std::vector<PointInstance>& points);
};

// Moves whenever a PointRenderer drew new content into its texture: the frame loop presents a
// frame whose draw data is unchanged only when this moved (the texture is not in the draw data).
uint64_t points_texture_revision();

// Asks the windowed app for another frame right away (glfwPostEmptyEvent, looked up at run time):
// views that animate on their own (the Walk view's playback) call it every frame while playing,
// since the app otherwise sleeps until input arrives. A no-op without a GLFW window.
void request_next_frame();

}  // namespace kvscope::app
