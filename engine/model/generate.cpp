// Compressed-cache generation (docs/generate.md). The model keeps every key and value; a
// CompressedCache on the Transformer decides which entries attention reads and with which log
// weights, so a run branches from the exact run at position N by copying the model and
// compressing the copy.
#include "engine/model/generate.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>

#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/eval/protocol.h"
#include "engine/eval/selection_check.h"

namespace kvscope {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::string fmt(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

int argmax(const std::vector<float>& logits) {
  return static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// log-sum-exp of the logits, in double.
double log_normaliser(const std::vector<float>& logits) {
  double shift = -std::numeric_limits<double>::infinity();
  for (float v : logits) shift = std::max(shift, static_cast<double>(v));
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - shift);
  return shift + std::log(sum);
}

// The entries attention currently reads for (layer, kv head): the compressed ones, then every
// position run since.
llama2c::CompressedHead current_entries(const llama2c::Transformer& model, int layer, int kv) {
  llama2c::CompressedHead h;
  int from = 0;
  if (model.is_compressed()) {
    h = model.compressed_cache().heads[layer][kv];
    from = model.compressed_cache().covered;
  }
  for (int p = from; p < model.positions(); ++p) {
    h.positions.push_back(p);
    h.num_logw.push_back(0.0f);
    h.den_logw.push_back(0.0f);
  }
  return h;
}

double mean_cache_entries(const llama2c::Transformer& model) {
  const llama2c::Config& c = model.config();
  if (!model.is_compressed()) return model.positions();
  const llama2c::CompressedCache& cache = model.compressed_cache();
  double total = 0;
  for (const auto& layer : cache.heads)
    for (const auto& head : layer) total += static_cast<double>(head.positions.size());
  return total / (c.n_layers * c.n_kv_heads) + (model.positions() - cache.covered);
}

}  // namespace

double kl_divergence(const std::vector<float>& p_logits, const std::vector<float>& q_logits) {
  if (p_logits.size() != q_logits.size())
    throw std::invalid_argument("kl_divergence: logits of different sizes");
  const double lp = log_normaliser(p_logits), lq = log_normaliser(q_logits);
  double kl = 0;
  for (size_t i = 0; i < p_logits.size(); ++i) {
    const double log_p = p_logits[i] - lp, log_q = q_logits[i] - lq;
    kl += std::exp(log_p) * (log_p - log_q);
  }
  return std::max(kl, 0.0);  // rounding can leave -1e-17 for identical distributions
}

double log_probability(const std::vector<float>& logits, int token) {
  return static_cast<double>(logits.at(token)) - log_normaliser(logits);
}

std::string compress_cache(llama2c::Transformer& model, const Method& method, double ratio,
                           const ParamValues& params, int sink, int window, uint64_t seed,
                           int round, int budget_tokens) {
  const llama2c::Config& c = model.config();
  const int hs = c.head_size(), group = c.kv_group();
  const int positions = model.positions();
  llama2c::CompressedCache next;
  next.covered = positions;
  next.heads.assign(c.n_layers, std::vector<llama2c::CompressedHead>(c.n_kv_heads));
  std::set<std::string> notes;
  for (int l = 0; l < c.n_layers; ++l) {
    for (int kv = 0; kv < c.n_kv_heads; ++kv) {
      llama2c::CompressedHead cur = current_entries(model, l, kv);
      llama2c::CompressedHead& out = next.heads[l][kv];
      const int n = static_cast<int>(cur.positions.size());
      const int n_mid = n - sink - window;
      if (n_mid <= 0) {  // nothing between the sinks and the window yet
        out = std::move(cur);
        continue;
      }
      // The middle keeps the ratio of the positions it stands for, not of its current entries,
      // so re-compressing holds the cache at about sink + window + ratio * (positions - both).
      // A token budget holds it at sink + window + budget_tokens.
      const int budget =
          budget_tokens >= 0
              ? std::min(n_mid, budget_tokens)
              : std::min<int>(n_mid,
                              static_cast<int>(std::llround(ratio * (positions - sink - window))));
      MatrixF keys(n, hs), values(n, hs);
      std::vector<MatrixF> queries(group, MatrixF(n, hs));
      for (int i = 0; i < n; ++i) {
        const int p = cur.positions[i];
        keys.row(i) = model.keys(l).row(p).segment(kv * hs, hs);
        values.row(i) = model.values(l).row(p).segment(kv * hs, hs);
        for (int g = 0; g < group; ++g)
          queries[g].row(i) = model.queries(l).row(p).segment((kv * group + g) * hs, hs);
      }
      MethodInput in;
      in.keys = &keys;
      in.values = &values;
      for (const MatrixF& q : queries) in.queries.push_back(&q);
      in.n = n;
      in.sink = sink;
      in.eval = window;
      in.mid_begin = sink;
      in.mid_end = n - window;
      in.budget = budget;
      in.keep_ratio = static_cast<double>(budget) / n_mid;
      in.layer = l;
      in.num_layers = c.n_layers;
      in.kv_head = kv;
      // Each re-compression draws afresh (the golden-ratio step keeps rounds apart).
      in.seed = seed + static_cast<uint64_t>(round) * 0x9E3779B97F4A7C15ull;
      in.params = params;
      // llama2.c's RoPE (engine/model/llama2c.cpp), at the entries' own positions.
      in.rope.layout = RopeInfo::Layout::Interleaved;
      in.rope.theta = 10000;
      in.positions = &cur.positions;
      if (method.needs_layer())
        throw InputError(method.name() +
                         ": needs every kv head of the layer at once, which generate does not "
                         "give (each head's cache is compressed on its own)");
      const Selection sel = method.select(in);
      // The protocol's rules, against the middle of the current cache entries.
      check_selection(sel, in.mid_begin, in.mid_end, in.budget, method, SelectionUnit::CacheEntry);
      if (!sel.note.empty()) notes.insert(sel.note);

      std::vector<float> num_bias(n, kNegInf), den_bias(n, kNegInf);
      for (size_t i = 0; i < sel.indices.size(); ++i)
        num_bias[sel.indices[i]] = static_cast<float>(std::log(sel.weights[i]));
      const std::vector<int>& den_idx = sel.separate ? sel.den_indices : sel.indices;
      const std::vector<double>& den_w = sel.separate ? sel.den_weights : sel.weights;
      for (size_t i = 0; i < den_idx.size(); ++i)
        den_bias[den_idx[i]] = static_cast<float>(std::log(den_w[i]));
      for (int i = 0; i < n; ++i) {
        const bool middle = i >= in.mid_begin && i < in.mid_end;
        if (middle && num_bias[i] == kNegInf && den_bias[i] == kNegInf) continue;  // dropped
        // An entry already standing for w tokens, kept with weight w', stands for w * w'.
        const float nb = middle ? num_bias[i] : 0.0f, db = middle ? den_bias[i] : 0.0f;
        out.positions.push_back(cur.positions[i]);
        out.num_logw.push_back(nb == kNegInf ? kNegInf : cur.num_logw[i] + nb);
        out.den_logw.push_back(db == kNegInf ? kNegInf : cur.den_logw[i] + db);
      }
    }
  }
  model.set_compressed_cache(std::move(next));
  std::string joined;
  for (const std::string& n : notes) joined += (joined.empty() ? "" : "; ") + n;
  return joined;
}

// ---------------------------------------------------------------------------------------------

const GenerateRun* GenerateReport::find(const std::string& method, double ratio) const {
  for (const GenerateRun& r : runs)
    if (r.method == method && r.ratio == ratio) return &r;
  return nullptr;
}

nlohmann::json GenerateReport::to_json() const {
  nlohmann::json j;
  j["format"] = "kvscope-generate/1";
  j["model"] = model;
  j["tokenizer"] = tokenizer;
  j["config"] = {{"dim", config.dim},
                 {"n_layers", config.n_layers},
                 {"n_heads", config.n_heads},
                 {"n_kv_heads", config.n_kv_heads},
                 {"head_dim", config.head_size()},
                 {"vocab_size", config.vocab_size},
                 {"seq_len", config.seq_len}};
  j["prompt"] = spec.prompt;
  j["prompt_tokens"] = prompt_tokens;
  j["compress_at"] = spec.compress_at;
  j["steps"] = spec.steps;
  j["recompress_every"] = spec.recompress_every;
  if (!spec.budgets.empty()) j["budgets"] = spec.budgets;
  j["sink"] = sink;
  j["window"] = window;
  j["seed"] = spec.seed;
  j["agreement"] = "teacher-forced on the exact run's tokens";
  j["prefix"] = {{"tokens", prefix_tokens}, {"text", prefix_text}};
  j["exact"] = {{"tokens", exact_tokens}, {"text", exact_text}};
  if (spec.has_continuation) {
    j["continuation"] = {{"tokens", continuation_tokens.size()},
                         {"scored_from", scored_from},
                         {"scored_tokens", scored_tokens},
                         {"exact_perplexity", exact_perplexity},
                         {"truncated", continuation_truncated}};
  }
  nlohmann::json results = nlohmann::json::array();
  for (const GenerateRun& r : runs) {
    nlohmann::json o;
    o["method"] = r.method;
    o["ratio"] = r.ratio;
    if (r.budget >= 0) o["budget"] = r.budget;
    o["top1_agreement"] = r.top1_agreement;
    o["mean_kl"] = r.mean_kl;
    if (spec.has_continuation) o["perplexity"] = r.perplexity;
    o["kl"] = r.kl;
    o["top1"] = r.top1;
    o["tokens"] = r.tokens;
    o["text"] = r.text;
    o["first_divergence"] = r.first_divergence;
    o["mean_cache_entries"] = r.mean_cache_entries;
    o["compressions"] = r.compressions;
    if (!r.note.empty()) o["note"] = r.note;
    results.push_back(o);
  }
  j["results"] = results;
  j["notes"] = notes;
  return j;
}

namespace {

// ---- run_generate's steps

// The settings that need neither the prompt nor N: the tokenizer, the methods, the ratios (token
// budgets replace them; they are checked against the middle once N, s and W are known), the steps
// and the re-compression.
void check_settings(GenerateSpec& spec, const llama2c::Config& c,
                    const llama2c::Tokenizer& tokenizer) {
  if (tokenizer.vocab_size() != c.vocab_size)
    throw SettingError("tokenizer", "--tokenizer",
                       "has " + std::to_string(tokenizer.vocab_size()) +
                           " tokens but the model's vocab_size is " + std::to_string(c.vocab_size));
  if (spec.methods.empty()) throw SettingError("methods", "--methods", "no method given");
  // Budgets are checked against the middle once N, s and W are known (resolve_window).
  if (!spec.budgets.empty()) spec.ratios.assign(spec.budgets.size(), 1.0);
  if (spec.ratios.empty()) throw SettingError("ratios", "--ratios", "no ratio given");
  for (double r : spec.ratios)
    if (!(r > 0 && r <= 1))
      throw SettingError("ratios", "--ratios", "keep ratio " + fmt(r) + " is not in (0, 1]");
  for (const Method* m : spec.methods) {
    auto it = spec.params.find(m->name());
    if (it != spec.params.end()) validate_method_params(*m, it->second);
  }
  if (spec.steps < 1) throw SettingError("steps", "--steps", "must be at least 1");
  if (spec.recompress_every < 0)
    throw SettingError("re-compression", "--recompress-every", "must be >= 0");
}

// N, the position the cache is compressed at: the prompt's end (BOS included) unless given; at
// or after the prompt's end, with room for `steps` more positions in the model's context.
int resolve_compress_at(GenerateReport& rep, const GenerateSpec& spec_in, int seq_len) {
  GenerateSpec& spec = rep.spec;
  if (spec.compress_at == 0) spec.compress_at = rep.prompt_tokens;
  const int N = spec.compress_at;
  if (N < rep.prompt_tokens)
    throw SettingError("compress at", "--compress-at",
                       std::to_string(N) + " is inside the prompt (" +
                           std::to_string(rep.prompt_tokens) +
                           " tokens with BOS): compress at or after its end");
  if (static_cast<long long>(N) + spec.steps > seq_len) {
    const std::string total = std::to_string(static_cast<long long>(N) + spec.steps) +
                              " positions exceed the model's context seq_len " +
                              std::to_string(seq_len);
    if (spec_in.compress_at == 0)
      throw SettingError("prompt", "--prompt",
                         std::to_string(N) + " tokens with BOS (compressed at its end); with " +
                             std::to_string(spec.steps) + " steps, " + total);
    throw SettingError(
        "compress at", "--compress-at",
        std::to_string(N) + " + " + std::to_string(spec.steps) + " steps = " + total);
  }
  return N;
}

// The sinks s and the window W kept at compression, and the token budgets turned into the
// ratios B / (N - s - W) of the middle.
void resolve_window(GenerateReport& rep, int N) {
  GenerateSpec& spec = rep.spec;
  // The window in generate's own terms (EvalWindow::make would name eval's flags): s sinks and
  // the W most recent of the N cached positions are kept.
  const int sink = spec.sink >= 0 ? spec.sink : std::min(256, N / 32);
  const int recent = spec.window >= 0 ? spec.window : std::min(256, N / 8);
  if (recent < 1) {
    if (spec.window >= 0)
      throw SettingError(
          "window", "--window",
          std::to_string(spec.window) + " must be at least 1 (the newest position is always kept)");
    throw SettingError(
        "compress at", "--compress-at",
        "the default window W = floor(N/8) is 0 positions at N = " + std::to_string(N) +
            "; compress at 8 or more positions (a longer prompt or a later "
            "compression) or set the window");
  }
  if (static_cast<long long>(sink) + recent > N)
    throw SettingError("sink/window", "--sink/--window",
                       "s + W = " + std::to_string(sink) + " + " + std::to_string(recent) +
                           " exceeds the " + std::to_string(N) +
                           " positions cached at compression (compress at)");
  const EvalWindow w = EvalWindow::make(N, spec.ratios[0], sink, recent);
  rep.sink = w.sink;
  rep.window = w.eval;
  if (w.n_mid < 1)
    throw SettingError("compress at", "--compress-at",
                       "no middle left to compress at " + std::to_string(N) +
                           " (s = " + std::to_string(w.sink) + " sinks + window " +
                           std::to_string(w.eval) + ")");
  for (size_t i = 0; i < spec.budgets.size(); ++i) {
    const int b = spec.budgets[i];
    if (b < 1 || b > w.n_mid)
      throw SettingError(
          "budget", "--budget",
          std::to_string(b) + " entries do not fit: the middle at compression holds " +
              std::to_string(w.n_mid) + " (N = " + std::to_string(N) +
              ", s = " + std::to_string(w.sink) + " sinks, window " + std::to_string(w.eval) +
              "; a budget counts middle entries, 1 to " + std::to_string(w.n_mid) + ")");
    if (std::count(spec.budgets.begin(), spec.budgets.end(), b) > 1)
      throw SettingError("budget", "--budget", std::to_string(b) + " given twice");
    spec.ratios[i] = static_cast<double>(b) / w.n_mid;
  }
}

// The perplexity run's tokens: the prompt then the continuation, cut to the model's context;
// the tokens after N are scored. Empty without a continuation.
std::vector<int> continuation_sequence(GenerateReport& rep, const llama2c::Tokenizer& tokenizer,
                                       const std::vector<int>& prompt, int N) {
  const GenerateSpec& spec = rep.spec;
  const int seq_len = rep.config.seq_len;
  std::vector<int> cont_seq;
  if (!spec.has_continuation) return cont_seq;
  cont_seq = prompt;
  const std::vector<int> more = tokenizer.encode_continuation(spec.continuation);
  cont_seq.insert(cont_seq.end(), more.begin(), more.end());
  if (static_cast<int>(cont_seq.size()) > seq_len) {
    cont_seq.resize(seq_len);
    rep.continuation_truncated = true;
    rep.notes.push_back("the continuation is truncated to the model's context of " +
                        std::to_string(seq_len) + " positions");
  }
  rep.continuation_tokens = cont_seq;
  rep.scored_from = N + 1;
  rep.scored_tokens = static_cast<int>(cont_seq.size()) - rep.scored_from;
  if (rep.scored_tokens < 1)
    throw SettingError("continuation", "--continuation",
                       "prompt and continuation make " + std::to_string(cont_seq.size()) +
                           " tokens; scoring after compression at " + std::to_string(N) +
                           " needs at least " + std::to_string(N + 2));
  return cont_seq;
}

// Forward passes of the whole experiment: the exact run, the continuation's exact side, then
// per (method, ratio) the teacher-forced and free-running steps and the scored continuation.
long long forward_passes(const GenerateSpec& spec, int N, const std::vector<int>& cont_seq,
                         int scored_tokens) {
  const long long per_run = 2LL * spec.steps + (spec.has_continuation ? scored_tokens : 0);
  return N + spec.steps + (spec.has_continuation ? cont_seq.size() - 1 : 0) +
         per_run * static_cast<long long>(spec.methods.size() * spec.ratios.size());
}

// Progress over forward passes, reported from worker threads (serialised); throws Cancelled
// once `cancel` is set.
class PassProgress {
 public:
  PassProgress(long long total, const GenerateProgressFn& progress, const std::atomic<bool>* cancel)
      : total_(total), progress_(progress), cancel_(cancel) {}

