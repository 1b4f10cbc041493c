// What compression does to the output (docs/generate.md): a llama2.c model runs a prompt with the
// full cache up to position N, then every layer's and kv head's cache is compressed by a method
// at a keep ratio (the protocol's sinks and most recent window kept, the method's weights
// entering attention as log w) and the model goes on, optionally re-compressing every K new
// tokens. Measured against the exact-cache run: top-1 agreement and KL divergence of the
// next-token distributions per step (teacher-forced on the exact run's tokens), the greedy
// continuation itself, and the perplexity of a given continuation.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/methods/method.h"
#include "engine/model/llama2c.h"

namespace kvscope {

struct GenerateSpec {
  std::string prompt;
  std::vector<const Method*> methods;
  std::vector<double> ratios{0.25};
  // Token budgets (the budget setting): when not empty they replace `ratios`, and the middle keeps
  // exactly B entries at every compression (the cache holds s + B + W; docs/generate.md). The
  // runs' ratios are then B / (N - s - W), the same m at the first compression.
  std::vector<int> budgets;
  std::map<std::string, ParamValues> params;  // by method name
  // N: positions [0, N) run with the full cache (prompt forced, then greedy); the token at
  // position N is predicted before compression and shared by every run. 0: the prompt's length
  // (BOS included).
  int compress_at = 0;
  int steps = 64;              // tokens generated after compression (positions N+1 .. N+steps)
  int recompress_every = 0;    // 0: compress once; K > 0: again after every K new positions
  int sink = -1, window = -1;  // -1: the protocol's defaults for n = N (s = N/32, E = N/8)
  uint64_t seed = 0;           // passed to the methods (random ones: uniform, subgen, balancekv)
  bool has_continuation = false;
  std::string continuation;  // text following the prompt verbatim (perplexity run)
  int threads = 1;           // runs (method, ratio) in parallel; 0: hardware concurrency
};

// One method at one ratio.
struct GenerateRun {
  std::string method;
  double ratio = 0;
  int budget = -1;  // the token budget it ran with (GenerateSpec::budgets), -1: by ratio
  // Teacher-forced on the exact run's tokens, per step t = 0 .. steps-1 (the forward pass at
  // position N + t): the compressed cache's top-1 token and KL(exact || compressed) in nats.
  std::vector<int> top1;
  std::vector<double> kl;
  double top1_agreement = 0;  // fraction of steps whose top-1 equals the exact run's
  double mean_kl = 0;
  // Free-running greedy continuation with the compressed cache (positions N+1 .. N+steps).
  std::vector<int> tokens;
  std::vector<std::string> text;
  int first_divergence = -1;  // first step whose token differs from the exact run's (-1: none)
  // Perplexity of the continuation's scored tokens (GenerateReport::scored_tokens), teacher
  // forced, compressed at N the same way; NaN without a continuation.
  double perplexity = 0;
  double mean_cache_entries = 0;  // cache entries per kv head at the last step (mean)
  int compressions = 0;           // compressions per kv head in the free-running pass
  std::string note;               // the method's notes (once)
};

struct GenerateReport {
  std::string model, tokenizer;
  llama2c::Config config;
  GenerateSpec spec;  // as run (compress_at resolved)
  int sink = 0, window = 0;
  std::vector<int> prefix_tokens;  // positions 0 .. N (BOS, prompt, greedy up to N)
  std::vector<std::string> prefix_text;
  int prompt_tokens = 0;  // BOS + encoded prompt
  // The exact-cache greedy continuation (positions N+1 .. N+steps) and its argmax per step.
  std::vector<int> exact_tokens;
  std::vector<std::string> exact_text;
  // Continuation run: its tokens (prompt + continuation), the positions scored, the exact cache's
  // perplexity on them.
  std::vector<int> continuation_tokens;
  int scored_from = 0;  // first position whose token is scored
  int scored_tokens = 0;
  double exact_perplexity = 0;
  bool continuation_truncated = false;
  std::vector<GenerateRun> runs;  // method-major, then ratio (spec order)
  std::vector<std::string> notes;

  nlohmann::json to_json() const;
  const GenerateRun* find(const std::string& method, double ratio) const;
};

// Called from worker threads (serialised) as work finishes: done and total forward passes.
using GenerateProgressFn = std::function<void(long long done, long long total)>;

// Runs the whole experiment. `model` is copied for each run (weights shared). Throws InputError
// naming the flag for bad specs (no methods, ratio outside (0, 1], N outside the context, N +
// steps past the context, window that does not fit N), Cancelled when `cancel` is set.
GenerateReport run_generate(const llama2c::Transformer& model, const llama2c::Tokenizer& tokenizer,
                            const GenerateSpec& spec, const GenerateProgressFn& progress = {},
                            const std::atomic<bool>* cancel = nullptr);

// Building block (exposed for tests and the benchmark): compresses every (layer, kv head) of
// `model`'s current cache (positions [0, model.positions())) with `method` so that the middle
// keeps round(ratio * (positions - sink - window)) entries. A model already compressed is
// compressed again over its current entries (weights compose: old w times new w). `round` varies
// the methods' seed between re-compressions. `budget_tokens` >= 0 keeps that many middle entries
// instead (at most the middle's), whatever the ratio. Returns the methods' notes (deduplicated).
std::string compress_cache(llama2c::Transformer& model, const Method& method, double ratio,
                           const ParamValues& params, int sink, int window, uint64_t seed,
                           int round = 0, int budget_tokens = -1);

// KL(p || q) in nats between softmax(p_logits) and softmax(q_logits), in double.
double kl_divergence(const std::vector<float>& p_logits, const std::vector<float>& q_logits);
// log softmax(logits)[token], in double.
double log_probability(const std::vector<float>& logits, int token);

}  // namespace kvscope
