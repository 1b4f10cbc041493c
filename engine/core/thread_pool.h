// The engine's one threading primitive: every parallel loop in the engine and
// the app's grid goes through one of the two calls below.
//
// - parallel_chunks(n, min_per_thread, fn): short regions (a t-SNE iteration opens five every
//   millisecond or two). A static split of [0, n) run on persistent worker threads, so a region
//   costs no thread start; each index is handled by exactly one chunk.
// - parallel_for(count, threads, cancel, fn): long tasks (a head's eval, a generation run, a grid
//   cell, a batch of walks). Indices are handed out one at a time to `threads` threads started
//   for the call (their start is nothing next to the tasks), so a long loop never holds the
//   persistent workers that the short regions in other jobs need.
#pragma once

#include <algorithm>
#include <atomic>
#include <functional>
#include <thread>
#include <vector>

namespace kvscope {

// The machine's hardware threads, at least 1.
inline int hardware_threads() {
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// fn(0 .. count-1) on min(threads, count) threads, the caller's included, each index once, in no
// set order. The first exception stops the others from taking new indices and is rethrown after
// all have returned; a set cancel flag stops them too (the caller then throws Cancelled itself).
void parallel_for(int count, int threads, const std::atomic<bool>* cancel,
                  const std::function<void(int)>& fn);

// Runs fn(t) for t in [0, tasks) on the persistent worker threads, t = 0 on the caller, and
// returns when all are done. Returns false without running anything when the pool cannot take
// the call (it is serving another caller, or this is one of its workers, or tasks exceeds its
// threads); the caller then starts threads of its own. Starting a thread per parallel region
// cost 0.17-0.39 ms on the 2-core development VM under load.
bool pool_run(int tasks, void (*fn)(void* ctx, int t), void* ctx);

// The number of threads parallel_chunks uses for n indices.
inline int chunk_threads(int n, int min_per_thread) {
  return std::max(1, std::min(hardware_threads(), n / std::max(1, min_per_thread)));
}

// Static split of [0, n) over the machine's cores, at least min_per_thread indices per thread,
// fn(begin, end) per chunk. Each index is handled by exactly one chunk; callers reduce afterwards
// in index order, so results do not depend on the thread count.
template <class Fn>
void parallel_chunks(int n, int min_per_thread, Fn&& fn) {
  const int threads = chunk_threads(n, min_per_thread);
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
  if (pool_run(threads, run_chunk, &ctx)) return;
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (int t = 1; t < threads; ++t) pool.emplace_back([&ctx, run_chunk, t] { run_chunk(&ctx, t); });
  run_chunk(&ctx, 0);
  for (auto& th : pool) th.join();
}

}  // namespace kvscope