  void advance(long long count) {
    if (cancel_ && cancel_->load()) throw Cancelled();
    if (!progress_) return;
    std::lock_guard<std::mutex> lock(mu_);
    done_ += count;
    progress_(done_, total_);
  }

 private:
  const long long total_;
  const GenerateProgressFn& progress_;
  const std::atomic<bool>* cancel_;
  std::mutex mu_;
  long long done_ = 0;
};

// The exact run's prefix: positions [0, N) with the full cache, the prompt forced then greedy,
// which also predicts the token at N. Returns the model with those positions cached, where every
// run branches.
llama2c::Transformer run_exact_prefix(const llama2c::Transformer& model,
                                      const llama2c::Tokenizer& tokenizer,
                                      const std::vector<int>& prompt, int N, GenerateReport& rep,
                                      PassProgress& passes) {
  llama2c::Transformer exact = model;
  exact.clear_compressed_cache();
  rep.prefix_tokens = prompt;
  for (int pos = 0; pos < N; ++pos) {
    const std::vector<float>& logits = exact.forward(rep.prefix_tokens[pos], pos);
    if (pos + 1 >= static_cast<int>(rep.prefix_tokens.size()))
      rep.prefix_tokens.push_back(argmax(logits));
    passes.advance(1);
  }
  for (size_t i = 0; i < rep.prefix_tokens.size(); ++i)
    rep.prefix_text.push_back(
        tokenizer.token_text(i == 0 ? -1 : rep.prefix_tokens[i - 1], rep.prefix_tokens[i]));
  return exact;
}

// The exact run's `steps` greedy positions from N, continuing `exact`; returns their logits.
std::vector<std::vector<float>> run_exact_steps(llama2c::Transformer exact,
                                                const llama2c::Tokenizer& tokenizer, int N,
                                                GenerateReport& rep, PassProgress& passes) {
  std::vector<std::vector<float>> exact_logits;
  int token = rep.prefix_tokens[N];
  for (int t = 0; t < rep.spec.steps; ++t) {
    exact_logits.push_back(exact.forward(token, N + t));
    const int next = argmax(exact_logits.back());
    rep.exact_text.push_back(tokenizer.token_text(token, next));
    rep.exact_tokens.push_back(next);
    token = next;
    passes.advance(1);
  }
  return exact_logits;
}

// The continuation's exact side: the full cache's perplexity on the scored tokens. Returns the
// model with the continuation's positions [0, N) cached, where its compressed runs branch.
llama2c::Transformer score_continuation_exact(const llama2c::Transformer& model,
                                              const std::vector<int>& cont_seq, int N,
                                              GenerateReport& rep, PassProgress& passes) {
  llama2c::Transformer cont_branch = model;
  if (!rep.spec.has_continuation) return cont_branch;
  std::vector<double> exact_log_p;
  cont_branch.clear_compressed_cache();
  llama2c::Transformer m = model;
  m.clear_compressed_cache();
  for (int pos = 0; pos + 1 < static_cast<int>(cont_seq.size()); ++pos) {
    if (pos == N) cont_branch = m;
    const std::vector<float>& logits = m.forward(cont_seq[pos], pos);
    if (pos + 1 >= rep.scored_from)
      exact_log_p.push_back(log_probability(logits, cont_seq[pos + 1]));
    passes.advance(1);
  }
  double nll = 0;
  for (double lp : exact_log_p) nll -= lp;
  rep.exact_perplexity = std::exp(nll / static_cast<double>(exact_log_p.size()));
  return cont_branch;
}

// One compressed run's method and keep ratio.
struct RunItem {
  const Method* method;
  double ratio;
  int budget;  // -1: by ratio
};

// One run per (method, ratio), method-major.
std::vector<RunItem> run_items(const GenerateSpec& spec) {
  std::vector<RunItem> items;
  for (const Method* m : spec.methods)
    for (size_t i = 0; i < spec.ratios.size(); ++i)
      items.push_back({m, spec.ratios[i], i < spec.budgets.size() ? spec.budgets[i] : -1});
  return items;
}

// What every compressed run reads: the report so far (spec, sinks and window, the exact run's
// tokens), the exact run's logits and the branches at N.
struct ExactRun {
  const GenerateReport& rep;
  const llama2c::Tokenizer& tokenizer;
  int N;
  const llama2c::Transformer& branch;
  const std::vector<std::vector<float>>& exact_logits;
  const llama2c::Transformer& cont_branch;
  const std::vector<int>& cont_seq;
  PassProgress& passes;
};

// One run's compressions of the cache (at N, then again every `recompress_every` new
// positions when set) and the method's notes they return.
class RunCompressor {
 public:
  RunCompressor(const RunItem& item, const GenerateReport& rep)
      : item_(item), rep_(rep), params_(params_of(item, rep.spec)) {}

