// Everything the app shows and edits, owned by the UI thread. Views read it and change settings
// through the request_* functions, which queue worker jobs; results come back as whole
// shared_ptrs swapped in by apply closures (see worker.h). Nothing here is touched by a worker
// thread directly.
//
// For view authors (view_geometry.cpp, view_walk.cpp, ...):
//   - the focused head:      s.focus.layer, s.focus.kv_head, s.focus_layer (LayerData, may be null
//                            while loading), s.focus_keys() / focus_values() / focus_queries()
//   - the current selection: s.run[0] (method A) and s.run[1] (method B, when s.ab_enabled):
//                            shared_ptr<const HeadRun>; run[k]->selection.trace is the WalkTrace
//                            (always requested for the focused head)
//   - linked highlighting:   s.hovered_token (this frame, set by any view), s.selected_tokens
//                            (box selection), s.selected_query (position of the chosen query)
//   - change detection:      s.focus_generation (capture/layer/head changed), s.run_generation
//                            (a new HeadRun arrived)
//   - background work:       s.worker.submit(Lane::Geometry, "geometry.tsne", "t-SNE", job)
//                            where job returns an ApplyFn that stores the result in the view.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "app/worker.h"
#include "engine/capture.h"
#include "engine/method.h"
#include "engine/protocol.h"

namespace kvscope::app {

struct Focus {
  int layer = 0;
  int kv_head = 0;
  bool operator==(const Focus&) const = default;
};

// What the grid cells of the Capture view and the Error heatmap are coloured by.
enum class GridMetric { Error = 0, Entropy = 1 };

// Attention entropy of every (layer, kv head): mean over the evaluation queries of the group's
// query heads of -sum p log p (nats). Computed in the background after a capture opens.
struct EntropyGrid {
  int layers = 0, heads = 0;
  std::vector<double> values;  // [layer * heads + head], NaN when refused / no queries
  double at(int l, int h) const { return values[static_cast<size_t>(l * heads + h)]; }
};

// Exact vs approximate attention of one query (the Error view's last panel), per method slot.
struct QueryComparison {
  int position = -1;                   // absolute query position j
  int q_head = 0;                      // query head (absolute index)
  std::vector<double> exact_weights;   // softmax over keys [0, j]
  std::vector<double> approx_weights;  // the estimator's normalised weights over [0, j]
  std::vector<double> exact_output;    // Attn(q_j) (d_v)
  std::vector<double> approx_output;   // z_j
  double relative_error = 0;
};

// The error sweep of the Error view: several methods x the protocol's ratios x seeds.
struct SweepRequest {
  std::vector<std::string> methods;
  std::vector<double> ratios{0.5, 0.25, 0.125, 0.0625};
  int seeds = 3;
  bool focused_layer_only = false;
  bool operator==(const SweepRequest&) const = default;
};

struct AppState {
  AppState();
  ~AppState();

  // ---- capture
  std::shared_ptr<CaptureFile> capture;  // CaptureFile::layer() is thread-safe
  std::string capture_path;
  std::string load_error;    // last failed open (the loader's InputError), shown in the window
  std::string loading_path;  // non-empty while a file is being opened
  Focus focus;
  std::shared_ptr<const LayerData> focus_layer;  // the focused layer (null while loading)
  uint64_t focus_generation = 0;

  // ---- method settings (A and the optional B of the A/B comparison)
  std::array<std::string, 2> method_name{"balancekv", "uniform"};
  bool ab_enabled = true;
  std::map<std::string, ParamValues> params;  // by method name, only non-default entries matter
  double keep_ratio = 0.25;
  int seed = 0;
  int sink_override = -1, eval_override = -1;  // -1: protocol default
  Estimator estimator = Estimator::Weighted;   // the authors' estimator is a protocol option
  std::string backend_choice = "cpu";          // cpu | cuda | auto
  std::string backend_active;                  // name() of the backend in use
  std::string backend_note;                    // why cuda is not used, or the device
  int grid_seeds = 3;                          // seeds averaged in the background grid
  GridMetric grid_metric = GridMetric::Error;

  // ---- results (swapped in whole by apply closures)
  std::array<std::shared_ptr<const HeadRun>, 2> run;  // focused head, A and B
  std::array<std::string, 2> run_error;               // method failed / not implemented
  std::array<double, 2> run_ms{0, 0};                 // wall time of the last run
  uint64_t run_generation = 0;
  std::shared_ptr<const EvalReport> grid;  // method A at keep_ratio, every layer and kv head
  std::string grid_error;
  std::shared_ptr<const EntropyGrid> entropy;
  SweepRequest sweep_request;
  std::shared_ptr<const EvalReport> sweep;
  std::string sweep_error;
  bool sweep_stale = false;                          // settings changed since the sweep ran
  std::shared_ptr<const QueryComparison> query_cmp;  // for selected_query, method A
  std::string query_cmp_error;
  std::map<std::string, std::string> job_errors;  // by job key, from failed jobs

  // ---- linked selection
  int hovered_token = -1;         // reset every frame before views draw; any view may set it
  int selected_token = -1;        // clicked token
  std::set<int> selected_tokens;  // box selection (Geometry view) shown in the token strip
  int selected_query = -1;        // absolute position of the query used by the Error view (-1:
                                  // the last one)
  int selected_q_head = 0;        // within the focused kv head's GQA group

  // ---- UI state that persists in sessions
  std::string active_view = "capture";  // the view shown (and screenshot) in each panel
  std::string status_message;           // transient line in the status bar

  Worker worker;

  // ---- accessors for views
  const Method* method(int slot) const;  // nullptr when unknown
  MethodSettings settings(int slot) const;
  const CaptureInfo* info() const { return capture ? &capture->info() : nullptr; }
  int num_tokens() const { return capture ? capture->info().num_tokens : 0; }
  // Focused head data (nullptr while the layer is loading or when the head is refused).
  const MatrixF* focus_keys() const;
  const MatrixF* focus_values() const;
  std::vector<const MatrixF*> focus_queries() const;  // the GQA group, may be empty
  bool focus_refused(std::string* why = nullptr) const;
  // The evaluation window the current settings give for the focused capture.
  EvalWindow window() const;
  // The query position the Error view uses (selected_query or the last one).
  int effective_query() const;
  // Token text for display (newlines and tabs escaped), "" when out of range.
  std::string token_text(int i) const;
  Backend* backend() const;

  // ---- requests (UI thread): each queues worker jobs, never blocks
  void request_open(const std::string& path);
  void set_focus(Focus f);
  // Settings changed: re-run the focused head now and the grid in the background.
  void settings_changed();
  void request_focus_runs();
  void request_grid();
  void request_entropy();
  void request_sweep(const SweepRequest& r);
  void request_query_comparison();
  void set_backend(const std::string& which);

  // ---- sessions
  nlohmann::json to_session() const;
  // Applies a session (opens its file when it differs). Throws InputError on malformed JSON.
  void apply_session(const nlohmann::json& j);

 private:
  uint64_t settings_generation_ = 0;  // stale results are dropped at apply time
  Backend* backend_ = nullptr;        // resolved from backend_choice (null: CPU)
};

// Where the bundled sample capture is (relative to the executable, then the source tree).
std::string default_capture_path(const char* argv0);

}  // namespace kvscope::app
