// Everything the app shows and edits, owned by the UI thread. docs/app.md has the picture.
//
//   Settings (plain values)  --views edit-->  AppState::settings
//   Results  (derived)       --reconcile()--> each Result carries the key of the settings it was
//                                             computed from; reconcile() runs once per frame,
//                                             compares every result's key with the key the
//                                             current settings give, cancels outdated jobs and
//                                             submits missing ones (or holds them for a Run
//                                             click when their estimated cost is too high).
//
// Views only edit `settings` (and their own view choices) and draw whatever result there is,
// marked stale while its key differs from the wanted one. No view calls a request function and
// no job result starts another job: every job is started by reconcile().
//
// For view authors (view_geometry.cpp, view_walk.cpp, ...):
//   - settings:              s.settings.focus, .method[0/1] (name + params), .keep_ratio, ...
//   - the focused head:      s.focus_layer() (LayerData, null while loading), s.focus_keys(),
//                            focus_values(), focus_queries()
//   - focused runs:          s.run(0) / s.run(1) (HeadRun*, null when none),
//                            s.result(kFocusA).stale() etc.; run(k)->selection.trace is the walk
//   - linked highlighting:   s.hovered_token (this frame), s.selected_tokens (box selection)
//   - a view's own derived result: override View::plan() (view.h); reconcile runs it.
#pragma once

#include <array>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <typeinfo>
#include <vector>

#include "app/grid_cells.h"
#include "app/new_capture.h"
#include "app/open_capture.h"
#include "app/sides_record.h"
#include "app/worker.h"
#include "engine/eval/attention_stats.h"
#include "engine/eval/protocol.h"
#include "engine/io/capture.h"
#include "engine/methods/method.h"

