// The evaluation protocol of docs/evaluation.md: window, per-head runs, the multithreaded
// evaluation over (method, ratio, layer, kv head) work items and R seeds, its JSON form and the
// exact merge of shard reports.
#include "engine/protocol.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "engine/backend.h"
#include "engine/error.h"
#include "engine/json_fields.h"
#include "engine/reference_cache.h"
#include "engine/seed_stats.h"
#include "engine/selection_check.h"
#include "engine/thread_pool.h"
#include "engine/token_harm.h"

namespace kvscope {
namespace {

std::string fmt_double(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

std::string join(const std::vector<std::string>& items, const char* sep = ", ") {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : sep) + s;
  return out;
}

std::vector<float> log_weights(const std::vector<double>& w) {
  std::vector<float> out(w.size());
  for (size_t i = 0; i < w.size(); ++i) out[i] = static_cast<float>(std::log(w[i]));
  return out;
}

// Query heads of kv head `kv` (GQA), or its keys when the capture has no queries: the rule is
// written once, in engine/reference_cache.cpp.
std::vector<const MatrixF*> error_queries(const LayerData& layer, int kv) {
  return reference_queries(layer, kv);
}

nlohmann::json params_json(const std::map<std::string, ParamValues>& p) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [method, values] : p) {
    nlohmann::json v = nlohmann::json::object();
    for (const auto& [name, value] : values) v[name] = value;
    j[method] = v;
  }
  return j;
}

std::vector<std::string> method_names(const std::vector<const Method*>& methods) {
  std::vector<std::string> names;
  for (const Method* m : methods) names.push_back(m->name());
  return names;
}

}  // namespace

std::pair<double, double> mean_std(const std::vector<double>& x) {
  if (x.empty()) return {0, 0};
  double mean = 0;
  for (double v : x) mean += v;
  mean /= static_cast<double>(x.size());
  if (std::all_of(x.begin(), x.end(), [&](double v) { return v == x[0]; })) return {x[0], 0};
  double ss = 0;
  for (double v : x) ss += (v - mean) * (v - mean);
  return {mean, std::sqrt(ss / static_cast<double>(x.size() - 1))};
}

// ---------------------------------------------------------------------------------------------
// Window

EvalWindow EvalWindow::make(int n, double keep_ratio, int sink_override, int eval_override) {
  if (!(keep_ratio > 0 && keep_ratio <= 1))
    throw SettingError("keep ratio", "--ratios",
                       "keep ratio " + fmt_double(keep_ratio) + " is not in (0, 1]");
  if (n <= 0) throw InputError("capture has no tokens to evaluate");
  EvalWindow w;
  w.n = n;
  w.keep_ratio = keep_ratio;
  w.sink_overridden = sink_override >= 0;
  w.eval_overridden = eval_override >= 0;
  w.sink = w.sink_overridden ? sink_override : std::min(256, n / 32);
  w.eval = w.eval_overridden ? eval_override : std::min(256, n / 8);
  if (w.eval < 1)
    throw SettingError("evaluation queries (E)", "--eval",
                       w.eval_overridden
                           ? std::string("needs at least 1 evaluation query")
                           : "the capture has only " + std::to_string(n) +
                                 " tokens: E = floor(n/8) = 0 evaluation queries (set E)");
  if (w.sink + w.eval > n)
    throw SettingError("sinks (s) and evaluation queries (E)", "--sink/--eval",
                       "s + E = " + std::to_string(w.sink) + " + " + std::to_string(w.eval) +
                           " exceeds the capture's " + std::to_string(n) + " tokens");
  w.mid_begin = w.sink;
  w.mid_end = n - w.eval;
  w.n_mid = w.mid_end - w.mid_begin;
  w.budget = static_cast<int>(std::llround(keep_ratio * w.n_mid));
  return w;
}

EvalWindow::Fitted EvalWindow::fit(int n, double keep_ratio, int sink_request, int eval_request) {
  Fitted out;
  std::vector<std::string> notes;
  if (!(keep_ratio > 0 && keep_ratio <= 1)) {
    notes.push_back("keep ratio " + fmt_double(keep_ratio) + " is not in (0, 1]; using 0.5");
    keep_ratio = 0.5;
  }
  n = std::max(n, 1);
  const int default_eval = std::max(1, std::min(256, n / 8));
  int eval = eval_request >= 0 ? eval_request : default_eval;
  if (eval < 1 || eval > n) {
    const int fitted = std::clamp(eval, 1, n);
    notes.push_back(
        (eval_request >= 0 ? "eval " + std::to_string(eval_request) : "E = floor(n/8) = 0") +
        " does not fit a " + std::to_string(n) + "-token capture: E = " + std::to_string(fitted));
    eval = fitted;
  } else if (eval_request < 0 && n / 8 < 1) {
    notes.push_back("a " + std::to_string(n) +
                    "-token capture is too short for E = floor(n/8): E = 1");
  }
  const int default_sink = std::min(256, n / 32);
  int sink = sink_request >= 0 ? sink_request : default_sink;
  if (sink > n - eval) {
    notes.push_back((sink_request >= 0 ? "sink " + std::to_string(sink_request)
                                       : "s = " + std::to_string(sink)) +
                    " does not fit a " + std::to_string(n) + "-token capture with E = " +
                    std::to_string(eval) + ": s = " + std::to_string(n - eval));
    sink = n - eval;
  }
  out.window.n = n;
  out.window.keep_ratio = keep_ratio;
  out.window.sink_overridden = sink_request >= 0;
  out.window.eval_overridden = eval_request >= 0;
  out.window.sink = sink;
  out.window.eval = eval;
  out.window.mid_begin = sink;
  out.window.mid_end = n - eval;
  out.window.n_mid = out.window.mid_end - out.window.mid_begin;
  out.window.budget = static_cast<int>(std::llround(keep_ratio * out.window.n_mid));
  if (out.window.n_mid == 0) notes.push_back("the middle is empty: nothing to compress");
  out.note = join(notes, "; ");
  return out;
}

std::vector<double> ratios_for_budgets(const std::vector<int>& budgets, int n, int sink_override,
                                       int eval_override) {
  if (budgets.empty()) throw SettingError("budget", "--budget", "no token budget given");
  const EvalWindow w = EvalWindow::make(n, 1.0, sink_override, eval_override);
  std::vector<double> ratios;
  for (int b : budgets) {
    if (b < 1 || b > w.n_mid)
      throw SettingError("budget", "--budget",
                         std::to_string(b) + " tokens do not fit: the middle holds " +
                             std::to_string(w.n_mid) + " (n = " + std::to_string(n) + ", s = " +
                             std::to_string(w.sink) + " sinks, E = " + std::to_string(w.eval) +
                             " evaluation positions; a budget counts middle tokens, 1 to " +
                             std::to_string(w.n_mid) + ")");
    if (std::count(budgets.begin(), budgets.end(), b) > 1)
      throw SettingError("budget", "--budget", std::to_string(b) + " given twice");
    ratios.push_back(static_cast<double>(b) / w.n_mid);
  }
  return ratios;
}

