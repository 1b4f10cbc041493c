#include "app/export.h"

#include <stb_image_write.h>  // implementation in Debian's libstb

#include <algorithm>
#include <cmath>
#include <fstream>

#include "app/view.h"
#include "engine/error.h"

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
