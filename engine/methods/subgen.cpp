// SubGen (Zandieh, Han, Mirrokni, Karbasi, "SubGen: Token Generation in Sublinear Time and Memory",
// 2024), Algorithm 1, run over the middle tokens in stream order. Two independent structures:
//
// Denominator (UpdateSoftmaxNormalizer, lines 11-23): online clustering of the keys. A key joins
// the nearest cluster representative (the cluster's first key) if it is within delta, else it
// starts a new cluster. Each cluster keeps a list S of t keys; a new cluster starts with t copies
// of its first key, and the n_c-th key of a cluster replaces each entry independently with
// probability 1/n_c, so every entry is a uniform sample of the cluster (with replacement). The
// softmax normaliser is estimated as sum_c n_c/t sum_{k in S_c} exp(<q,k>): each entry has weight
// n_c/t (line 30), and an entry drawn twice counts twice (weights of a token add up).
//
// Numerator (UpdateMatrixProduct, lines 24-28): s slots, each replaced by the new pair (k, v) with
// probability ||v||^2 / (mu + ||v||^2), mu the running sum of ||v||^2, so each slot is an i.i.d.
// sample with P(i) = ||v_i||^2 / mu (Lemma 1) -- sampling WITH replacement, as in the paper. The
// product exp(Kq)^T V is estimated as sum_slots mu / (s ||v||^2) exp(<q,k>) v (line 29).
// By default each slot's final content is drawn directly from that distribution (inverse CDF, one
// uniform per slot), which Lemma 1 shows is exactly the distribution the streaming coin flips
// produce, at O(log n) instead of O(n) per slot; literal_reservoir = 1 runs the coin flips of
// line 26 token by token instead (same distribution, different random draws).
// Both estimators are unbiased for a fixed query (tests/test_subgen.cpp checks this); their ratio,
// the attention output, is not, and its error has a heavy tail (docs/methods.md).
//
// Budget (memory) accounting. A cluster stores at most min(t, n_c) distinct keys, so the
// denominator's capacity is cap(delta) = sum_c min(t, n_c); the numerator's is s slots. The split
// parameter reserves split*m for the numerator; delta is chosen by bisection (to 0.1%) as the
// smallest delta whose clustering has cap(delta) <= m - round(split*m) (cap is computed from the
// clustering alone, which is deterministic, so delta does not depend on the random draws and both
// estimators stay unbiased). The numerator then gets the rest: s = m - cap(delta). Distinct
// numerator tokens
// + distinct denominator tokens <= s + cap = m; fewer when samples repeat (the note says how many).
// If even one cluster cannot fit (min(t, n_mid) > the denominator's share), t is lowered to fit.
// A delta override (> 0) that would exceed the share falls back to the automatic delta.
// Randomness: CounterRng(seed, kRandSubGen, layer, kv_head), denominator draws first in stream
// order, then the numerator's.
// The clustering (every radius the search tries, and the final one) runs on the key-clustering op
// of MethodInput::backend (engine/ops/key_clusters.h; the CPU when none): O(n x clusters x d) per
// radius, the method's hot part. A device gets the next levels of the bisection as one batch.
// The seeded sampling stays here: O(n d) for the norms, then s draws by binary search (or the
// literal reservoir's O(n s) coin flips, drawn in stream order from one counter).
#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

#include "engine/core/error.h"
#include "engine/core/random.h"
#include "engine/methods/method.h"
#include "engine/methods/scoring.h"
#include "engine/ops/backend.h"