const std::vector<double>& kvpress_keep_ratios() {
  static const std::vector<double> r{0.75, 0.5, 0.25, 0.125};
  return r;
}

const std::vector<double>* parse_ratio_preset(const std::string& name) {
  static const std::vector<double> protocol{0.5, 0.25, 0.125, 0.0625};
  if (name == "kvpress") return &kvpress_keep_ratios();
  if (name == "protocol") return &protocol;
  return nullptr;
}

std::string EvalWindow::describe() const {
  std::string s = "n=" + std::to_string(n) + " s=" + std::to_string(sink) +
                  " E=" + std::to_string(eval) + " middle=" + std::to_string(n_mid) +
                  " m=" + std::to_string(budget);
  std::vector<std::string> why;
  if (sink_overridden) why.push_back("s set by hand");
  if (eval_overridden) why.push_back("E set by hand");
  if (!sink_overridden && !eval_overridden && scaled_down())
    why.push_back("scaled down from 256/256 for a short capture: s = floor(n/32), E = floor(n/8)");
  else if (scaled_down() && (!sink_overridden || !eval_overridden))
    why.push_back("defaults scaled down for a short capture");
  if (!why.empty()) s += " (" + join(why, "; ") + ")";
  return s;
}

std::string method_unavailable(const Method& method, const CaptureInfo& info,
                               const ParamValues& params) {
  std::vector<std::string> why;
  if (method.needs_queries() && !info.has_queries)
    why.push_back("needs the capture's queries, and this capture has none");
  if (method.needs_rope() && !info.rope.known())
    why.push_back("needs RoPE's theta and layout to undo the rotation, and " +
                  (info.rope.missing.empty() ? std::string("this capture does not say them")
                                             : info.rope.missing));
  if (method.needs_output_projection(params))
    why.push_back(
        "needs each query head's output projection W_O, which captures do not carry (its "
        "projection setting 'identity' takes W_O = I, an approximation)");
  return join(why, "; ");
}

// ---------------------------------------------------------------------------------------------
// Estimators

const char* estimator_name(Estimator e) {
  return e == Estimator::Authors ? "authors" : "weighted";
}

Estimator parse_estimator(const std::string& s) {
  if (s == "weighted") return Estimator::Weighted;
  if (s == "authors") return Estimator::Authors;
  throw SettingError("estimator", "--estimator", "'" + s + "' is not weighted or authors");
}

void apply_authors_estimator(Selection& sel, double keep_ratio) {
  const int rounds = keep_ratio > 0 && keep_ratio < 1
                         ? static_cast<int>(std::ceil(std::log2(1.0 / keep_ratio) - 1e-9))
                         : 0;
  sel.separate = true;
  sel.den_indices = sel.indices;
  sel.den_weights.assign(sel.indices.size(), std::ldexp(1.0, rounds));
}

// ---------------------------------------------------------------------------------------------
// One head

MethodInput make_method_input(const LayerData& layer, int num_layers, int kv_head,
                              const EvalWindow& w, const ParamValues& params, uint64_t seed) {
  if (kv_head < 0 || kv_head >= static_cast<int>(layer.keys.size()))
    throw InputError("kv head " + std::to_string(kv_head) + " out of range: layer " +
                     std::to_string(layer.layer) + " has " + std::to_string(layer.keys.size()) +
                     " kv heads");
  MethodInput in;
  in.keys = &layer.keys[kv_head];
  in.values = &layer.values[kv_head];
  if (!layer.queries.empty()) in.queries = error_queries(layer, kv_head);
  in.n = w.n;
  in.sink = w.sink;
  in.eval = w.eval;
  in.mid_begin = w.mid_begin;
  in.mid_end = w.mid_end;
  in.budget = w.budget;
  in.keep_ratio = w.keep_ratio;
  in.layer = layer.layer;
  in.num_layers = num_layers;
  in.kv_head = kv_head;
  in.seed = seed;
  in.params = params;
  in.rope = layer.rope;
  in.layer_data = &layer;
  return in;
}

MethodInput make_method_input(const LayerData& layer, int num_layers, int kv_head,
                              const EvalWindow& w, const MethodSettings& s, uint64_t seed) {
  return make_method_input(layer, num_layers, kv_head, w, s.params, seed);
}

namespace {

// Errors of `selection` (already made by s.method on window w of this kv head) for every
// evaluation query of the group, against the precomputed exact reference when given. A GPU
// backend scores through the Backend seam.
HeadRun score_head_run(const LayerData& layer, int kv_head, const EvalWindow& w,
                       Selection selection, Backend* backend, const ExactReference* reference) {
  const MatrixF& K = layer.keys[kv_head];
  const MatrixF& V = layer.values[kv_head];
  HeadRun run;
  run.window = w;
  run.selection = std::move(selection);
  const std::vector<const MatrixF*> queries = error_queries(layer, kv_head);
  const Selection& sel = run.selection;
  if (backend && backend->parallel_in_one_call()) {
    // Through the Backend seam, one kv head per batch.
    ErrorBatch b;
    b.n = w.n;
    b.d = static_cast<int>(K.cols());
    b.dv = static_cast<int>(V.cols());
    b.q_heads = static_cast<int>(queries.size());
    b.kv_heads = 1;
    b.sink = w.sink;
    b.eval = w.eval;
    b.keys = {K.data()};
    b.values = {V.data()};
    for (const MatrixF* q : queries) b.queries.push_back(q->data());
    b.num_idx = {sel.indices};
    b.num_logw = {log_weights(sel.weights)};
    b.den_idx = {sel.separate ? sel.den_indices : sel.indices};
    b.den_logw = {sel.separate ? log_weights(sel.den_weights) : b.num_logw[0]};
    const size_t count = queries.size() * static_cast<size_t>(w.eval);
    std::vector<double> rel(count), nrm(count), mass(count);
    b.relative = rel.data();
    b.normalized = nrm.data();
    b.mass = mass.data();
    backend->attention_errors(b);
    run.per_query_head.assign(queries.size(), std::vector<QueryError>(w.eval));
    for (size_t h = 0; h < queries.size(); ++h)
      for (int e = 0; e < w.eval; ++e) {
        const size_t o = h * w.eval + e;
        run.per_query_head[h][e] = {w.n - w.eval + e, rel[o], nrm[o], mass[o]};
      }
  } else if (reference) {
    run.per_query_head = reference->evaluate(sel);
  } else {
    run.per_query_head = ExactReference(queries, K, V, w.sink, w.eval).evaluate(sel);
  }

  size_t count = 0;
  for (const auto& head : run.per_query_head)
    for (const QueryError& qe : head) {
      run.mean_relative += qe.relative;
      run.mean_normalized += qe.normalized;
      run.mean_mass += qe.mass;
      ++count;
    }
  run.mean_relative /= static_cast<double>(count);
  run.mean_normalized /= static_cast<double>(count);
  run.mean_mass /= static_cast<double>(count);
  // A non-finite figure (values so large that float scores overflow) is an error, never a result.
  if (!std::isfinite(run.mean_relative) || !std::isfinite(run.mean_normalized) ||
      !std::isfinite(run.mean_mass))
    throw InputError(
        "layer " + std::to_string(layer.layer) + " kv head " + std::to_string(kv_head) +
        ": the approximation gave a non-finite error (values too large for float arithmetic?); no "
        "figure reported for this head");
  return run;
}

// The checks run_head makes before asking the method (they name the head and the method).
void check_head(const LayerData& layer, int kv_head, const Method& method) {
  if (kv_head < 0 || kv_head >= static_cast<int>(layer.keys.size()))
    throw InputError("kv head " + std::to_string(kv_head) + " out of range: layer " +
                     std::to_string(layer.layer) + " has " + std::to_string(layer.keys.size()) +
                     " kv heads");
  if (kv_head < static_cast<int>(layer.refused.size()) && !layer.refused[kv_head].empty())
    throw InputError("layer " + std::to_string(layer.layer) + " kv head " +
                     std::to_string(kv_head) + " is refused: " + layer.refused[kv_head]);
  if (method.needs_queries() && layer.queries.empty())
    throw InputError(method.name() + " needs queries and the capture has none");
}

}  // namespace

