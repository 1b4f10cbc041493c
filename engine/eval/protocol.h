// The evaluation protocol (docs/evaluation.md): sinks, middle, evaluation window, keep ratio,
// seeds, GQA groups; per head and summarised. Reductions are double precision.
#pragma once

#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/attention/eval_window.h"
#include "engine/attention/exact_attention.h"
#include "engine/io/capture.h"
#include "engine/methods/method.h"

namespace kvscope {

// Token budgets (docs/evaluation.md, "Budgets"). One rule: a budget of B tokens is the number of
// middle tokens a method keeps, m = B, exactly as a keep ratio r gives m = round(r * n_mid); the
// s sinks and the E evaluation positions are the protocol's and come on top for every method (the
// cache holds s + B + E entries). A budget is run as the keep ratio B / n_mid, which gives
// m = B exactly. Throws SettingError naming the setting "budget" (CLI: --budget) when B is
// below 1 or above the middle n_mid of the window (n, sink_override, eval_override).
std::vector<double> ratios_for_budgets(const std::vector<int>& budgets, int n, int sink_override,
                                       int eval_override);

// kvpress's usual compression ratios 0.25, 0.5, 0.75, 0.875 (kvpress counts the fraction
// removed) as KVScope's keep ratios: 0.75, 0.5, 0.25, 0.125 (docs/evaluation.md). The preset's
// name, "kvpress", is accepted wherever a list of keep ratios is (parse_ratio_preset).
const std::vector<double>& kvpress_keep_ratios();
// The keep ratios of a named preset ("kvpress", "protocol": 0.5, 0.25, 0.125, 0.0625), or
// nullptr when `name` names none.
const std::vector<double>* parse_ratio_preset(const std::string& name);

// How a selection is scored. Weighted: numerator and denominator both use the method's weights
// w (docs/evaluation.md). Authors: the BalanceKV authors' notebook and forward pass, numerator
// weight w and denominator weight 2^T on every kept token, T = ceil(log2(1/keep_ratio)) (their
// rounds).
enum class Estimator { Weighted, Authors };
const char* estimator_name(Estimator e);          // "weighted" | "authors"
Estimator parse_estimator(const std::string& s);  // throws InputError naming --estimator
// Rewrites `sel` for the authors' estimator: the denominator set becomes the numerator's kept
// tokens, each with weight 2^T.
void apply_authors_estimator(Selection& sel, double keep_ratio);

// Everything that picks how one method runs.
struct MethodSettings {
  const Method* method = nullptr;
  double keep_ratio = 0.5;
  ParamValues params;
  int sink = -1, eval = -1;  // overrides, -1 = protocol default
  Estimator estimator = Estimator::Weighted;
};

// One method on one kv head for one seed: its selection and the errors of every evaluation query
// of every query head in the group.
struct HeadRun {
  EvalWindow window;
  Selection selection;
  std::vector<std::vector<QueryError>> per_query_head;  // [group head][E]
  double mean_relative = 0;                             // over group heads and queries
  double mean_normalized = 0;
  double mean_mass = 0;
};

// make_method_input (engine/methods/method.h) with the settings' parameters.
MethodInput make_method_input(const LayerData& layer, int num_layers, int kv_head,
                              const EvalWindow& w, const MethodSettings& s, uint64_t seed);
HeadRun run_head(const LayerData& layer, int num_layers, int kv_head, const MethodSettings& s,
                 uint64_t seed, bool want_trace = false, Backend* backend = nullptr,
                 const std::atomic<bool>* cancel = nullptr);

// Result of one (method, ratio, layer, kv head) over R seeds.
struct HeadEval {
  std::string method;
  double ratio = 0;
  int layer = 0, kv_head = 0;
  double mean = 0, std = 0;  // relative error: mean/std over seeds of the seed means
  double normalized_mean = 0, mass_mean = 0;
  std::vector<double> per_seed;   // seed means
  std::vector<double> per_query;  // [E] relative error by query position (over heads, seeds)
  std::string note;
  int kept = 0, budget = 0;  // tokens of the middle the method kept (first seed) vs the budget m
  double saturation = -1;    // walks: mean over seeds of Selection::saturation; -1 otherwise
  bool refused = false;      // head refused (NaN/Inf) or method not applicable
  std::string error;         // non-empty when the method threw (what it said)
  // Why a method loses, per token (EvalSpec::harm; engine/eval/token_harm.h): the harm of the
  // middle tokens the method kept and of those it dropped (harm_split's kept_sum and dropped_sum, a
  // token in the numerator or denominator set counting as kept), mean over seeds; NaN when not
  // computed.
  double harm_kept = std::numeric_limits<double>::quiet_NaN();
  double harm_dropped = std::numeric_limits<double>::quiet_NaN();
  bool has_harm() const { return !std::isnan(harm_kept); }
  int point = 0;  // EvalSpec::points: which point this result is of (0 without points)
};

// Limits on a spec (CLI flags and eval reports read back by merge), named in the errors.
constexpr int kMaxShards = 100000;
constexpr int kMaxSeeds = 100000;

struct EvalSpec {
  std::vector<const Method*> methods;
  std::vector<double> ratios{0.5, 0.25, 0.125, 0.0625};
  // Token budgets (--budget): when not empty, run_eval replaces `ratios` by B / n_mid for each
  // budget B (ratios_for_budgets), so every method keeps exactly B middle tokens.
  std::vector<int> budgets;
  int seeds = 10;
  uint64_t base_seed = 0;
  std::vector<int> layers;                    // empty: all
  std::vector<int> heads;                     // kv heads, empty: all
  std::map<std::string, ParamValues> params;  // by method name
  int sink = -1, eval = -1;
  int shard_index = 0, shard_count = 1;  // --shard i/N: this process runs work items i, i+N, ...
  int threads = 0;                       // 0: hardware concurrency
  Estimator estimator = Estimator::Weighted;  // --estimator
  // Also split each head's per-token harm (engine/eval/token_harm.h) into kept and dropped for
  // every result (HeadEval::harm_kept / harm_dropped): one token_harm per kv head, about as much
  // work as the head's exact reference.
  bool harm = false;
  // A sweep of one method's parameters as one run (kvscope-cli sweep, sweep --grid2, the Error
  // view's tuning heatmap): when not empty, `methods` holds exactly one method and each point is
  // evaluated as its own variant of it, with that method's `params` overlaid by the point; every
  // HeadEval carries its point's index. One pass serves all points: each layer is loaded once and
  // each head's exact reference (with the logits of every key when the points' selections keep
  // more columns in all than the head has) is shared by every point (docs/performance.md, "The
  // sweep as one run"). EvalReport::split_points() gives the report of each point.
  std::vector<ParamValues> points;
};

struct EvalSummary {
  std::string method;
  double ratio = 0;
  double mean = 0, std = 0;  // mean over heads of head means; std over seeds of the mean over heads
  int heads = 0;
  // With EvalSpec::harm: the mean over heads of HeadEval::harm_kept / harm_dropped, and the mean
  // over heads of the dropped share harm_dropped / (harm_kept + harm_dropped). NaN otherwise.
  double harm_kept = std::numeric_limits<double>::quiet_NaN();
  double harm_dropped = std::numeric_limits<double>::quiet_NaN();
  double harm_dropped_share = std::numeric_limits<double>::quiet_NaN();
};

struct EvalReport {
  std::string capture_path;
  CaptureInfo info;
  EvalSpec spec;
  EvalWindow window_example;  // the window at the first ratio (for printing s and E)
  std::vector<HeadEval> results;
  // The capture has no queries: errors use the keys as proxy queries (and say so in notes).
  bool proxy_queries = false;
  std::vector<std::string> notes;  // shown once to users: proxy queries, refused methods
  // The seconds this call's threads spent building exact sides (summed over threads; 0 for
  // sides found in the reference cache, in memory or on disk, and for a device's batched path)
  // and how many it built: cold work, which the app's cost model keeps apart from scoring
  // (docs/app.md, "Estimates"). Not part of the report's JSON: timings are not figures.
  double exact_build_seconds = 0;
  int exact_builds = 0;
  std::vector<EvalSummary> summary() const;
  // One line per method that threw on some work items (how many, and the first message).
  std::vector<std::string> failures() const;
  // The report of each of spec.points (in order): its results (in canonical order), its spec
  // with the point overlaid on the method's params and no points, as a run of that point alone
  // would give. A report without points gives itself.
  std::vector<EvalReport> split_points() const;
  // A report with spec.points is written by point (split_points()); to_json throws
  // std::logic_error on it.
  nlohmann::json to_json() const;
  static EvalReport from_json(const nlohmann::json& j);  // throws InputError
  // The CSV form: one row per (method, ratio, layer, kv head), numbers to 17 digits.
  static std::string csv_header();  // "method,ratio,...,error\n"
  std::string csv_rows() const;
};

// Why `method` with `params` cannot run on a capture described by `info` ("" when it can): it
// needs queries and the capture has none, it needs RoPE's theta and layout and the capture does
// not say them (CaptureInfo::rope.missing), or it needs the output projection W_O, which captures
// do not carry. What a method needs is its own self-description (Method::needs_queries,
// needs_rope, needs_output_projection); this is the one place it is checked against a capture:
// the app greys such methods out with this reason, run_eval refuses their work items with it
// (HeadEval::refused, a report note), and the CLI leaves them out of `all` or refuses them by
// name (runnable_methods, require_runnable).
std::string method_unavailable(const Method& method, const CaptureInfo& info,
                               const ParamValues& params = {});

// The methods of `methods` that can run on a capture described by `info`, each with its
// parameters in `params` (method_unavailable). Each one left out is appended to `left_out` as
// "<name> (<why>)".
std::vector<const Method*> runnable_methods(const std::vector<const Method*>& methods,
                                            const CaptureInfo& info,
                                            const std::map<std::string, ParamValues>& params,
                                            std::vector<std::string>& left_out);

// Throws SettingError for setting `setting` (flag `flag`) naming the first method of `methods`
// that cannot run on a capture described by `info` with its parameters in `params`, and why: a
// method asked for by name is an error in the request, not something to leave out quietly.
void require_runnable(const std::vector<const Method*>& methods, const CaptureInfo& info,
                      const std::map<std::string, ParamValues>& params, const std::string& setting,
                      const std::string& flag);

// validate_method_params (the parameters of a method): engine/methods/method.h.

// Called from worker threads (never two at once) after each finished work item.
using ProgressFn = std::function<void(int done, int total)>;

// Every (method, ratio, layer, kv head) work item of this shard over spec.seeds seeds, layer by
// layer on spec.threads threads; results in canonical order (layer, kv head, method, ratio) and
// identical for any thread count. Bad specs throw InputError naming the flag before any work; a
// method that throws is recorded in its HeadEval::error (see failures()); a set cancel flag
// throws Cancelled. On the CPU the exact side of each kv head is computed once per capture and
// window (the reference cache, engine/eval/reference_cache.h) and shared by all its items and every
// later run. A backend that parallelises inside one call (a GPU) scores through
// Backend::attention_errors, all kv heads of a layer in one call per (point, method, ratio, seed):
// each seed's selections of the layer are made first (engine/eval/protocol_batched.cpp).
EvalReport run_eval(CaptureFile& capture, const EvalSpec& spec, const ProgressFn& progress = {},
                    const std::atomic<bool>* cancel = nullptr, Backend* backend = nullptr);

// Combines shard reports of the same spec exactly; throws InputError on mismatch or overlap.
EvalReport merge_reports(const std::vector<EvalReport>& parts);

}  // namespace kvscope
