// The evaluation protocol of docs/evaluation.md: window, per-head runs, the multithreaded
// evaluation over (method, ratio, layer, kv head) work items and R seeds, its JSON form and the
// exact merge of shard reports.
#include "engine/eval/protocol.h"

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

#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/eval/protocol_detail.h"
#include "engine/eval/reference_cache.h"
#include "engine/eval/seed_stats.h"
#include "engine/eval/selection_check.h"
#include "engine/eval/token_harm.h"
#include "engine/io/json_fields.h"
#include "engine/ops/backend.h"

namespace kvscope {
namespace {

using protocol_detail::fmt_double;
using protocol_detail::join;

std::vector<double> log_weights(const std::vector<double>& w) {
  std::vector<double> out(w.size());
  for (size_t i = 0; i < w.size(); ++i) out[i] = std::log(w[i]);
  return out;
}

// Query heads of kv head `kv` (GQA), or its keys when the capture has no queries: the rule is
// written once, in engine/eval/reference_cache.cpp.
std::vector<const MatrixF*> error_queries(const LayerData& layer, int kv) {
  return reference_queries(layer, kv);
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

std::string method_unavailable(const Method& method, const CaptureInfo& info,
                               const ParamValues& params) {
  std::vector<std::string> why;
  if (method.needs_queries() && !info.has_queries)
    why.push_back("needs the capture's queries, and this capture has none");
  if (method.needs_rope() && !info.rope.known())
    why.push_back("needs RoPE's theta and layout to undo the rotation, and " +
                  (info.rope.missing.empty() ? std::string("this capture does not say them")
                                             : info.rope.missing));
  if (method.needs_output_projection(params) && !info.has_output_projection)
    why.push_back(
        "needs each query head's output projection W_O (layers.L.wo), and this capture does not "
        "carry it (its projection setting 'identity' takes W_O = I, an approximation)");
  return join(why, "; ");
}

namespace {

// method_unavailable with the method's parameters from `params` (its defaults when absent).
std::string unavailable_with(const Method& m, const CaptureInfo& info,
                             const std::map<std::string, ParamValues>& params) {
  const auto p = params.find(m.name());
  return method_unavailable(m, info, p == params.end() ? ParamValues{} : p->second);
}

}  // namespace

std::vector<const Method*> runnable_methods(const std::vector<const Method*>& methods,
                                            const CaptureInfo& info,
                                            const std::map<std::string, ParamValues>& params,
                                            std::vector<std::string>& left_out) {
  std::vector<const Method*> out;
  for (const Method* m : methods) {
    const std::string why = unavailable_with(*m, info, params);
    if (why.empty())
      out.push_back(m);
    else
      left_out.push_back(m->name() + " (" + why + ")");
  }
  return out;
}

void require_runnable(const std::vector<const Method*>& methods, const CaptureInfo& info,
                      const std::map<std::string, ParamValues>& params, const std::string& setting,
                      const std::string& flag) {
  for (const Method* m : methods) {
    const std::string why = unavailable_with(*m, info, params);
    if (!why.empty())
      throw SettingError(setting, flag, m->name() + " cannot run on this capture: it " + why);
  }
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
    // Through the Backend seam, this kv head alone (run_eval batches a layer's heads:
    // evaluate_layer_batched, engine/eval/protocol_batched.cpp).
    ErrorBatch b;
    protocol_detail::add_error_head(b, layer, kv_head, w, sel);
    run.per_query_head = protocol_detail::run_error_batch(*backend, b);
  } else if (reference) {
    run.per_query_head = reference->evaluate(sel);
  } else {
    run.per_query_head = ExactReference(queries, K, V, w.sink, w.eval).evaluate(sel);
  }

  protocol_detail::finish_head_run(run, layer.layer, kv_head);
  return run;
}

}  // namespace

namespace protocol_detail {

void finish_head_run(HeadRun& run, int layer, int kv_head) {
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
        "layer " + std::to_string(layer) + " kv head " + std::to_string(kv_head) +
        ": the approximation gave a non-finite error (values too large for float arithmetic?); no "
        "figure reported for this head");
}

void add_error_head(ErrorBatch& b, const LayerData& layer, int kv_head, const EvalWindow& w,
                    const Selection& sel) {
  const MatrixF& K = layer.keys[kv_head];
  const MatrixF& V = layer.values[kv_head];
  const std::vector<const MatrixF*> queries = error_queries(layer, kv_head);
  if (b.kv_heads == 0) {
    b.n = w.n;
    b.d = static_cast<int>(K.cols());
    b.dv = static_cast<int>(V.cols());
    b.sink = w.sink;
    b.eval = w.eval;
    b.layer_id = layer.id.value();
  } else if (b.layer_id != layer.id.value()) {
    b.layer_id = 0;  // heads of different layers: nothing names them all
  }
  ++b.kv_heads;
  b.q_heads += static_cast<int>(queries.size());
  b.keys.push_back(K.data());
  b.values.push_back(V.data());
  for (const MatrixF* q : queries) b.queries.push_back(q->data());
  b.num_idx.push_back(sel.indices);
  b.num_logw.push_back(log_weights(sel.weights));
  b.den_idx.push_back(sel.separate ? sel.den_indices : sel.indices);
  b.den_logw.push_back(sel.separate ? log_weights(sel.den_weights) : b.num_logw.back());
}

std::vector<std::vector<QueryError>> run_error_batch(Backend& backend, ErrorBatch& b) {
  const size_t count = static_cast<size_t>(b.q_heads) * static_cast<size_t>(b.eval);
  std::vector<double> rel(count), nrm(count), mass(count);
  b.relative = rel.data();
  b.normalized = nrm.data();
  b.mass = mass.data();
  backend.attention_errors(b);
  b.relative = b.normalized = b.mass = nullptr;
  std::vector<std::vector<QueryError>> out(static_cast<size_t>(b.q_heads),
                                           std::vector<QueryError>(b.eval));
  for (size_t h = 0; h < out.size(); ++h)
    for (int e = 0; e < b.eval; ++e) {
      const size_t o = h * b.eval + e;
      out[h][e] = {b.n - b.eval + e, rel[o], nrm[o], mass[o]};
    }
  return out;
}

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

bool budget_free(const Method& method, Estimator estimator) {
  // The authors' estimator scales the denominator by 2^T, which depends on the ratio.
  return !method.depends_on_seed() && !method.depends_on_budget() &&
         estimator == Estimator::Weighted;
}

bool nothing_to_compress(const EvalWindow& w) {
  return w.budget >= w.n_mid;
}

Selection whole_middle(const EvalWindow& w) {
  Selection sel;
  for (int t = w.mid_begin; t < w.mid_end; ++t) sel.indices.push_back(t);
  sel.weights.assign(sel.indices.size(), 1.0);
  return sel;
}

Selection group_selection(const LayerData& layer, int num_layers, int kv_head,
                          const MethodSettings& s, const EvalWindow& w, uint64_t seed,
                          Backend* backend, const std::atomic<bool>* cancel, SharedWork& shared) {
  const Method& method = *s.method;
  MethodInput in = make_method_input(layer, num_layers, kv_head, w, s, seed);
  in.cancel = cancel;
  in.backend = backend;
  Selection sel;
  if (nothing_to_compress(w)) {
    sel = whole_middle(w);
  } else if (method.ranks_by_score()) {
    if (!shared.ranking) shared.ranking = method.rank(in);
    sel = method.ranked_selection(in, *shared.ranking);
  } else {
    sel = method.select(in);
  }
  check_selection(sel, w.mid_begin, w.mid_end, w.budget, method);
  if (s.estimator == Estimator::Authors) apply_authors_estimator(sel, s.keep_ratio);
  if (cancel && cancel->load()) throw Cancelled();
  return sel;
}

std::vector<std::string> method_refusals(const EvalSpec& spec, const CaptureInfo& info) {
  const size_t points = std::max<size_t>(1, spec.points.size());
  std::vector<std::string> out(points * spec.methods.size());
  for (size_t pt = 0; pt < points; ++pt)
    for (size_t m = 0; m < spec.methods.size(); ++m) {
      const Method& method = *spec.methods[m];
      const std::string why =
          method_unavailable(method, info, item_params(spec, method, static_cast<int>(pt)));
      if (!why.empty()) out[pt * spec.methods.size() + m] = method.name() + " " + why;
    }
  return out;
}

bool start_item(const LayerData& layer, const EvalSpec& spec, const WorkItem& it,
                const std::string& refusal, HeadEval& he, MethodSettings& settings) {
  const Method* method = spec.methods[it.method];
  he.method = method->name();
  he.ratio = spec.ratios[it.ratio];
  he.layer = spec.layers[it.layer];
  he.kv_head = spec.heads[it.head];
  he.point = it.point;
  if (!refusal.empty()) {
    he.refused = true;
    he.note = refusal;
    return false;
  }
  if (he.kv_head < static_cast<int>(layer.refused.size()) && !layer.refused[he.kv_head].empty()) {
    he.refused = true;
    he.note = layer.refused[he.kv_head];
    return false;
  }
  settings.method = method;
  settings.keep_ratio = he.ratio;
  settings.sink = spec.sink;
  settings.eval = spec.eval;
  settings.estimator = spec.estimator;
  settings.params = item_params(spec, *method, it.point);
  return true;
}

void add_seed_run(const EvalSpec& spec, const HeadRun& run, int r, const TokenHarm* harm,
                  HeadEval& he, SeedSums& sums) {
  if (he.note.empty()) he.note = run.selection.note;
  if (r == 0) {
    he.kept = static_cast<int>(run.selection.indices.size());
    he.budget = run.window.budget;
  }
  if (run.selection.saturation >= 0)
    he.saturation = (r == 0 ? 0.0 : he.saturation) + run.selection.saturation / spec.seeds;
  if (harm) {
    const HarmSplit split = harm_split(*harm, run.selection);
    sums.harm_kept += split.kept_sum;
    sums.harm_dropped += split.dropped_sum;
  }
  he.per_seed.push_back(run.mean_relative);
  sums.norm.push_back(run.mean_normalized);
  sums.mass.push_back(run.mean_mass);
  if (he.per_query.empty()) he.per_query.assign(run.window.eval, 0.0);
  for (const auto& head : run.per_query_head)
    for (int e = 0; e < run.window.eval; ++e) he.per_query[e] += head[e].relative;
  if (r == spec.seeds - 1)
    for (double& v : he.per_query) v /= static_cast<double>(spec.seeds * run.per_query_head.size());
}

void fail_item(HeadEval& he, const std::string& what) {
  he.error = what;
  he.per_seed.clear();
  he.per_query.clear();
}

void finish_item(const EvalSpec& spec, const SeedSums& sums, bool harm, HeadEval& he) {
  std::tie(he.mean, he.std) = mean_std(he.per_seed);
  he.normalized_mean = mean_std(sums.norm).first;
  he.mass_mean = mean_std(sums.mass).first;
  if (harm) {
    he.harm_kept = sums.harm_kept / spec.seeds;
    he.harm_dropped = sums.harm_dropped / spec.seeds;
  }
}

}  // namespace protocol_detail

