// make_method_input and check_method_input (engine/methods/method.h): what a method is given, made
// and checked in one place.
#include <string>

#include "engine/attention/exact_attention.h"
#include "engine/core/error.h"
#include "engine/io/capture.h"
#include "engine/methods/method.h"

namespace kvscope {

MethodInput make_method_input(const LayerData& layer, int num_layers, int kv_head,
                              const EvalWindow& w, const ParamValues& params, uint64_t seed) {
  if (kv_head < 0 || kv_head >= static_cast<int>(layer.keys.size()))
    throw InputError("kv head " + std::to_string(kv_head) + " out of range: layer " +
                     std::to_string(layer.layer) + " has " + std::to_string(layer.keys.size()) +
                     " kv heads");
  MethodInput in;
  in.keys = &layer.keys[kv_head];
  in.values = &layer.values[kv_head];
  if (!layer.queries.empty()) in.queries = reference_queries(layer, kv_head);
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

void check_method_input(const MethodInput& in, const std::string& method, bool needs_queries) {
  const std::string who = method + ": ";
  if (!in.keys || !in.values) throw InputError(who + "no keys/values given");
  if (in.n <= 0) throw InputError(who + "empty head (n = " + std::to_string(in.n) + ")");
  if (in.keys->rows() != in.n || in.values->rows() != in.n)
    throw InputError(who + "keys have " + std::to_string(in.keys->rows()) + " rows and values " +
                     std::to_string(in.values->rows()) + ", expected n = " + std::to_string(in.n));
  if (in.mid_begin < 0 || in.mid_begin > in.mid_end || in.mid_end > in.n)
    throw InputError(who + "middle [" + std::to_string(in.mid_begin) + ", " +
                     std::to_string(in.mid_end) + ") is not inside [0, " + std::to_string(in.n) +
                     ")");
  // The loader refuses NaN/Inf heads; hand-built inputs get the same clear refusal here instead
  // of NaN scores or clusterings that never meet their budget.
  if (!in.keys->allFinite())
    throw InputError(who + "layer " + std::to_string(in.layer) + " kv head " +
                     std::to_string(in.kv_head) + ": keys contain NaN or Inf");
  if (!in.values->allFinite())
    throw InputError(who + "layer " + std::to_string(in.layer) + " kv head " +
                     std::to_string(in.kv_head) + ": values contain NaN or Inf");
  const int n_mid = in.mid_end - in.mid_begin;
  if (in.budget < 0 || in.budget > n_mid)
    throw InputError(who + "budget m = " + std::to_string(in.budget) + " is outside [0, " +
                     std::to_string(n_mid) + "] (the middle's length)");
  if (!needs_queries) return;
  if (in.queries.empty())
    throw InputError(who + "needs the capture's queries (tensors layers." +
                     std::to_string(in.layer) +
                     ".query), but this capture has none; capture with queries or pick a "
                     "method that does not need them");
  for (const MatrixF* q : in.queries) {
    if (!q) throw InputError(who + "a query head of the group is missing");
    if (q->rows() != in.n || q->cols() != in.keys->cols())
      throw InputError(who + "query head has shape " + std::to_string(q->rows()) + " x " +
                       std::to_string(q->cols()) + ", expected " + std::to_string(in.n) + " x " +
                       std::to_string(in.keys->cols()) + " like the keys");
    if (!q->allFinite())
      throw InputError(who + "layer " + std::to_string(in.layer) + ": a query head of kv head " +
                       std::to_string(in.kv_head) + " contains NaN or Inf");
  }
}

}  // namespace kvscope