namespace kvscope::app {

struct Focus {
  int layer = 0;
  int kv_head = 0;
  bool operator==(const Focus&) const = default;
};

// What the grid cells of the Capture view and the Error heatmap are coloured by.
enum class GridMetric { Error = 0, Entropy = 1 };

// Attention entropy of every (layer, kv head) (engine/eval/attention_stats.h), NaN when refused.
struct EntropyGrid {
  int layers = 0, heads = 0;
  std::vector<double> values;  // [layer * heads + head]
  double at(int l, int h) const { return values[static_cast<size_t>(l * heads + h)]; }
};

// Exact vs approximate attention of one query (the Error view's last panel), method A.
struct QueryComparison {
  int position = -1;                   // absolute query position j
  int q_head = 0;                      // query head (absolute index)
  std::vector<double> exact_weights;   // softmax over keys [0, j]
  std::vector<double> approx_weights;  // the estimator's normalised weights over [0, j]
  std::vector<double> exact_output;    // Attn(q_j) (d_v)
  std::vector<double> approx_output;   // z_j
  double relative_error = 0;
};

// The error sweep of the Error view: several methods x ratios x seeds.
struct SweepRequest {
  std::vector<std::string> methods;
  std::vector<double> ratios{0.5, 0.25, 0.125, 0.0625};
  int seeds = 3;
  bool focused_layer_only = false;
  bool operator==(const SweepRequest&) const = default;
};
// The app's default method choices, in one place (app_plans.cpp, where each name is written
// once): methods A and B of fresh settings, and the default lists of the Error view's sweep, the
// Output view's generation and the Theory view's error vs budget (each keeps only the methods
// the registry holds).
struct DefaultMethods {
  std::array<std::string, 2> slots;
  std::vector<std::string> sweep, output, theory;
};
const DefaultMethods& default_methods();
// The methods the Error view's sweep compares when the user has chosen none
// (default_methods().sweep); AppState::sweep_request adds A and B.
std::vector<std::string> default_sweep_methods();

// One method slot (A or B): the method and its own parameter values (only non-defaults).
struct MethodChoice {
  std::string name;
  ParamValues params;
  bool operator==(const MethodChoice&) const = default;
};

// Every setting, as plain values. Sessions save and restore exactly this (plus view choices).
struct Settings {
  Focus focus;
  std::array<MethodChoice, 2> method{MethodChoice{default_methods().slots[0], {}},
                                     MethodChoice{default_methods().slots[1], {}}};
  bool ab_enabled = true;
  double keep_ratio = 0.25;
  // A token budget instead of a ratio (docs/evaluation.md, "Budgets"): while budget_mode is on,
  // keep_ratio is derived from budget_tokens (budget_tokens / n_mid, so m = budget_tokens) by
  // fit_settings_to_capture, and budget_tokens is clamped to the middle.
  bool budget_mode = false;
  int budget_tokens = 128;
  int seed = 0;
  int sink_override = -1, eval_override = -1;  // -1: protocol default
  Estimator estimator = Estimator::Weighted;   // the authors' estimator is a protocol option
  std::string backend = "cpu";                 // one of backend_choices() (engine/ops/backend.h)
  int grid_seeds = 0;                          // seeds of the background grid; 0: by capture size
  GridMetric grid_metric = GridMetric::Error;
  SweepRequest sweep;       // empty methods: the default (AppState::sweep_request)
  int selected_query = -1;  // absolute position of the Error view's query (-1: default)
  int selected_q_head = 0;  // within the focused kv head's GQA group
  std::string active_view = "capture";
  std::array<std::string, 2> panel_view{"capture", "tokens"};  // tab shown in each panel
  bool operator==(const Settings&) const = default;
};

// The names of the built-in derived results (also their worker job keys).
inline constexpr const char* kLayer = "layer";
inline constexpr const char* kFocusA = "focus.A";
inline constexpr const char* kFocusB = "focus.B";
inline constexpr const char* kGrid = "grid";
inline constexpr const char* kSweep = "sweep";
inline constexpr const char* kEntropy = "entropy";
inline constexpr const char* kQuery = "query";
// The capture set the Set view opened (app/views/view_set.cpp; a CaptureSet), which other views
// may read, e.g. the Error view's tuning grid on the set's tuning prompts.
inline constexpr const char* kSetOpen = "set.open";
// The Error view's name (ErrorView::name(), app/views/view_error_view.h): while it is shown in a
// panel, AppState::sweep_request asks for the default sweep.
inline constexpr const char* kErrorView = "error";

// One derived result and the state of the job that computes it.
struct Result {
  std::string want;  // key the current settings give ("" = not wanted now)
  std::string key;   // key `value` / `error` were computed from
  std::shared_ptr<const void> value;
  const std::type_info* type = nullptr;  // of `value` (JobPlan::value_type)
  std::string error;                     // the job failed for `key`
  bool partial = false;                  // value is an intermediate frame of a running job
  double seconds = 0;                    // wall time of the run that produced value
  // Job state.
  std::string running;    // key of the submitted job ("" = none)
  std::string held;       // == want when the job waits for a Run click (estimate too high)
  std::string cancelled;  // key the user cancelled (not resubmitted until Run)
  std::string approved;   // key the user asked to run whatever its cost
  // From its plan (JobPlan::progressive): never held for a Run click; a Cancel holds for every
  // later key too (cancel_holds) until Run.
  bool progressive = false;
  bool cancel_holds = false;
  std::string waiting;     // why the job cannot start yet (e.g. "loading layer 3")
  double estimate_s = -1;  // expected seconds for `want` (-1: unknown)
  std::string estimate_text;
  // A job whose estimate is above its plan's limit starts anyway and measures itself
  // (AppState::check_probes): `probing` is its key while it does, from `probe_start` (when it
  // started running, as the worker reports it). When it runs past `probe_limit_s`, or its own progress says it will
  // take far longer, it is stopped and held with that estimate (`measured` is then its key, and
  // the estimate stays until the key changes); otherwise it runs on.
  std::string probing;
  std::chrono::steady_clock::time_point probe_start{};
  double probe_limit_s = 0;
  std::string measured;
  // The probing plan's cost (JobPlan::cost_class, units, threads): a stopped probe's pace is
  // recorded in the cost model as a finished job's is.
  std::string probe_cost_class;
  double probe_units = 0;
  int probe_threads = 1;

