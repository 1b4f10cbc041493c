#include "app/grid_pace.h"

#include <algorithm>

namespace kvscope::app {

namespace {

double median(std::deque<double> v) {
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  double m = v[mid];
  if (v.size() % 2 == 0)
    m = 0.5 * (m + *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid)));
  return m;
}

void push_window(std::deque<double>& d, double v) {
  d.push_back(v);
  if (d.size() > GridPace::kWindow) d.pop_front();
}

}  // namespace

GridPace::GridPace(int layers, int heads, const Prior& prior)
    : heads_(std::max(1, heads)),
      prior_(prior),
      touched_(static_cast<size_t>(std::max(0, layers)) * static_cast<size_t>(std::max(1, heads)),
               0) {}

void GridPace::mark_in_hand(int layer, int head) {
  const size_t i = static_cast<size_t>(layer) * static_cast<size_t>(heads_) + head;
  if (i < touched_.size()) touched_[i] = 1;
}

void GridPace::cell_done(const Cell& c, double seconds, double build_seconds, double at_s) {
  seconds = std::max(0.0, seconds);
  build_seconds = std::clamp(build_seconds, 0.0, seconds);
  push_window(warm_[c.slot == 1 ? 1 : 0], seconds - build_seconds);
  if (build_seconds > 0) push_window(build_, build_seconds);
  const size_t i = static_cast<size_t>(c.layer) * static_cast<size_t>(heads_) + c.head;
  if (i < touched_.size() && !touched_[i]) {
    touched_[i] = 1;
    ++first_touches_;
    if (build_seconds > 0) ++builds_on_first_touch_;
  }
  done_s_ += seconds;
  recent_.emplace_back(at_s, seconds);
  if (recent_.size() > kRateWindow + 1) recent_.pop_front();
}

double GridPace::warm_s(int slot) const {
  const size_t k = slot == 1 ? 1 : 0, other = 1 - k;
  if (!warm_[k].empty()) return median(warm_[k]);
  if (!warm_[other].empty()) {
    // The other slot's measurement, scaled by how the two methods compare in the cost model.
    const double measured = median(warm_[other]);
    if (prior_.warm_s[k] > 0 && prior_.warm_s[other] > 0)
      return measured * prior_.warm_s[k] / prior_.warm_s[other];
    return measured;
  }
  return prior_.warm_s[k];
}

double GridPace::build_s() const {
  return build_.empty() ? prior_.build_s : median(build_);
}

double GridPace::build_chance() const {
  // Until heads were touched, one build is assumed (a fresh session builds every side); each
  // first touch then moves the chance to what this machine's caches give (a side read from disk
  // costs no build).
  return std::min(1.0, (builds_on_first_touch_ + 1.0) / (first_touches_ + 1.0));
}

double GridPace::work_left(const std::vector<Cell>& pending,
                           const std::vector<Running>& running) const {
  const double build = build_chance() * build_s();
  std::vector<char> counted(touched_.size(), 0);
  // One build for a head not touched yet, carried by the first of its cells seen here (a
  // running cell first: it is the one building).
  auto first_build = [&](const Cell& c) {
    const size_t i = static_cast<size_t>(c.layer) * static_cast<size_t>(heads_) + c.head;
    if (i >= touched_.size() || touched_[i] || counted[i]) return 0.0;
    counted[i] = 1;
    return build;
  };
  const double warm[2] = {warm_s(0), warm_s(1)};
  double work = 0;
  for (const Running& r : running)
    work += std::max(0.0, warm[r.cell.slot == 1] + first_build(r.cell) - r.seconds);
  for (const Cell& c : pending) work += warm[c.slot == 1] + first_build(c);
  return work;
}

double GridPace::left_s(const std::vector<Cell>& pending, const std::vector<Running>& running,
                        double elapsed_s, int threads) const {
  const double work = work_left(pending, running);
  // Wall seconds per thread-second: the threads in use, the machine's load and what the job does
  // between cells (loading layers ahead), measured over the last cells so that a change of load
  // shows within a few cells, and the job's start (threads starting, the first layer loading)
  // stops counting.
  double running_s = 0;
  for (const Running& r : running) running_s += r.seconds;
  if (recent_.size() > kRateWindow / 2) {
    double spent = 0;
    for (size_t k = 1; k < recent_.size(); ++k) spent += recent_[k].second;
    const double span = elapsed_s - recent_.front().first;
    // The running cells' seconds since the window's first cell ended (at most the span).
    for (const Running& r : running) spent += std::min(r.seconds, span);
    if (spent > 0 && span > 0) return work * span / spent;
  }
  const double spent = done_s_ + running_s;
  if (spent > 0 && elapsed_s > 0) return work * elapsed_s / spent;
  return work / std::max(1, threads);
}

}  // namespace kvscope::app
