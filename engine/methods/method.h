// The interface every compression method implements (docs/methods.md), and the registry.
// A method sees one kv head of one layer and returns a weighted selection of the middle.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/attention/eval_window.h"
#include "engine/attention/selection.h"
#include "engine/core/rope.h"
#include "engine/core/tensor.h"

namespace kvscope {

class Backend;
struct LayerData;

// Parameters are data: the CLI (--param method.name=value) and the GUI list and edit them
// without knowing the method.
struct ParamSpec {
  enum class Type { Int, Float, Bool, Choice };
  std::string name;
  Type type = Type::Float;
  double min = 0, max = 1, default_value = 0;
  std::string help;
  std::vector<std::string> choices;  // for Choice: value is the index
  bool log_scale = false;            // hint for sliders
};
using ParamValues = std::map<std::string, double>;

// Value of `name`: from `values` when present, else the spec default. Throws InputError for an
// unknown name.
double param_value(const std::vector<ParamSpec>& specs, const ParamValues& values,
                   const std::string& name);

// The spec of `name` in `specs`. Throws InputError "<method>: unknown parameter '<name>' (known:
// <the names in specs>)" when there is none.
const ParamSpec& find_param_spec(const std::vector<ParamSpec>& specs, const std::string& name,
                                 const std::string& method);

// The one parameter validator (run_eval, the sweep, theory, generate, every method's run, the CLI
// and the app's session reader call it): each of `values` must have a spec in `specs`, be a
// finite number, a whole number unless the spec is Float, and lie in [min, max] (Bool: [0, 1];
// Choice: [0, choices - 1]). Throws SettingError naming the setting "<method>.<name>" (the CLI
// shows it as "--param <method>.<name>").
void validate_params(const std::vector<ParamSpec>& specs, const ParamValues& values,
                     const std::string& method);

struct MethodInput {
  const MatrixF* keys = nullptr;        // n x d, all tokens of this kv head
  const MatrixF* values = nullptr;      // n x d_v
  std::vector<const MatrixF*> queries;  // the GQA group's query heads (n x d each), may be empty
  int n = 0;
  int sink = 0;       // s: tokens [0, s) always kept
  int eval = 0;       // E: tokens [n-E, n) are the evaluation queries, kept as they arrive
  int mid_begin = 0;  // = sink
  int mid_end = 0;    // = n - eval
  int budget = 0;     // m: how many middle tokens to keep
  double keep_ratio = 0.5;
  int layer = 0, num_layers = 1, kv_head = 0;
  uint64_t seed = 0;
  ParamValues params;
  bool want_trace = false;
  int trace_query = -1;  // query position used in walk traces (-1: last)
  const std::atomic<bool>* cancel = nullptr;
  Backend* backend = nullptr;  // nullptr: CPU
  RopeInfo rope;  // how keys and queries were rotated (the capture's; engine/core/rope.h)
  // The whole layer (every kv head), for methods whose selection of one head depends on the
  // others (Method::needs_layer). Set by make_method_input (engine/eval/protocol.h); nullptr where
  // a caller builds a MethodInput by hand, and then such methods refuse.
  const LayerData* layer_data = nullptr;
  // The token position of each row, where rows are not tokens 0..n-1 (a compressed cache being
  // compressed again, engine/model/generate.cpp); nullptr: row t is at position t. Methods that
  // undo RoPE rotate by these positions.
  const std::vector<int>* positions = nullptr;
};

// The MethodInput of kv head `kv_head` (keys, values, its GQA group's queries when the capture
// has them) over window `w`, with `params`; want_trace, trace_query, cancel and backend are left
// at their defaults. Throws InputError when kv_head is out of range.
MethodInput make_method_input(const LayerData& layer, int num_layers, int kv_head,
                              const EvalWindow& w, const ParamValues& params, uint64_t seed);

// The one check of a MethodInput every method that reads the head runs: keys/values present
// with n > 0 rows, all finite, 0 <= mid_begin <= mid_end <= n, 0 <= budget <= n_mid, and (when
// `needs_queries`) at least one query head of n rows, the keys' width and finite. Throws
// InputError naming the method and the problem.
void check_method_input(const MethodInput& in, const std::string& method, bool needs_queries);

// A score-ranking method's ordering of the middle (see Method::ranks_by_score).
struct Ranking {
  std::vector<int> order;     // every middle position (token - mid_begin), best first
  std::vector<double> hover;  // Selection::middle_scores of every selection taken from it
  // The scores ranked (larger first, indexed like hover), where the method has them
  // (rank_by_scores fills it): what wrappers compare across heads (adakv, chunkkv).
  std::vector<double> scores;
  // Layer-level wrappers (adakv): the scores of every kv head of the layer, [kv head][middle].
  std::vector<std::vector<double>> layer_scores;
};

class Method {
 public:
  virtual ~Method() = default;
  virtual std::string name() const = 0;     // e.g. "balancekv"
  virtual std::string summary() const = 0;  // one line
  virtual std::vector<ParamSpec> params() const { return {}; }
  virtual bool needs_queries() const { return false; }
  // Whether the selection stays within MethodInput::budget (checked by the protocol). Only the
  // uncompressed reference "exact" says no.
  virtual bool respects_budget() const { return true; }
  virtual Selection select(const MethodInput& in) const = 0;