namespace kvscope {
namespace {

using Clustering = KeyClusters;

// Clusterings of the middle's keys at `deltas`, on the op (engine/ops/key_clusters.h) of the
// method's backend (the CPU when none).
std::vector<Clustering> cluster_keys(const MethodInput& in, int t, long long limit,
                                     std::vector<double> deltas) {
  ClusterBatch b;
  b.keys = in.keys->data() + static_cast<size_t>(in.mid_begin) * in.keys->cols();
  b.n = in.mid_end - in.mid_begin;
  b.d = static_cast<int>(in.keys->cols());
  b.t = t;
  b.limit = limit;
  b.deltas = std::move(deltas);
  std::vector<Clustering> out(b.deltas.size());
  b.out = out.data();
  b.cancel = in.cancel;
  b.layer_id = layer_id_of(in, {in.keys});
  method_backend(in).key_clusters(b);
  return out;
}

class SubGen final : public Method {
 public:
  std::string name() const override { return "subgen"; }
  std::string summary() const override {
    return "streaming clusters (t uniform samples each) for the denominator, ||v||^2 sampling "
           "for the numerator";
  }
  std::vector<ParamSpec> params() const override {
    return {
        param_spec("t", ParamSpec::Type::Int, 1, 64, 2,
                   "uniform samples kept per key cluster (denominator)"),
        param_spec("split", ParamSpec::Type::Float, 0.05, 0.95, 0.5,
                   "share of the budget reserved for the numerator's ||v||^2 samples"),
        param_spec("delta", ParamSpec::Type::Float, 0, 1e6, 0,
                   "cluster radius; 0 = choose by bisection so the budget is met", {}, false),
        param_spec("literal_reservoir", ParamSpec::Type::Bool, 0, 1, 0,
                   "run the numerator reservoir's coin flips token by token (same distribution, "
                   "O(n s))"),
    };
  }

  Selection select(const MethodInput& in) const override {
    check_method_input(in, name(), false);
    validate_params(params(), in.params, name());
    const auto specs = params();
    int t = static_cast<int>(param_value(specs, in.params, "t"));
    const double split = param_value(specs, in.params, "split");
    const double delta_override = param_value(specs, in.params, "delta");
    const bool literal = param_value(specs, in.params, "literal_reservoir") >= 0.5;
    if (t < 1) throw InputError("subgen.t must be >= 1, got " + std::to_string(t));
    if (!(split > 0 && split < 1)) throw InputError("subgen.split must be inside (0, 1)");
    if (!(delta_override >= 0)) throw InputError("subgen.delta must be >= 0 (0 = automatic)");

    const int n_mid = in.mid_end - in.mid_begin;
    const int m = in.budget;
    Selection sel;
    sel.separate = true;
    sel.cluster.assign(n_mid, -1);
    std::ostringstream note;
    // Parts start with a space; trimmed at the end.
    if (m < 2 || n_mid == 0) {
      sel.note = "budget m = " + std::to_string(m) +
                 " cannot hold both a numerator and a denominator sample; nothing kept";
      return sel;
    }
    const int num_share = std::clamp(static_cast<int>(std::lround(split * m)), 1, m - 1);
    const int den_share = m - num_share;
    if (t > den_share) {
      note << " t lowered from " << t << " to " << den_share << " to fit the budget;";
      t = den_share;
    }

    const MatrixD keys = in.keys->middleRows(in.mid_begin, n_mid).cast<double>();

    // Delta: the smallest radius whose clustering fits the denominator's share. The search does
    // not depend on the seed, and the protocol asks for the same head, t and share once per seed:
    // the last few searches are remembered per thread, keyed by everything they read (the
    // keys by address, shape and a checksum of their values) and the backend that ran them.
    SearchKey key{
        &method_backend(in), in.keys->data(), in.mid_begin, n_mid, static_cast<int>(keys.cols()), t,
        den_share,           delta_override,  0.0};
    for (Eigen::Index i = 0; i < keys.size(); ++i)
      key.checksum += keys.data()[i] * static_cast<double>(1 + (i % 7));
    thread_local std::vector<std::pair<SearchKey, SearchResult>> searches;
    for (const auto& [k, r] : searches)
      if (k == key) return finish(in, t, literal, r, std::move(sel), std::move(note));
    SearchResult result = search_delta(in, keys, t, den_share, delta_override);
    if (searches.size() >= 8) searches.erase(searches.begin());
    searches.emplace_back(key, result);
    return finish(in, t, literal, result, std::move(sel), std::move(note));
  }