  // `round` varies the method's seed between re-compressions.
  void compress(llama2c::Transformer& m, int round) {
    const std::string note = compress_cache(m, *item_.method, item_.ratio, params_, rep_.sink,
                                            rep_.window, rep_.spec.seed, round, item_.budget);
    if (!note.empty()) notes_.insert(note);
  }
  // Re-compress after step t of `steps`?
  bool due(int t, int steps) const {
    const int every = rep_.spec.recompress_every;
    return every > 0 && (t + 1) % every == 0 && t + 1 < steps;
  }
  const std::set<std::string>& notes() const { return notes_; }

 private:
  static ParamValues params_of(const RunItem& item, const GenerateSpec& spec) {
    const auto pit = spec.params.find(item.method->name());
    return pit == spec.params.end() ? ParamValues{} : pit->second;
  }

  const RunItem& item_;
  const GenerateReport& rep_;
  const ParamValues params_;
  std::set<std::string> notes_;
};

// Teacher-forced on the exact run's tokens: per step the compressed cache's top-1 and
// KL(exact || compressed), from the cache compressed at N.
void teacher_forced_on_exact(llama2c::Transformer compressed, RunCompressor& compressor,
                             const ExactRun& exact, GenerateRun& run) {
  const GenerateReport& rep = exact.rep;
  const int steps = rep.spec.steps, N = exact.N;
  run.top1.resize(steps);
  run.kl.resize(steps);
  int agree = 0;
  int round = 0;
  for (int t = 0; t < steps; ++t) {
    const int fed = t == 0 ? rep.prefix_tokens[N] : rep.exact_tokens[t - 1];
    const std::vector<float>& logits = compressed.forward(fed, N + t);
    run.top1[t] = argmax(logits);
    run.kl[t] = kl_divergence(exact.exact_logits[t], logits);
    agree += run.top1[t] == rep.exact_tokens[t];
    run.mean_kl += run.kl[t];
    if (compressor.due(t, steps)) compressor.compress(compressed, ++round);
    exact.passes.advance(1);
  }
  run.top1_agreement = static_cast<double>(agree) / steps;
  run.mean_kl /= steps;
}

// Free-running greedy from the cache compressed at N: the tokens, where they first leave the
// exact run's, the compressions and the cache's size at the last step.
void free_running_greedy(llama2c::Transformer compressed, RunCompressor& compressor,
                         const ExactRun& exact, GenerateRun& run) {
  const GenerateReport& rep = exact.rep;
  const int steps = rep.spec.steps, N = exact.N;
  int round = 0;
  int fed = rep.prefix_tokens[N];
  for (int t = 0; t < steps; ++t) {
    const int next = argmax(compressed.forward(fed, N + t));
    run.text.push_back(exact.tokenizer.token_text(fed, next));
    run.tokens.push_back(next);
    if (run.first_divergence < 0 && next != rep.exact_tokens[t]) run.first_divergence = t;
    fed = next;
    if (compressor.due(t, steps)) compressor.compress(compressed, ++round);
    exact.passes.advance(1);
  }
  run.compressions = round + 1;
  run.mean_cache_entries = mean_cache_entries(compressed);
}

// Teacher-forced on the continuation, its cache compressed at N the same way: the perplexity of
// the scored tokens.
double continuation_perplexity(RunCompressor& compressor, const ExactRun& exact) {
  const GenerateReport& rep = exact.rep;
  const std::vector<int>& cont_seq = exact.cont_seq;
  llama2c::Transformer m = exact.cont_branch;
  compressor.compress(m, 0);
  int round = 0;
  double nll = 0;
  for (int pos = exact.N; pos + 1 < static_cast<int>(cont_seq.size()); ++pos) {
    nll -= log_probability(m.forward(cont_seq[pos], pos), cont_seq[pos + 1]);
    if (compressor.due(pos - exact.N, rep.scored_tokens)) compressor.compress(m, ++round);
    exact.passes.advance(1);
  }
  return std::exp(nll / rep.scored_tokens);
}

// One (method, ratio): the cache compressed at N, then the three passes measured against the
// exact run.
void run_compressed(const RunItem& item, const ExactRun& exact, GenerateRun& run) {
  run.method = item.method->name();
  run.ratio = item.ratio;
  run.budget = item.budget;
  RunCompressor compressor(item, exact.rep);
  llama2c::Transformer compressed_at_n = exact.branch;
  compressor.compress(compressed_at_n, 0);
  teacher_forced_on_exact(compressed_at_n, compressor, exact, run);
  free_running_greedy(compressed_at_n, compressor, exact, run);
  run.perplexity = exact.rep.spec.has_continuation ? continuation_perplexity(compressor, exact)
                                                   : std::numeric_limits<double>::quiet_NaN();
  for (const std::string& n : compressor.notes()) run.note += (run.note.empty() ? "" : "; ") + n;
}

}  // namespace

GenerateReport run_generate(const llama2c::Transformer& model, const llama2c::Tokenizer& tokenizer,
                            const GenerateSpec& spec_in, const GenerateProgressFn& progress,
                            const std::atomic<bool>* cancel) {
  const llama2c::Config& c = model.config();
  GenerateReport rep;
  rep.model = model.path();
  rep.tokenizer = tokenizer.path();
  rep.config = c;
  rep.spec = spec_in;
  GenerateSpec& spec = rep.spec;

  // ---- the spec, checked before any work
  check_settings(spec, c, tokenizer);
  const std::vector<int> prompt = tokenizer.encode(spec.prompt, /*bos=*/true, /*eos=*/false);
  rep.prompt_tokens = static_cast<int>(prompt.size());
  const int N = resolve_compress_at(rep, spec_in, c.seq_len);
  resolve_window(rep, N);
  const std::vector<int> cont_seq = continuation_sequence(rep, tokenizer, prompt, N);

  // ---- progress over forward passes
  PassProgress passes(forward_passes(spec, N, cont_seq, rep.scored_tokens), progress, cancel);

  // ---- the exact run: prefix to N, the token at N, then `steps` greedy positions
  const llama2c::Transformer branch = run_exact_prefix(model, tokenizer, prompt, N, rep, passes);
  const std::vector<std::vector<float>> exact_logits =
      run_exact_steps(branch, tokenizer, N, rep, passes);

  // ---- the continuation's exact side
  const llama2c::Transformer cont_branch =
      score_continuation_exact(model, cont_seq, N, rep, passes);

  // ---- one run per (method, ratio)
  const std::vector<RunItem> items = run_items(spec);
  rep.runs.resize(items.size());
  const ExactRun exact{rep, tokenizer, N, branch, exact_logits, cont_branch, cont_seq, passes};
  const int threads = spec.threads > 0 ? spec.threads : hardware_threads();
  parallel_for(static_cast<int>(items.size()), threads, nullptr, [&](int i) {
    const size_t index = static_cast<size_t>(i);
    run_compressed(items[index], exact, rep.runs[index]);
  });
  return rep;
}

}  // namespace kvscope