  bool has_value() const { return value != nullptr; }
  // The value (or error) belongs to the current settings.
  bool fresh() const { return !want.empty() && key == want && !partial; }
  // Something is shown that was computed for other settings.
  bool stale() const { return (value || !error.empty()) && key != want; }
  bool busy() const { return !running.empty(); }
  // The value as a T, or null when there is none or it is of another type (a result is never
  // read as a type its job did not return).
  template <typename T>
  const T* get() const {
    return holds<T>() ? static_cast<const T*>(value.get()) : nullptr;
  }
  template <typename T>
  std::shared_ptr<const T> ptr() const {
    return holds<T>() ? std::static_pointer_cast<const T>(value) : nullptr;
  }
  template <typename T>
  bool holds() const {
    return value && type && *type == typeid(T);
  }
};

// What a derived result needs under the current settings: built every frame by a planner.
struct JobPlan {
  std::string key;      // the settings key; "" = not wanted
  std::string waiting;  // non-empty: a prerequisite is missing (the job is not started)
  Lane lane = Lane::Analysis;
  std::string label;
  // Cost: `units` of work of class `cost_class` (seconds per unit measured at run time) on
  // `threads` threads. Jobs above the auto-run limit wait for a Run click.
  std::string cost_class;
  double units = 0;
  double prior_per_unit = 0;  // seconds per unit before a measurement (0: the general prior)
  int threads = 1;
  double auto_limit_s = 3.0;
  // Progressive (the grid): fills in piece by piece and is cancellable, so it starts without a
  // Run click whatever its cost; `units` counts only what is still missing.
  bool progressive = false;
  // Computes the value; `partial` posts an intermediate value (e.g. a t-SNE frame) of the same
  // type. Set through returns<T>() or derive() so that the value's type is recorded.
  using PartialFn = std::function<void(std::shared_ptr<const void>)>;
  std::function<std::shared_ptr<const void>(JobContext&, const PartialFn&)> compute;
  const std::type_info* value_type = nullptr;
  // What can be shown for `key` before its job has run, built on the UI thread from what is
  // already computed (of value_type; the grid: the cells in the store, every other cell the
  // earlier settings' value marked stale). reconcile() installs it, as a partial value, in the
  // frame the key changes: a value of earlier settings is never shown as this key's, not even
  // until the job posts its first frame. Empty: the old value stays, stale() says so.
  std::function<std::shared_ptr<const void>()> in_hand;

  // compute = fn, a callable (JobContext&, const PartialFn&) -> shared_ptr<const T>.
  template <class T, class Fn>
  void returns(Fn fn) {
    value_type = &typeid(T);
    compute = [fn = std::move(fn)](JobContext& ctx,
                                   const PartialFn& partial) -> std::shared_ptr<const void> {
      std::shared_ptr<const T> v = fn(ctx, partial);
      return v;
    };
  }

