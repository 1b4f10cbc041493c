// The compute side of the app (Tracy/Polyscope style): the UI thread never blocks on compute or
// file loading. Jobs run on worker lanes (one thread each, FIFO within a lane), can be cancelled
// through the std::atomic<bool> handed to the engine (MethodInput::cancel, run_eval's cancel), and
// report progress. A job does not touch AppState: it returns an "apply" closure that the UI thread
// runs at the start of the next frame, so results are swapped in whole.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kvscope::app {

struct AppState;

// Lanes are independent queues so that a long background job (the whole grid, an error sweep, a
// t-SNE) never delays the interactive re-run of the focused head.
enum class Lane : int {
  Focus = 0,     // file loading, the focused head (must feel instant)
  Grid = 1,      // the whole layer x head grid for the current method
  Analysis = 2,  // error sweeps over methods, ratios and seeds
  Geometry = 3,  // projections (PCA, t-SNE), walk replays
};
constexpr int kNumLanes = 4;

// Runs on the UI thread with the app state; the only way a job changes what is shown.
using ApplyFn = std::function<void(AppState&)>;

// What a running job sees.
class JobContext {
 public:
  // Pass to the engine (MethodInput::cancel, run_head, run_eval).
  const std::atomic<bool>* cancel_flag() const { return cancel_.get(); }
  bool cancelled() const { return cancel_->load(std::memory_order_relaxed); }
  // Throws kvscope::Cancelled when the job has been cancelled; call between steps.
  void check_cancel() const;
  void progress(int done, int total) {
    done_.store(done, std::memory_order_relaxed);
    total_.store(total, std::memory_order_relaxed);
  }
  // The job's own estimate of the seconds it has left, as of now (the grid's, app/grid_pace.h,
  // which knows cold work from warm); JobInfo::left_s counts it down until the next one. A job
  // that never calls this is paced by its progress alone (time_left_s).
  void time_left(double seconds);
  double time_left_said() const { return left_s_.load(); }  // -1: never said
  // Posts an intermediate result (e.g. a t-SNE frame while it converges).
  void post(ApplyFn fn);

 private:
  friend class Worker;
  std::shared_ptr<std::atomic<bool>> cancel_ = std::make_shared<std::atomic<bool>>(false);
  std::atomic<int> done_{0}, total_{0};
  // time_left's seconds (-1: never said) and when it was said (steady clock, nanoseconds).
  std::atomic<double> left_s_{-1};
  std::atomic<int64_t> left_at_ns_{0};
  class Worker* worker_ = nullptr;
};

// The job body: computes from immutable inputs it captured (shared_ptrs), returns what to apply.
// Throwing kvscope::InputError / std::exception reports the message under the job's key
// (AppState::job_errors); throwing kvscope::Cancelled drops the job silently.
using JobFn = std::function<ApplyFn(JobContext&)>;

struct JobInfo {
  Lane lane = Lane::Focus;
  std::string key;    // identifies what the job computes ("focus.A", "grid", ...)
  std::string label;  // shown to users
  bool running = false;
  int done = 0, total = 0;
  double elapsed_s = 0;  // since it started running
  double left_s = -1;    // the job's own time left (JobContext::time_left) counted down to now
};

// The seconds a running job has left: its own estimate when it gives one (the grid's), else its
// pace so far (elapsed x left / done); -1 when neither says anything yet (nothing done, or less
// than a second run).
double time_left_s(const JobInfo& job);

class Worker {
 public:
  Worker();
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Queues a job. A queued job with the same key (any lane) is dropped and a running one is
  // cancelled: the newest request for the same result wins.
  void submit(Lane lane, const std::string& key, const std::string& label, JobFn fn);
  // Cancels queued and running jobs whose key starts with `key_prefix` ("" = all).
  void cancel(const std::string& key_prefix);
  // Queued + running jobs, for progress bars.
  std::vector<JobInfo> jobs() const;
  // True when a job whose key starts with `key_prefix` is queued or running.
  bool busy(const std::string& key_prefix = "") const;
  // Number of apply closures waiting for the UI thread.
  size_t pending_applies() const;
  // Runs the waiting apply closures on the UI thread. Returns how many ran.
  int drain(AppState& state);
  // Called (from a worker thread) whenever something was posted, e.g. glfwPostEmptyEvent.
  void set_wakeup(std::function<void()> wake) { wake_ = std::move(wake); }

 private:
  friend class JobContext;
  struct Job {
    Lane lane;
    std::string key, label;
    JobFn fn;
    std::shared_ptr<JobContext> ctx;
    std::chrono::steady_clock::time_point started{};  // when its lane took it
  };
  // A lane is a scheduler, not a parallel loop: one long-lived thread that runs its queue's jobs
  // one after another and must stay free to take the next one while the other lanes are busy, so
  // it is a thread of its own rather than a task of engine/core/thread_pool.h (whose parallel_for
  // and parallel_chunks the jobs themselves use for their inner loops).
  struct LaneState {
    std::deque<Job> queue;
    std::shared_ptr<Job> running;
    std::thread thread;
  };
  void lane_loop(int lane);
  void post(ApplyFn fn);

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  LaneState lanes_[kNumLanes];
  std::mutex apply_mutex_;
  std::vector<ApplyFn> applies_;
  std::atomic<size_t> pending_{0};
  std::function<void()> wake_;
};

}  // namespace kvscope::app
