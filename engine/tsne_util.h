// Helpers shared by the t-SNE code (tsne.cpp, tsne_fft.cpp, knn.cpp): the static work split and
// the embedding's bounding box.
#pragma once

#include <algorithm>
#include <thread>
#include <vector>

namespace kvscope {

// Static split of [0, n) over the machine's cores, at least min_per_thread indices per thread.
// Each index is handled by exactly one thread and every reduction is done afterwards in index
// order, so results do not depend on the thread count.
template <class Fn>
void tsne_parallel_for(int n, int min_per_thread, Fn&& fn) {
  const int hw = std::max(1u, std::thread::hardware_concurrency());
  const int threads = std::max(1, std::min(hw, n / std::max(1, min_per_thread)));
  if (threads <= 1) {
    fn(0, n);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  const int chunk = (n + threads - 1) / threads;
  for (int t = 1; t < threads; ++t) {
    const int b = t * chunk, e = std::min(n, b + chunk);
    if (b < e) pool.emplace_back([&fn, b, e] { fn(b, e); });
  }
  fn(0, std::min(n, chunk));
  for (auto& th : pool) th.join();
}

// The number of threads tsne_parallel_for would use for n indices.
inline int tsne_threads(int n, int min_per_thread) {
  const int hw = std::max(1u, std::thread::hardware_concurrency());
  return std::max(1, std::min(hw, n / std::max(1, min_per_thread)));
}

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