HeadRun run_head(const LayerData& layer, int num_layers, int kv_head, const MethodSettings& s,
                 uint64_t seed, bool want_trace, Backend* backend,
                 const std::atomic<bool>* cancel) {
  if (!s.method) throw std::invalid_argument("run_head: no method");
  check_head(layer, kv_head, *s.method);
  const EvalWindow w =
      EvalWindow::make(static_cast<int>(layer.keys[kv_head].rows()), s.keep_ratio, s.sink, s.eval);
  MethodInput in = make_method_input(layer, num_layers, kv_head, w, s, seed);
  in.want_trace = want_trace;
  in.cancel = cancel;
  in.backend = backend;
  Selection sel = s.method->select(in);
  check_selection(sel, w.mid_begin, w.mid_end, w.budget, *s.method);
  if (s.estimator == Estimator::Authors) apply_authors_estimator(sel, s.keep_ratio);
  if (cancel && cancel->load()) throw Cancelled();
  // On the CPU, against the exact reference cache (one selection: the kept tokens' logits only).
  std::unique_ptr<ExactReference> ref;
  if (!(backend && backend->parallel_in_one_call()))
    ref = cached_reference(layer, kv_head, w.sink, w.eval, false, cancel);
  return score_head_run(layer, kv_head, w, std::move(sel), backend, ref.get());
}

// ---------------------------------------------------------------------------------------------
// Many heads

