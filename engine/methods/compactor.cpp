// Compactor (Chari & Van Durme, "Compactor: Calibrated Query-Agnostic KV Cache Compression with
// Approximate Leverage Scores", 2025), ported from kvpress's CompactorPress
// (kvpress/presses/compactor_press.py, with leverage_press.py and non_causal_attention_press.py,
// the reference; docs/methods.md names the commit). Inside the context less its first
// `sink_size_start` and last `sink_size_end` tokens (region R), two scores, each z-normalised
// over all kv heads of the layer (mean and unbiased std over heads and tokens, std at least
// 1e-6), are blended: blending * leverage + attention, blending = the compression ratio by
// default.
//  - leverage: the pre-RoPE keys of R, centred over R, times a Gaussian sketch Phi (d x k,
//    entries N(0, 1/k)); with X that (|R| x k), the score of row i is
//    max(0, x_i^T (X^T X + 0.01 I)^-1 x_i) (the press's Cholesky with jitter 1e-2);
//  - attention: non-causal attention inside chunks of `chunk_size` tokens of R (aligned at R's
//    start; no 1/sqrt(d) scaling, as in the press): each key's softmax weight summed over the
//    chunk's queries, averaged over the GQA group, times |v|, then average-pooled over 3
//    neighbours (zero padded). In the last, partial chunk the press pads queries and keys with
//    zeros, masks padded keys' logits to -1e-9 and padded queries' rows to 0: padded keys take a
//    share of every softmax and padded query rows add ~1/chunk_size to each real key; kept here.
// The sinks at both ends score above everything.
//
// Mapping to the protocol (docs/methods.md, "kvpress presses"): the context is [0, n-E); the
// queries are the captured ones (after RoPE, as the press rotates them), the keys for the
// leverage are the captured keys rotated back to before RoPE (engine/core/rope.h; a capture without
// rope_theta / rope_layout is refused); the compression ratio is 1 - (s + m) / (n - E), so the
// ranking depends on the budget, and the sketch on the seed (KVScope's Philox stream, not
// torch's): select() runs per (ratio, seed). `sketch` = `exact` takes Phi = I (k = d), the
// leverage the sketch approximates; it is what the golden test checks against the press (with
// its randn made the identity). Every kv head of the layer is scored for the z-normalisation.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <list>
#include <memory>
#include <mutex>

#include "engine/core/error.h"
#include "engine/core/random.h"
#include "engine/io/capture.h"
#include "engine/methods/method.h"
#include "engine/methods/scoring.h"
#include "engine/ops/backend.h"

namespace kvscope {
namespace {

std::vector<ParamSpec> compactor_params() {
  return {
      param_spec("sink_size_start", ParamSpec::Type::Int, 0, 4096, 8,
                 "first tokens of the context always kept"),
      param_spec("sink_size_end", ParamSpec::Type::Int, 0, 4096, 4,
                 "last tokens of the context always kept"),
      param_spec("chunk_size", ParamSpec::Type::Int, 1, 65536, 256,
                 "tokens per chunk of the non-causal attention"),
      param_spec("sketch_dimension", ParamSpec::Type::Int, 1, 4096, 48,
                 "columns of the Gaussian sketch of the keys"),
      param_spec("blending", ParamSpec::Type::Float, -1, 100, -1,
                 "weight of the leverage score; -1 = the compression ratio (the press's None)"),
      param_spec("sketch", ParamSpec::Type::Choice, 0, 1, 0,
                 "Gaussian sketch (the press) or exact leverage (Phi = I)", {"gaussian", "exact"}),
  };
}

// Mean and unbiased standard deviation (at least 1e-6) over every value of `v`.
void z_normalise(std::vector<std::vector<double>>& v) {
  double sum = 0, count = 0;
  for (const auto& h : v)
    for (double x : h) sum += x, ++count;
  const double mean = sum / count;
  double ss = 0;
  for (const auto& h : v)
    for (double x : h) ss += (x - mean) * (x - mean);
  const double sd = std::max(std::sqrt(ss / (count - 1)), 1e-6);
  for (auto& h : v)
    for (double& x : h) x = (x - mean) / sd;
}

using LayerScores = std::vector<std::vector<double>>;

// What identifies a layer's data without keeping a pointer to it: a 64-bit hash of its RoPE, the
// shapes and every value of its keys, values and queries (a multiply-xorshift mix per 64 bits,
// far cheaper than the scores it stands for).
uint64_t fingerprint(const LayerData& layer, int begin, int end) {
  uint64_t h = 0x9E3779B97F4A7C15ull;
  auto mix = [&](uint64_t v) {
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  };
  uint64_t theta_bits;
  std::memcpy(&theta_bits, &layer.rope.theta, sizeof theta_bits);
  mix(theta_bits);
  mix(static_cast<uint64_t>(layer.rope.layout));
  mix(static_cast<uint64_t>(begin));
  mix(static_cast<uint64_t>(end));
  auto all = [&](const MatrixF& m) {
    mix(static_cast<uint64_t>(m.rows()));
    mix(static_cast<uint64_t>(m.cols()));
    const size_t count = static_cast<size_t>(m.size());
    const float* x = m.data();
    size_t i = 0;
    for (; i + 2 <= count; i += 2) {
      uint64_t word;
      std::memcpy(&word, x + i, sizeof word);
      mix(word);
    }
    if (i < count) {
      uint32_t last;
      std::memcpy(&last, x + i, sizeof last);
      mix(last);
    }
  };
  for (const MatrixF& m : layer.keys) all(m);
  for (const MatrixF& m : layer.values) all(m);
  for (const MatrixF& m : layer.queries) all(m);
  return h;
}

// A memo of the last few layers' scores (thread-safe; two threads may compute the same entry,
// and both get equal values).
struct MemoKey {
  int what, layer, begin, end, size;
  uint64_t seed;
  // The backend that computed the chunked attention (0 for the leverage, always on the CPU): a
  // device's figures differ from the CPU's by rounding, and each backend keeps its own.
  uintptr_t backend;
  auto operator<=>(const MemoKey&) const = default;
};
std::shared_ptr<const LayerScores> memo(uint64_t fp, MemoKey key,
                                        const std::function<LayerScores()>& make) {
  static std::mutex mutex;
  static std::list<std::pair<std::pair<uint64_t, MemoKey>, std::shared_ptr<const LayerScores>>>
      entries;  // most recent first
  const auto id = std::make_pair(fp, key);
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto it = entries.begin(); it != entries.end(); ++it)
      if (it->first == id) {
        entries.splice(entries.begin(), entries, it);
        return entries.front().second;
      }
  }
  auto made = std::make_shared<const LayerScores>(make());
  std::lock_guard<std::mutex> lock(mutex);
  entries.emplace_front(id, made);
  if (entries.size() > 64) entries.pop_back();
  return made;
}