using protocol_detail::check_head;

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
  Selection sel = protocol_detail::nothing_to_compress(w) ? protocol_detail::whole_middle(w)
                                                          : s.method->select(in);
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

using protocol_detail::all_items;
using protocol_detail::item_params;
using protocol_detail::SharedWork;
using protocol_detail::WorkGroup;
using protocol_detail::WorkItem;

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
  Selection sel = protocol_detail::group_selection(layer, num_layers, kv_head, s, w, seed, backend,
                                                   cancel, shared);
  HeadRun run = score_head_run(layer, kv_head, w, std::move(sel), backend, reference);
  if (protocol_detail::budget_free(method, s.estimator)) shared.budget_free_run = run;
  return run;
}

// Every item of a group over spec.seeds seeds. A seed-independent method runs once per ratio and
// that run counts for every seed (the figures are those of R identical runs, summed in the same
// order as before); a score-ranking method ranks once for all ratios.
void evaluate_group(const LayerData& layer, int num_layers, const EvalSpec& spec,
                    const WorkItem* items, size_t count, const std::string& refusal,
                    const std::atomic<bool>* cancel, Backend* backend,
                    const ExactReference* reference, const TokenHarm* harm, HeadEval* out,
                    const std::function<void()>& item_done) {
  SharedWork shared;
  for (size_t g = 0; g < count; ++g) {
    const Method* method = spec.methods[items[g].method];
    HeadEval& he = out[g];
    MethodSettings settings;
    if (protocol_detail::start_item(layer, spec, items[g], refusal, he, settings)) {
      protocol_detail::SeedSums sums;
      std::optional<HeadRun> seed_free_run;  // the one run of a seed-independent method
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
            protocol_detail::fail_item(he, e.what());
            break;
          }
          if (!method->depends_on_seed()) seed_free_run = std::move(fresh);
        }
        protocol_detail::add_seed_run(spec, seed_free_run ? *seed_free_run : fresh, r, harm, he,
                                      sums);
      }
      if (he.error.empty()) protocol_detail::finish_item(spec, sums, harm != nullptr, he);
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