 private:
  static constexpr int kSpeculate = 5;  // bisection levels per call on a parallel backend
  struct SearchKey {
    const Backend* backend;
    const float* keys;
    int mid_begin, n_mid, d, t, den_share;
    double delta_override, checksum;
    bool operator==(const SearchKey&) const = default;
  };
  struct SearchResult {
    double delta = 0;
    Clustering clusters;
    std::string note;  // what the search says (automatic delta, override refused)
  };

  static SearchResult search_delta(const MethodInput& in, const MatrixD& keys, int t, int den_share,
                                   double delta_override) {
    const std::atomic<bool>* cancel = in.cancel;
    auto cluster_stream = [&](double delta) {
      return std::move(cluster_keys(in, t, den_share, {delta}).front());
    };
    std::ostringstream note;
    double delta = delta_override;
    Clustering clusters;
    bool need_auto = delta_override <= 0;
    if (!need_auto) {
      clusters = cluster_stream(delta);
      if (clusters.over) {
        note << " delta " << delta_override << " needs more than " << den_share
             << " denominator slots; using the automatic delta;";
        need_auto = true;
      }
    }
    if (need_auto) {
      double lo = 0;
      // Every key within hi of the first one: a single cluster (padded against rounding, since
      // the clustering compares squared distances).
      double hi = (keys.rowwise() - keys.row(0)).rowwise().norm().maxCoeff() * (1 + 1e-9) + 1e-12;
      clusters = cluster_stream(lo);
      if (!clusters.over) {
        delta = lo;
      } else {
        // cap(delta) is a step function; 0.1% of delta is as close as the budget needs. A backend
        // that parallelises inside one call gets the next kSpeculate levels of the bisection's
        // tree at once (2^kSpeculate - 1 radii, the midpoints either outcome leads to, computed
        // as the sequential search computes them); the walk down the tree then takes the same
        // steps, so delta is the one the sequential search finds.
        const int levels = method_backend(in).parallel_in_one_call() ? kSpeculate : 1;
        auto go_on = [&](int iter) { return iter < 60 && hi - lo > 1e-3 * std::max(hi, 1e-30); };
        for (int iter = 0; go_on(iter);) {
          if (cancel && cancel->load(std::memory_order_relaxed)) throw Cancelled();
          // Node j of the tree (breadth first) has children 2j+1 (fits: hi = mid) and 2j+2
          // (over: lo = mid).
          std::vector<double> node_lo{lo}, node_hi{hi}, mids;
          for (size_t j = 0; j < (size_t{1} << levels) - 1; ++j) {
            const double mid = 0.5 * (node_lo[j] + node_hi[j]);
            mids.push_back(mid);
            node_lo.push_back(node_lo[j]);
            node_hi.push_back(mid);
            node_lo.push_back(mid);
            node_hi.push_back(node_hi[j]);
          }
          const std::vector<Clustering> probes = cluster_keys(in, t, den_share, mids);
          for (size_t j = 0; j < mids.size() && go_on(iter); ++iter) {
            if (probes[j].over) {
              lo = mids[j];
              j = 2 * j + 2;
            } else {
              hi = mids[j];
              j = 2 * j + 1;
            }
          }
        }
        delta = hi;
        clusters = cluster_stream(delta);
      }
      note << " delta " << delta << " (auto);";
    } else {
      note << " delta " << delta << ";";
    }
    if (clusters.over)  // cannot happen: a single cluster always fits once t <= den_share
      throw std::logic_error("subgen: no delta fits the denominator's share");
    return {delta, std::move(clusters), note.str()};
  }