  // A job derived from its input (docs/design.md, "Keys and results"): `in` holds every value the
  // job reads (a struct with nlohmann's to_json, declared beside it with
  // NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE), the key is `kind` and all of `in`, and `fn` is a plain
  // function (no captures) of `in` and of the handles `in` identifies (the capture by its id, a
  // layer by its index, the backend by its name). So nothing the job reads can be missing from
  // its key, and two settings that give the same input share one result.
  template <class Out, class Input, class Handles>
  void derive(const char* kind, Input in, Handles handles,
              std::shared_ptr<const Out> (*fn)(const Input&, const Handles&, JobContext&,
                                               const PartialFn&)) {
    key = derived_key(kind, in);
    returns<Out>(
        [in = std::move(in), handles = std::move(handles), fn](
            JobContext& ctx, const PartialFn& partial) { return fn(in, handles, ctx, partial); });
  }
  template <class Input>
  static std::string derived_key(const char* kind, const Input& in) {
    return std::string(kind) + "|" + nlohmann::json(in).dump();
  }
};
using NamedPlan = std::pair<std::string, JobPlan>;

// What every evaluation job reads beyond its own settings (part of their inputs, JobPlan::derive):
// the capture (by the id of its opening), the backend (by name), the window as passed to the
// engine (the overrides, or the clamped window when the capture needed one) and the estimator.
struct EvalCommon {
  uint64_t capture = 0;
  std::string backend;
  int sink = -1, eval = -1;
  std::string estimator;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(EvalCommon, capture, backend, sink, eval, estimator)

// Work units of one head run of a method (one seed), what every plan's cost is counted in: the
// evaluation side costs about n*E*G*d multiply-adds, the selection about n*d times a method
// factor; both scale like n * d * (E*G + 64).
double head_units(const CaptureInfo& ci, const EvalWindow& w);
// Work units of building one kv head's exact side (the "exact" class): n * d * E * G.
double exact_units(const CaptureInfo& ci, const EvalWindow& w);
inline const char* const kExactCostClass = "exact";

// Prior seconds per work unit before anything was measured on this machine: deliberately slow
// (the slowest method measured on the 2-core build machine, BalanceKV, rounded up), so that big
// jobs on a fresh start wait for a Run click rather than start by themselves.
inline constexpr double kPriorPerUnit = 6e-9;
// Evaluations and exact sides before anything was measured: what one core of the 2-core build
// machine measured on an 8192-token Llama-3-shaped capture (bench_app_grid): a BalanceKV cell's
// warm work (its walk and scoring, the slowest method's) about 3e-11 s per head_units, a side's
// build about 1.2e-10 s per exact_units. Not made slow on purpose: an estimate holds nothing by
// itself (AppState::check_probes), and a fresh start's first grid should say what it will take.
inline constexpr double kPriorEvalPerUnit = 3e-11;
inline constexpr double kPriorExactPerUnit = 1.2e-10;

// Measured seconds per unit of work, by cost class ("head:balancekv", "tsne", ...). Cold work
// and warm work are separate classes: "exact" is building one head's exact side (per
// exact_units), "eval:<method>" a method's selection and scoring against a side in hand (per
// head_units); a grid cell's time is split between them (CellTiming), so a grid that built every
// side does not make the next one, which builds none, look as slow (docs/app.md, "Estimates").
class CostModel {
 public:
  // Seconds per unit of `cost_class`: measured when known, else the mean of the measured head
  // classes, else a conservative prior.
  double per_unit(const std::string& cost_class, double prior = 0) const;
  bool measured(const std::string& cost_class) const { return per_unit_.count(cost_class) > 0; }
  void record(const std::string& cost_class, double units, double seconds);
  const std::map<std::string, double>& measured_table() const { return per_unit_; }

 private:
  std::map<std::string, double> per_unit_;
};

struct AppState {
  AppState();
  ~AppState();

  Settings settings;