namespace {

struct WorkItem {
  int method = 0, ratio = 0, layer = 0, head = 0;  // positions in the spec's lists
  int point = 0;                                   // position in spec.points (0 without)
};

// Work items in canonical order: layer, kv head, point, method, ratio (layer-major, so
// concurrent workers share the loader's layer cache). Results are always reported in this order.
std::vector<WorkItem> all_items(const EvalSpec& spec) {
  std::vector<WorkItem> items;
  const int points = std::max<int>(1, static_cast<int>(spec.points.size()));
  for (int l = 0; l < static_cast<int>(spec.layers.size()); ++l)
    for (int h = 0; h < static_cast<int>(spec.heads.size()); ++h)
      for (int pt = 0; pt < points; ++pt)
        for (int m = 0; m < static_cast<int>(spec.methods.size()); ++m)
          for (int r = 0; r < static_cast<int>(spec.ratios.size()); ++r)
            items.push_back({m, r, l, h, pt});
  return items;
}

// The parameters method `method` of the spec runs with at point `point`.
ParamValues item_params(const EvalSpec& spec, const Method& method, int point) {
  ParamValues params;
  if (auto p = spec.params.find(method.name()); p != spec.params.end()) params = p->second;
  if (!spec.points.empty())
    for (const auto& [name, v] : spec.points[point]) params[name] = v;
  return params;
}

// The work items of one (layer, kv head, point, method): its ratios in this shard, in order.
struct WorkGroup {
  size_t first = 0, count = 0;  // positions in the shard's item list
};

// What a group's runs share, so that nothing is computed twice: the ranking of a score-ranking
// method (one per head: it depends on neither seed nor budget), and the run of a method that
// ignores both seed and budget (exact).
struct SharedWork {
  std::optional<Ranking> ranking;
  std::optional<HeadRun> budget_free_run;
};

// One run of `method` on one head for one (ratio, seed), reusing what `shared` holds.
HeadRun group_run(const LayerData& layer, int num_layers, int kv_head, const MethodSettings& s,
                  uint64_t seed, Backend* backend, const std::atomic<bool>* cancel,
                  const ExactReference* reference, SharedWork& shared) {
  const Method& method = *s.method;
  check_head(layer, kv_head, method);
  const EvalWindow w =
      EvalWindow::make(static_cast<int>(layer.keys[kv_head].rows()), s.keep_ratio, s.sink, s.eval);
  if (shared.budget_free_run) {
    HeadRun run = *shared.budget_free_run;
    run.window = w;
    return run;
  }
  MethodInput in = make_method_input(layer, num_layers, kv_head, w, s, seed);
  in.cancel = cancel;
  in.backend = backend;
  Selection sel;
  if (method.ranks_by_score()) {
    if (!shared.ranking) shared.ranking = method.rank(in);
    sel = method.ranked_selection(in, *shared.ranking);
  } else {
    sel = method.select(in);
  }
  check_selection(sel, w.mid_begin, w.mid_end, w.budget, method);
  if (s.estimator == Estimator::Authors) apply_authors_estimator(sel, s.keep_ratio);
  if (cancel && cancel->load()) throw Cancelled();
  HeadRun run = score_head_run(layer, kv_head, w, std::move(sel), backend, reference);
  // The authors' estimator scales the denominator by 2^T, which depends on the ratio.
  if (!method.depends_on_seed() && !method.depends_on_budget() &&
      s.estimator == Estimator::Weighted)
    shared.budget_free_run = run;
  return run;
}

// Every item of a group over spec.seeds seeds. A seed-independent method runs once per ratio and
// that run counts for every seed (the figures are those of R identical runs, summed in the same
// order as before); a score-ranking method ranks once for all ratios.
void evaluate_group(const LayerData& layer, int num_layers, const EvalSpec& spec,
                    const WorkItem* items, size_t count, bool method_refused,
                    const std::atomic<bool>* cancel, Backend* backend,
                    const ExactReference* reference, const TokenHarm* harm, HeadEval* out,
                    const std::function<void()>& item_done) {
  SharedWork shared;
  for (size_t g = 0; g < count; ++g) {
    const WorkItem& it = items[g];
    const Method* method = spec.methods[it.method];
    HeadEval& he = out[g];
    he.method = method->name();
    he.ratio = spec.ratios[it.ratio];
    he.layer = spec.layers[it.layer];
    he.kv_head = spec.heads[it.head];
    he.point = it.point;
    if (method_refused) {
      he.refused = true;
      he.note = method->name() + " needs queries and the capture has none";
    } else if (he.kv_head < static_cast<int>(layer.refused.size()) &&
               !layer.refused[he.kv_head].empty()) {
      he.refused = true;
      he.note = layer.refused[he.kv_head];
    } else {
      MethodSettings settings;
      settings.method = method;
      settings.keep_ratio = he.ratio;
      settings.sink = spec.sink;
      settings.eval = spec.eval;
      settings.estimator = spec.estimator;
      settings.params = item_params(spec, *method, it.point);

      std::vector<double> norm_seeds, mass_seeds;
      double harm_kept = 0, harm_dropped = 0;  // sums over seeds (spec.harm)
      std::optional<HeadRun> seed_free_run;    // the one run of a seed-independent method
      for (int r = 0; r < spec.seeds; ++r) {
        if (cancel && cancel->load()) throw Cancelled();
        HeadRun fresh;
        if (!seed_free_run) {
          try {
            fresh = group_run(layer, num_layers, he.kv_head, settings,
                              spec.base_seed + static_cast<uint64_t>(r), backend, cancel, reference,
                              shared);
          } catch (const Cancelled&) {
            throw;
          } catch (const std::exception& e) {
            // A method that throws is reported, not fatal: the other methods' figures stand.
            he.error = e.what();
            he.per_seed.clear();
            he.per_query.clear();
            break;
          }
          if (!method->depends_on_seed()) seed_free_run = std::move(fresh);
        }
        const HeadRun& run = seed_free_run ? *seed_free_run : fresh;
        if (he.note.empty()) he.note = run.selection.note;
        if (r == 0) {
          he.kept = static_cast<int>(run.selection.indices.size());
          he.budget = run.window.budget;
        }
        if (run.selection.saturation >= 0)
          he.saturation = (r == 0 ? 0.0 : he.saturation) + run.selection.saturation / spec.seeds;
        if (harm) {
          const HarmSplit split = harm_split(*harm, run.selection);
          harm_kept += split.kept_sum;
          harm_dropped += split.dropped_sum;
        }
        he.per_seed.push_back(run.mean_relative);
        norm_seeds.push_back(run.mean_normalized);
        mass_seeds.push_back(run.mean_mass);
        if (he.per_query.empty()) he.per_query.assign(run.window.eval, 0.0);
        for (const auto& head : run.per_query_head)
          for (int e = 0; e < run.window.eval; ++e) he.per_query[e] += head[e].relative;
        if (r == spec.seeds - 1)
          for (double& v : he.per_query)
            v /= static_cast<double>(spec.seeds * run.per_query_head.size());
      }
      if (he.error.empty()) {
        std::tie(he.mean, he.std) = mean_std(he.per_seed);
        he.normalized_mean = mean_std(norm_seeds).first;
        he.mass_mean = mean_std(mass_seeds).first;
        if (harm) {
          he.harm_kept = harm_kept / spec.seeds;
          he.harm_dropped = harm_dropped / spec.seeds;
        }
      }
    }
    if (item_done) item_done();
  }
}

std::vector<int> resolve_list(const std::vector<int>& given, int count, const char* setting,
                              const char* flag, const char* what) {
  if (given.empty()) {
    std::vector<int> all(count);
    for (int i = 0; i < count; ++i) all[i] = i;
    return all;
  }
  std::set<int> seen;
  for (int v : given) {
    if (v < 0 || v >= count)
      throw SettingError(setting, flag,
                         std::string(what) + " " + std::to_string(v) +
                             " out of range (the capture has " + std::to_string(count) + ")");
    if (!seen.insert(v).second)
      throw SettingError(setting, flag,
                         std::string(what) + " " + std::to_string(v) + " given twice");
  }
  return given;
}

}  // namespace