  // The seeded part: reservoirs and samples over the clustering of `search`.
  static Selection finish(const MethodInput& in, int t, bool literal, const SearchResult& search,
                          Selection sel, std::ostringstream note) {
    const int n_mid = in.mid_end - in.mid_begin;
    const int m = in.budget;
    const Clustering& clusters = search.clusters;
    note << search.note;
    const int num_clusters = static_cast<int>(clusters.size.size());
    const int slots = m - static_cast<int>(clusters.capacity);  // numerator's s

    CounterRng rng(in.seed, kRandSubGen, static_cast<uint32_t>(in.layer),
                   static_cast<uint32_t>(in.kv_head));

    // Denominator reservoirs, in stream order (lines 14-21).
    std::vector<std::vector<int>> samples(num_clusters);
    std::vector<int> seen(num_clusters, 0);
    for (int i = 0; i < n_mid; ++i) {
      const int c = clusters.owner[i];
      if (seen[c]++ == 0) {
        samples[c].assign(t, i);
        continue;
      }
      const double p = 1.0 / seen[c];
      for (int j = 0; j < t; ++j)
        if (rng.uniform() < p) samples[c][j] = i;
    }
    std::vector<double> den_weight(n_mid, 0.0);
    for (int c = 0; c < num_clusters; ++c)
      for (int i : samples[c]) den_weight[i] += static_cast<double>(clusters.size[c]) / t;

    // Numerator: s i.i.d. samples with P(i) = ||v_i||^2 / mu (lines 24-29).
    std::vector<double> sq(n_mid);
    double mu = 0;
    for (int i = 0; i < n_mid; ++i) {
      sq[i] = in.values->row(in.mid_begin + i).cast<double>().squaredNorm();
      mu += sq[i];
    }
    std::vector<int> count(n_mid, 0);
    if (mu > 0) {
      if (literal) {
        std::vector<int> slot(slots, -1);
        double running = 0;
        for (int i = 0; i < n_mid; ++i) {
          if (sq[i] <= 0) continue;  // p = 0: never replaces a slot
          running += sq[i];
          const double p = sq[i] / running;
          for (int j = 0; j < slots; ++j)
            if (rng.uniform() < p) slot[j] = i;
        }
        for (int i : slot)
          if (i >= 0) ++count[i];
      } else {
        std::vector<double> cdf(n_mid);
        double run = 0;
        for (int i = 0; i < n_mid; ++i) cdf[i] = (run += sq[i]);
        for (int j = 0; j < slots; ++j) {
          const double u = rng.uniform() * run;
          // first i with cdf[i] > u: never a zero-norm token (its cdf equals its predecessor's)
          int i = static_cast<int>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
          i = std::min(i, n_mid - 1);
          while (sq[i] <= 0 && i > 0) --i;  // guard against rounding at the top end
          if (sq[i] > 0) ++count[i];
        }
      }
    } else {
      note << " all values are zero: the numerator is exactly 0;";
    }

    int num_distinct = 0, den_distinct = 0;
    for (int i = 0; i < n_mid; ++i) {
      if (count[i] > 0) {
        sel.indices.push_back(in.mid_begin + i);
        sel.weights.push_back(count[i] * mu / (static_cast<double>(slots) * sq[i]));
        ++num_distinct;
      }
      if (den_weight[i] > 0) {
        sel.den_indices.push_back(in.mid_begin + i);
        sel.den_weights.push_back(den_weight[i]);
        ++den_distinct;
      }
    }
    sel.middle_scores.resize(n_mid);
    for (int i = 0; i < n_mid; ++i) {
      sel.middle_scores[i] = mu > 0 ? sq[i] / mu : 0.0;  // numerator sampling probability
      sel.cluster[i] = clusters.owner[i];
    }
    note << " " << num_clusters << " clusters, t = " << t << ": denominator " << den_distinct
         << " distinct of " << clusters.capacity << " slots; numerator s = " << slots << ", "
         << num_distinct << " distinct; " << num_distinct + den_distinct << " of m = " << m
         << " used";
    sel.note = note.str().substr(1);
    return sel;
  }
};

}  // namespace

std::unique_ptr<Method> make_subgen() {
  return std::make_unique<SubGen>();
}

}  // namespace kvscope
