#include "app/app_state.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "engine/attention/exact_attention.h"
#include "engine/core/error.h"
#include "engine/core/printable.h"
#include "engine/ops/backend.h"

namespace kvscope::app {
namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::string fmt_seconds(double s) {
  char buf[64];
  if (s < 0)
    return "unknown";
  else if (s < 1)
    std::snprintf(buf, sizeof buf, "%.0f ms", s * 1000);
  else if (s < 120)
    std::snprintf(buf, sizeof buf, "%.1f s", s);
  else if (s < 7200)
    std::snprintf(buf, sizeof buf, "%.0f min", s / 60);
  else
    std::snprintf(buf, sizeof buf, "%.1f h", s / 3600);
  return buf;
}

std::string method_label(const std::string& name, const ParamValues& params) {
  const Method* m = find_method(name);
  std::string out;
  if (m)
    for (const ParamSpec& p : m->params()) {
      auto it = params.find(p.name);
      if (it == params.end() || it->second == p.default_value) continue;
      char buf[96];
      if (p.type == ParamSpec::Type::Choice && it->second >= 0 &&
          it->second < static_cast<double>(p.choices.size()))
        std::snprintf(buf, sizeof buf, "%s %s", p.name.c_str(),
                      p.choices[static_cast<size_t>(it->second)].c_str());
      else
        std::snprintf(buf, sizeof buf, "%s %g", p.name.c_str(), it->second);
      out += (out.empty() ? "" : ", ") + std::string(buf);
    }
  return out.empty() ? name : name + " (" + out + ")";
}

// ---------------------------------------------------------------- window fitting

EvalWindow fit_window(int n, double keep_ratio, int sink_override, int eval_override,
                      std::string* note) {
  if (!(keep_ratio > 0 && keep_ratio <= 1)) keep_ratio = std::clamp(keep_ratio, 1e-6, 1.0);
  auto f = EvalWindow::fit(n, keep_ratio, sink_override, eval_override);
  if (note) *note = f.note;
  return f.window;
}

// ---------------------------------------------------------------- cost model

double CostModel::per_unit(const std::string& cost_class, double prior) const {
  auto it = per_unit_.find(cost_class);
  if (it != per_unit_.end()) return it->second;
  // An evaluation's cost per unit against its method's focused run. A focused run is timed in
  // wall seconds while A, B and the query comparison share the cores, and it computes its head's
  // exact reference alone; an evaluation shares that work over the layer. Measured on the 2-core
  // VM ("about 3 min" was shown for 48 s taken): 1.2e-9 s per unit focused against 1.2e-10 in
  // the evaluation of a 4-layer llama3-8b-shaped 8192-token capture, 4e-9 against 1e-9 on the
  // sample's sweep.
  constexpr double kEvalPerFocusedUnit = 0.3;
  auto mean_of = [&](const char* prefix) {
    double sum = 0;
    int count = 0;
    for (const auto& [k, v] : per_unit_)
      if (k.rfind(prefix, 0) == 0) {
        sum += v;
        ++count;
      }
    return count ? sum / count : -1.0;
  };
  if (cost_class.rfind("eval:", 0) == 0) {
    // A method's evaluations (grid, sweep) before any was measured: other methods' evaluations
    // per unit, but no more than its own focused run's (one selection and its errors for one
    // head; BalanceKV's also records the walk trace). Taking the other methods' cost alone made
    // cheap baselines cost as much as BalanceKV: the sample's sweep of five methods was
    // estimated at 4.5 s, held for a Run click, and ran in 1.2 s on a loaded 2-core machine.
    const double evals = mean_of("eval:");
    auto head = per_unit_.find("head:" + cost_class.substr(5));
    if (evals > 0 && head != per_unit_.end()) return std::min(evals, head->second);
    if (evals > 0) return evals;
    // Nothing evaluated yet: the focused runs' cost, scaled. The first evaluation's measurement
    // replaces this.
    if (head != per_unit_.end()) return kEvalPerFocusedUnit * head->second;
    if (double m = mean_of("head:"); m > 0) return kEvalPerFocusedUnit * m;
    return prior > 0 ? prior : kPriorEvalPerUnit;
  } else if (cost_class.rfind("head:", 0) == 0) {
    if (double m = mean_of("head:"); m > 0) return m;
    // No focused run measured yet, but evaluations (the grid's cells start by themselves): the
    // method's, else every method's, scaled up. On a fresh start the prior held the focused head
    // of a 32768-token capture for a Run click (about 27 s estimated, about 1 s taken) while the
    // grid computed that same head.
    auto eval = per_unit_.find("eval:" + cost_class.substr(5));
    if (eval != per_unit_.end()) return eval->second / kEvalPerFocusedUnit;
    if (double e = mean_of("eval:"); e > 0) return e / kEvalPerFocusedUnit;
  }
  return prior > 0 ? prior : kPriorPerUnit;
}

void CostModel::record(const std::string& cost_class, double units, double seconds) {
  if (units <= 0 || !(seconds > 0)) return;
  const double v = seconds / units;
  auto it = per_unit_.find(cost_class);
  // The newest measurement counts most, older ones smooth out noise.
  per_unit_[cost_class] = it == per_unit_.end() ? v : 0.5 * it->second + 0.5 * v;
}

// ---------------------------------------------------------------- state

AppState::AppState() {
  resolve_backend();
}

AppState::~AppState() {
  worker.cancel("");
  remove_temp_captures();  // the app's own temporary captures do not outlive it
}

const Method* AppState::method(int slot) const {
  return find_method(method_name(slot));
}

ParamValues AppState::params_for(const std::string& name) const {
  for (int slot = 0; slot < 2; ++slot)
    if (settings.method[static_cast<size_t>(slot)].name == name &&
        (slot == 0 || settings.ab_enabled))
      return settings.method[static_cast<size_t>(slot)].params;
  return {};
}

EvalWindow AppState::window(std::string* note) const {
  return fit_window(std::max(1, num_tokens()), settings.keep_ratio, settings.sink_override,
                    settings.eval_override, note);
}

MethodSettings AppState::method_settings(int slot) const {
  MethodSettings ms;
  ms.method = method(slot);
  ms.keep_ratio = settings.keep_ratio;
  ms.params = settings.method[static_cast<size_t>(slot)].params;
  std::string note;
  EvalWindow w = window(&note);
  // Pass the clamped window to the engine only when clamping was needed.
  ms.sink = note.empty() ? settings.sink_override : w.sink;
  ms.eval = note.empty() ? settings.eval_override : w.eval;
  ms.estimator = settings.estimator;
  return ms;
}

int AppState::grid_seeds_for(int n) const {
  if (settings.grid_seeds > 0) return settings.grid_seeds;
  return n <= 1024 ? 3 : n <= 4096 ? 2 : 1;
}

const Result& AppState::result(const std::string& name) const {
  static const Result kNone;
  auto it = results.find(name);
  return it == results.end() ? kNone : it->second;
}

const HeadRun* AppState::run(int slot) const {
  if (slot == 1 && !settings.ab_enabled) return nullptr;
  return result(slot == 0 ? kFocusA : kFocusB).get<HeadRun>();
}

std::shared_ptr<const HeadRun> AppState::run_ptr(int slot) const {
  if (slot == 1 && !settings.ab_enabled) return nullptr;
  return result(slot == 0 ? kFocusA : kFocusB).ptr<HeadRun>();
}

std::string AppState::run_error(int slot) const {
  if (slot == 1 && !settings.ab_enabled) return {};
  const Result& r = result(slot == 0 ? kFocusA : kFocusB);
  return r.key == r.want ? r.error : std::string();
}

std::shared_ptr<const LayerData> AppState::focus_layer() const {
  const Result& r = result(kLayer);
  if (!r.fresh()) return nullptr;
  // A view may change the focus while drawing; until the next reconcile() the loaded layer is
  // still the old one, and it must not be shown as the new one.
  std::shared_ptr<const LayerData> layer = r.ptr<LayerData>();
  return layer && layer->layer == settings.focus.layer ? layer : nullptr;
}

const MatrixF* AppState::focus_keys() const {
  auto layer = focus_layer();
  if (!layer || focus_refused()) return nullptr;
  return &layer->keys[static_cast<size_t>(settings.focus.kv_head)];
}

const MatrixF* AppState::focus_values() const {
  auto layer = focus_layer();
  if (!layer || focus_refused()) return nullptr;
  return &layer->values[static_cast<size_t>(settings.focus.kv_head)];
}

std::vector<const MatrixF*> AppState::focus_queries() const {
  auto layer = focus_layer();
  if (!layer || focus_refused() || layer->queries.empty()) return {};
  return layer->group_queries(settings.focus.kv_head);
}

bool AppState::focus_refused(std::string* why) const {
  auto layer = focus_layer();
  if (!layer) return false;
  size_t h = static_cast<size_t>(settings.focus.kv_head);
  if (h >= layer->keys.size()) {
    if (why) *why = "kv head out of range";
    return true;
  }
  if (h < layer->refused.size() && !layer->refused[h].empty()) {
    if (why) *why = layer->refused[h];
    return true;
  }
  return false;
}

int AppState::effective_query() const {
  int n = num_tokens();
  if (n <= 0) return -1;
  EvalWindow w = window();
  const int sq = settings.selected_query;
  if (sq >= w.n - w.eval && sq < w.n) return sq;
  // Default: the evaluation query where method A errs most (the most telling one to inspect;
  // the last query mostly attends to itself).
  const HeadRun* r = run(0);
  if (r && !r->per_query_head.empty() && result(kFocusA).fresh()) {
    const auto& heads = r->per_query_head;
    int best = n - 1;
    double best_err = -1;
    for (size_t t = 0; t < heads[0].size(); ++t) {
      double sum = 0;
      for (const auto& h : heads)
        if (t < h.size()) sum += h[t].relative;
      if (sum > best_err) {
        best_err = sum;
        best = heads[0][t].position;
      }
    }
    return best;
  }
  return n - 1;
}

std::string AppState::token_text(int i) const {
  const CaptureInfo* ci = info();
  if (!ci || i < 0 || i >= static_cast<int>(ci->tokens.size())) return {};
  return printable(ci->tokens[static_cast<size_t>(i)]);
}

std::pair<int, int> AppState::progress(const std::string& name) const {
  for (const JobInfo& j : worker.jobs())
    if (j.key == name && j.running) return {j.done, j.total};
  return {0, 0};
}

void AppState::resolve_backend() {
  if (backend_ && backend_resolved_ == settings.backend) return;
  std::string why;
  bool cuda = cuda_available(&why);
  try {
    Backend& b = select_backend(settings.backend);
    backend_ = &b;
    backend_resolved_ = settings.backend;
    backend_active = b.name();
    if (&b != &cpu_backend())
      backend_note = b.name() + " in use";
    else
      backend_note = cuda ? "CUDA available but not selected" : "CUDA not used: " + why;
  } catch (const std::exception& e) {
    // Keep the previous backend (the setting goes back to it); say why.
    backend_note = e.what();
    status_message = e.what();
    if (!backend_) {
      backend_ = &select_backend("cpu");
      backend_active = backend_->name();
      backend_resolved_ = "cpu";
    }
    settings.backend = backend_resolved_;
  }
}

// ---------------------------------------------------------------- actions

void AppState::capture_saved_as(const std::string& from, const std::string& to) {
  if (capture && capture_path == from) capture_path = to;
}

void AppState::remove_temp_captures(const std::string& keep) {
  for (auto it = temp_captures.begin(); it != temp_captures.end();) {
    if (*it == keep) {
      ++it;
      continue;
    }
    std::error_code ec;
    fs::remove(*it, ec);  // a mapped capture stays readable until it is closed
    it = temp_captures.erase(it);
  }
}

void AppState::set_focus(Focus f) {
  if (!capture) return;
  const CaptureInfo& ci = capture->info();
  if (f.layer < 0 || f.layer >= ci.num_layers || f.kv_head < 0 || f.kv_head >= ci.kv_heads) return;
  settings.focus = f;
}

void AppState::run_now(const std::string& name) {
  Result& r = results[name];
  r.approved = r.want;
  r.cancelled.clear();
  r.cancel_holds = false;
  if (r.key == r.want) r.key.clear();  // re-run an up-to-date result too
}

void AppState::cancel_job(const std::string& name) {
  Result& r = results[name];
  if (r.running.empty()) return;
  worker.cancel(name);
  r.cancelled = r.running;
  r.running.clear();
  // A progressive result keeps what it computed (its cells answer their key) and stays
  // cancelled, whatever changes, until Run.
  if (r.progressive)
    r.cancel_holds = true;
  else if (r.partial)
    r.partial = false, r.key = "(cancelled)";
}

void AppState::fit_settings_to_capture(bool announce) {
  if (!capture) return;
  const CaptureInfo& ci = capture->info();
  const int n = ci.num_tokens;
  Settings& st = settings;
  auto say = [&](const std::string& m) {
    if (announce) notes.push_back(m);
  };
  if (st.focus.layer < 0 || st.focus.layer >= ci.num_layers || st.focus.kv_head < 0 ||
      st.focus.kv_head >= ci.kv_heads) {
    if (announce && (st.focus.layer != 0 || st.focus.kv_head != 0))
      say("focus L" + std::to_string(st.focus.layer) + " H" + std::to_string(st.focus.kv_head) +
          " is not in this capture: focused L0 H0");
    st.focus = Focus{0, 0};
  }
  // Overrides that do not fit this capture are adjusted (and said), never passed on to fail.
  if (st.eval_override == 0 || st.eval_override > n) {
    int e = std::max(1, std::min(n, std::min(256, n / 8)));
    say("eval override E = " + std::to_string(st.eval_override) + " does not fit " +
        std::to_string(n) + " tokens: set to " + std::to_string(e));
    st.eval_override = e;
  }
  if (st.sink_override >= 0) {
    const int e = st.eval_override >= 1 ? st.eval_override : std::max(1, std::min(256, n / 8));
    if (st.sink_override + e > n) {
      int sk = std::max(0, std::min(n - e, std::min(256, n / 32)));
      say("sink override s = " + std::to_string(st.sink_override) + " does not fit " +
          std::to_string(n) + " tokens (E = " + std::to_string(e) + "): set to " +
          std::to_string(sk));
      st.sink_override = sk;
    }
  }
  std::string note;
  window(&note);
  if (!note.empty()) say(note);
  // A token budget keeps exactly budget_tokens middle tokens: the ratio that gives m = B.
  if (st.budget_mode) {
    const int n_mid = window().n_mid;
    if (n_mid > 0) {
      const int b = std::clamp(st.budget_tokens, 1, n_mid);
      if (b != st.budget_tokens)
        say("budget " + std::to_string(st.budget_tokens) + " does not fit the middle of " +
            std::to_string(n_mid) + " tokens: set to " + std::to_string(b));
      st.budget_tokens = b;
      st.keep_ratio = static_cast<double>(b) / n_mid;
    }
  }
  const int group = ci.group_size();
  st.selected_q_head = std::clamp(st.selected_q_head, 0, std::max(0, group - 1));
  if (st.selected_query >= n) st.selected_query = -1;
}

void AppState::submit(const std::string& name, Result& r, const JobPlan& p) {
  r.running = p.key;
  const std::string key = p.key, cls = p.cost_class;
  const double units = p.units;
  const int threads = std::max(1, p.threads);
  auto compute = p.compute;
  const std::type_info* type = p.value_type;
  worker.submit(p.lane, name, p.label, [=](JobContext& ctx) -> ApplyFn {
    JobPlan::PartialFn partial = [&ctx, name, key, type](std::shared_ptr<const void> v) {
      ctx.post([name, key, type, v](AppState& s) {
        Result& r = s.results[name];
        if (r.running != key) return;
        r.value = v;
        r.type = type;
        r.key = key;
        r.error.clear();
        r.partial = true;
      });
    };
    const auto t0 = std::chrono::steady_clock::now();
    std::shared_ptr<const void> value;
    std::string error;
    try {
      value = compute(ctx, partial);
    } catch (const Cancelled&) {
      throw;
    } catch (const std::exception& e) {
      error = e.what();
    }
    ctx.check_cancel();
    const double secs = seconds_since(t0);
    return [=](AppState& s) {
      Result& r = s.results[name];
      if (r.running != key) return;  // outdated or cancelled meanwhile
      r.running.clear();
      r.key = key;
      r.partial = false;
      r.seconds = secs;
      if (!error.empty()) {
        r.value.reset();
        r.error = error;
        return;
      }
      r.value = value;
      r.type = type;
      r.error.clear();
      if (!cls.empty()) s.costs.record(cls, units, secs * threads);
    };
  });
}

void AppState::check_probes() {
  // A job is held only when it ran past its limit without finishing, or when a second of its own
  // progress projects more than kFarOver times its limit (then a first second paced 3x slower
  // than the rest would be needed to hold a job under its limit). So nothing that takes less
  // than its limit is held on an estimate, however wrong the cost model is (a first measurement
  // taken under load or cold once held 0.55 s of work at "about 8.4 s").
  constexpr double kProbeSeconds = 1.0;
  constexpr double kFarOver = 3.0;
  std::vector<JobInfo> jobs;
  for (auto& [name, r] : results) {
    if (r.probing.empty()) continue;
    if (r.running != r.probing) {  // done, failed, cancelled or outdated meanwhile
      r.probing.clear();
      continue;
    }
    if (jobs.empty()) jobs = worker.jobs();
    const auto job = std::find_if(jobs.begin(), jobs.end(),
                                  [&](const JobInfo& j) { return j.key == name && j.running; });
    if (job == jobs.end()) continue;  // still queued: its clock starts when it runs
    const auto now = probe_clock();
    // From when the job started running, not from when a frame first saw it: a UI thread late
    // to look (a busy machine, a long frame) saw a third of a 60 s t-SNE done "in a second" and
    // let it run on as short.
    if (r.probe_start == std::chrono::steady_clock::time_point{})
      r.probe_start = now - std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                std::chrono::duration<double>(job->elapsed_s));
    const double elapsed = std::chrono::duration<double>(now - r.probe_start).count();
    if (elapsed < kProbeSeconds) continue;
    const bool paced = job->total > 0 && job->done > 0;
    const double projected =
        paced ? elapsed * static_cast<double>(job->total) / static_cast<double>(job->done) : -1;
    if (paced && projected <= r.probe_limit_s) {  // short after all: it runs on
      r.probing.clear();
      continue;
    }
    const bool past_limit = elapsed >= r.probe_limit_s;
    if (!past_limit && !(paced && projected > kFarOver * r.probe_limit_s)) continue;
    worker.cancel(name);
    r.running.clear();
    r.held = r.measured = r.probing;
    r.probing.clear();
    if (paced) {
      if (!r.probe_cost_class.empty())
        costs.record(r.probe_cost_class, r.probe_units * job->done / job->total,
                     elapsed * r.probe_threads);
      char pct[32];
      std::snprintf(pct, sizeof pct, "%.0f%%", 100.0 * job->done / job->total);
      r.estimate_s = projected;
      r.estimate_text = "about " + fmt_seconds(projected) + " (measured here: " + pct + " in " +
                        fmt_seconds(elapsed) + ")";
    } else {
      r.estimate_s = elapsed;
      r.estimate_text = "more than " + fmt_seconds(elapsed) + " (measured here: no part done in " +
                        fmt_seconds(elapsed) + ")";
    }
  }
}

