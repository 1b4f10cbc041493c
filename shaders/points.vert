// Instanced scatter points (app/point_renderer.cpp): one screen-aligned quad per point, expanded
// from gl_VertexID (triangle strip of 4), so no per-vertex buffer is needed.
#version 330 core

layout(location = 0) in vec2 a_centre;  // pixels from the canvas' top-left corner
layout(location = 1) in float a_radius;  // pixels
layout(location = 2) in float a_shape;   // 0 disc, 1 ring, 2 square
layout(location = 3) in vec4 a_colour;   // straight (not premultiplied) RGBA

uniform vec2 u_canvas;  // canvas size in pixels

out vec2 v_local;  // position inside the quad, pixels from the point's centre
out vec4 v_colour;
out float v_radius;
flat out int v_shape;

void main() {
  vec2 corner = vec2(float(gl_VertexID & 1), float((gl_VertexID >> 1) & 1)) * 2.0 - 1.0;
  float extent = a_radius + 1.0;  // one more pixel for the anti-aliased edge
  v_local = corner * extent;
  v_colour = a_colour;
  v_radius = a_radius;
  v_shape = int(a_shape + 0.5);
  vec2 px = a_centre + v_local;
  // Canvas pixels (y down) to clip space (y up).
  gl_Position = vec4(px.x / u_canvas.x * 2.0 - 1.0, 1.0 - px.y / u_canvas.y * 2.0, 0.0, 1.0);
}