class Compactor final : public Method {
 public:
  std::string name() const override { return "compactor"; }
  std::string summary() const override {
    return "kvpress Compactor: key leverage (Gaussian sketch) blended with chunked non-causal "
           "attention x |v|, z-normalised over the layer";
  }
  std::vector<ParamSpec> params() const override { return compactor_params(); }
  bool needs_queries() const override { return true; }
  bool needs_layer() const override { return true; }
  bool needs_rope() const override { return true; }
  // The Gaussian sketch is drawn per seed (with sketch = exact nothing depends on it).
  bool depends_on_seed() const override { return true; }
  Selection select(const MethodInput& in) const override {
    check_method_input(in, name(), true);
    validate_params(params(), in.params, name());
    if (!in.layer_data)
      throw InputError(name() +
                       ": needs every kv head of the layer at once, and this caller "
                       "gives one head only");
    if (!in.rope.known())
      throw InputError(name() +
                       ": needs the capture's RoPE (rope_theta and rope_layout) to rotate the "
                       "keys back to before RoPE, and " +
                       (in.rope.missing.empty() ? std::string("it is unknown") : in.rope.missing));
    const auto specs = params();
    auto p = [&](const char* n) { return param_value(specs, in.params, n); };
    const int ctx = in.mid_end;
    const int left = std::min(static_cast<int>(p("sink_size_start")), ctx);
    const int right = std::min(static_cast<int>(p("sink_size_end")), std::max(0, ctx - left));
    const int begin = left, end = ctx - right, len = end - begin;
    const double ratio = ctx > 0 ? 1.0 - static_cast<double>(in.sink + in.budget) / ctx : 0.0;
    const double blending = p("blending") < 0 ? ratio : p("blending");
    const LayerData& layer = *in.layer_data;
    const int heads = static_cast<int>(layer.keys.size());
    std::shared_ptr<const LayerScores> lev, att;
    if (len >= 2) {
      // Both z-normalised scores are the same for every head and ratio of a layer (and the
      // leverage for every seed when exact): made once and kept in a small memo.
      const bool exact = p("sketch") >= 0.5;
      const int k = static_cast<int>(p("sketch_dimension")),
                chunk = static_cast<int>(p("chunk_size"));
      const uint64_t fp = fingerprint(layer, begin, end);
      lev = memo(fp, {1, in.layer, begin, end, exact ? 0 : k, exact ? 0ull : in.seed, 0}, [&] {
        LayerScores v(heads);
        for (int h = 0; h < heads; ++h) {
          if (in.cancel && in.cancel->load()) throw Cancelled();
          v[h] = leverage(layer.keys[h], begin, end, in, h, k, exact);
        }
        z_normalise(v);
        return v;
      });
      Backend& backend = method_backend(in);
      att =
          memo(fp, {2, in.layer, begin, end, chunk, 0, reinterpret_cast<uintptr_t>(&backend)}, [&] {
            LayerScores v = attention(layer, begin, end, chunk, backend, in.cancel);
            z_normalise(v);
            return v;
          });
    }
    double top = -std::numeric_limits<double>::infinity();
    std::vector<double> mine(std::max(len, 0));
    for (int i = 0; i < len; ++i)
      top = std::max(top, mine[i] = blending * (*lev)[in.kv_head][i] + (*att)[in.kv_head][i]);
    std::vector<double> scores(in.mid_end - in.mid_begin);
    for (int t = in.mid_begin; t < in.mid_end; ++t)
      scores[t - in.mid_begin] = t >= begin && t < end ? mine[t - begin] : top;
    Selection sel = prefix_selection(in, rank_by_scores(scores, scores), in.budget);
    return sel;
  }