EvalReport run_eval(CaptureFile& capture, const EvalSpec& spec_in, const ProgressFn& progress,
                    const std::atomic<bool>* cancel, Backend* backend) {
  const CaptureInfo& info = capture.info();
  EvalReport report;
  report.capture_path = info.path;
  report.info = info;
  EvalSpec& spec = report.spec;
  spec = spec_in;

  // Validate everything before any work starts, naming the flag.
  if (spec.methods.empty()) throw SettingError("methods", "--methods", "no method given");
  if (!spec.budgets.empty())
    spec.ratios = ratios_for_budgets(spec.budgets, info.num_tokens, spec.sink, spec.eval);
  if (spec.ratios.empty()) throw SettingError("keep ratios", "--ratios", "no keep ratio given");
  if (spec.seeds < 1) throw SettingError("seeds", "--seeds", "needs at least 1 seed");
  if (spec.shard_count < 1 || spec.shard_index < 0 || spec.shard_index >= spec.shard_count)
    throw SettingError("shard", "--shard",
                       std::to_string(spec.shard_index) + "/" + std::to_string(spec.shard_count) +
                           " is not i/N with 0 <= i < N");
  if (spec.threads < 0) throw SettingError("threads", "--threads", "must be 0 (all cores) or more");
  spec.layers = resolve_list(spec.layers, info.num_layers, "layers", "--layers", "layer");
  spec.heads = resolve_list(spec.heads, info.kv_heads, "kv heads", "--heads", "kv head");
  for (const Method* m : spec.methods)
    if (std::count(spec.methods.begin(), spec.methods.end(), m) > 1)
      throw SettingError("methods", "--methods", m->name() + " given twice");
  for (double r : spec.ratios)
    if (std::count(spec.ratios.begin(), spec.ratios.end(), r) > 1)
      throw SettingError("keep ratios", "--ratios", fmt_double(r) + " given twice");
  for (const auto& [name, values] : spec.params) {
    auto it = std::find_if(spec.methods.begin(), spec.methods.end(),
                           [&](const Method* m) { return m->name() == name; });
    if (it == spec.methods.end())
      throw SettingError(name + ".*", "--param " + name + ".*",
                         name + " is not among the evaluated methods");
    validate_method_params(**it, values);
  }
  if (!spec.points.empty()) {
    if (spec.methods.size() != 1)
      throw SettingError(
          "methods", "--method",
          "a parameter sweep runs one method (" + std::to_string(spec.methods.size()) + " given)");
    for (size_t pt = 0; pt < spec.points.size(); ++pt)
      validate_method_params(*spec.methods[0], item_params(spec, *spec.methods[0], int(pt)));
  }
  for (double r : spec.ratios) EvalWindow::make(info.num_tokens, r, spec.sink, spec.eval);
  report.window_example = EvalWindow::make(info.num_tokens, spec.ratios[0], spec.sink, spec.eval);

  report.proxy_queries = !info.has_queries;
  std::vector<char> method_refused(spec.methods.size(), 0);
  if (report.proxy_queries) {
    std::vector<std::string> refused;
    for (size_t m = 0; m < spec.methods.size(); ++m)
      if (spec.methods[m]->needs_queries()) {
        method_refused[m] = 1;
        refused.push_back(spec.methods[m]->name());
      }
    report.notes.push_back(
        "the capture has no queries: errors use the keys as proxy queries (q_j = k_j)");
    if (!refused.empty())
      report.notes.push_back("refused (they need queries, the capture has none): " + join(refused));
  }

  // This shard's items: i, i+N, i+2N, ... of the canonical list.
  const std::vector<WorkItem> items = all_items(spec);
  std::vector<WorkItem> mine;
  for (size_t i = spec.shard_index; i < items.size(); i += spec.shard_count)
    mine.push_back(items[i]);
  report.results.resize(mine.size());

  const int total = static_cast<int>(mine.size());
  int threads = spec.threads > 0 ? spec.threads : hardware_threads();
  threads = std::max(1, std::min(threads, total));

  // Layer by layer (memory stays bounded by one layer). The unit of work is a group: the items
  // of one (kv head, point, method), so that a method ranks or runs once for all its ratios and
  // seeds. Groups are taken in head order; the exact reference of a kv head is taken from the
  // reference cache (engine/reference_cache.h: built there once per capture, window and head) by
  // the first group that needs it and dropped when its last group is done, so only about `threads`
  // references (with any logits they hold) are alive at once.
  const bool cpu_scoring = !(backend && backend->parallel_in_one_call());
  std::mutex mu;  // guards done and progress calls
  int done = 0;
  auto item_done = [&] {
    std::lock_guard<std::mutex> lock(mu);
    ++done;
    if (progress) progress(done, total);
  };
  // The next layer loads on its own thread while this one computes (with a warm reference cache,
  // loading is a third of an eval's work and would otherwise leave the other cores idle).
  std::future<std::shared_ptr<const LayerData>> next_layer;
  for (size_t begin = 0; begin < mine.size();) {
    size_t end = begin;
    while (end < mine.size() && mine[end].layer == mine[begin].layer) ++end;
    const std::shared_ptr<const LayerData> layer =
        next_layer.valid() ? next_layer.get() : capture.layer(spec.layers[mine[begin].layer]);
    if (end < mine.size() && threads > 1)
      next_layer = std::async(std::launch::async, [&capture, L = spec.layers[mine[end].layer]] {
        return capture.layer(L);
      });
    std::vector<WorkGroup> groups;
    for (size_t i = begin; i < end; ++i) {
      if (i == begin || mine[i].head != mine[i - 1].head || mine[i].method != mine[i - 1].method ||
          mine[i].point != mine[i - 1].point)
        groups.push_back({i, 0});
      ++groups.back().count;
    }
    struct HeadReference {
      std::once_flag built;
      std::unique_ptr<ExactReference> ref;
      std::atomic<int> users{0};  // groups still to score against it
    };
    std::vector<HeadReference> refs(spec.heads.size());
    // Per-token harm of each kv head (spec.harm; engine/token_harm.h), built by the first group
    // that needs it and dropped after its last, as the references are.
    struct HeadHarm {
      std::once_flag built;
      std::unique_ptr<TokenHarm> harm;
      std::atomic<int> users{0};
    };
    std::vector<HeadHarm> harms(spec.harm ? spec.heads.size() : 0);
    auto wants_harm = [&](const WorkGroup& g) {
      const WorkItem& it = mine[g.first];
      const int kv = spec.heads[it.head];
      return !harms.empty() && !method_refused[it.method] &&
             !(kv < static_cast<int>(layer->refused.size()) && !layer->refused[kv].empty());
    };
    for (const WorkGroup& g : groups)
      if (wants_harm(g)) ++harms[mine[g.first].head].users;
    auto uses_reference = [&](const WorkGroup& g) {
      const WorkItem& it = mine[g.first];
      const int kv = spec.heads[it.head];
      return cpu_scoring && !method_refused[it.method] &&
             !(kv < static_cast<int>(layer->refused.size()) && !layer->refused[kv].empty());
    };
    // Held logits of every key pay when the selections a head scores keep more columns in all
    // than it has keys (docs/performance.md, "Exact reference cache").
    std::vector<double> columns(spec.heads.size(), 0.0);
    const EvalWindow& ew = report.window_example;
    for (const WorkGroup& g : groups) {
      if (!uses_reference(g)) continue;
      const WorkItem& first = mine[g.first];
      ++refs[first.head].users;
      const Method& m = *spec.methods[first.method];
      const double fixed = ew.sink + ew.eval;
      if (!m.depends_on_seed() && !m.depends_on_budget() && spec.estimator == Estimator::Weighted) {
        columns[first.head] += fixed + ew.n_mid;
        continue;
      }
      const int runs = m.depends_on_seed() ? spec.seeds : 1;
      for (size_t i = g.first; i < g.first + g.count; ++i)
        columns[first.head] += runs * (fixed + spec.ratios[mine[i].ratio] * ew.n_mid);
    }
    parallel_for(static_cast<int>(groups.size()), threads, cancel, [&](int k) {
      const WorkGroup& g = groups[k];
      const WorkItem& first = mine[g.first];
      const ExactReference* ref = nullptr;
      HeadReference* slot = uses_reference(g) ? &refs[first.head] : nullptr;
      if (slot) {
        std::call_once(slot->built, [&] {
          const int kv = spec.heads[first.head];
          slot->ref =
              cached_reference(*layer, kv, ew.sink, ew.eval, columns[first.head] > ew.n, cancel);
        });
        ref = slot->ref.get();
      }
      const TokenHarm* harm = nullptr;
      HeadHarm* hslot = wants_harm(g) ? &harms[first.head] : nullptr;
      if (hslot) {
        std::call_once(hslot->built, [&] {
          const int kv = spec.heads[first.head];
          hslot->harm = std::make_unique<TokenHarm>(
              token_harm(harm_queries(*layer, kv), layer->keys[kv], layer->values[kv],
                         report.window_example.sink, report.window_example.eval));
        });
        harm = hslot->harm.get();
      }
      evaluate_group(*layer, info.num_layers, spec, &mine[g.first], g.count,
                     method_refused[first.method], cancel, backend, ref, harm,
                     &report.results[g.first], item_done);
      if (hslot && --hslot->users == 0) hslot->harm.reset();
      if (slot && --slot->users == 0) slot->ref.reset();
    });
    begin = end;
  }
  if (cancel && cancel->load()) throw Cancelled();
  return report;
}

