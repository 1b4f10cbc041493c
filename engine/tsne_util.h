// Helpers shared by the t-SNE code (tsne.cpp, tsne_fft.cpp, knn.cpp): the static work split and
// the embedding's bounding box.
#pragma once

#include <algorithm>
#include <thread>
#include <vector>

namespace kvscope {

// Runs fn(t) for t in [0, tasks) on the persistent worker threads of the t-SNE code, t = 0 on
// the caller, and returns when all are done. Returns false without running anything when the
// pool cannot take the call (it is serving another caller, or this is one of its workers, or
// tasks exceeds its threads); the caller then starts threads of its own. Starting a thread per
// parallel region cost 0.17-0.39 ms on the 2-core development VM under load, and a t-SNE
// iteration has five regions.
bool tsne_pool_run(int tasks, void (*fn)(void* ctx, int t), void* ctx);

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
  const int chunk = (n + threads - 1) / threads;
  struct Ctx {
    Fn* fn;
    int n, chunk;
  } ctx{&fn, n, chunk};
  auto run_chunk = [](void* c, int t) {
    const Ctx& x = *static_cast<Ctx*>(c);
    const int b = t * x.chunk, e = std::min(x.n, b + x.chunk);
    if (b < e) (*x.fn)(b, e);
  };
  if (tsne_pool_run(threads, run_chunk, &ctx)) return;
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (int t = 1; t < threads; ++t) pool.emplace_back([&ctx, run_chunk, t] { run_chunk(&ctx, t); });
  run_chunk(&ctx, 0);
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