namespace {

// Checks the whole spec against the capture before any work starts, naming the flag, and fills
// in what the spec leaves to the capture (ratios from budgets, every layer and head, the
// window at the first ratio).
void validate_spec(EvalReport& report, const CaptureInfo& info) {
  EvalSpec& spec = report.spec;
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
}

// The notes every report of this capture and spec carries (proxy queries, the methods it cannot
// run) and, per method, why it cannot (method_unavailable: one definition with the app's
// greyed-out methods and the CLI's choice of methods): such items are refused, saying why.
std::vector<std::string> note_refusals(EvalReport& report, const CaptureInfo& info) {
  const EvalSpec& spec = report.spec;
  report.proxy_queries = !info.has_queries;
  if (report.proxy_queries)
    report.notes.push_back(
        "the capture has no queries: errors use the keys as proxy queries (q_j = k_j)");
  std::vector<std::string> refusals = protocol_detail::method_refusals(spec, info);
  {
    std::vector<std::string> refused;
    for (const std::string& why : refusals)
      if (!why.empty() && std::find(refused.begin(), refused.end(), why) == refused.end())
        refused.push_back(why);
    if (!refused.empty()) report.notes.push_back("refused: " + join(refused, "; "));
  }
  return refusals;
}

// This shard's items: i, i+N, i+2N, ... of the canonical list.
std::vector<WorkItem> shard_items(const EvalSpec& spec) {
  const std::vector<WorkItem> items = all_items(spec);
  std::vector<WorkItem> mine;
  for (size_t i = spec.shard_index; i < items.size(); i += spec.shard_count)
    mine.push_back(items[i]);
  return mine;
}

// Adds to `columns` the columns the exact reference scores for one group's selections (all its
// ratios and seeds): the sinks and window plus the kept middle tokens of each run, run by run.
void add_kept_columns(const EvalSpec& spec, const EvalWindow& ew, const std::vector<WorkItem>& mine,
                      const WorkGroup& g, double& columns) {
  const WorkItem& first = mine[g.first];
  const Method& m = *spec.methods[first.method];
  const double fixed = ew.sink + ew.eval;
  if (protocol_detail::budget_free(m, spec.estimator)) {
    columns += fixed + ew.n_mid;
    return;
  }
  const int runs = m.depends_on_seed() ? spec.seeds : 1;
  for (size_t i = g.first; i < g.first + g.count; ++i)
    columns += runs * (fixed + spec.ratios[mine[i].ratio] * ew.n_mid);
}

// cached_reference for kv head `kv`, adding the seconds it spent building the exact side (when
// it did) to the report's cold work (EvalReport::exact_build_seconds), under `mu`.
std::unique_ptr<ExactReference> timed_reference(const LayerData& layer, int kv,
                                                const EvalWindow& w, bool want_logits,
                                                const std::atomic<bool>* cancel, std::mutex& mu,
                                                EvalReport& report) {
  double built_s = 0;
  auto ref = cached_reference(layer, kv, w.sink, w.eval, want_logits, cancel, nullptr, &built_s);
  if (built_s > 0) {
    std::lock_guard<std::mutex> lock(mu);
    report.exact_build_seconds += built_s;
    ++report.exact_builds;
  }
  return ref;
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
  const ReferenceCacheStats cache_before = ReferenceCache::global().stats();

  validate_spec(report, info);

  const std::vector<std::string> refusals = note_refusals(report, info);

  const std::vector<WorkItem> mine = shard_items(spec);
  report.results.resize(mine.size());

  const int total = static_cast<int>(mine.size());
  int threads = spec.threads > 0 ? spec.threads : hardware_threads();
  threads = std::max(1, std::min(threads, total));

  // Layer by layer (memory stays bounded by one layer). The unit of work is a group: the items
  // of one (kv head, point, method), so that a method ranks or runs once for all its ratios and
  // seeds. Groups are taken in head order; the exact reference of a kv head is taken from the
  // reference cache (engine/eval/reference_cache.h: built there once per capture, window and head)
  // by the first group that needs it and dropped when its last group is done, so only about
  // `threads` references (with any logits they hold) are alive at once.
  const bool cpu_scoring = !(backend && backend->parallel_in_one_call());
  std::mutex mu;  // guards done, progress calls and the exact sides' timings
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
    // Per-token harm of each kv head (spec.harm; engine/eval/token_harm.h), built by the first
    // group that needs it and dropped after its last, as the references are.
    struct HeadHarm {
      std::once_flag built;
      std::unique_ptr<TokenHarm> harm;
      std::atomic<int> users{0};
    };
    std::vector<HeadHarm> harms(spec.harm ? spec.heads.size() : 0);
    auto wants_harm = [&](const WorkGroup& g) {
      const WorkItem& it = mine[g.first];
      const int kv = spec.heads[it.head];
      return !harms.empty() && protocol_detail::item_refusal(refusals, spec, it).empty() &&
             !(kv < static_cast<int>(layer->refused.size()) && !layer->refused[kv].empty());
    };
    for (const WorkGroup& g : groups)
      if (wants_harm(g)) ++harms[mine[g.first].head].users;
    // The harm of group g's head, built by the first group that asks (null without spec.harm).
    auto harm_of = [&](const WorkGroup& g) -> const TokenHarm* {
      if (!wants_harm(g)) return nullptr;
      HeadHarm& hslot = harms[mine[g.first].head];
      std::call_once(hslot.built, [&] {
        const int kv = spec.heads[mine[g.first].head];
        hslot.harm = std::make_unique<TokenHarm>(
            token_harm(harm_queries(*layer, kv), layer->keys[kv], layer->values[kv],
                       report.window_example.sink, report.window_example.eval));
      });
      return hslot.harm.get();
    };
    if (!cpu_scoring) {
      // Every selection of the layer first, then one attention_errors call per (point, method,
      // ratio, seed) over all its kv heads (engine/eval/protocol_batched.cpp); the harms go with
      // the layer.
      protocol_detail::evaluate_layer_batched(
          *layer, info.num_layers, spec, mine, groups, refusals, threads, cancel, *backend,
          [&](size_t k) { return harm_of(groups[k]); }, report.results.data(), item_done);
      begin = end;
      continue;
    }
    auto uses_reference = [&](const WorkGroup& g) {
      const WorkItem& it = mine[g.first];
      const int kv = spec.heads[it.head];
      return cpu_scoring && protocol_detail::item_refusal(refusals, spec, it).empty() &&
             !(kv < static_cast<int>(layer->refused.size()) && !layer->refused[kv].empty());
    };
    // Held logits of every key pay when the selections a head scores keep more columns in all
    // than it has keys (docs/performance.md, "Exact reference cache").
    const EvalWindow& ew = report.window_example;
    std::vector<double> columns(spec.heads.size(), 0.0);
    for (const WorkGroup& g : groups) {
      if (!uses_reference(g)) continue;
      ++refs[mine[g.first].head].users;
      add_kept_columns(spec, ew, mine, g, columns[mine[g.first].head]);
    }
    parallel_for(static_cast<int>(groups.size()), threads, cancel, [&](int k) {
      const WorkGroup& g = groups[k];
      const WorkItem& first = mine[g.first];
      const ExactReference* ref = nullptr;
      HeadReference* slot = uses_reference(g) ? &refs[first.head] : nullptr;
      if (slot) {
        std::call_once(slot->built, [&] {
          slot->ref = timed_reference(*layer, spec.heads[first.head], ew,
                                      columns[first.head] > ew.n, cancel, mu, report);
        });
        ref = slot->ref.get();
      }
      const TokenHarm* harm = harm_of(g);
      HeadHarm* hslot = harm ? &harms[first.head] : nullptr;
      evaluate_group(*layer, info.num_layers, spec, &mine[g.first], g.count,
                     protocol_detail::item_refusal(refusals, spec, first), cancel, backend, ref,
                     harm, &report.results[g.first], item_done);
      if (hslot && --hslot->users == 0) hslot->harm.reset();
      if (slot && --slot->users == 0) slot->ref.reset();
    });
    begin = end;
  }
  if (cancel && cancel->load()) throw Cancelled();
  // A stored exact reference that failed its checksum was rebuilt (the figures are the cold
  // ones); say so, since it means the cache folder's disk changed files under it.
  const ReferenceCacheStats cache_after = ReferenceCache::global().stats();
  if (const long long bad = cache_after.disk_rejected - cache_before.disk_rejected; bad > 0)
    report.notes.push_back(std::to_string(bad) +
                           " stored exact reference(s) did not verify and were computed again "
                           "(last: " +
                           cache_after.last_rejected + ")");
  return report;
}

}  // namespace kvscope
