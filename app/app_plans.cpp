// The app's own results and what each needs under the current settings (docs/app.md, "How the
// app computes"): one planner per result, each deriving its job from an input struct that holds
// every value the job reads (JobPlan::derive, app/app_state.h). reconcile() (app_state.cpp)
// calls them every frame in dependency order (AppState::planners below).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>

#include "app/app_state.h"
#include "app/views/view_jobs.h"
#include "engine/attention/exact_attention.h"
#include "engine/core/error.h"
#include "engine/ops/backend.h"

namespace kvscope::app {

namespace {

// Threads for background evaluations: all cores but one, which stays free for the focused
// head's re-runs and the UI.
int background_threads() {
  unsigned hw = std::thread::hardware_concurrency();
  return hw > 2 ? static_cast<int>(hw) - 1 : 1;
}

// Focused runs are what the user clicked for: started by themselves up to this estimate.
constexpr double kFocusAutoLimitS = 20.0;
// Everything else (grid, sweep, entropy, projections) up to this one.
constexpr double kBackgroundAutoLimitS = 3.0;

}  // namespace

// ---- job inputs: every value a job reads; its key is derived from them (JobPlan::derive)

namespace {

struct LayerInput {
  uint64_t capture = 0;
  int layer = 0;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(LayerInput, capture, layer)
struct CaptureHandle {
  std::shared_ptr<CaptureFile> capture;
};

std::shared_ptr<const LayerData> load_layer(const LayerInput& in, const CaptureHandle& h,
                                            JobContext&, const JobPlan::PartialFn&) {
  return h.capture->layer(in.layer);
}

// One method on the focused head for one seed (the focused runs A and B).
struct FocusInput {
  EvalCommon common;
  int layer = 0, kv_head = 0, num_layers = 0;
  std::string method;
  ParamValues params;
  double keep_ratio = 0;
  uint64_t seed = 0;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(FocusInput, common, layer, kv_head, num_layers, method, params,
                                   keep_ratio, seed)
// The progressive grid (plan_grid, app/grid_cells.h). A cell reads the evaluation's common
// part, the one keep ratio, its own slot's method and parameters, its head and its seed ("any"
// for a method that ignores the seed), so a change of A's parameters leaves B's cells where they
// are. The grid as a whole adds which slots are in it, the first seed and the seed count.
struct GridSlotInput {
  std::string method;
  ParamValues params;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(GridSlotInput, method, params)
struct GridCellInput {
  EvalCommon common;
  double keep_ratio = 0;
  GridSlotInput slot;
  int layer = 0, kv_head = 0;
  std::string seed;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(GridCellInput, common, keep_ratio, slot, layer, kv_head, seed)
struct GridInput {
  EvalCommon common;
  double keep_ratio = 0;
  std::vector<GridSlotInput> slots;  // A, and B when A/B is on
  uint64_t seed = 0;
  int seeds = 1;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(GridInput, common, keep_ratio, slots, seed, seeds)

struct FocusHandles {
  std::shared_ptr<const LayerData> layer;  // (common.capture, layer)
  Backend* backend = nullptr;              // common.backend
  std::string refused;                     // why the loaded head is refused ("" = it is not)
};

std::shared_ptr<const HeadRun> run_focus(const FocusInput& in, const FocusHandles& h,
                                         JobContext& ctx, const JobPlan::PartialFn&) {
  const MethodSettings ms =
      method_settings_of({in.method, in.params, in.keep_ratio, in.common.sink, in.common.eval},
                         parse_estimator(in.common.estimator));
  if (!h.refused.empty()) throw InputError("head refused: " + h.refused);
  return std::make_shared<HeadRun>(run_head(*h.layer, in.num_layers, in.kv_head, ms, in.seed, true,
                                            h.backend, ctx.cancel_flag()));
}

// The Error view's sweep over methods and ratios (run_eval with token harm).
struct SweepInput {
  EvalCommon common;
  std::vector<std::string> methods;
  std::map<std::string, ParamValues> params;
  std::vector<double> ratios;
  int seeds = 0;
  uint64_t base_seed = 0;
  std::vector<int> layers;  // empty: all
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(SweepInput, common, methods, params, ratios, seeds, base_seed,
                                   layers)
struct EvalHandles {
  std::shared_ptr<CaptureFile> capture;  // common.capture
  Backend* backend = nullptr;            // common.backend
  int threads = 1;                       // figures are identical for any count (run_eval)
};

std::shared_ptr<const EvalReport> run_sweep(const SweepInput& in, const EvalHandles& h,
                                            JobContext& ctx, const JobPlan::PartialFn&) {
  EvalSpec spec;
  for (const std::string& name : in.methods)
    if (const Method* m = find_method(name)) spec.methods.push_back(m);
  spec.params = in.params;
  spec.ratios = in.ratios;
  spec.harm = true;  // the Error view's harm kept vs dropped (engine/eval/token_harm.h)
  spec.seeds = in.seeds;
  spec.base_seed = in.base_seed;
  spec.sink = in.common.sink;
  spec.eval = in.common.eval;
  spec.estimator = parse_estimator(in.common.estimator);
  spec.threads = h.threads;
  spec.layers = in.layers;
  return std::make_shared<EvalReport>(run_eval(
      *h.capture, spec, [&](int d, int t) { ctx.progress(d, t); }, ctx.cancel_flag(), h.backend));
}

// The mean attention entropy of every head: it reads the evaluation rows only (n and E).
struct EntropyInput {
  uint64_t capture = 0;
  int n = 0, eval = 0;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(EntropyInput, capture, n, eval)

std::shared_ptr<const EntropyGrid> run_entropy(const EntropyInput& in, const CaptureHandle& h,
                                               JobContext& ctx, const JobPlan::PartialFn&) {
  const CaptureInfo& ci = h.capture->info();
  EvalWindow w;  // mean_attention_entropy reads n and eval (engine/eval/attention_stats.h)
  w.n = in.n;
  w.eval = in.eval;
  auto eg = std::make_shared<EntropyGrid>();
  eg->layers = ci.num_layers;
  eg->heads = ci.kv_heads;
  eg->values.assign(static_cast<size_t>(ci.num_layers * ci.kv_heads), NAN);
  for (int L = 0; L < ci.num_layers; ++L) {
    ctx.progress(L, ci.num_layers);
    std::shared_ptr<const LayerData> layer;
    try {
      layer = h.capture->layer(L);
    } catch (const InputError&) {
      continue;  // the grid shows the loader's message; entropy stays NaN here
    }
    for (int kv = 0; kv < ci.kv_heads; ++kv)
      eg->values[static_cast<size_t>(L * ci.kv_heads + kv)] =
          mean_attention_entropy(*layer, kv, w, ctx.cancel_flag());
  }
  return eg;
}

// One query of the focused head: exact against method A's weighted attention.
struct QueryInput {
  std::string run_a;  // the key of method A's focused run (its input, so its settings)
  int kv_head = 0, q_head = 0, position = 0;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(QueryInput, run_a, kv_head, q_head, position)
struct QueryHandles {
  std::shared_ptr<const LayerData> layer;  // the layer of run_a
  std::shared_ptr<const HeadRun> run;      // run_a's value
};

std::shared_ptr<const QueryComparison> compare_query(const QueryInput& in, const QueryHandles& h,
                                                     JobContext&, const JobPlan::PartialFn&) {
  const LayerData& layer = *h.layer;
  if (layer.queries.empty()) throw InputError("this capture has no queries");
  const MatrixF& K = layer.keys[static_cast<size_t>(in.kv_head)];
  const MatrixF& V = layer.values[static_cast<size_t>(in.kv_head)];
  const int j = in.position;
  const float* q = layer.queries[static_cast<size_t>(in.q_head)].row(j).data();
  const EvalWindow& w = h.run->window;
  auto qc = std::make_shared<QueryComparison>();
  qc->position = j;
  qc->q_head = in.q_head;
  qc->exact_weights = attention_row(q, K, j);
  qc->approx_weights = estimator_weights(q, K, j, w, h.run->selection);
  VectorD ex = exact_attention(q, K, V, j);
  VectorD ap = weighted_attention(q, K, V, j, w, h.run->selection);
  qc->exact_output.assign(ex.data(), ex.data() + ex.size());
  qc->approx_output.assign(ap.data(), ap.data() + ap.size());
  double en = ex.norm();
  qc->relative_error = en > 0 ? (ap - ex).norm() / en : 0;
  return qc;
}

// Selections an evaluation computes per kv head: the protocol runs a method that ignores the
// seed once for all seeds, and one that ignores the budget once for all ratios.
double runs_per_head(const Method* m, size_t ratios, int seeds) {
  if (!m) return static_cast<double>(ratios) * seeds;
  return (m->depends_on_budget() ? static_cast<double>(ratios) : 1.0) *
         (m->depends_on_seed() ? seeds : 1);
}

}  // namespace

EvalCommon AppState::eval_common() const {
  const MethodSettings ms = method_settings(0);
  return {capture_id, backend_active, ms.sink, ms.eval, estimator_name(settings.estimator)};
}

// ---------------------------------------------------------------- planning

JobPlan AppState::plan_layer() const {
  JobPlan p;
  if (!capture) return p;
  const int L = settings.focus.layer;
  p.lane = Lane::Focus;
  p.label = "loading layer " + std::to_string(L);
  p.auto_limit_s = 1e30;
  p.derive("layer", LayerInput{capture_id, L}, CaptureHandle{capture}, &load_layer);
  return p;
}

JobPlan AppState::plan_focus(int slot) const {
  JobPlan p;
  if (!capture || (slot == 1 && !settings.ab_enabled)) return p;
  const CaptureInfo& ci = capture->info();
  const MethodChoice& mc = settings.method[static_cast<size_t>(slot)];
  const Focus f = settings.focus;
  FocusInput in{
      eval_common(), f.layer,   f.kv_head,           ci.num_layers,
      mc.name,       mc.params, settings.keep_ratio, static_cast<uint64_t>(settings.seed)};
  FocusHandles h;
  h.layer = focus_layer();
  h.backend = backend_;
  if (h.layer) focus_refused(&h.refused);
  p.derive("focus", std::move(in), h, &run_focus);
  if (!h.layer) {
    p.waiting = "loading layer " + std::to_string(f.layer);
    return p;
  }
  p.lane = Lane::Focus;
  p.label = mc.name + " on L" + std::to_string(f.layer) + " H" + std::to_string(f.kv_head);
  p.cost_class = "head:" + mc.name;
  p.units = head_units(ci, window());
  p.auto_limit_s = kFocusAutoLimitS;
  return p;
}

JobPlan AppState::plan_grid() const {
  JobPlan p;
  if (!capture) return p;
  const CaptureInfo& ci = capture->info();
  const int seeds = grid_seeds();
  GridInput in{eval_common(), settings.keep_ratio, {}, static_cast<uint64_t>(settings.seed), seeds};
  for (size_t k = 0; k < 2; ++k)
    if (k == 0 || settings.ab_enabled)
      in.slots.push_back({settings.method[k].name, settings.method[k].params});
  p.key = JobPlan::derived_key("grid", in);
  const Result& now = result(kGrid);
  // The job: built when the key changed, its cells in hand refreshed when the store changed
  // (this runs every frame; the cells' keys are derived once per grid key).
  if (grid_plan_job_ && grid_plan_key_ == p.key && grid_plan_version_ != grid_cells.version()) {
    auto job = std::make_shared<GridJob>(*grid_plan_job_);
    job->previous = now.ptr<GridReport>();
    for (GridJob::Need& n : job->needs) n.have = grid_cells.get(n.key);
    grid_plan_job_ = job;
    grid_plan_version_ = grid_cells.version();
  }
  if (!grid_plan_job_ || grid_plan_key_ != p.key) {
    auto job = std::make_shared<GridJob>();
    job->capture = capture;
    job->backend = backend_;
    job->base.ratios = {in.keep_ratio};
    job->base.sink = in.common.sink;
    job->base.eval = in.common.eval;
    job->base.estimator = settings.estimator;  // in.common.estimator is its name
    job->base.threads = 1;
    job->seeds = seeds;
    job->base_seed = in.seed;
    job->layers = ci.num_layers;
    job->heads = ci.kv_heads;
    // Every core: the grid's threads run below the UI and the focused runs (grid_cells.cpp).
    job->threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    // A device's grid holds a layer per thread: no more than the capture's layer cache keeps,
    // less the layer loaded ahead (run_grid_job).
    job->layers_at_once = std::max(1, default_cached_layers(ci) - 1);
    job->priority = grid_priority;
    job->previous = now.ptr<GridReport>();
    for (size_t k = 0; k < in.slots.size(); ++k) {
      GridJob::Slot& sl = job->slots[k];
      sl.method = method(static_cast<int>(k));
      sl.name = in.slots[k].method;
      sl.params = in.slots[k].params;
      if (!sl.method) continue;
      sl.runs = sl.method->depends_on_seed() ? seeds : 1;
      GridCellInput cell{in.common, in.keep_ratio, in.slots[k], 0, 0, ""};
      for (int run = 0; run < sl.runs; ++run) {
        cell.seed = sl.method->depends_on_seed() ? std::to_string(in.seed + run) : "any";
        for (int l = 0; l < ci.num_layers; ++l)
          for (int h = 0; h < ci.kv_heads; ++h) {
            GridJob::Need n;
            n.slot = static_cast<int>(k);
            n.layer = cell.layer = l;
            n.head = cell.kv_head = h;
            n.run = run;
            n.key = JobPlan::derived_key("cell", cell);
            n.have = grid_cells.get(n.key);
            job->needs.push_back(std::move(n));
          }
      }
    }
    grid_plan_job_ = job;
    grid_plan_key_ = p.key;
    grid_plan_version_ = grid_cells.version();
  }
  std::shared_ptr<const GridJob> job = grid_plan_job_;
  p.lane = Lane::Grid;
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%g", settings.keep_ratio);
  p.label = "grid: " + settings.method[0].name + " at " + ratio;
  p.progressive = true;
  // The estimate: the missing cells only, each at its method's measured warm cost, plus a build
  // of each exact side this session has not seen (app/grid_pace.h keeps the two apart while the
  // job runs, from what it measures itself).
  const EvalWindow w = window();
  const double per_cell = head_units(ci, w), per_side = exact_units(ci, w);
  const double build_s = per_side * costs.per_unit(kExactCostClass, kPriorExactPerUnit);
  GridPace::Prior prior;
  for (size_t k = 0; k < 2; ++k)
    prior.warm_s[k] = per_cell * costs.per_unit("eval:" + job->slots[k].name);
  prior.build_s = build_s;
  std::vector<char> in_hand(static_cast<size_t>(ci.num_layers) * ci.kv_heads, 0);
  for (int l = 0; l < ci.num_layers; ++l)
    for (int h = 0; h < ci.kv_heads; ++h)
      in_hand[static_cast<size_t>(l) * ci.kv_heads + h] = exact_side_in_hand(w, l, h) ? 1 : 0;
  double seconds = 0;
  std::vector<char> costed(in_hand.size(), 0);
  for (const GridJob::Need& n : job->needs) {
    if (n.have) continue;
    seconds += prior.warm_s[static_cast<size_t>(n.slot)];
    const size_t i = static_cast<size_t>(n.layer) * ci.kv_heads + n.head;
    if (!in_hand[i] && !costed[i]) {
      costed[i] = 1;
      seconds += build_s;
    }
  }
  if (job->pace_prior.warm_s != prior.warm_s || job->pace_prior.build_s != prior.build_s ||
      job->exact_in_hand != in_hand) {
    auto updated = std::make_shared<GridJob>(*job);
    updated->pace_prior = prior;
    updated->exact_in_hand = std::move(in_hand);
    grid_plan_job_ = job = updated;
  }
  p.cost_class = "";
  p.units = seconds / kPriorPerUnit;
  p.threads = job->threads;
  p.auto_limit_s = 1e30;
  p.in_hand = [job]() -> std::shared_ptr<const void> {
    if (!job->slots[0].method) return nullptr;
    std::vector<std::shared_ptr<const GridCell>> cells;
    cells.reserve(job->needs.size());
    for (const GridJob::Need& n : job->needs) cells.push_back(n.have);
    std::shared_ptr<const GridReport> g = assemble_grid(*job, cells);
    return g;
  };
  const std::string name = settings.method[0].name;
  const uint64_t capture = capture_id;
  p.returns<GridReport>(
      [job, name, per_cell, per_side, capture, w](
          JobContext& ctx, const JobPlan::PartialFn& partial) -> std::shared_ptr<const GridReport> {
        if (!job->slots[0].method) throw InputError("unknown method '" + name + "'");
        return run_grid_job(
            *job, ctx,
            [&ctx, job, per_cell, per_side, capture, w](const GridJob::Need& n, const HeadEval& he,
                                                        const CellTiming& t) {
              const std::string cls = "eval:" + job->slots[static_cast<size_t>(n.slot)].name;
              const std::string side = exact_side_id(capture, w, n.layer, n.head);
              ctx.post([key = n.key, he, cls, per_cell, per_side, t, side](AppState& s) {
                s.grid_cells.insert(key, he);
                s.exact_sides_seen.insert(side);
                // Warm and cold apart (CostModel): the scoring, and the side's build if any.
                s.costs.record(cls, per_cell, t.seconds - t.build_seconds);
                if (t.build_seconds > 0) s.costs.record(kExactCostClass, per_side, t.build_seconds);
              });
            },
            [&partial](std::shared_ptr<const GridReport> g) { partial(g); });
      });
  return p;
}

const DefaultMethods& default_methods() {
  static const DefaultMethods d = [] {
    // Each method the defaults name, written once.
    const std::string uniform = "uniform", streaming = "streaming", snapkv = "snapkv",
                      subgen = "subgen", kcenter = "subgen-kcenter", balancekv = "balancekv";
    auto registered = [](std::vector<std::string> names) {
      names.erase(std::remove_if(names.begin(), names.end(),
                                 [](const std::string& m) { return !find_method(m); }),
                  names.end());
      return names;
    };
    DefaultMethods out;
    out.slots = {balancekv, uniform};
    out.sweep = registered({uniform, streaming, snapkv, kcenter, balancekv});
    out.output = registered({uniform, snapkv, balancekv, streaming});
    out.theory = registered({balancekv, uniform, subgen});
    return out;
  }();
  return d;
}

std::vector<std::string> default_sweep_methods() {
  return default_methods().sweep;
}

SweepRequest AppState::sweep_request() const {
  if (!settings.sweep.methods.empty()) return settings.sweep;
  SweepRequest r = settings.sweep;  // the ratios, seeds and layers it was left with
  const auto& shown = settings.panel_view;
  if (std::find(shown.begin(), shown.end(), kErrorView) == shown.end()) return r;
  r.methods = default_sweep_methods();
  for (int k = 0; k < 2; ++k)
    if ((k == 0 || settings.ab_enabled) &&
        std::find(r.methods.begin(), r.methods.end(), method_name(k)) == r.methods.end())
      r.methods.push_back(method_name(k));
  return r;
}

JobPlan AppState::plan_sweep() const {
  JobPlan p;
  const SweepRequest r = sweep_request();
  if (!capture || r.methods.empty()) return p;
  const CaptureInfo& ci = capture->info();
  SweepInput in;
  in.common = eval_common();
  std::vector<const Method*> methods;
  for (const std::string& name : r.methods) {
    const Method* m = find_method(name);
    if (!m) continue;
    methods.push_back(m);
    in.methods.push_back(name);
    // Each method with the parameters of the slot that runs it (A or B), defaults otherwise;
    // never parameters of a method the sweep does not run.
    ParamValues pv = params_for(name);
    if (!pv.empty()) in.params[name] = pv;
  }
  if (methods.empty()) return p;
  in.ratios = r.ratios;
  in.seeds = r.seeds;
  in.base_seed = static_cast<uint64_t>(settings.seed);
  if (r.focused_layer_only) in.layers = {settings.focus.layer};
  EvalHandles h{capture, backend_, background_threads()};
  p.derive("sweep", std::move(in), h, &run_sweep);
  p.lane = Lane::Analysis;
  p.label = "error sweep";
  const double heads = (r.focused_layer_only ? 1.0 : ci.num_layers) * ci.kv_heads;
  // Each head's exact side is computed once for the whole sweep (the reference cache), each run
  // adds its selection and the scoring of its kept tokens: the exact sides not yet built at the
  // "exact" class's cost (cold), then per run n * d * (ratio * E * G + 64) at the sweep's mean
  // ratio at each method's warm cost. (Costing every run as a whole head run estimated the
  // 32-layer 32768-token capture's default sweep at 10 h.) Expressed in units of the general
  // prior, as the plan has one class only.
  const EvalWindow w = window();
  const double nd = static_cast<double>(ci.num_tokens) * ci.head_dim;
  // The exact sides this session has not built or read yet, nor found on disk (the others are
  // in the cache).
  double sides_to_build = 0;
  for (int l = 0; l < ci.num_layers; ++l)
    if (!r.focused_layer_only || l == settings.focus.layer)
      for (int kv = 0; kv < ci.kv_heads; ++kv)
        sides_to_build += exact_side_in_hand(w, l, kv) ? 0 : 1;
  double mean_ratio = 0;
  for (double ratio : r.ratios) mean_ratio += ratio / static_cast<double>(r.ratios.size());
  const double units_per_run = nd * (mean_ratio * w.eval * ci.group_size() + 64.0) * heads;
  double seconds = 0;
  for (const Method* m : methods)
    seconds += units_per_run * runs_per_head(m, r.ratios.size(), r.seeds) *
               costs.per_unit("eval:" + m->name());
  seconds += sides_to_build * exact_units(ci, w) *
             costs.per_unit(kExactCostClass, kPriorExactPerUnit);
  p.cost_class = "";
  p.units = seconds / kPriorPerUnit;
  p.threads = h.threads;
  p.auto_limit_s = kBackgroundAutoLimitS;
  return p;
}

JobPlan AppState::plan_entropy() const {
  JobPlan p;
  if (!capture || settings.grid_metric != GridMetric::Entropy) return p;
  const CaptureInfo& ci = capture->info();
  if (!ci.has_queries) return p;
  const EvalWindow w = window();
  p.derive("entropy", EntropyInput{capture_id, w.n, w.eval}, CaptureHandle{capture}, &run_entropy);
  p.lane = Lane::Grid;
  p.label = "attention entropy";
  p.cost_class = "entropy";
  p.units = static_cast<double>(ci.num_layers) * ci.q_heads * w.eval * ci.num_tokens * ci.head_dim;
  p.auto_limit_s = kBackgroundAutoLimitS;
  return p;
}

JobPlan AppState::plan_query() const {
  JobPlan p;
  if (!capture || !capture->info().has_queries) return p;
  const Result& ra = result(kFocusA);
  QueryHandles h{focus_layer(), run_ptr(0)};
  const int kv = settings.focus.kv_head;
  const int group = capture->info().group_size();
  const int qh = kv * group + std::clamp(settings.selected_q_head, 0, std::max(0, group - 1));
  if (!ra.fresh() || !h.layer || !h.run) {
    // Wanted, but method A's run for these settings is not there yet.
    p.derive("query", QueryInput{ra.want, kv, qh, settings.selected_query}, h, &compare_query);
    p.waiting = "waiting for method A";
    return p;
  }
  p.derive("query", QueryInput{ra.key, kv, qh, effective_query()}, h, &compare_query);
  p.lane = Lane::Focus;
  p.label = "query comparison";
  p.auto_limit_s = 1e30;  // one query: always cheap
  return p;
}

std::vector<std::pair<std::string, JobPlan (AppState::*)() const>> AppState::planners() {
  // In dependency order: the focused runs read the layer, the query comparison reads run A.
  return {{kLayer, &AppState::plan_layer},    {kFocusA, &AppState::plan_focus_a},
          {kFocusB, &AppState::plan_focus_b}, {kGrid, &AppState::plan_grid},
          {kSweep, &AppState::plan_sweep},    {kEntropy, &AppState::plan_entropy},
          {kQuery, &AppState::plan_query},    {kNewCapture, &AppState::plan_new_capture},
          {kOpen, &AppState::plan_open},      {kSetOpen, &AppState::plan_set_open}};
}

double exact_units(const CaptureInfo& ci, const EvalWindow& w) {
  return static_cast<double>(ci.num_tokens) * ci.head_dim * static_cast<double>(w.eval) *
         ci.group_size();
}

std::string AppState::exact_side_id(uint64_t capture, const EvalWindow& w, int layer,
                                    int kv_head) {
  std::string id = std::to_string(capture);
  id += '|';
  id += window_side_id(w, layer, kv_head);
  return id;
}

std::string AppState::window_side_id(const EvalWindow& w, int layer, int kv_head) {
  std::string id;
  for (int v : {w.sink, w.eval, layer, kv_head}) {
    if (!id.empty()) id += '|';
    id += std::to_string(v);
  }
  return id;
}

bool AppState::exact_side_in_hand(const EvalWindow& w, int layer, int kv_head) const {
  return exact_sides_seen.count(exact_side_id(capture_id, w, layer, kv_head)) ||
         exact_sides_on_disk.count(window_side_id(w, layer, kv_head));
}

double head_units(const CaptureInfo& ci, const EvalWindow& w) {
  return static_cast<double>(ci.num_tokens) * ci.head_dim *
         (static_cast<double>(w.eval) * ci.group_size() + 64.0);
}

}  // namespace kvscope::app