  // What a selection depends on, so the protocol does no work twice. A method whose selection is
  // the same for every MethodInput::seed says false here: the protocol runs it once per (head,
  // ratio) and counts that run for every seed. One that ignores MethodInput::budget (and
  // keep_ratio) says false to depends_on_budget: it runs once per head.
  virtual bool depends_on_seed() const { return true; }
  virtual bool depends_on_budget() const { return true; }
  // Score-ranking methods keep a prefix of one ordering of the middle that depends on neither
  // the seed nor the budget (the top m of a fixed score, ties to the lower index, weight 1).
  // For them the protocol calls rank() once per head and ranked_selection() for every ratio;
  // select(in) must be ranked_selection(in, rank(in)) (each of them implements it so).
  virtual bool ranks_by_score() const { return false; }
  // Whether rank() also fills Ranking::scores, which the wrappers (adakv, chunkkv, criticalkv)
  // compare across heads or rescale: streaming ranks by position alone and cannot be wrapped.
  virtual bool ranks_with_scores() const { return ranks_by_score(); }
  // Whether one head's selection depends on the other kv heads of the layer (kvpress's adakv
  // and chunkkv wrappers): such a method reads MethodInput::layer_data and refuses without it.
  // The protocol still runs it head by head; it scores the other heads itself.
  virtual bool needs_layer() const { return false; }
  // What a capture must carry for the method to run (method_unavailable in engine/eval/protocol.h
  // says why one cannot, for the app's method lists): RoPE's theta and layout, for methods that
  // rotate keys or queries back to before RoPE (expected-attention, compactor; wrappers ask their
  // inner method); each query head's output projection W_O, which no capture carries today, with
  // the method's parameters since a method may do without it when asked (criticalkv's projection).
  virtual bool needs_rope() const { return false; }
  virtual bool needs_output_projection(const ParamValues& /*params*/) const { return false; }
  // Whether select() records a walk (Selection::trace) when MethodInput::want_trace asks: the
  // Walk view replays only such methods.
  virtual bool produces_trace() const { return false; }
  virtual Ranking rank(const MethodInput& in) const;
  virtual Selection ranked_selection(const MethodInput& in, const Ranking& ranking) const;
};

// validate_params against the method's own specs, named by the method.
inline void validate_method_params(const Method& method, const ParamValues& values) {
  validate_params(method.params(), values, method.name());
}

// A score-ranking method (ranks_by_score) whose selection is the first `budget` positions of its
// ranking, weight 1 (prefix_selection, engine/methods/scoring.h): it implements rank() only.
class ScoreRankingMethod : public Method {
 public:
  bool ranks_by_score() const override { return true; }
  Selection select(const MethodInput& in) const override { return ranked_selection(in, rank(in)); }
  Selection ranked_selection(const MethodInput& in, const Ranking& r) const override;
};

// Every method the engine has, in display order: the methods of engine/methods/ and the
// wrapped ones `--methods all` runs (adakv(snapkv), adakv(expected-attention)).
const std::vector<const Method*>& all_methods();
// Adds a method after the others, as if its factory were in engine/methods/registry.cpp's list:
// from then on find_method, all_methods (so `--methods all`, the CLI's list of known methods,
// run_eval and the app's method combos) and the wrappers know it. For plugins and tests; call it
// before any thread reads the lists. Throws std::invalid_argument for a name already taken or
// one that is not a plain name.
void register_method(std::unique_ptr<Method> method);
// nullptr when unknown. Besides the names of all_methods(), a wrapper around a score-ranking
// method, "adakv(snapkv)", "chunkkv(knorm)", "criticalkv(expected-attention)" (wrapper_names()),
// is made on first use and lives as long as the program (nullptr when the inner method is
// unknown or does not rank by score; parse_method_list says which).
const Method* find_method(const std::string& name);
// The wrappers find_method understands, in display order.
const std::vector<std::string>& wrapper_names();
// Parses "a,b,c" or "all"; throws InputError naming the unknown method.
std::vector<const Method*> parse_method_list(const std::string& list);

}  // namespace kvscope