 private:
  // max(0, diag(X (X^T X + 0.01 I)^-1 X^T)) of the centred pre-RoPE keys of [begin, end) times
  // the sketch (Phi = I when `exact`).
  static std::vector<double> leverage(const MatrixF& keys, int begin, int end,
                                      const MethodInput& in, int head, int k, bool exact) {
    const MatrixD pre = unrotate_rows(keys, begin, end, in.rope, in.positions);
    const MatrixD centred = pre.rowwise() - pre.colwise().mean();
    MatrixD X;
    if (exact) {
      X = centred;
    } else {
      const int d = static_cast<int>(keys.cols());
      MatrixD phi(d, k);
      CounterRng rng(in.seed, kRandSketch, static_cast<uint32_t>(in.layer),
                     static_cast<uint32_t>(head));
      const double scale = 1.0 / std::sqrt(static_cast<double>(k));
      for (int i = 0; i < d; ++i)
        for (int j = 0; j < k; ++j) {  // Box-Muller, one normal per pair of uniforms
          const double u1 = 1.0 - rng.uniform(), u2 = rng.uniform();
          phi(i, j) = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2) * scale;
        }
      X = centred * phi;
    }
    MatrixD G = X.transpose() * X;
    G = 0.5 * (G + G.transpose());
    G.diagonal().array() += 1e-2;
    const Eigen::LLT<Eigen::MatrixXd> llt(G);
    const MatrixD solved = llt.solve(X.transpose());  // k x |R|
    std::vector<double> out(X.rows());
    for (int i = 0; i < static_cast<int>(X.rows()); ++i)
      out[i] = std::max(0.0, X.row(i).dot(solved.col(i)));
    return out;
  }

  // The press's non-causal chunked attention column sums over [begin, end) (the chunked-attention
  // op, engine/ops/chunk_scores.h, every kv head of the layer in one call on `backend`),
  // group-averaged, times |v|, average-pooled over 3 neighbours; one vector per kv head.
  static LayerScores attention(const LayerData& layer, int begin, int end, int chunk,
                               Backend& backend, const std::atomic<bool>* cancel) {
    const int len = end - begin, heads = static_cast<int>(layer.keys.size());
    std::vector<std::vector<double>> col(heads, std::vector<double>(len));
    std::vector<size_t> group(heads);
    ChunkScoreBatch batch;
    batch.len = len;
    batch.d = static_cast<int>(layer.keys.front().cols());
    batch.chunk = chunk;
    batch.cancel = cancel;
    for (int kv = 0; kv < heads; ++kv) {
      const MatrixF& K = layer.keys[kv];
      const std::vector<const MatrixF*> queries =
          layer.queries.empty() ? std::vector<const MatrixF*>{&K} : layer.group_queries(kv);
      ChunkScoreHead head;
      head.keys = K.row(begin).data();
      for (const MatrixF* Q : queries) head.queries.push_back(Q->row(begin).data());
      head.col = col[kv].data();
      group[kv] = queries.size();
      batch.heads.push_back(std::move(head));
    }
    backend.chunk_scores(batch);
    LayerScores out(heads);
    for (int kv = 0; kv < heads; ++kv) {
      std::vector<double> scaled(len);
      for (int i = 0; i < len; ++i)
        scaled[i] = col[kv][i] / static_cast<double>(group[kv]) *
                    layer.values[kv].row(begin + i).cast<double>().norm();
      out[kv] = avg_pool_same(scaled, 3);
    }
    return out;
  }
};

}  // namespace

std::unique_ptr<Method> make_compactor() {
  return std::make_unique<Compactor>();
}

}  // namespace kvscope
