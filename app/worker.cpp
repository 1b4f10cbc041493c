#include "app/worker.h"

#include <algorithm>
#include <exception>

#include "app/app_state.h"
#include "engine/core/error.h"

namespace kvscope::app {

void JobContext::check_cancel() const {
  if (cancelled()) throw Cancelled();
}

void JobContext::post(ApplyFn fn) {
  if (worker_ && !cancelled()) worker_->post(std::move(fn));
}

Worker::Worker() {
  for (int i = 0; i < kNumLanes; ++i) lanes_[i].thread = std::thread([this, i] { lane_loop(i); });
}

Worker::~Worker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    for (auto& lane : lanes_) {
      lane.queue.clear();
      if (lane.running) lane.running->ctx->cancel_->store(true);
    }
  }
  cv_.notify_all();
  for (auto& lane : lanes_)
    if (lane.thread.joinable()) lane.thread.join();
}

void Worker::submit(Lane lane, const std::string& key, const std::string& label, JobFn fn) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& l : lanes_) {
      std::erase_if(l.queue, [&](const Job& j) { return j.key == key; });
      if (l.running && l.running->key == key) l.running->ctx->cancel_->store(true);
    }
    Job job{lane, key, label, std::move(fn), std::make_shared<JobContext>()};
    job.ctx->worker_ = this;
    lanes_[static_cast<int>(lane)].queue.push_back(std::move(job));
  }
  cv_.notify_all();
}

void Worker::cancel(const std::string& key_prefix) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto match = [&](const std::string& k) { return k.rfind(key_prefix, 0) == 0; };
  for (auto& l : lanes_) {
    std::erase_if(l.queue, [&](const Job& j) { return match(j.key); });
    if (l.running && match(l.running->key)) l.running->ctx->cancel_->store(true);
  }
}

std::vector<JobInfo> Worker::jobs() const {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<JobInfo> out;
  for (const auto& l : lanes_) {
    if (l.running) {
      const JobContext& c = *l.running->ctx;
      double left = c.left_s_.load();
      if (left >= 0) {
        const auto said = std::chrono::steady_clock::time_point(
            std::chrono::steady_clock::duration(c.left_at_ns_.load()));
        left = std::max(0.0, left - std::chrono::duration<double>(now - said).count());
      }
      out.push_back({l.running->lane, l.running->key, l.running->label, true, c.done_.load(),
                     c.total_.load(),
                     std::chrono::duration<double>(now - l.running->started).count(), left});
    }
    for (const auto& j : l.queue) out.push_back({j.lane, j.key, j.label, false, 0, 0, 0, -1});
  }
  return out;
}

void JobContext::time_left(double seconds) {
  left_at_ns_.store(std::chrono::steady_clock::now().time_since_epoch().count());
  left_s_.store(seconds >= 0 ? seconds : -1);
}

double time_left_s(const JobInfo& job) {
  if (job.running && job.left_s >= 0) return job.left_s;
  if (!job.running || job.done <= 0 || job.total <= 0 || job.elapsed_s < 1.0) return -1;
  return job.elapsed_s * static_cast<double>(std::max(0, job.total - job.done)) / job.done;
}

bool Worker::busy(const std::string& key_prefix) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto match = [&](const std::string& k) { return k.rfind(key_prefix, 0) == 0; };
  for (const auto& l : lanes_) {
    if (l.running && match(l.running->key)) return true;
    for (const auto& j : l.queue)
      if (match(j.key)) return true;
  }
  return false;
}

size_t Worker::pending_applies() const {
  return pending_.load();
}

void Worker::post(ApplyFn fn) {
  {
    std::lock_guard<std::mutex> lock(apply_mutex_);
    applies_.push_back(std::move(fn));
    pending_.store(applies_.size());
  }
  if (wake_) wake_();
}

int Worker::drain(AppState& state) {
  std::vector<ApplyFn> todo;
  {
    std::lock_guard<std::mutex> lock(apply_mutex_);
    todo.swap(applies_);
    pending_.store(0);
  }
  for (auto& fn : todo) fn(state);
  return static_cast<int>(todo.size());
}

void Worker::lane_loop(int lane_index) {
  LaneState& lane = lanes_[lane_index];
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || !lane.queue.empty(); });
      if (stop_) return;
      job = std::make_shared<Job>(std::move(lane.queue.front()));
      job->started = std::chrono::steady_clock::now();
      lane.queue.pop_front();
      lane.running = job;
    }
    ApplyFn result;
    std::string error;
    bool cancelled = false;
    try {
      result = job->fn(*job->ctx);
      cancelled = job->ctx->cancelled();
    } catch (const Cancelled&) {
      cancelled = true;
    } catch (const std::exception& e) {
      error = e.what();
    } catch (...) {
      error = "unknown error";
    }
    if (!cancelled) {
      std::string key = job->key;
      if (!error.empty()) {
        post([key, error](AppState& s) { s.job_errors[key] = error; });
      } else {
        post([key, result = std::move(result)](AppState& s) {
          s.job_errors.erase(key);
          if (result) result(s);
        });
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      lane.running.reset();
    }
    if (wake_) wake_();
  }
}

}  // namespace kvscope::app
