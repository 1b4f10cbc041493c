// Instanced scatter points: signed distance to the disc / ring / square edge, one pixel of
// anti-aliasing, straight alpha (blended onto an opaque background by the renderer).
#version 330 core

in vec2 v_local;
in vec4 v_colour;
in float v_radius;
flat in int v_shape;

out vec4 frag_colour;

void main() {
  float dist;
  if (v_shape == 2) {
    dist = max(abs(v_local.x), abs(v_local.y)) - v_radius;
  } else {
    dist = length(v_local) - v_radius;
  }
  float coverage = clamp(0.5 - dist, 0.0, 1.0);
  if (v_shape == 1) {
    // Ring 1.5 pixels wide: fade out again towards the centre.
    coverage *= clamp(dist + 2.0, 0.0, 1.0);
  }
  if (coverage <= 0.0) discard;
  frag_colour = vec4(v_colour.rgb, v_colour.a * coverage);
}
