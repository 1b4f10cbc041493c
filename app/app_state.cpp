#include "app/app_state.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>

#include "engine/attention.h"
#include "engine/backend.h"
#include "engine/error.h"

namespace kvscope::app {
namespace fs = std::filesystem;

namespace {

// Runs `fn`, turning failures (other than cancellation) into the message for `on_error`.
template <typename Fn, typename OnError>
ApplyFn guarded(Fn&& fn, OnError&& on_error) {
  try {
    return fn();
  } catch (const Cancelled&) {
    throw;
  } catch (const std::exception& e) {
    return on_error(std::string(e.what()));
  }
}

// Threads for background evaluations: all cores but one, which stays free for the focused
// head's re-runs and the UI.
int background_threads() {
  unsigned hw = std::thread::hardware_concurrency();
  return hw > 2 ? static_cast<int>(hw) - 1 : 1;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

AppState::AppState() {
  set_backend(backend_choice);
}

AppState::~AppState() {
  worker.cancel("");
}

const Method* AppState::method(int slot) const {
  return find_method(method_name[static_cast<size_t>(slot)]);
}

MethodSettings AppState::settings(int slot) const {
  MethodSettings ms;
  ms.method = method(slot);
  ms.keep_ratio = keep_ratio;
  if (ms.method) {
    auto it = params.find(ms.method->name());
    if (it != params.end()) ms.params = it->second;
  }
  ms.sink = sink_override;
  ms.eval = eval_override;
  ms.estimator = estimator;
  return ms;
}

const MatrixF* AppState::focus_keys() const {
  if (!focus_layer || focus_refused()) return nullptr;
  return &focus_layer->keys[static_cast<size_t>(focus.kv_head)];
}

const MatrixF* AppState::focus_values() const {
  if (!focus_layer || focus_refused()) return nullptr;
  return &focus_layer->values[static_cast<size_t>(focus.kv_head)];
}

std::vector<const MatrixF*> AppState::focus_queries() const {
  if (!focus_layer || focus_refused() || focus_layer->queries.empty()) return {};
  return focus_layer->group_queries(focus.kv_head);
}

bool AppState::focus_refused(std::string* why) const {
  if (!focus_layer) return false;
  size_t h = static_cast<size_t>(focus.kv_head);
  if (h >= focus_layer->keys.size()) {
    if (why) *why = "kv head out of range";
    return true;
  }
  if (h < focus_layer->refused.size() && !focus_layer->refused[h].empty()) {
    if (why) *why = focus_layer->refused[h];
    return true;
  }
  return false;
}

EvalWindow AppState::window() const {
  return EvalWindow::make(num_tokens(), keep_ratio, sink_override, eval_override);
}

int AppState::effective_query() const {
  int n = num_tokens();
  if (n <= 0) return -1;
  EvalWindow w = window();
  if (selected_query >= w.n - w.eval && selected_query < w.n) return selected_query;
  // Default: the evaluation query where method A errs most (the most telling one to inspect;
  // the last query mostly attends to itself).
  if (run[0] && !run[0]->per_query_head.empty()) {
    const auto& heads = run[0]->per_query_head;
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
  std::string out;
  for (char c : ci->tokens[static_cast<size_t>(i)]) {
    if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c == '\r')
      out += "\\r";
    else
      out += c;
  }
  return out;
}

Backend* AppState::backend() const {
  return backend_;
}

void AppState::set_backend(const std::string& which) {
  std::string why;
  bool cuda = cuda_available(&why);
  try {
    Backend& b = select_backend(which);
    backend_ = &b;
    backend_choice = which;
    backend_active = b.name();
    if (b.is_gpu())
      backend_note = "GPU in use";
    else
      backend_note = cuda ? "CUDA available but not selected" : "CUDA not used: " + why;
  } catch (const std::exception& e) {
    // Keep the previous backend; say why the requested one is unavailable.
    backend_note = e.what();
    status_message = e.what();
  }
}

void AppState::request_open(const std::string& path) {
  loading_path = path;
  worker.submit(Lane::Focus, "open", "opening " + fs::path(path).filename().string(),
                [path](JobContext& ctx) -> ApplyFn {
                  return guarded(
                      [&]() -> ApplyFn {
                        std::shared_ptr<CaptureFile> cap = CaptureFile::open(path);
                        ctx.check_cancel();
                        return [path, cap](AppState& s) {
                          if (s.loading_path == path) s.loading_path.clear();
                          s.capture = cap;
                          s.capture_path = path;
                          s.load_error.clear();
                          s.worker.cancel("grid");
                          s.worker.cancel("sweep");
                          s.worker.cancel("focus");
                          s.run = {};
                          s.run_error = {};
                          s.grid.reset();
                          s.sweep.reset();
                          s.entropy.reset();
                          s.query_cmp.reset();
                          s.focus_layer.reset();
                          s.selected_tokens.clear();
                          s.selected_token = -1;
                          s.selected_query = -1;
                          s.focus = Focus{-1, -1};
                          s.set_focus(Focus{0, 0});
                          s.request_grid();
                          // Entropy costs a pass over every layer: only when it is shown.
                          if (s.grid_metric == GridMetric::Entropy) s.request_entropy();
                          if (!s.sweep_request.methods.empty()) s.request_sweep(s.sweep_request);
                        };
                      },
                      [path](const std::string& msg) -> ApplyFn {
                        return [path, msg](AppState& s) {
                          if (s.loading_path == path) s.loading_path.clear();
                          s.load_error = msg;  // the current capture stays open
                        };
                      });
                });
}

void AppState::set_focus(Focus f) {
  if (!capture) return;
  const CaptureInfo& ci = capture->info();
  if (f.layer < 0 || f.layer >= ci.num_layers || f.kv_head < 0 || f.kv_head >= ci.kv_heads) return;
  if (f == focus && focus_layer) return;
  bool layer_changed = f.layer != focus.layer || !focus_layer;
  focus = f;
  ++focus_generation;
  run = {};
  query_cmp.reset();
  if (!layer_changed) {
    request_focus_runs();
    return;
  }
  focus_layer.reset();
  std::shared_ptr<CaptureFile> cap = capture;
  int L = f.layer;
  worker.submit(Lane::Focus, "focus.layer", "loading layer " + std::to_string(L),
                [cap, L](JobContext&) -> ApplyFn {
                  return guarded(
                      [&]() -> ApplyFn {
                        std::shared_ptr<const LayerData> data = cap->layer(L);
                        return [cap, L, data](AppState& s) {
                          if (s.capture != cap || s.focus.layer != L) return;
                          s.focus_layer = data;
                          ++s.focus_generation;
                          s.request_focus_runs();
                        };
                      },
                      [cap](const std::string& msg) -> ApplyFn {
                        return [cap, msg](AppState& s) {
                          if (s.capture != cap) return;
                          s.run_error = {msg, msg};
                        };
                      });
                });
}

void AppState::settings_changed() {
  ++settings_generation_;
  if (sweep) sweep_stale = true;
  request_focus_runs();
  request_grid();
}

void AppState::request_focus_runs() {
  if (!capture || !focus_layer) return;
  const uint64_t gen = settings_generation_;
  const uint64_t fgen = focus_generation;
  for (int slot = 0; slot < 2; ++slot) {
    std::string key = slot == 0 ? "focus.A" : "focus.B";
    if (slot == 1 && !ab_enabled) {
      worker.cancel(key);
      run[1].reset();
      run_error[1].clear();
      continue;
    }
    MethodSettings ms = settings(slot);
    if (!ms.method) {
      run_error[static_cast<size_t>(slot)] = "unknown method '" + method_name[slot] + "'";
      continue;
    }
    std::string why;
    if (focus_refused(&why)) {
      run_error[static_cast<size_t>(slot)] = "head refused: " + why;
      continue;
    }
    std::shared_ptr<const LayerData> layer = focus_layer;
    int num_layers = capture->info().num_layers, kv = focus.kv_head;
    uint64_t sd = static_cast<uint64_t>(seed);
    Backend* be = backend_;
    worker.submit(
        Lane::Focus, key,
        ms.method->name() + " on L" + std::to_string(focus.layer) + " H" + std::to_string(kv),
        [=](JobContext& ctx) -> ApplyFn {
          return guarded(
              [&]() -> ApplyFn {
                auto t0 = std::chrono::steady_clock::now();
                auto hr = std::make_shared<HeadRun>(
                    run_head(*layer, num_layers, kv, ms, sd, true, be, ctx.cancel_flag()));
                double ms_taken = seconds_since(t0) * 1000.0;
                ctx.check_cancel();
                return [=](AppState& s) {
                  if (s.settings_generation_ != gen || s.focus_generation != fgen) return;
                  s.run[static_cast<size_t>(slot)] = hr;
                  s.run_error[static_cast<size_t>(slot)].clear();
                  s.run_ms[static_cast<size_t>(slot)] = ms_taken;
                  ++s.run_generation;
                  if (slot == 0) s.request_query_comparison();
                };
              },
              [=](const std::string& msg) -> ApplyFn {
                return [=](AppState& s) {
                  if (s.settings_generation_ != gen || s.focus_generation != fgen) return;
                  s.run[static_cast<size_t>(slot)].reset();
                  s.run_error[static_cast<size_t>(slot)] = msg;
                  ++s.run_generation;
                  if (slot == 0) s.query_cmp.reset();
                };
              });
        });
  }
}

void AppState::request_grid() {
  if (!capture) return;
  const Method* m = method(0);
  if (!m) return;
  EvalSpec spec;
  spec.methods = {m};
  spec.ratios = {keep_ratio};
  spec.seeds = grid_seeds;
  spec.base_seed = static_cast<uint64_t>(seed);
  spec.params = params;
  spec.sink = sink_override;
  spec.eval = eval_override;
  spec.estimator = estimator;
  spec.threads = background_threads();
  std::shared_ptr<CaptureFile> cap = capture;
  Backend* be = backend_;
  const uint64_t gen = settings_generation_;
  grid_error.clear();
  worker.submit(
      Lane::Grid, "grid", "grid: " + m->name() + " at " + std::to_string(keep_ratio),
      [=](JobContext& ctx) -> ApplyFn {
        return guarded(
            [&]() -> ApplyFn {
              auto rep = std::make_shared<EvalReport>(run_eval(
                  *cap, spec, [&](int d, int t) { ctx.progress(d, t); }, ctx.cancel_flag(), be));
              ctx.check_cancel();
              return [=](AppState& s) {
                if (s.capture != cap || s.settings_generation_ != gen) return;
                s.grid = rep;
                s.grid_error.clear();
              };
            },
            [=](const std::string& msg) -> ApplyFn {
              return [=](AppState& s) {
                if (s.capture != cap || s.settings_generation_ != gen) return;
                s.grid.reset();
                s.grid_error = msg;
              };
            });
      });
}

void AppState::request_entropy() {
  if (!capture) return;
  std::shared_ptr<CaptureFile> cap = capture;
  EvalWindow w = window();
  worker.submit(Lane::Grid, "entropy", "attention entropy", [cap, w](JobContext& ctx) -> ApplyFn {
    const CaptureInfo& ci = cap->info();
    auto eg = std::make_shared<EntropyGrid>();
    eg->layers = ci.num_layers;
    eg->heads = ci.kv_heads;
    eg->values.assign(static_cast<size_t>(ci.num_layers * ci.kv_heads), NAN);
    for (int L = 0; L < ci.num_layers; ++L) {
      ctx.progress(L, ci.num_layers);
      std::shared_ptr<const LayerData> layer;
      try {
        layer = cap->layer(L);
      } catch (const std::exception&) {
        continue;  // the grid shows the loader's message; entropy stays NaN here
      }
      if (layer->queries.empty()) continue;
      for (int h = 0; h < ci.kv_heads; ++h) {
        if (h < static_cast<int>(layer->refused.size()) && !layer->refused[h].empty()) continue;
        double sum = 0;
        int count = 0;
        for (const MatrixF* Q : layer->group_queries(h)) {
          for (int j = w.n - w.eval; j < w.n; ++j) {
            ctx.check_cancel();
            std::vector<double> p = attention_row(Q->row(j).data(), layer->keys[h], j);
            double e = 0;
            for (double x : p)
              if (x > 0) e -= x * std::log(x);
            sum += e;
            ++count;
          }
        }
        if (count) eg->values[static_cast<size_t>(L * ci.kv_heads + h)] = sum / count;
      }
    }
    return [cap, eg](AppState& s) {
      if (s.capture == cap) s.entropy = eg;
    };
  });
}

void AppState::request_sweep(const SweepRequest& r) {
  sweep_request = r;
  if (!capture || r.methods.empty()) return;
  EvalSpec spec;
  for (const std::string& name : r.methods)
    if (const Method* m = find_method(name)) spec.methods.push_back(m);
  if (spec.methods.empty()) return;
  spec.ratios = r.ratios;
  spec.seeds = r.seeds;
  spec.base_seed = static_cast<uint64_t>(seed);
  spec.params = params;
  spec.sink = sink_override;
  spec.eval = eval_override;
  spec.estimator = estimator;
  spec.threads = background_threads();
  if (r.focused_layer_only) spec.layers = {focus.layer};
  std::shared_ptr<CaptureFile> cap = capture;
  Backend* be = backend_;
  sweep_error.clear();
  sweep_stale = false;
  worker.submit(Lane::Analysis, "sweep", "error sweep", [=](JobContext& ctx) -> ApplyFn {
    return guarded(
        [&]() -> ApplyFn {
          auto rep = std::make_shared<EvalReport>(run_eval(
              *cap, spec, [&](int d, int t) { ctx.progress(d, t); }, ctx.cancel_flag(), be));
          ctx.check_cancel();
          return [=](AppState& s) {
            if (s.capture != cap) return;
            s.sweep = rep;
            s.sweep_error.clear();
          };
        },
        [=](const std::string& msg) -> ApplyFn {
          return [=](AppState& s) {
            if (s.capture != cap) return;
            s.sweep_error = msg;
          };
        });
  });
}

void AppState::request_query_comparison() {
  if (!focus_layer || !run[0] || focus_layer->queries.empty()) {
    query_cmp.reset();
    return;
  }
  std::shared_ptr<const LayerData> layer = focus_layer;
  std::shared_ptr<const HeadRun> hr = run[0];
  int kv = focus.kv_head;
  int group = capture->info().group_size();
  int qh = kv * group + std::clamp(selected_q_head, 0, std::max(0, group - 1));
  int j = effective_query();
  query_cmp_error.clear();
  worker.submit(Lane::Focus, "focus.query", "query comparison", [=](JobContext&) -> ApplyFn {
    return guarded(
        [&]() -> ApplyFn {
          const MatrixF& K = layer->keys[static_cast<size_t>(kv)];
          const MatrixF& V = layer->values[static_cast<size_t>(kv)];
          const float* q = layer->queries[static_cast<size_t>(qh)].row(j).data();
          const EvalWindow& w = hr->window;
          const Selection& sel = hr->selection;
          auto qc = std::make_shared<QueryComparison>();
          qc->position = j;
          qc->q_head = qh;
          qc->exact_weights = attention_row(q, K, j);
          // The estimator's own normalised weights over [0, j]: weight 1 for sinks and the
          // window, the method's weight on its (denominator) selection, 0 for dropped keys.
          std::vector<double> w_key(static_cast<size_t>(j + 1), 0.0);
          for (int i = 0; i < std::min(w.sink, j + 1); ++i) w_key[static_cast<size_t>(i)] = 1;
          for (int i = w.n - w.eval; i <= j; ++i) w_key[static_cast<size_t>(i)] = 1;
          const auto& idx = sel.separate ? sel.den_indices : sel.indices;
          const auto& wts = sel.separate ? sel.den_weights : sel.weights;
          for (size_t t = 0; t < idx.size() && t < wts.size(); ++t)
            if (idx[t] <= j) w_key[static_cast<size_t>(idx[t])] = wts[t];
          const int d = static_cast<int>(K.cols());
          const double scale = 1.0 / std::sqrt(static_cast<double>(d));
          std::vector<double> logits(static_cast<size_t>(j + 1), -INFINITY);
          double mx = -INFINITY;
          for (int i = 0; i <= j; ++i) {
            if (w_key[static_cast<size_t>(i)] <= 0) continue;
            double dot = 0;
            for (int c = 0; c < d; ++c) dot += static_cast<double>(q[c]) * K(i, c);
            logits[static_cast<size_t>(i)] = dot * scale + std::log(w_key[static_cast<size_t>(i)]);
            mx = std::max(mx, logits[static_cast<size_t>(i)]);
          }
          double z = 0;
          qc->approx_weights.assign(static_cast<size_t>(j + 1), 0.0);
          for (int i = 0; i <= j; ++i)
            if (std::isfinite(logits[static_cast<size_t>(i)]))
              z += (qc->approx_weights[static_cast<size_t>(i)] =
                        std::exp(logits[static_cast<size_t>(i)] - mx));
          for (double& x : qc->approx_weights) x /= z;
          VectorD ex = exact_attention(q, K, V, j);
          VectorD ap = weighted_attention(q, K, V, j, w, sel);
          qc->exact_output.assign(ex.data(), ex.data() + ex.size());
          qc->approx_output.assign(ap.data(), ap.data() + ap.size());
          double en = ex.norm();
          qc->relative_error = en > 0 ? (ap - ex).norm() / en : 0;
          return [qc, hr](AppState& s) {
            if (s.run[0] == hr) s.query_cmp = qc;
          };
        },
        [hr](const std::string& msg) -> ApplyFn {
          return [msg, hr](AppState& s) {
            if (s.run[0] == hr) s.query_cmp_error = msg;
          };
        });
  });
}

nlohmann::json AppState::to_session() const {
  nlohmann::json j;
  j["kvscope_session"] = 1;
  j["capture"] = capture_path;
  j["focus"] = {{"layer", focus.layer}, {"kv_head", focus.kv_head}};
  j["method_a"] = method_name[0];
  j["method_b"] = method_name[1];
  j["ab_enabled"] = ab_enabled;
  j["keep_ratio"] = keep_ratio;
  j["seed"] = seed;
  j["sink"] = sink_override;
  j["eval"] = eval_override;
  j["backend"] = backend_choice;
  j["grid_seeds"] = grid_seeds;
  j["grid_metric"] = grid_metric == GridMetric::Error ? "error" : "entropy";
  j["selected_query"] = selected_query;
  j["selected_q_head"] = selected_q_head;
  j["active_view"] = active_view;
  nlohmann::json p = nlohmann::json::object();
  for (const auto& [name, values] : params) p[name] = values;
  j["params"] = p;
  j["sweep"] = {{"methods", sweep_request.methods},
                {"ratios", sweep_request.ratios},
                {"seeds", sweep_request.seeds},
                {"focused_layer_only", sweep_request.focused_layer_only}};
  return j;
}

void AppState::apply_session(const nlohmann::json& j) {
  try {
    if (!j.is_object() || !j.contains("kvscope_session"))
      throw InputError("not a KVScope session (no \"kvscope_session\" key)");
    method_name[0] = j.value("method_a", method_name[0]);
    method_name[1] = j.value("method_b", method_name[1]);
    for (int slot = 0; slot < 2; ++slot)
      if (!find_method(method_name[slot]))
        throw InputError("method_" + std::string(slot ? "b" : "a") + ": unknown method '" +
                         method_name[slot] + "'");
    ab_enabled = j.value("ab_enabled", ab_enabled);
    keep_ratio = j.value("keep_ratio", keep_ratio);
    if (!(keep_ratio > 0 && keep_ratio <= 1))
      throw InputError("keep_ratio: " + std::to_string(keep_ratio) + " is not in (0, 1]");
    seed = j.value("seed", seed);
    sink_override = j.value("sink", sink_override);
    eval_override = j.value("eval", eval_override);
    grid_seeds = std::clamp(j.value("grid_seeds", grid_seeds), 1, 10);
    grid_metric = j.value("grid_metric", std::string("error")) == "entropy" ? GridMetric::Entropy
                                                                            : GridMetric::Error;
    selected_query = j.value("selected_query", selected_query);
    selected_q_head = j.value("selected_q_head", selected_q_head);
    active_view = j.value("active_view", active_view);
    if (j.contains("params")) {
      params.clear();
      for (const auto& [name, values] : j["params"].items())
        params[name] = values.get<ParamValues>();
    }
    if (j.contains("sweep")) {
      const auto& sw = j["sweep"];
      SweepRequest r;
      r.methods = sw.value("methods", r.methods);
      r.ratios = sw.value("ratios", r.ratios);
      r.seeds = sw.value("seeds", r.seeds);
      r.focused_layer_only = sw.value("focused_layer_only", false);
      sweep_request = r;
    }
    set_backend(j.value("backend", backend_choice));
    Focus f{0, 0};
    if (j.contains("focus")) f = {j["focus"].value("layer", 0), j["focus"].value("kv_head", 0)};
    std::string path = j.value("capture", std::string());
    if (!path.empty() && path != capture_path) {
      // Focus applies once the file is open (request_open resets it to 0/0 first).
      request_open(path);
      worker.submit(Lane::Focus, "session.focus", "restoring focus", [f](JobContext&) -> ApplyFn {
        return [f](AppState& s) {
          s.set_focus(f);
          s.settings_changed();
        };
      });
    } else {
      set_focus(f);
      settings_changed();
      if (!sweep_request.methods.empty()) request_sweep(sweep_request);
    }
  } catch (const nlohmann::json::exception& e) {
    throw InputError(std::string("session: malformed JSON field: ") + e.what());
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