  // ---- capture (opened through a request, app/open_capture.h: an action, not a setting)
  std::shared_ptr<CaptureFile> capture;  // CaptureFile::layer() is thread-safe
  std::string capture_path;
  uint64_t capture_id = 0;   // incremented on every successful open (part of every key)
  std::string load_error;    // last failed open (the loader's InputError), shown in the window
  std::string loading_path;  // non-empty while a file is being opened
  // The last open asked for (request_open) and whether it is still wanted: reconcile() runs it
  // while it is pending (result kOpen) and, once its job is done, failed or was cancelled, ends
  // it and swaps in the capture it opened (finish_open). open_next opens once it has ended.
  OpenRequest open_request;
  bool open_pending = false;
  std::string open_next;
  std::vector<std::string> notes;  // settings adjusted to fit the capture (shown until dismissed)
  // The capture set open (File > Open set, a manifest or folder on the command line, dropped on
  // the window or typed in the Set view; "" for none): its entries are the result kSetOpen,
  // planned whatever view is shown, so the Set view and the Error view's tuning grid read one
  // set. A set asked for is `set_request` until its opening ends: then it becomes set_path, or
  // (failing) set_path stays and `set_error` names the file and what is wrong. set_shown asks
  // the frame to show the Set view once, when a set is asked for.
  std::string set_path;
  std::string set_request;
  std::string set_error;
  bool set_shown = true;
  // Capture files the app wrote itself (File > New capture) in the temporary folder. They are
  // deleted when another capture opens and when the AppState ends (the app quits); a file the
  // user saved is never in here.
  std::set<std::string> temp_captures;
  // File > New capture (app/new_capture.h; transient, not saved): the last capture asked for,
  // and whether it is still wanted. The dialog's Run sets both (ask_new_capture), its Cancel
  // clears new_capture_pending; reconcile() runs the request while it is pending (result
  // kNewCapture) and, once its job is done, clears it and opens the capture it made.
  NewCaptureRequest new_capture;
  bool new_capture_pending = false;
  std::shared_ptr<const NewCaptureResult> new_capture_made;  // the last capture made
  // The file of a cancelled request, removed once its job has ended (it may have written the
  // capture just before the cancel reached it).
  std::string new_capture_discard;

  // ---- backend (resolved from settings.backend by reconcile)
  std::string backend_active;  // name() of the backend in use
  std::string backend_note;    // why cuda is not used, or the device

  // ---- derived results, by name (kFocusA, kGrid, ..., and views' own)
  std::map<std::string, Result> results;
  CostModel costs;
  // The clock a probing job's pace is judged by (check_probes). Tests run it faster or slower
  // than the wall so that a probe's verdict does not depend on how fast the machine is.
  std::function<std::chrono::steady_clock::time_point()> probe_clock = [] {
    return std::chrono::steady_clock::now();
  };
  std::map<std::string, std::string> job_errors;  // by job key, from failed jobs

  // ---- linked selection (transient, not saved)
  int hovered_token = -1;         // reset every frame before views draw; any view may set it
  int selected_token = -1;        // clicked token
  std::set<int> selected_tokens;  // box selection (Geometry view) shown in the token strip
  std::string status_message;     // transient line in the status bar
  // Screen rectangles of named widgets (for the GUI test), filled while drawing.
  std::map<std::string, std::array<float, 4>> ui_items;

  // ---- the progressive grid's cells (app/grid_cells.h) and where its job looks first
  GridCellStore grid_cells;
  // The heads whose exact side this session has built or read (exact_side_id): the reference
  // cache holds them, so a grid costs them no build (cold work, CostModel's "exact" class).
  std::set<std::string> exact_sides_seen;
  static std::string exact_side_id(uint64_t capture, const EvalWindow& w, int layer, int kv_head);
  // The same head and window without the opening's id ("sink|eval|layer|kv_head").
  static std::string window_side_id(const EvalWindow& w, int layer, int kv_head);
  // The sides the disk tier held for this capture when the app last had it open, and where
  // that record is kept ("" when the tier is off): read by the opening job, written by
  // reconcile() as sides are seen (app/sides_record.h). A grid costs neither these nor the
  // ones seen a build.
  std::set<std::string> exact_sides_on_disk;
  std::string sides_record;
  bool exact_side_in_hand(const EvalWindow& w, int layer, int kv_head) const;
  std::shared_ptr<GridPriority> grid_priority = std::make_shared<GridPriority>();
  SidesRecordWriter sides_writer;
  size_t sides_seen_recorded = 0;  // exact_sides_seen's size when last handed to the writer
  std::array<int, 2> grid_rows_visible{-1, -1};  // rows of the grid drawn on screen last frame

  Worker worker;