// ---------------------------------------------------------------------------------------------
// Summary and JSON

std::vector<std::string> EvalReport::failures() const {
  std::vector<std::string> out;
  for (const Method* m : spec.methods) {
    int failed = 0, of = 0;
    std::string first;
    for (const HeadEval& he : results) {
      if (he.method != m->name()) continue;
      ++of;
      if (!he.error.empty() && failed++ == 0) first = he.error;
    }
    if (failed)
      out.push_back(m->name() + " failed on " + std::to_string(failed) + " of " +
                    std::to_string(of) + " work items: " + first);
  }
  return out;
}

std::vector<EvalReport> EvalReport::split_points() const {
  if (spec.points.empty()) return {*this};
  std::vector<EvalReport> out(spec.points.size());
  for (size_t pt = 0; pt < out.size(); ++pt) {
    EvalReport& r = out[pt];
    r.capture_path = capture_path;
    r.info = info;
    r.spec = spec;
    r.spec.points.clear();
    r.spec.params[spec.methods[0]->name()] = item_params(spec, *spec.methods[0], int(pt));
    r.window_example = window_example;
    r.proxy_queries = proxy_queries;
    r.notes = notes;
  }
  for (const HeadEval& h : results) {
    HeadEval copy = h;
    copy.point = 0;
    out.at(h.point).results.push_back(std::move(copy));
  }
  return out;
}

std::vector<EvalSummary> EvalReport::summary() const {
  std::vector<EvalSummary> out;
  for (const Method* m : spec.methods) {
    for (double ratio : spec.ratios) {
      EvalSummary s;
      s.method = m->name();
      s.ratio = ratio;
      std::vector<const HeadEval*> heads;
      for (const HeadEval& he : results)
        if (he.method == s.method && he.ratio == ratio && !he.refused && he.error.empty())
          heads.push_back(&he);
      s.heads = static_cast<int>(heads.size());
      if (!heads.empty()) {
        double mean = 0;
        for (const HeadEval* he : heads) mean += he->mean;
        s.mean = mean / static_cast<double>(heads.size());
        // Spread over seeds: the mean over heads, one value per seed.
        std::vector<double> per_seed(heads[0]->per_seed.size(), 0.0);
        for (const HeadEval* he : heads)
          for (size_t r = 0; r < per_seed.size() && r < he->per_seed.size(); ++r)
            per_seed[r] += he->per_seed[r] / static_cast<double>(heads.size());
        s.std = mean_std(per_seed).second;
        // Harm kept vs dropped: means over the heads that have it.
        double kept = 0, dropped = 0, share = 0;
        int with_harm = 0, with_share = 0;
        for (const HeadEval* he : heads) {
          if (!he->has_harm()) continue;
          ++with_harm;
          kept += he->harm_kept;
          dropped += he->harm_dropped;
          if (he->harm_kept + he->harm_dropped > 0) {
            share += he->harm_dropped / (he->harm_kept + he->harm_dropped);
            ++with_share;
          }
        }
        if (with_harm > 0) {
          s.harm_kept = kept / with_harm;
          s.harm_dropped = dropped / with_harm;
          s.harm_dropped_share = with_share > 0 ? share / with_share : 0.0;
        }
      }
      out.push_back(s);
    }
  }
  return out;
}

nlohmann::json EvalReport::to_json() const {
  if (!spec.points.empty())
    throw std::logic_error("EvalReport::to_json: a report with points is written by point");
  using nlohmann::json;
  json j;
  j["format"] = "kvscope-eval/1";
  j["capture"] = {{"path", capture_path},           {"model", info.model},
                  {"source", info.source},          {"synthetic", info.synthetic},
                  {"num_layers", info.num_layers},  {"q_heads", info.q_heads},
                  {"kv_heads", info.kv_heads},      {"head_dim", info.head_dim},
                  {"value_dim", info.value_dim},    {"num_tokens", info.num_tokens},
                  {"has_queries", info.has_queries}};
  const EvalWindow& w = window_example;
  json budgets = json::array();
  for (double r : spec.ratios)
    if (w.n > 0) budgets.push_back(static_cast<int>(std::llround(r * w.n_mid)));
  j["window"] = {{"n", w.n},
                 {"s", w.sink},
                 {"E", w.eval},
                 {"n_mid", w.n_mid},
                 {"budgets", budgets},
                 {"scaled_down", w.scaled_down()},
                 {"describe", w.describe()}};
  j["spec"] = {{"methods", method_names(spec.methods)},
               {"ratios", spec.ratios},
               {"seeds", spec.seeds},
               {"base_seed", spec.base_seed},
               {"layers", spec.layers},
               {"heads", spec.heads},
               {"params", params_json(spec.params)},
               {"sink", spec.sink},
               {"eval", spec.eval},
               {"shard_index", spec.shard_index},
               {"shard_count", spec.shard_count},
               {"estimator", estimator_name(spec.estimator)}};
  if (!spec.budgets.empty()) j["spec"]["budgets"] = spec.budgets;
  j["proxy_queries"] = proxy_queries;
  j["notes"] = notes;
  j["failures"] = failures();
  json sum = json::array();
  const std::vector<EvalSummary> summary_rows = summary();
  for (const EvalSummary& s : summary_rows)
    sum.push_back({{"method", s.method},
                   {"ratio", s.ratio},
                   {"mean", s.mean},
                   {"std", s.std},
                   {"heads", s.heads}});
  if (spec.harm)
    for (size_t i = 0; i < sum.size(); ++i) {
      const EvalSummary& s = summary_rows[i];
      if (std::isnan(s.harm_kept)) continue;
      sum[i]["harm_kept"] = s.harm_kept;
      sum[i]["harm_dropped"] = s.harm_dropped;
      sum[i]["harm_dropped_share"] = s.harm_dropped_share;
    }
  if (spec.harm) j["spec"]["harm"] = true;
  j["summary"] = sum;
  json res = json::array();
  for (const HeadEval& he : results) {
    json r = {{"method", he.method},
              {"ratio", he.ratio},
              {"layer", he.layer},
              {"kv_head", he.kv_head},
              {"mean", he.mean},
              {"std", he.std},
              {"normalized_mean", he.normalized_mean},
              {"mass_mean", he.mass_mean},
              {"per_seed", he.per_seed},
              {"per_query", he.per_query},
              {"refused", he.refused}};
    if (!he.note.empty()) r["note"] = he.note;
    if (!he.refused && he.error.empty()) {
      r["kept"] = he.kept;
      r["budget"] = he.budget;
    }
    if (he.saturation >= 0) r["saturation"] = he.saturation;
    if (he.has_harm()) {
      r["harm_kept"] = he.harm_kept;
      r["harm_dropped"] = he.harm_dropped;
    }
    if (!he.error.empty()) r["error"] = he.error;
    res.push_back(r);
  }
  j["results"] = res;
  return j;
}

