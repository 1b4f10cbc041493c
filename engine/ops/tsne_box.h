// Helpers shared by the t-SNE code (tsne.cpp, tsne_fft.cpp): the embedding's bounding box. Its
// parallel regions are engine/core/thread_pool.h's parallel_chunks.
#pragma once

#include <algorithm>

namespace kvscope {

// The bounding box of n >= 1 points in 2-D (x, y interleaved), in double.
struct TsneBox {
  double minx, maxx, miny, maxy;
};
inline TsneBox tsne_bounding_box(const float* y, int n) {
  TsneBox b{y[0], y[0], y[1], y[1]};
  for (int i = 1; i < n; ++i) {
    b.minx = std::min(b.minx, double(y[2 * i]));
    b.maxx = std::max(b.maxx, double(y[2 * i]));
    b.miny = std::min(b.miny, double(y[2 * i + 1]));
    b.maxy = std::max(b.maxy, double(y[2 * i + 1]));
  }
  return b;
}

}  // namespace kvscope