  // ---- accessors for views
  const Method* method(int slot) const;  // nullptr when unknown
  const std::string& method_name(int slot) const {
    return settings.method[static_cast<size_t>(slot)].name;
  }
  // Method, ratio, the slot's own parameters and the fitted window for the engine.
  MethodSettings method_settings(int slot) const;
  // What every evaluation job reads beyond its own settings: capture, backend, window, estimator.
  EvalCommon eval_common() const;
  const CaptureInfo* info() const { return capture ? &capture->info() : nullptr; }
  int num_tokens() const { return capture ? capture->info().num_tokens : 0; }
  const Result& result(const std::string& name) const;
  // Current values (null when none; check result(name).stale() to know if they are outdated).
  const HeadRun* run(int slot) const;
  std::shared_ptr<const HeadRun> run_ptr(int slot) const;
  // Why the focused run of a slot failed for the current settings ("" when it did not).
  std::string run_error(int slot) const;
  // The layer x head grid (method A's and B's cells, app/grid_cells.h) and its report; the
  // report also holds method B's cells: read one method through GridReport::find.
  const GridReport* grid_report() const { return result(kGrid).get<GridReport>(); }
  const EvalReport* grid() const {
    const GridReport* g = grid_report();
    return g ? &g->report : nullptr;
  }
  const EvalReport* sweep() const { return result(kSweep).get<EvalReport>(); }
  // The sweep the settings ask for: settings.sweep once the user chose one; while it is empty, the
  // default (default_sweep_methods() and method A, and B when shown) if the Error view is shown,
  // none otherwise. Opening the Error view changes no setting.
  SweepRequest sweep_request() const;
  const EntropyGrid* entropy() const { return result(kEntropy).get<EntropyGrid>(); }
  const QueryComparison* query_cmp() const { return result(kQuery).get<QueryComparison>(); }
  // The focused layer, only when it is the one the settings ask for.
  std::shared_ptr<const LayerData> focus_layer() const;
  const MatrixF* focus_keys() const;
  const MatrixF* focus_values() const;
  std::vector<const MatrixF*> focus_queries() const;  // the GQA group, may be empty
  bool focus_refused(std::string* why = nullptr) const;
  // The evaluation window the settings give, fitted to the capture (never throws with a capture
  // open; see fit_window). `note` says what was clamped.
  EvalWindow window(std::string* note = nullptr) const;
  // Seeds of the background grid: settings.grid_seeds, or by capture size when 0.
  int grid_seeds() const { return grid_seeds_for(num_tokens()); }
  // The same rule for captures of `num_tokens` tokens (a set's longest, in the Set view).
  int grid_seeds_for(int num_tokens) const;
  // The query position the Error view uses (selected_query or method A's worst one).
  int effective_query() const;
  // Token text for display (newlines and tabs escaped), "" when out of range.
  std::string token_text(int i) const;
  Backend* backend() const { return backend_; }
  // Progress of a result's running job (done, total), {0, 0} when none.
  std::pair<int, int> progress(const std::string& name) const;

  // ---- actions (UI thread)
  // Asks for a capture to be opened (app/open_capture.cpp): a new request, which reconcile()
  // opens in the background; the open one stays when it fails. A session's open keeps the
  // selected query (a plain open resets it). Asking again replaces a pending request. A capture
  // set (a folder or a .jsonl manifest) is asked for as the set instead (set_request): it
  // replaces the set open once it opened, and the open one stays when it fails.
  void request_open(const std::string& path, bool from_session = false);
  // Opens `path` once the pending request has ended (at once when none is pending).
  void request_open_after(const std::string& path);
  // The open capture, read from `from`, was saved as `to` (a copy of that file): from now on
  // `to` is its path (window title, sessions, exports). Nothing is reloaded or recomputed.
  void capture_saved_as(const std::string& from, const std::string& to);
  // Deletes the temporary captures (temp_captures) except `keep` (the one open, if any).
  void remove_temp_captures(const std::string& keep = "");
  // Focus a head (clamped to the capture); same as editing settings.focus.
  void set_focus(Focus f);
  // The user's Run / Cancel of a result's job.
  void run_now(const std::string& name);
  void cancel_job(const std::string& name);

