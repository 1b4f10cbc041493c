#include "engine/tsne_util.h"

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>

namespace kvscope {
namespace {

// hardware_concurrency() - 1 threads that wait for a call, each running its task index, and one
// call at a time. Never destroyed: the workers sleep on the condition variable at exit.
class WorkerPool {
 public:
  WorkerPool() : workers_(std::max(1u, std::thread::hardware_concurrency()) - 1) {
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
      remaining_ = tasks - 1;
      ++generation_;
    }
    start_.notify_all();
    // The workers read ctx, which lives in the caller's frame: wait for them even when task 0
    // throws, then pass the exception on.
    std::exception_ptr failed;
    try {
      fn(ctx, 0);
    } catch (...) {
      failed = std::current_exception();
    }
    std::unique_lock<std::mutex> lk(m_);
    done_.wait(lk, [this] { return remaining_ == 0; });
    if (failed) std::rethrow_exception(failed);
    return true;
  }

 private:
  void serve(int w) {
    in_worker_ = true;
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lk(m_);
    for (;;) {
      start_.wait(lk, [&] { return generation_ != seen; });
      seen = generation_;
      if (w >= tasks_) continue;
      void (*fn)(void*, int) = fn_;
      void* ctx = ctx_;
      lk.unlock();
      fn(ctx, w);
      lk.lock();
      if (--remaining_ == 0) done_.notify_one();
    }
  }

  const int workers_;
  std::mutex call_;  // one caller at a time
  std::mutex m_;
  std::condition_variable start_, done_;
  uint64_t generation_ = 0;
  int tasks_ = 0, remaining_ = 0;
  void (*fn_)(void*, int) = nullptr;
  void* ctx_ = nullptr;
  static thread_local bool in_worker_;
};

thread_local bool WorkerPool::in_worker_ = false;

}  // namespace

bool tsne_pool_run(int tasks, void (*fn)(void* ctx, int t), void* ctx) {
  static WorkerPool* pool = new WorkerPool;  // never freed (see WorkerPool)
  return pool->run(tasks, fn, ctx);
}

}  // namespace kvscope
