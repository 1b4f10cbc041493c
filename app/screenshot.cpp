#include "app/screenshot.h"

#include <GL/gl.h>  // glReadPixels is GL 1.0: exported by libGL itself, no loader needed

#include <cstdint>
#include <vector>

#include "app/export.h"

namespace kvscope::app {

void save_framebuffer_png(const std::string& path, int fb_width, int fb_height, float fb_scale_x,
                          float fb_scale_y, ScreenRect rect) {
  std::vector<uint8_t> px(static_cast<size_t>(fb_width) * fb_height * 4);
  glPixelStorei(GL_PACK_ALIGNMENT, 1);
  glReadBuffer(GL_BACK);
  glReadPixels(0, 0, fb_width, fb_height, GL_RGBA, GL_UNSIGNED_BYTE, px.data());
  if (!rect.empty()) {
    rect.x0 *= fb_scale_x;
    rect.x1 *= fb_scale_x;
    rect.y0 *= fb_scale_y;
    rect.y1 *= fb_scale_y;
  }
  write_png(path, px, fb_width, fb_height, /*bottom_up=*/true, rect);
}

}  // namespace kvscope::app