  // Once per frame (before views draw): applies finished jobs, fits settings to the capture,
  // then plans every result in dependency order, compares keys and starts/cancels jobs.
  // `plan_views` adds the views' own plans; it runs after the app's results are planned, so a
  // view's planner sees which of them are fresh for the current settings.
  using ViewPlanner = std::function<void(const AppState&, std::vector<NamedPlan>&)>;
  void reconcile(const ViewPlanner& plan_views = {});

  // ---- sessions
  nlohmann::json to_session() const;
  // Parses and checks a whole session without changing anything; throws InputError naming the
  // field and the problem.
  Settings parse_session(const nlohmann::json& j, std::string* capture_path) const;
  // Applies a session (validated whole first; opens its file when it differs).
  void apply_session(const nlohmann::json& j);

 private:
  // The app's own results and their planners, in dependency order (see reconcile()).
  static std::vector<std::pair<std::string, JobPlan (AppState::*)() const>> planners();
  JobPlan plan_layer() const;
  JobPlan plan_focus(int slot) const;
  JobPlan plan_focus_a() const { return plan_focus(0); }
  JobPlan plan_focus_b() const { return plan_focus(1); }
  JobPlan plan_grid() const;
  JobPlan plan_sweep() const;
  JobPlan plan_entropy() const;
  JobPlan plan_query() const;
  JobPlan plan_new_capture() const;  // app/new_capture.cpp
  JobPlan plan_open() const;         // app/open_capture.cpp
  JobPlan plan_set_open() const;     // app/open_capture.cpp
  // A pending open whose job is done, failed or was cancelled: no longer pending; swaps in the
  // capture it opened (clearing every result), or keeps the open one and says why.
  void finish_open();
  // A pending New capture whose job is done: no longer pending; opens what it made.
  void finish_new_capture();
  // A set asked for whose opening ended: the set open now, or set_error (app/open_capture.cpp).
  void finish_set_open();
  // The exact sides seen since the last call, added to this capture's record on disk (in the
  // background; app/sides_record.h) so that its next opening costs them no build.
  void record_exact_sides();
  void submit(const std::string& name, Result& r, const JobPlan& p);
  // Each probing job (Result::probing) that has run for a second: held with the time its own
  // progress projects when that is over its limit, left to run otherwise.
  void check_probes();
  void resolve_backend();
  void fit_settings_to_capture(bool announce);
  // The method settings for any method name in jobs: the slot's own params when the name is
  // method A's or B's, defaults otherwise.
  ParamValues params_for(const std::string& method_name) const;

  Backend* backend_ = nullptr;
  std::string backend_resolved_;  // settings.backend the backend was resolved for
  // plan_grid's job, kept while neither the key nor the cell store changed (planned every frame).
  mutable std::string grid_plan_key_;
  mutable uint64_t grid_plan_version_ = 0;
  mutable std::shared_ptr<const GridJob> grid_plan_job_;
};

// The evaluation window for n tokens, clamped to fit (s + E <= n, E >= 1) when the protocol's
// window or the overrides do not; `note` says what changed. Throws only for n <= 0.
// (EvalWindow::fit of engine/eval/protocol.h; keep_ratio outside (0, 1] is clamped first.)
EvalWindow fit_window(int n, double keep_ratio, int sink_override, int eval_override,
                      std::string* note = nullptr);

// A method's name with its non-default parameters, for captions and legends: "balancekv (gamma
// 2, temp 0.1)"; the bare name when every parameter is at its default (or the method is unknown).
std::string method_label(const std::string& name, const ParamValues& params);

// Seconds as people read them: "850 ms", "4.2 s", "12 min", "1.5 h"; "unknown" when negative.
std::string fmt_seconds(double s);

// Where the bundled sample capture is (relative to the executable, then the source tree).
std::string default_capture_path(const char* argv0);

}  // namespace kvscope::app