void AppState::reconcile(const ViewPlanner& plan_views) {
  worker.drain(*this);
  check_probes();
  finish_new_capture();  // may ask to open the capture it made
  finish_open();
  finish_set_open();
  record_exact_sides();
  resolve_backend();
  fit_settings_to_capture(false);
  // Where the grid job looks first (read by the job before each cell).
  grid_priority->focus_layer = settings.focus.layer;
  grid_priority->focus_head = settings.focus.kv_head;
  grid_priority->visible_first = grid_rows_visible[0];
  grid_priority->visible_last = grid_rows_visible[1];
  // Each plan's key is published as its result's `want` before the next planner runs: a planner
  // that reads an earlier result (focus_layer(), run(0), fresh()) then knows whether that result
  // belongs to the current settings. Planning every result first and publishing after let the
  // focused run of a new head take the previous head's layer.
  std::vector<NamedPlan> all;
  for (const auto& [name, planner] : planners()) {
    all.emplace_back(name, (this->*planner)());
    results[name].want = all.back().second.key;
  }
  if (plan_views) {  // the views' own results, planned after (and from) the app's
    std::vector<NamedPlan> extra;
    plan_views(*this, extra);
    for (NamedPlan& p : extra) {
      results[p.first].want = p.second.key;
      all.push_back(std::move(p));
    }
  }
  std::set<std::string> planned;
  for (const auto& [name, p] : all) {
    planned.insert(name);
    Result& r = results[name];
    r.want = p.key;
    r.waiting = p.waiting;
    r.progressive = p.progressive;
    if (p.key.empty()) {
      if (!r.running.empty()) worker.cancel(name);
      r.running.clear();
      r.held.clear();
      r.estimate_s = -1;
      r.estimate_text.clear();
      continue;
    }
    if (r.measured == p.key) {
      // Held by its own measurement (check_probes): that estimate stands.
    } else if (p.compute && p.waiting.empty()) {  // a waiting job's size is not known yet
      const double per_unit =
          p.cost_class.empty() ? kPriorPerUnit : costs.per_unit(p.cost_class, p.prior_per_unit);
      r.estimate_s = p.units * per_unit / std::max(1, p.threads);
      r.estimate_text = "about " + fmt_seconds(r.estimate_s);
      if (!p.cost_class.empty() && !costs.measured(p.cost_class))
        r.estimate_text += " (not yet measured on this machine)";
    }
    // The key changed: what is already computed for it replaces the earlier settings' value now,
    // in the same frame, so nothing of theirs reads as fresh until the job's first frame.
    if (r.key != p.key && p.in_hand && p.waiting.empty()) {
      if (std::shared_ptr<const void> v = p.in_hand()) {
        r.value = std::move(v);
        r.type = p.value_type;
        r.key = p.key;
        r.error.clear();
        r.partial = true;
      }
    }
    if (r.key == p.key && !r.partial) continue;  // fresh
    if (r.running == p.key) continue;            // on its way
    if (!r.running.empty()) {                    // outdated job
      worker.cancel(name);
      r.running.clear();
    }
    if (!p.waiting.empty() || !p.compute) continue;
    // A cancelled progressive result waits for Run, unless nothing is left to compute.
    if (r.cancel_holds && p.units > 0) r.cancelled = p.key;
    if (r.cancelled == p.key) continue;
    if (!p.progressive && r.estimate_s > p.auto_limit_s && r.approved != p.key) {
      // An estimate holds nothing by itself, measured here or not: the job starts and measures
      // itself (check_probes), and is held only when its own run says it is long.
      if (r.measured == p.key) {
        r.held = p.key;
        continue;
      }
      r.probing = p.key;
      r.probe_start = {};
      r.probe_limit_s = p.auto_limit_s;
      r.probe_cost_class = p.cost_class;
      r.probe_units = p.units;
      r.probe_threads = std::max(1, p.threads);
    }
    r.held.clear();
    submit(name, r, p);
  }
  // The cell store stays bounded: past 20000 cells (about 50 MB) only the current grid's stay.
  if (grid_cells.size() > 20000 && grid_plan_job_) {
    std::set<std::string> keep;
    for (const GridJob::Need& n : grid_plan_job_->needs) keep.insert(n.key);
    grid_cells.trim(20000, keep);
  }
  for (auto& [name, r] : results)
    if (!planned.count(name)) {
      r.want.clear();
      if (!r.running.empty()) worker.cancel(name);
      r.running.clear();
    }
}

std::string default_capture_path(const char* argv0) {
  const char* name = "sample_data/stories260K_lily.safetensors";
  std::vector<fs::path> candidates;
  std::error_code ec;
  if (argv0) {
    fs::path exe = fs::weakly_canonical(fs::path(argv0), ec);
    fs::path dir = exe.parent_path();
    for (int up = 0; up < 4 && !dir.empty(); ++up) {
      candidates.push_back(dir / name);
      dir = dir.parent_path();
    }
  }
#ifdef KVSCOPE_SOURCE_DIR
  candidates.push_back(fs::path(KVSCOPE_SOURCE_DIR) / name);
#endif
  candidates.push_back(fs::path(name));
  for (const auto& c : candidates)
    if (fs::exists(c, ec)) return c.string();
  return candidates.empty() ? name : candidates.back().string();
}

}  // namespace kvscope::app