namespace {
constexpr long long kMaxWorkItems = 1 << 24;  // of a report read back (EvalReport::from_json)
}  // namespace

EvalReport EvalReport::from_json(const nlohmann::json& j) {
  // Every field is read through JsonField: a wrong type, a missing field or a value out of range
  // throws InputError naming the field's path ("eval report field \"results[3].mean\": expected a
  // number, got null"). Ranges are checked before anything is sized by them (merge allocates per
  // shard and per work item).
  EvalReport rep;
  const JsonField doc(j, "eval report");
  if (!j.is_object() || !j.contains("format") || !j["format"].is_string() ||
      j["format"].get<std::string>() != "kvscope-eval/1")
    doc.fail("not a kvscope eval report (\"format\" is not \"kvscope-eval/1\")");

  const JsonField c = doc.at("capture");
  rep.capture_path = c.at("path").string();
  rep.info.path = rep.capture_path;
  rep.info.model = c.at("model").string();
  rep.info.source = c.get("source", "");
  rep.info.synthetic = c.get("synthetic", false);
  rep.info.num_layers = c.at("num_layers").integer(1, kMaxCaptureLayers);
  rep.info.q_heads = c.at("q_heads").integer(1, kMaxCaptureHeads);
  rep.info.kv_heads = c.at("kv_heads").integer(1, kMaxCaptureHeads);
  rep.info.head_dim = c.at("head_dim").integer(1, kMaxCaptureHeadDim);
  rep.info.value_dim = c.get("value_dim", rep.info.head_dim, 1, kMaxCaptureHeadDim);
  rep.info.num_tokens = c.at("num_tokens").integer(1, kMaxCaptureTokens);
  rep.info.has_queries = c.at("has_queries").boolean();

  const JsonField s = doc.at("spec");
  for (const JsonField& name : s.at("methods").elements()) {
    const Method* m = find_method(name.string());
    if (!m) name.fail("unknown method '" + name.string() + "'");
    rep.spec.methods.push_back(m);
  }
  const JsonField ratios = s.at("ratios");
  if (ratios.size() < 1 || ratios.size() > 1000)
    ratios.fail("holds " + std::to_string(ratios.size()) + " ratios, expected 1 to 1000");
  rep.spec.ratios.clear();  // EvalSpec's default ratios are not the report's
  for (const JsonField& r : ratios.elements()) {
    const double x = r.number();
    if (!(x > 0 && x <= 1)) r.fail(fmt_double(x) + " is not a keep ratio in (0, 1]");
    rep.spec.ratios.push_back(x);
  }
  if (const std::optional<JsonField> b = s.find("budgets")) {
    if (b->size() > 1000)
      b->fail("holds " + std::to_string(b->size()) + " budgets, more than 1000");
    rep.spec.budgets = b->integers(1, kMaxCaptureTokens);
    if (!rep.spec.budgets.empty() && rep.spec.budgets.size() != rep.spec.ratios.size())
      b->fail("holds " + std::to_string(rep.spec.budgets.size()) + " budgets for " +
              std::to_string(rep.spec.ratios.size()) + " ratios");
  }
  rep.spec.harm = s.get("harm", false);
  rep.spec.seeds = s.at("seeds").integer(1, kMaxSeeds);
  rep.spec.base_seed = s.at("base_seed").unsigned_integer();
  rep.spec.layers = s.at("layers").integers(0, rep.info.num_layers - 1);
  rep.spec.heads = s.at("heads").integers(0, rep.info.kv_heads - 1);
  if (rep.spec.layers.size() > static_cast<size_t>(rep.info.num_layers) ||
      rep.spec.heads.size() > static_cast<size_t>(rep.info.kv_heads))
    s.fail("lists more layers or heads than the capture has");
  // merge lays out every work item of the spec: bounded before anything is sized by it (an
  // eval of a llama3-8b capture with every method at 4 ratios has about 10^4).
  const double work_items =
      static_cast<double>(rep.spec.methods.size()) * static_cast<double>(rep.spec.ratios.size()) *
      static_cast<double>(rep.spec.layers.size()) * static_cast<double>(rep.spec.heads.size());
  if (work_items > static_cast<double>(kMaxWorkItems))
    s.fail("asks for " + std::to_string(static_cast<long long>(work_items)) +
           " work items (methods x ratios x layers x heads), more than " +
           std::to_string(kMaxWorkItems));
  for (const auto& [method, values] : s.at("params").members())
    for (const auto& [name, value] : values.members())
      rep.spec.params[method][name] = value.number();
  rep.spec.sink = s.at("sink").integer(-1, kMaxCaptureTokens);
  rep.spec.eval = s.at("eval").integer(-1, kMaxCaptureTokens);
  rep.spec.shard_count = s.at("shard_count").integer(1, kMaxShards);
  rep.spec.shard_index = s.at("shard_index").integer(0, rep.spec.shard_count - 1);
  if (const std::optional<JsonField> e = s.find("estimator")) {
    const std::string name = e->string();
    if (name != "weighted" && name != "authors")
      e->fail("'" + name + "' is not weighted or authors");
    rep.spec.estimator = parse_estimator(name);
  }
  try {
    rep.window_example =
        EvalWindow::make(rep.info.num_tokens, rep.spec.ratios[0], rep.spec.sink, rep.spec.eval);
  } catch (const InputError& e) {
    s.fail(std::string("its window does not fit the capture: ") + e.what());
  }

  rep.proxy_queries = doc.get("proxy_queries", false);
  if (const std::optional<JsonField> notes = doc.find("notes")) rep.notes = notes->strings();
  const JsonField results = doc.at("results");
  const size_t max_results = static_cast<size_t>(rep.spec.methods.size()) * rep.spec.ratios.size() *
                             std::max<size_t>(1, rep.spec.layers.size()) *
                             std::max<size_t>(1, rep.spec.heads.size());
  if (results.size() > max_results)
    results.fail("holds " + std::to_string(results.size()) + " entries, more than the spec's " +
                 std::to_string(max_results) + " work items");
  for (const JsonField& r : results.elements()) {
    HeadEval he;
    he.method = r.at("method").string();
    he.ratio = r.at("ratio").number();
    he.layer = r.at("layer").integer(0, rep.info.num_layers - 1);
    he.kv_head = r.at("kv_head").integer(0, rep.info.kv_heads - 1);
    he.mean = r.at("mean").number();
    he.std = r.at("std").number();
    he.normalized_mean = r.get("normalized_mean", 0.0);
    he.mass_mean = r.get("mass_mean", 0.0);
    if (const std::optional<JsonField> v = r.find("per_seed")) he.per_seed = v->numbers();
    if (const std::optional<JsonField> v = r.find("per_query")) he.per_query = v->numbers();
    he.refused = r.get("refused", false);
    he.note = r.get("note", "");
    he.error = r.get("error", "");
    he.kept = r.get("kept", 0, 0, kMaxCaptureTokens);
    he.budget = r.get("budget", 0, 0, kMaxCaptureTokens);
    he.saturation = r.get("saturation", -1.0);
    if (r.has("harm_kept")) he.harm_kept = r.at("harm_kept").number();
    if (r.has("harm_dropped")) he.harm_dropped = r.at("harm_dropped").number();
    rep.results.push_back(std::move(he));
  }
  return rep;
}

