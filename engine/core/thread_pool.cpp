#include "engine/core/thread_pool.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVS_PAUSE() _mm_pause()
#else
#define KVS_PAUSE() ((void)0)
#endif

namespace kvscope {
namespace {

// Spins for up to kSpin until ready() holds; false if it did not. A t-SNE iteration opens a
// region every millisecond or two, so a worker (or the caller at the end of a region) usually
// finds its signal within the spin; sleeping on the condition variable instead cost a futex
// wake-up per region and side, which on the 2-core VM (virtualised inter-processor interrupts)
// was 3% of a 32k-point run's CPU on the caller's thread alone.
template <class Ready>
bool spin_until(Ready&& ready) {
  constexpr auto kSpin = std::chrono::microseconds(100);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 1;; ++i) {
    if (ready()) return true;
    KVS_PAUSE();
    if (i % 64 == 0 && std::chrono::steady_clock::now() - t0 > kSpin) return ready();
  }
}

// hardware_concurrency() - 1 threads that wait for a call, each running its task index, and one
// call at a time. A call is published by bumping generation_ under m_ (so a worker that checks
// the predicate under m_ cannot miss it); completion is the atomic remaining_ reaching 0.
// Never destroyed: the workers sleep on the condition variable at exit.
class WorkerPool {
 public:
  WorkerPool() : workers_(hardware_threads() - 1) {
    for (int w = 1; w <= workers_; ++w) std::thread([this, w] { serve(w); }).detach();
  }

  bool run(int tasks, void (*fn)(void*, int), void* ctx) {
    if (in_worker_ || tasks - 1 > workers_) return false;
    std::unique_lock<std::mutex> busy(call_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    {
      std::lock_guard<std::mutex> lk(m_);
      fn_ = fn;
      ctx_ = ctx;
      tasks_ = tasks;
      remaining_.store(tasks - 1, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
    }
    start_.notify_all();  // no system call when every worker is still spinning
    // The workers read ctx, which lives in the caller's frame: wait for them even when task 0
    // throws, then pass the exception on.
    std::exception_ptr failed;
    try {
      fn(ctx, 0);
    } catch (...) {
      failed = std::current_exception();
    }
    auto all_done = [this] { return remaining_.load(std::memory_order_acquire) == 0; };
    if (!spin_until(all_done)) {
      std::unique_lock<std::mutex> lk(m_);
      done_.wait(lk, all_done);
    }
    if (failed) std::rethrow_exception(failed);
    return true;
  }

 private:
  void serve(int w) {
    in_worker_ = true;
    uint64_t seen = 0;
    for (;;) {
      auto published = [&] { return generation_.load(std::memory_order_acquire) != seen; };
      if (!spin_until(published)) {
        std::unique_lock<std::mutex> lk(m_);
        start_.wait(lk, published);
      }
      void (*fn)(void*, int);
      void* ctx;
      int tasks;
      {
        std::lock_guard<std::mutex> lk(m_);
        seen = generation_.load(std::memory_order_relaxed);
        fn = fn_, ctx = ctx_, tasks = tasks_;
      }
      if (w >= tasks) continue;
      fn(ctx, w);
      if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lk(m_);  // orders the store against a caller about to wait
        done_.notify_one();
      }
    }
  }

  const int workers_;
  std::mutex call_;  // one caller at a time
  std::mutex m_;
  std::condition_variable start_, done_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> remaining_{0};
  int tasks_ = 0;
  void (*fn_)(void*, int) = nullptr;
  void* ctx_ = nullptr;
  static thread_local bool in_worker_;
};

thread_local bool WorkerPool::in_worker_ = false;

}  // namespace

bool pool_run(int tasks, void (*fn)(void* ctx, int t), void* ctx) {
  static WorkerPool* pool = new WorkerPool;  // never freed (see WorkerPool)
  return pool->run(tasks, fn, ctx);
}

void parallel_for(int count, int threads, const std::atomic<bool>* cancel,
                  const std::function<void(int)>& fn) {
  std::atomic<int> next{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::exception_ptr first_error;
  auto worker = [&] {
    for (;;) {
      if (stop.load() || (cancel && cancel->load())) return;
      const int i = next.fetch_add(1);
      if (i >= count) return;
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first_error) first_error = std::current_exception();
        stop = true;
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::min(threads, count); ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace kvscope
