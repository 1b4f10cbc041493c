// engine/core/thread_pool.h, the engine's one threading primitive: parallel_chunks (short regions
// on persistent workers) and parallel_for (long tasks, one index at a time).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "engine/core/thread_pool.h"

namespace kvscope {
namespace {

// parallel_chunks (persistent workers, with threads of its own as the fallback; the t-SNE's
// regions): every index once, from nested regions and from several callers at the same time, and an
// exception in the caller's chunk leaves the pool usable.
TEST(ThreadPool, ParallelChunksCoverEveryIndexOnceFromAnyCaller) {
  auto check = [](int n) {
    std::vector<std::atomic<int>> hits(n);
    parallel_chunks(n, 1, [&](int b, int e) {
      for (int i = b; i < e; ++i) hits[i].fetch_add(1);
    });
    for (int i = 0; i < n; ++i)
      if (hits[i].load() != 1) return false;
    return true;
  };
  EXPECT_TRUE(check(1));
  EXPECT_TRUE(check(1000));
  std::atomic<int> nested_ok{0};
  parallel_chunks(4, 1, [&](int b, int e) {
    for (int i = b; i < e; ++i) nested_ok += check(257) ? 1 : 0;
  });
  EXPECT_EQ(nested_ok.load(), 4);
  std::atomic<int> failures{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&] {
      for (int r = 0; r < 200; ++r)
        if (!check(100 + r)) ++failures;
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_THROW(parallel_chunks(100, 1,
                               [](int b, int) {
                                 if (b == 0) throw std::runtime_error("chunk 0");
                               }),
               std::runtime_error);
  EXPECT_TRUE(check(999));
}

// parallel_for: every index once on any thread count (more threads than indices included), the
// first exception rethrown after the others stop taking indices, and a set cancel flag stops it.
TEST(ThreadPool, ParallelForRunsEveryIndexOnceAndStopsOnErrorOrCancel) {
  for (int threads : {1, 2, 3, 8}) {
    for (int count : {0, 1, 5, 200}) {
      std::vector<std::atomic<int>> hits(count);
      parallel_for(count, threads, nullptr, [&](int i) { hits[i].fetch_add(1); });
      for (int i = 0; i < count; ++i) EXPECT_EQ(hits[i].load(), 1) << threads << " " << count;
    }
  }
  std::atomic<int> ran{0};
  EXPECT_THROW(parallel_for(1000, 2, nullptr,
                            [&](int i) {
                              ++ran;
                              std::this_thread::sleep_for(std::chrono::microseconds(50));
                              if (i == 3) throw std::runtime_error("index 3");
                            }),
               std::runtime_error);
  EXPECT_LT(ran.load(), 1000);
  std::atomic<bool> cancel{false};
  std::atomic<int> after{0};
  parallel_for(1000, 2, &cancel, [&](int i) {
    if (i == 10) cancel = true;
    if (cancel.load()) ++after;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  });
  EXPECT_LT(after.load(), 1000 - 10);
}

}  // namespace
}  // namespace kvscope