// ---------------------------------------------------------------------------------------------
// Merge

EvalReport merge_reports(const std::vector<EvalReport>& parts) {
  if (parts.empty()) throw InputError("merge: no reports given");
  const EvalReport& first = parts[0];
  const EvalSpec& fs = first.spec;
  auto same_spec = [&](const EvalSpec& s) {
    return method_names(s.methods) == method_names(fs.methods) && s.ratios == fs.ratios &&
           s.budgets == fs.budgets && s.harm == fs.harm && s.seeds == fs.seeds &&
           s.base_seed == fs.base_seed && s.layers == fs.layers && s.heads == fs.heads &&
           s.params == fs.params && s.sink == fs.sink && s.eval == fs.eval &&
           s.shard_count == fs.shard_count && s.estimator == fs.estimator;
  };
  std::set<int> shards;
  for (size_t p = 0; p < parts.size(); ++p) {
    const EvalReport& r = parts[p];
    const std::string which = "merge: report " + std::to_string(p + 1);
    if (r.info.model != first.info.model || r.info.num_tokens != first.info.num_tokens ||
        r.info.num_layers != first.info.num_layers || r.info.kv_heads != first.info.kv_heads ||
        r.info.q_heads != first.info.q_heads)
      throw InputError(which + " is of a different capture (" + r.info.model + ", " +
                       std::to_string(r.info.num_tokens) + " tokens) than report 1 (" +
                       first.info.model + ", " + std::to_string(first.info.num_tokens) +
                       " tokens)");
    if (!same_spec(r.spec))
      throw InputError(which +
                       " was run with a different spec (methods, ratios, seeds, layers, "
                       "heads, params, window or shard count) than report 1");
    if (!shards.insert(r.spec.shard_index).second)
      throw InputError(which + ": shard " + std::to_string(r.spec.shard_index) + "/" +
                       std::to_string(fs.shard_count) + " is given twice");
  }
  std::vector<std::string> missing;
  for (int i = 0; i < fs.shard_count; ++i)
    if (!shards.count(i)) {
      if (missing.size() == 10) {
        missing.push_back("... (" + std::to_string(fs.shard_count - shards.size()) + " in all)");
        break;
      }
      missing.push_back(std::to_string(i) + "/" + std::to_string(fs.shard_count));
    }
  if (!missing.empty()) throw InputError("merge: missing shard(s) " + join(missing));

  EvalReport out = first;
  out.spec.shard_index = 0;
  out.spec.shard_count = 1;
  out.results.clear();
  out.notes.clear();

  // Put every result at its canonical position; each must be filled exactly once.
  EvalSpec canon = fs;
  const std::vector<WorkItem> items = all_items(canon);
  auto pos = [](const auto& list, const auto& v) {
    return static_cast<int>(std::find(list.begin(), list.end(), v) - list.begin());
  };
  const std::vector<std::string> names = method_names(fs.methods);
  std::vector<HeadEval> slots(items.size());
  std::vector<char> filled(items.size(), 0);
  const size_t nr = fs.ratios.size(), nm = names.size(), nh = fs.heads.size();
  for (const EvalReport& r : parts) {
    for (const std::string& note : r.notes)
      if (std::find(out.notes.begin(), out.notes.end(), note) == out.notes.end())
        out.notes.push_back(note);
    for (const HeadEval& he : r.results) {
      const size_t l = pos(fs.layers, he.layer), h = pos(fs.heads, he.kv_head),
                   m = pos(names, he.method), q = pos(fs.ratios, he.ratio);
      if (l >= fs.layers.size() || h >= nh || m >= nm || q >= nr)
        throw InputError("merge: result " + he.method + " ratio " + fmt_double(he.ratio) +
                         " layer " + std::to_string(he.layer) + " kv head " +
                         std::to_string(he.kv_head) + " is not part of the spec");
      const size_t index = ((l * nh + h) * nm + m) * nr + q;
      if (filled[index]++)
        throw InputError("merge: result " + he.method + " ratio " + fmt_double(he.ratio) +
                         " layer " + std::to_string(he.layer) + " kv head " +
                         std::to_string(he.kv_head) + " appears in more than one report");
      slots[index] = he;
    }
  }
  for (size_t i = 0; i < items.size(); ++i)
    if (!filled[i])
      throw InputError("merge: no result for " + names[items[i].method] + " ratio " +
                       fmt_double(fs.ratios[items[i].ratio]) + " layer " +
                       std::to_string(fs.layers[items[i].layer]) + " kv head " +
                       std::to_string(fs.heads[items[i].head]) + " (a shard is incomplete)");
  out.results = std::move(slots);
  return out;
}

}  // namespace kvscope
