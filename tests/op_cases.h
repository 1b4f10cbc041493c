// The case table of the backend ops, as ggml's test-backend-ops: named shapes and seeds for every
// op, the inputs they make, and one case type (OpCase, at the end) that runs them in a check mode
// (tests/test_cuda_parity.cpp's CudaParity.MatchesCpu: the device against the CPU reference, for
// every case marked `parity`) and a timing mode (bench/bench_gpu.cpp: BM_Gpu<label> and
// BM_Cpu<label> for every case marked `bench`). Adding a shape is one line here; adding an op is
// its table, its inputs and its OpRun here (docs/design.md, "Adding a backend op"). Also used by
// the registry's tests (tests/test_backend_registry.cpp). Header-only: the engine library does
// not use it.
//
// Two fills: `normal` cases draw std::normal_distribution from std::mt19937 (the parity cases'
// inputs since they were written); `fast` cases (benchmark sizes: a 32-head layer takes seconds to
// draw from a normal distribution) fill with a splitmix64 hash of the index mapped to a symmetric
// uniform in [-scale, scale].
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/random.h"
#include "engine/ops/backend.h"

namespace kvscope {

enum class CaseFill { normal, fast };

namespace op_cases {

inline std::vector<float> normal(size_t count, double sd, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, static_cast<float>(sd));
  std::vector<float> out(count);
  for (float& x : out) x = dist(rng);
  return out;
}

inline void fast_fill(std::vector<float>& v, float amp, uint64_t seed) {
  for (size_t i = 0; i < v.size(); ++i) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    v[i] = amp * (static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f);
  }
}

template <typename Case>
const Case& find_case(const std::vector<Case>& cases, const std::string& name) {
  for (const Case& c : cases)
    if (name == c.name) return c;
  throw std::out_of_range("no op case named '" + name + "' (tests/op_cases.h)");
}

}  // namespace op_cases

// ---- walk ------------------------------------------------------------------------------------

// `heads` x `blocks` blocks of `len` rows, for kv heads first_head.. and block ids first_id..
struct WalkBlocks {
  int heads = 1, blocks = 1, len = 128;
  double key_scale = 0.35;  // normal: key sd; fast: key amplitude
  uint32_t first_head = 0, first_id = 0;
};

struct WalkCase {
  const char* name;
  int d, dv;
  std::vector<WalkBlocks> groups;
  uint32_t seed;
  CaseFill fill;
  bool parity, bench;
};

inline const std::vector<WalkCase>& walk_cases() {
  static const std::vector<WalkCase> cases = {
      // Full 128-row blocks and a short tail (the fast kernel), a 200-row block and a block with
      // huge logits (both on the exact double kernel).
      {"standard",
       48,
       40,
       {{3, 4, 128, 0.35}, {1, 1, 77, 0.35, 3, 0}, {1, 1, 200, 0.35, 3, 1}, {1, 1, 64, 8.0, 3, 2}},
       100,
       CaseFill::normal,
       true,
       false},
      // One layer: 32 heads x 32768 tokens, d = dv = 128, B = 128 (docs/performance.md target).
      {"layer_32x32k", 128, 128, {{32, 256, 128, 0.6}}, 1, CaseFill::fast, false, true},
      // One head of 32768 tokens (on both backends, for the ratio).
      {"head_32k", 128, 128, {{1, 256, 128, 0.6}}, 1, CaseFill::fast, false, true},
  };
  return cases;
}
inline const WalkCase& find_walk_case(const std::string& name) {
  return op_cases::find_case(walk_cases(), name);
}

// A walk case's rows, laid out block after block.
struct WalkCaseData {
  int d = 0, dv = 0;
  std::vector<float> keys, values;
  std::vector<int> offset{0};
  std::vector<uint32_t> head, id;
  int rows() const { return offset.back(); }

  WalkCaseData() = default;
  explicit WalkCaseData(const WalkCase& c) : d(c.d), dv(c.dv) {
    uint32_t seed = c.seed;
    for (const WalkBlocks& g : c.groups)
      for (int h = 0; h < g.heads; ++h)
        for (int b = 0; b < g.blocks; ++b) {
          if (c.fill == CaseFill::normal)
            add_normal_block(g.len, g.first_head + h, g.first_id + b, g.key_scale, seed += 7);
          else
            add_layout(g.len, g.first_head + h, g.first_id + b);
        }
    if (c.fill == CaseFill::fast) {
      // Key entries in [-0.6, 0.6]: <k_i,k_j>/sqrt(d) of order 1, as centred real keys are;
      // values small enough that p_i is not always clipped.
      keys.resize(static_cast<size_t>(rows()) * d);
      values.resize(static_cast<size_t>(rows()) * dv);
      op_cases::fast_fill(keys, static_cast<float>(c.groups.front().key_scale), c.seed);
      op_cases::fast_fill(values, 0.1f, c.seed + 1);
    }
  }

  void add_layout(int len, uint32_t h, uint32_t b) {
    offset.push_back(offset.back() + len);
    head.push_back(h);
    id.push_back(b);
  }

  void add_normal_block(int len, uint32_t h, uint32_t b, double key_sd, uint32_t seed) {
    std::vector<float> k = op_cases::normal(static_cast<size_t>(len) * d, key_sd, seed);
    // Centre the keys within the block, as the practical walk does before calling the backend.
    for (int c = 0; c < d; ++c) {
      double mean = 0;
      for (int r = 0; r < len; ++r) mean += k[static_cast<size_t>(r) * d + c];
      mean /= len;
      for (int r = 0; r < len; ++r) k[static_cast<size_t>(r) * d + c] -= static_cast<float>(mean);
    }
    const std::vector<float> v = op_cases::normal(static_cast<size_t>(len) * dv, 0.12, seed + 1);
    keys.insert(keys.end(), k.begin(), k.end());
    values.insert(values.end(), v.begin(), v.end());
    add_layout(len, h, b);
  }

  // The batch of layer 3, round 1 (the parity tests' keys), writing into the given outputs.
  WalkBatch batch(std::vector<int8_t>& sigma, std::vector<float>& p, std::vector<float>& partial,
                  uint64_t seed) const {
    sigma.assign(rows(), 0);
    p.assign(rows(), NAN);
    partial.assign(rows(), NAN);
    WalkBatch b;
    b.d = d;
    b.dv = dv;
    b.num_blocks = static_cast<int>(head.size());
    b.keys = keys.data();
    b.values = values.data();
    b.block_offset = offset.data();
    b.block_head = head.data();
    b.block_id = id.data();
    b.seed = seed;
    b.layer = 3;
    b.round = 1;
    b.sigma = sigma.data();
    b.p = p.data();
    b.partial = partial.data();
    return b;
  }
};

// ---- attention errors ------------------------------------------------------------------------

struct ErrorCase {
  const char* name;
  int n, d, dv, q_heads, kv_heads, sink, eval;
  double keep;    // kept share of the middle
  bool separate;  // normal fill: a different denominator set on odd kv heads
  uint32_t seed;
  CaseFill fill;
  bool parity, bench;
};

inline const std::vector<ErrorCase>& error_cases() {
  static const std::vector<ErrorCase> cases = {
      // GQA groups of 2, separate numerator/denominator sets on odd kv heads, several key tiles.
      {"gqa_separate", 300, 32, 24, 4, 2, 8, 40, 0.5, true, 11, CaseFill::normal, true, false},
      // Llama-like head dims, E not a multiple of the 16-query tile.
      {"llama_dims", 700, 128, 128, 2, 1, 21, 87, 0.25, false, 12, CaseFill::normal, true, false},
      // Odd d (scalar logit loop) and dv = 16 (one query per thread in the column layout).
      {"odd_d", 150, 13, 16, 2, 2, 4, 24, 0.5, true, 14, CaseFill::normal, true, false},
      // dv above 128 takes the wider accumulator variant.
      {"wide_dv", 260, 16, 200, 1, 1, 0, 33, 0.125, false, 13, CaseFill::normal, true, false},
      // Keeping every middle token at weight 1: zero error, full mass.
      {"full_selection", 400, 64, 64, 2, 2, 12, 50, 1.0, false, 21, CaseFill::normal, false, false},
      {"bad_selection", 200, 16, 16, 1, 1, 4, 20, 0.5, false, 31, CaseFill::normal, false, false},
      {"fallback", 300, 32, 32, 2, 1, 8, 40, 0.5, false, 41, CaseFill::normal, false, false},
      // Benchmarks: 256 evaluation queries over all 32 query heads (8 kv heads) of a layer, every
      // other middle token at weight 2; and one head on both backends (the ratio).
      {"layer_8k", 8192, 128, 128, 32, 8, 256, 256, 0.5, false, 7, CaseFill::fast, false, true},
      {"layer_32k", 32768, 128, 128, 32, 8, 256, 256, 0.5, false, 7, CaseFill::fast, false, true},
      {"head_8k", 8192, 128, 128, 1, 1, 256, 256, 0.5, false, 7, CaseFill::fast, false, true},
  };
  return cases;
}
inline const ErrorCase& find_error_case(const std::string& name) {
  return op_cases::find_case(error_cases(), name);
}

// An error case's heads and selections, and its batch (outputs set by run()).
struct ErrorCaseData {
  std::vector<std::vector<float>> keys, values, queries;
  ErrorBatch batch;
  std::vector<double> relative, normalized, mass;

  explicit ErrorCaseData(const ErrorCase& c) {
    batch.n = c.n;
    batch.d = c.d;
    batch.dv = c.dv;
    batch.q_heads = c.q_heads;
    batch.kv_heads = c.kv_heads;
    batch.sink = c.sink;
    batch.eval = c.eval;
    if (c.fill == CaseFill::fast)
      make_fast(c);
    else
      make_normal(c);
    for (int h = 0; h < c.kv_heads; ++h) {
      batch.keys.push_back(keys[h].data());
      batch.values.push_back(values[h].data());
    }
    for (int h = 0; h < c.q_heads; ++h)
      batch.queries.push_back(queries[queries.size() == 1 ? 0 : h].data());
  }

  void make_normal(const ErrorCase& c) {
    const int n = c.n;
    for (int h = 0; h < c.kv_heads; ++h) {
      keys.push_back(op_cases::normal(static_cast<size_t>(n) * c.d, 1.0, c.seed + 10 * h));
      values.push_back(op_cases::normal(static_cast<size_t>(n) * c.dv, 1.0, c.seed + 10 * h + 1));
    }
    for (int h = 0; h < c.q_heads; ++h)
      queries.push_back(op_cases::normal(static_cast<size_t>(n) * c.d, 1.2, c.seed + 1000 + h));
    std::mt19937 rng(c.seed + 77);
    const int mid_begin = c.sink, mid_end = n - c.eval;
    for (int h = 0; h < c.kv_heads; ++h) {
      std::vector<int> middle(mid_end - mid_begin);
      for (int i = 0; i < mid_end - mid_begin; ++i) middle[i] = mid_begin + i;
      std::shuffle(middle.begin(), middle.end(), rng);
      const int m = static_cast<int>(std::lround(c.keep * middle.size()));
      std::vector<int> idx(middle.begin(), middle.begin() + m);
      std::uniform_real_distribution<float> lw(0.2f, 1.2f);
      std::vector<double> logw(m);
      for (double& x : logw) x = lw(rng);
      batch.num_idx.push_back(idx);
      batch.num_logw.push_back(logw);
      if (c.separate && h % 2 == 1) {  // a different denominator set on odd heads
        std::shuffle(middle.begin(), middle.end(), rng);
        std::vector<int> didx(middle.begin(), middle.begin() + m / 2);
        std::vector<double> dlogw(didx.size(), std::log(2.0f / static_cast<float>(c.keep)));
        batch.den_idx.push_back(didx);
        batch.den_logw.push_back(dlogw);
      } else {
        batch.den_idx.push_back(idx);
        batch.den_logw.push_back(logw);
      }
    }
  }

  // Every other middle token at weight 2 (keep 1/2); one query buffer shared by all query heads
  // (timing only).
  void make_fast(const ErrorCase& c) {
    const int n = c.n;
    keys.resize(c.kv_heads);
    values.resize(c.kv_heads);
    for (int h = 0; h < c.kv_heads; ++h) {
      keys[h].resize(static_cast<size_t>(n) * c.d);
      values[h].resize(static_cast<size_t>(n) * c.dv);
      op_cases::fast_fill(keys[h], 1.0f, 10 + h);
      op_cases::fast_fill(values[h], 1.0f, 100 + h);
    }
    queries.assign(1, std::vector<float>(static_cast<size_t>(n) * c.d));
    op_cases::fast_fill(queries[0], 1.0f, c.seed);
    for (int h = 0; h < c.kv_heads; ++h) {
      std::vector<int> idx;
      for (int i = c.sink; i < n - c.eval; i += 2) idx.push_back(i);
      batch.num_idx.push_back(idx);
      batch.num_logw.push_back(std::vector<double>(idx.size(), std::log(2.0)));
      batch.den_idx.push_back(idx);
      batch.den_logw.push_back(batch.num_logw.back());
    }
  }

  // Points the outputs at fresh arrays (NaN) and runs the op on `backend`.
  void run(Backend& backend) {
    prepare_outputs();
    backend.attention_errors(batch);
  }
  void prepare_outputs() {
    const size_t count = static_cast<size_t>(batch.q_heads) * batch.eval;
    relative.assign(count, NAN);
    normalized.assign(count, NAN);
    mass.assign(count, NAN);
    batch.relative = relative.data();
    batch.normalized = normalized.data();
    batch.mass = mass.data();
  }
};

// ---- attention scores ------------------------------------------------------------------------

// `kv_heads` heads of `group` query heads each, query rows [row_begin, row_end) reduced by
// `reduce`; with `stops`, every head also asks for the running sums at stop rows drawn in
// [row_begin, row_end] (BUZZ's eviction-time scores).
struct ScoreCase {
  const char* name;
  int n, d, kv_heads, group, row_begin, row_end;
  ScoreReduce reduce;
  bool stops;
  double key_sd;  // normal: key sd (queries 1.2); larger makes sharper rows
  uint32_t seed;
  CaseFill fill;
  bool parity, bench;
};

inline const std::vector<ScoreCase>& score_cases() {
  static const std::vector<ScoreCase> cases = {
      // H2O: every middle row, GQA groups of 2 over two kv heads, several key tiles and chunks.
      {"h2o_gqa", 300, 32, 2, 2, 8, 260, ScoreReduce::mean_seen, false, 1.0, 5, CaseFill::normal,
       true, false},
      // SnapKV's observation window with Llama's d = 128 and a group of 4.
      {"window_llama", 700, 128, 1, 4, 636, 668, ScoreReduce::sum, false, 1.0, 6, CaseFill::normal,
       true, false},
      // TOVA's last row over three kv heads (kvpress variant), odd d.
      {"last_row_odd_d", 257, 13, 3, 2, 200, 201, ScoreReduce::sum, false, 1.0, 7, CaseFill::normal,
       true, false},
      // A window reaching row 0 (window longer than the prefix), group of 3.
      {"from_row_0", 150, 64, 1, 3, 0, 150, ScoreReduce::sum, false, 1.0, 8, CaseFill::normal, true,
       false},
      // BUZZ's full-prefix rule: stopped sums, sharp rows (large logits).
      {"stops_sharp", 230, 16, 1, 1, 4, 210, ScoreReduce::sum, true, 3.0, 9, CaseFill::normal, true,
       false},
      // Benchmarks: H2O over a layer's 8 kv heads (groups of 4) at n = 8192; SnapKV's window of
      // 32 at n = 32768.
      {"h2o_layer_8k", 8192, 128, 8, 4, 4, 7936, ScoreReduce::mean_seen, false, 1.0, 3,
       CaseFill::fast, false, true},
      {"window_layer_32k", 32768, 128, 8, 4, 32480, 32512, ScoreReduce::sum, false, 1.0, 3,
       CaseFill::fast, false, true},
  };
  return cases;
}
inline const ScoreCase& find_score_case(const std::string& name) {
  return op_cases::find_case(score_cases(), name);
}

// A score case's heads and its batch (outputs set by run()).
struct ScoreCaseData {
  std::vector<std::vector<float>> keys, queries;  // [kv_heads], [kv_heads * group]
  std::vector<int> stop_rows;
  std::vector<std::vector<double>> scores, stopped;  // [kv_heads][row_end]
  ScoreBatch batch;

  explicit ScoreCaseData(const ScoreCase& c) {
    const size_t nd = static_cast<size_t>(c.n) * c.d;
    for (int h = 0; h < c.kv_heads; ++h) {
      if (c.fill == CaseFill::normal) {
        keys.push_back(op_cases::normal(nd, c.key_sd, c.seed + 10 * h));
      } else {
        keys.emplace_back(nd);
        op_cases::fast_fill(keys.back(), static_cast<float>(c.key_sd), c.seed + 10 * h);
      }
    }
    for (int q = 0; q < c.kv_heads * c.group; ++q) {
      if (c.fill == CaseFill::normal) {
        queries.push_back(op_cases::normal(nd, 1.2, c.seed + 1000 + q));
      } else {
        queries.emplace_back(nd);
        op_cases::fast_fill(queries.back(), 1.0f, c.seed + 1000 + q);
      }
    }
    if (c.stops) {
      std::mt19937 rng(c.seed + 77);
      std::uniform_int_distribution<int> stop(c.row_begin, c.row_end);
      stop_rows.resize(c.row_end);
      for (int& r : stop_rows) r = stop(rng);
    }
    batch.n = c.n;
    batch.d = c.d;
    batch.row_begin = c.row_begin;
    batch.row_end = c.row_end;
    batch.reduce = c.reduce;
    batch.stop_rows = c.stops ? stop_rows.data() : nullptr;
    scores.assign(c.kv_heads, {});
    stopped.assign(c.kv_heads, {});
    for (int h = 0; h < c.kv_heads; ++h) {
      ScoreHead head;
      head.keys = keys[h].data();
      for (int g = 0; g < c.group; ++g) head.queries.push_back(queries[h * c.group + g].data());
      batch.heads.push_back(head);
    }
    prepare_outputs();
  }

  // Points the outputs at fresh arrays (NaN) and runs the op on `backend`.
  void run(Backend& backend) {
    prepare_outputs();
    backend.attention_scores(batch);
  }
  void prepare_outputs() {
    for (size_t h = 0; h < batch.heads.size(); ++h) {
      scores[h].assign(batch.row_end, NAN);
      batch.heads[h].scores = scores[h].data();
      if (batch.stop_rows) {
        stopped[h].assign(batch.row_end, NAN);
        batch.heads[h].stopped = stopped[h].data();
      }
    }
  }
};

// ---- key clusters ----------------------------------------------------------------------------

// SubGen's clustering: n keys of width d drawn around `centres` centres (spread 1, noise
// `noise`), t samples per cluster, a capacity limit, and radii as fractions of the noise's
// typical distance sqrt(2 d) * noise (0 puts every distinct key in its own cluster).
struct ClusterCase {
  const char* name;
  int n, d, centres;
  double noise;
  int t;
  long long limit;
  std::vector<double> radii;  // x sqrt(2 d) * noise
  uint32_t seed;
  bool parity, bench;
};

inline const std::vector<ClusterCase>& cluster_cases() {
  static const std::vector<ClusterCase> cases = {
      // Llama's d = 128 around 12 centres: radii below, at and above the noise's distances.
      {"clumped_llama", 600, 128, 12, 0.2, 2, 400, {0, 0.5, 0.9, 1.0, 1.1, 2.0}, 11, true, false},
      // Odd d, t = 3, a limit that stops some radii early.
      {"odd_d_limit", 333, 13, 20, 0.5, 3, 60, {0.3, 0.8, 1.0, 1.3, 3.0}, 12, true, false},
      // No structure (one centre): every radius keeps opening clusters; t = 1.
      {"noise_only", 256, 32, 1, 1.0, 1, 255, {0, 0.7, 0.95, 1.05}, 13, true, false},
      // Benchmark: one SubGen batch on a Llama head's 8192 middle keys around 256 centres, a
      // denominator share of 1024 (m = 2048 at split 0.5), 31 radii around the noise's distance.
      {"subgen_batch_8k",
       8192,
       128,
       256,
       0.2,
       2,
       1024,
       {0.80, 0.81, 0.82, 0.83, 0.84, 0.85, 0.86, 0.87, 0.88, 0.89, 0.90,
        0.91, 0.92, 0.93, 0.94, 0.95, 0.96, 0.97, 0.98, 0.99, 1.00, 1.01,
        1.02, 1.03, 1.04, 1.05, 1.06, 1.07, 1.08, 1.09, 1.10},
       14,
       false,
       true},
  };
  return cases;
}
inline const ClusterCase& find_cluster_case(const std::string& name) {
  return op_cases::find_case(cluster_cases(), name);
}

// A cluster case's keys and its batch (outputs set by run()).
struct ClusterCaseData {
  std::vector<float> keys;
  std::vector<KeyClusters> out;
  ClusterBatch batch;

  explicit ClusterCaseData(const ClusterCase& c) {
    const std::vector<float> centres =
        op_cases::normal(static_cast<size_t>(c.centres) * c.d, 1.0, c.seed);
    keys = op_cases::normal(static_cast<size_t>(c.n) * c.d, c.noise, c.seed + 1);
    std::mt19937 rng(c.seed + 2);
    std::uniform_int_distribution<int> pick(0, c.centres - 1);
    for (int i = 0; i < c.n; ++i) {
      const int k = pick(rng);
      for (int j = 0; j < c.d; ++j)
        keys[static_cast<size_t>(i) * c.d + j] += centres[static_cast<size_t>(k) * c.d + j];
    }
    batch.keys = keys.data();
    batch.n = c.n;
    batch.d = c.d;
    batch.t = c.t;
    batch.limit = c.limit;
    const double unit = std::sqrt(2.0 * c.d) * c.noise;
    for (double r : c.radii) batch.deltas.push_back(r * unit);
  }
  void run(Backend& backend) {
    out.assign(batch.deltas.size(), KeyClusters{});
    batch.out = out.data();
    backend.key_clusters(batch);
  }
};

// ---- cache scores ----------------------------------------------------------------------------

// BUZZ's streamed scores over one segment: rows [row_begin, row_end) over a cache of `cached`
// positions drawn below row_begin (ascending) plus every position of the segment; group query
// heads; log n or not. acc starts from positive values, as after earlier segments.
struct CacheScoreCase {
  const char* name;
  int n, d, group, cached, row_begin, row_end;
  bool log_n;
  double key_sd;
  uint32_t seed;
  bool parity, bench;
};

inline const std::vector<CacheScoreCase>& cache_score_cases() {
  static const std::vector<CacheScoreCase> cases = {
      // A BUZZ segment with Llama's d = 128 and a group of 4: 300 cached keys, 180 rows.
      {"segment_llama", 700, 128, 4, 300, 480, 660, false, 1.0, 21, true, false},
      // log n scores, odd d, group of 3, sharp rows.
      {"log_n_odd_d", 400, 13, 3, 150, 250, 330, true, 3.0, 22, true, false},
      // The first segment: rows from 0, no cached key; one query head.
      {"from_row_0", 200, 64, 1, 0, 0, 200, false, 1.0, 23, true, false},
      // One row (an eviction right after the previous one), group of 2.
      {"one_row", 300, 32, 2, 120, 290, 291, true, 1.0, 24, true, false},
      // Benchmark: a segment of BUZZ's defaults at n = 8192 (k + T + w = 564 cached keys, the
      // 240 rows between two evictions), Llama's d = 128, a group of 4.
      {"segment_8k", 8192, 128, 4, 564, 7000, 7240, false, 1.0, 25, false, true},
  };
  return cases;
}
inline const CacheScoreCase& find_cache_score_case(const std::string& name) {
  return op_cases::find_case(cache_score_cases(), name);
}

struct CacheScoreCaseData {
  std::vector<float> keys;
  std::vector<std::vector<float>> queries;
  std::vector<int> ids;
  std::vector<double> acc, acc_start;
  CacheScoreBatch batch;

  explicit CacheScoreCaseData(const CacheScoreCase& c) {
    const size_t nd = static_cast<size_t>(c.n) * c.d;
    keys = op_cases::normal(nd, c.key_sd, c.seed);
    for (int g = 0; g < c.group; ++g)
      queries.push_back(op_cases::normal(nd, 1.2, c.seed + 100 + g));
    std::vector<int> below(c.row_begin);
    for (int i = 0; i < c.row_begin; ++i) below[i] = i;
    std::mt19937 rng(c.seed + 7);
    std::shuffle(below.begin(), below.end(), rng);
    below.resize(std::min(c.cached, c.row_begin));
    std::sort(below.begin(), below.end());
    ids = below;
    for (int i = c.row_begin; i < c.row_end; ++i) ids.push_back(i);
    std::uniform_real_distribution<double> start(0.0, 2.0);
    acc_start.assign(c.n, 0.0);
    for (int i : ids) acc_start[i] = start(rng);
    batch.keys = keys.data();
    for (const auto& q : queries) batch.queries.push_back(q.data());
    batch.n = c.n;
    batch.d = c.d;
    batch.key_ids = ids.data();
    batch.num_keys = static_cast<int>(ids.size());
    batch.row_begin = c.row_begin;
    batch.row_end = c.row_end;
    batch.log_n = c.log_n;
  }
  void run(Backend& backend) {
    acc = acc_start;
    batch.acc = acc.data();
    backend.cache_scores(batch);
  }
};

// ---- expected scores -------------------------------------------------------------------------

// Expected-attention's scores: `heads` kv heads of `count` tokens, `group` query heads each (their
// rows drawn around a per-channel mean, as real queries sit off the origin), the mean RoPE
// rotation of the method (theta 10000, the half layout, `future` positions after the context).
struct ExpectedCase {
  const char* name;
  int heads, group, count, d, dv, future;
  bool use_covariance, use_vnorm;
  double epsilon;
  uint32_t seed;
  bool parity, bench;
};

inline const std::vector<ExpectedCase>& expected_cases() {
  static const std::vector<ExpectedCase> cases = {
      // Llama's d = 128 and a group of 4, the press's defaults.
      {"llama_group4", 1, 4, 700, 128, 128, 512, true, true, 0.0, 31, true, false},
      // Two kv heads, odd widths (d = 13, dv = 9), a group of 3, epsilon.
      {"two_heads_odd_d", 2, 3, 333, 13, 9, 64, true, true, 0.01, 32, true, false},
      // Neither the covariance term nor the value norms.
      {"mean_only", 1, 2, 200, 64, 64, 512, false, false, 0.0, 33, true, false},
      // One token: a zero covariance, a softmax over one logit.
      {"one_token", 1, 1, 1, 8, 8, 16, true, true, 0.0, 34, true, false},
      // Benchmark: one kv head of an 8k Llama-3-shaped context (4 sinks), a group of 4.
      {"head_8k", 1, 4, 8188, 128, 128, 512, true, true, 0.0, 35, false, true},
  };
  return cases;
}
inline const ExpectedCase& find_expected_case(const std::string& name) {
  return op_cases::find_case(expected_cases(), name);
}

struct ExpectedCaseData {
  std::vector<std::vector<float>> keys, values;
  std::vector<std::vector<double>> queries;  // heads * group
  std::vector<double> rotation;
  std::vector<std::vector<double>> out;
  ExpectedScoreBatch batch;

  explicit ExpectedCaseData(const ExpectedCase& c) {
    const size_t nd = static_cast<size_t>(c.count) * c.d;
    uint32_t seed = c.seed;
    for (int h = 0; h < c.heads; ++h) {
      keys.push_back(op_cases::normal(nd, 1.0, seed++));
      values.push_back(op_cases::normal(static_cast<size_t>(c.count) * c.dv, 1.0, seed++));
      for (int g = 0; g < c.group; ++g) {
        const std::vector<float> q = op_cases::normal(nd, 1.2, seed++);
        std::vector<double> qd(nd);
        for (size_t e = 0; e < nd; ++e) qd[e] = q[e] + 0.5 * std::sin(0.7 * (e % c.d) + g);
        queries.push_back(std::move(qd));
      }
    }
    // The method's rotation: mean over positions [count, count + future) of RoPE at each.
    rotation.assign(static_cast<size_t>(c.d) * c.d, 0.0);
    for (int i = 0; i < c.d / 2; ++i) {
      const double freq = std::pow(10000.0, -2.0 * i / c.d);
      double cs = 0, sn = 0;
      for (int p = c.count; p < c.count + c.future; ++p) {
        cs += std::cos(p * freq);
        sn += std::sin(p * freq);
      }
      cs /= c.future, sn /= c.future;
      const int a = i, b = i + c.d / 2;
      rotation[a * c.d + a] = cs, rotation[a * c.d + b] = -sn;
      rotation[b * c.d + a] = sn, rotation[b * c.d + b] = cs;
    }
    batch.count = c.count;
    batch.d = c.d;
    batch.dv = c.dv;
    batch.rotation = rotation.data();
    batch.use_covariance = c.use_covariance;
    batch.use_vnorm = c.use_vnorm;
    batch.epsilon = c.epsilon;
    out.assign(c.heads, std::vector<double>(c.count));
    for (int h = 0; h < c.heads; ++h) {
      ExpectedScoreHead head;
      head.keys = keys[h].data();
      head.values = values[h].data();
      for (int g = 0; g < c.group; ++g) head.queries.push_back(queries[h * c.group + g].data());
      head.scores = out[h].data();
      batch.heads.push_back(std::move(head));
    }
  }
  void run(Backend& backend) {
    for (auto& o : out) std::fill(o.begin(), o.end(), -1.0);
    backend.expected_scores(batch);
  }
};

// ---- chunk scores ----------------------------------------------------------------------------

// Compactor's chunked attention over a region of `len` tokens: `heads` kv heads, `group` query
// heads each, chunks of `chunk` (the last one partial unless chunk divides len). Keys and queries
// at scale `sd`: compactor's logits are unscaled, so sd sets how sharp the rows are.
struct ChunkCase {
  const char* name;
  int heads, group, len, d, chunk;
  double sd;
  uint32_t seed;
  bool parity, bench;
};

inline const std::vector<ChunkCase>& chunk_cases() {
  static const std::vector<ChunkCase> cases = {
      // Llama's d = 128, a group of 4, the press's chunk of 256 with a partial last chunk.
      {"llama_partial", 1, 4, 700, 128, 256, 0.35, 41, true, false},
      // Two kv heads, odd d = 13, a group of 3, chunks that divide the region (no padding).
      {"two_heads_exact_chunks", 2, 3, 300, 13, 50, 1.0, 42, true, false},
      // One chunk larger than the region: everything is the partial last chunk.
      {"one_partial_chunk", 1, 2, 90, 32, 256, 0.5, 43, true, false},
      // Benchmark: one kv head of an 8k Llama-3-shaped context's region, a group of 4.
      {"head_8k", 1, 4, 8180, 128, 256, 0.35, 44, false, true},
  };
  return cases;
}
inline const ChunkCase& find_chunk_case(const std::string& name) {
  return op_cases::find_case(chunk_cases(), name);
}

struct ChunkCaseData {
  std::vector<std::vector<float>> keys, queries;  // queries: heads * group
  std::vector<std::vector<double>> col;
  ChunkScoreBatch batch;

  explicit ChunkCaseData(const ChunkCase& c) {
    const size_t nd = static_cast<size_t>(c.len) * c.d;
    uint32_t seed = c.seed;
    for (int h = 0; h < c.heads; ++h) {
      keys.push_back(op_cases::normal(nd, c.sd, seed++));
      for (int g = 0; g < c.group; ++g) queries.push_back(op_cases::normal(nd, c.sd, seed++));
    }
    batch.len = c.len;
    batch.d = c.d;
    batch.chunk = c.chunk;
    col.assign(c.heads, std::vector<double>(c.len));
    for (int h = 0; h < c.heads; ++h) {
      ChunkScoreHead head;
      head.keys = keys[h].data();
      for (int g = 0; g < c.group; ++g) head.queries.push_back(queries[h * c.group + g].data());
      head.col = col[h].data();
      batch.heads.push_back(std::move(head));
    }
  }
  void run(Backend& backend) {
    for (auto& o : col) std::fill(o.begin(), o.end(), -1.0);
    backend.chunk_scores(batch);
  }
};

// ---- t-SNE gradient --------------------------------------------------------------------------

struct TsneCase {
  const char* name;
  int n;
  // normal: a symmetric P over ring neighbours at offsets 1, 2, 5, 17 with random weights;
  // fast: 45 neighbours on each side (3 x perplexity 30, as the affinity step produces), uniform.
  uint32_t seed;
  CaseFill fill;
  bool parity, bench;
};

inline const std::vector<TsneCase>& tsne_cases() {
  static const std::vector<TsneCase> cases = {
      {"ring", 700, 51, CaseFill::normal, true, false},
      {"band_8k", 8192, 5, CaseFill::fast, false, true},
      {"band_32k", 32768, 5, CaseFill::fast, false, true},
  };
  return cases;
}
inline const TsneCase& find_tsne_case(const std::string& name) {
  return op_cases::find_case(tsne_cases(), name);
}

// A t-SNE case's embedding and P (CSR), and the op's input (exaggeration 12, exact: theta 0).
struct TsneCaseData {
  std::vector<float> y, val;
  std::vector<int> rowptr{0}, col;
  TsneGradInput in;

  explicit TsneCaseData(const TsneCase& c) {
    const int n = c.n;
    if (c.fill == CaseFill::normal) {
      y = op_cases::normal(2 * static_cast<size_t>(n), 3.0, c.seed);
      std::mt19937 rng(c.seed + 1);
      std::uniform_real_distribution<float> w(0.5f, 1.5f);
      std::vector<std::vector<std::pair<int, float>>> rows(n);
      for (int i = 0; i < n; ++i)
        for (int off : {1, 2, 5, 17}) {
          const int j = (i + off) % n;
          const float v = w(rng);
          rows[i].push_back({j, v});
          rows[j].push_back({i, v});
        }
      double total = 0;
      for (const auto& r : rows)
        for (const auto& e : r) total += e.second;
      for (const auto& r : rows) {
        for (const auto& e : r) {
          col.push_back(e.first);
          val.push_back(static_cast<float>(e.second / total));
        }
        rowptr.push_back(static_cast<int>(col.size()));
      }
    } else {
      y.resize(2 * static_cast<size_t>(n));
      op_cases::fast_fill(y, 30.0f, c.seed);
      const int half = 45;
      for (int i = 0; i < n; ++i) {
        for (int o = 1; o <= half; ++o) {
          col.push_back((i + o) % n);
          col.push_back((i - o + n) % n);
        }
        rowptr.push_back(static_cast<int>(col.size()));
      }
      val.assign(col.size(), 1.0f / static_cast<float>(col.size()));
    }
    in.n = n;
    in.y = y.data();
    in.p_rowptr = rowptr.data();
    in.p_col = col.data();
    in.p_val = val.data();
    in.exaggeration = 12;
    in.theta = 0;
  }
};

// ---- k-center --------------------------------------------------------------------------------

struct KcenterCase {
  const char* name;
  int n, d;
  int clusters;  // normal: well-separated clusters (sd 20 centres, sd 0.5 noise); fast: 0
  int k;         // the benchmark's centres (the parity test tries several)
  uint32_t seed;
  CaseFill fill;
  bool parity, bench;
};

inline const std::vector<KcenterCase>& kcenter_cases() {
  static const std::vector<KcenterCase> cases = {
      {"separated", 960, 16, 24, 24, 61, CaseFill::normal, true, false},
      {"keys_32k", 32768, 128, 0, 256, 9, CaseFill::fast, false, true},
  };
  return cases;
}
inline const KcenterCase& find_kcenter_case(const std::string& name) {
  return op_cases::find_case(kcenter_cases(), name);
}

struct KcenterCaseData {
  int n = 0, d = 0;
  std::vector<float> x;  // n x d

  explicit KcenterCaseData(const KcenterCase& c) : n(c.n), d(c.d) {
    x.resize(static_cast<size_t>(n) * d);
    if (c.fill == CaseFill::fast) {
      op_cases::fast_fill(x, 1.0f, c.seed);
      return;
    }
    const std::vector<float> centres =
        op_cases::normal(static_cast<size_t>(c.clusters) * d, 20.0, c.seed);
    const std::vector<float> noise = op_cases::normal(static_cast<size_t>(n) * d, 0.5, c.seed + 1);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < d; ++j)
        x[static_cast<size_t>(i) * d + j] =
            centres[(i % c.clusters) * d + j] + noise[static_cast<size_t>(i) * d + j];
  }
};

// ---- one case type: check mode and timing mode -------------------------------------------------

// One case's inputs and outputs, made fresh for each backend it runs on.
struct OpRun {
  virtual ~OpRun() = default;
  // Runs the op on `backend` over this run's inputs (every step, in order), outputs fresh.
  virtual void run(Backend& backend) = 0;
  // Timing mode: the steps a device timing replays (each on a backend of its own:
  // cuda_op_timer, kernels/cuda_backend.h). Default: the whole run.
  virtual std::vector<std::function<void(Backend&)>> steps() {
    return {[this](Backend& b) { run(b); }};
  }
  // Check mode: "" when this run's outputs (from a device) match `cpu`'s (the same case on the CPU
  // reference) within the op's tolerance; otherwise what differs, first differences first.
  virtual std::string mismatch(const OpRun& cpu) const = 0;
};

struct OpCase {
  std::string op;     // op_name(): "chunk_scores"
  std::string label;  // the case and its variant: "chunk_scores/head_8k" (gtest and benchmarks)
  bool parity = false, bench = false;
  bool bench_cpu = false;  // timed on the CPU too (seconds, not minutes)
  std::function<std::unique_ptr<OpRun>()> make;
};

namespace op_cases {

// "" when every entry is within rel * |cpu| + abs, else the first few that are not.
inline std::string close(const std::vector<double>& dev, const std::vector<double>& cpu, double rel,
                         double abs, const std::string& what) {
  if (dev.size() != cpu.size())
    return what + ": " + std::to_string(dev.size()) + " values, the CPU " +
           std::to_string(cpu.size()) + "\n";
  std::string out;
  int bad = 0;
  for (size_t i = 0; i < dev.size(); ++i)
    if (!(std::fabs(dev[i] - cpu[i]) <= rel * std::fabs(cpu[i]) + abs) && ++bad <= 5) {
      char line[160];
      std::snprintf(line, sizeof line, "%s[%zu]: device %.17g, cpu %.17g\n", what.c_str(), i,
                    dev[i], cpu[i]);
      out += line;
    }
  if (bad > 5) out += what + ": " + std::to_string(bad) + " entries differ\n";
  return out;
}
inline std::vector<double> widen(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}
template <typename Run>
const Run& as(const OpRun& r) {
  return static_cast<const Run&>(r);
}

// ---- walk

// The parity case's signs on two seeds. `float32`: the authors' float32 walk (BalanceKV's
// default), else KVScope's double walk. A sign may differ only where the draw u_i lies within
// float rounding of the CPU's clip(p_i); everything after it in that block follows another walk,
// so the first difference of a block is allowed when it is such a draw, at most one block in a
// thousand rows. The same rows overflow (p NaN) on both sides. Before the first difference, the
// double walk's p and partial sums agree to float accuracy.
struct WalkParityRun : OpRun {
  WalkCaseData w;
  bool float32;
  static constexpr uint64_t kSeeds[2] = {1ull, 0x9e3779b97f4a7c15ull};
  std::vector<int8_t> sigma[2];
  std::vector<float> p[2], partial[2];
  WalkParityRun(const WalkCase& c, bool f32) : w(c), float32(f32) {}
  void run(Backend& backend) override {
    for (int s = 0; s < 2; ++s) {
      WalkBatch b = w.batch(sigma[s], p[s], partial[s], kSeeds[s]);
      b.float32 = float32;
      b.value_eps = float32 ? 1e-8 : 0.0;
      backend.walk_blocks(b);
    }
  }
  std::string mismatch(const OpRun& cpu_run) const override {
    const auto& cpu = as<WalkParityRun>(cpu_run);
    std::string out;
    for (int s = 0; s < 2; ++s) {
      int flipped = 0;
      for (size_t b = 0; b + 1 < w.offset.size(); ++b) {
        const int r0 = w.offset[b], r1 = w.offset[b + 1];
        const std::string where = "seed " + std::to_string(s) + " block " + std::to_string(b);
        int first_diff = r1;
        for (int i = r0; i < r1; ++i) {
          if (sigma[s][i] != 1 && sigma[s][i] != -1) return where + ": a row has no sign\n";
          if (std::isnan(p[s][i]) != std::isnan(cpu.p[s][i]))
            out += where + " row " + std::to_string(i - r0) + ": overflowed on one side only\n";
          if (sigma[s][i] != cpu.sigma[s][i]) {
            first_diff = i;
            break;
          }
        }
        if (first_diff < r1) {
          ++flipped;
          const double u = counter_uniform(kSeeds[s], kRandWalk, 3, w.head[b], 1, w.id[b],
                                           static_cast<uint32_t>(first_diff - r0));
          const double clipped = std::clamp(static_cast<double>(cpu.p[s][first_diff]), 0.0, 1.0);
          if (!(std::fabs(u - clipped) < 1e-4))
            out += where + ": a sign differs although the draw is far from clip(p)\n";
        }
        if (float32) continue;  // the float walk's p and sums are compared through its signs
        double scale = 1;
        for (int i = r0; i < first_diff; ++i)
          if (std::isfinite(cpu.partial[s][i]))
            scale = std::max(scale, std::fabs(double(cpu.partial[s][i])));
        for (int i = r0; i < first_diff; ++i) {
          const bool finite_sum = std::isfinite(cpu.partial[s][i]);
          const bool same_nonfinite = std::isnan(partial[s][i])
                                          ? std::isnan(cpu.partial[s][i])
                                          : partial[s][i] == cpu.partial[s][i];
          if (finite_sum ? !(std::fabs(partial[s][i] - cpu.partial[s][i]) <= 1e-4 * scale)
                         : !same_nonfinite)
            out += where + " row " + std::to_string(i - r0) + ": partial sums differ\n";
          if (finite_sum && std::isfinite(cpu.p[s][i]) &&
              !(std::fabs(p[s][i] - cpu.p[s][i]) <= 4e-4 * scale))
            out += where + " row " + std::to_string(i - r0) + ": p differs\n";
        }
      }
      if (flipped > std::max(1, w.rows() / 1000))
        out += "seed " + std::to_string(s) + ": " + std::to_string(flipped) + " blocks flipped\n";
    }
    return out;
  }
};

// The benchmark's layer: round r walks the first tokens / 2^r tokens of every head (the kept
// tokens of the previous round are contiguous after the method's gather). `authors`: the
// authors' float32 walk; else KVScope's double walk (preset kvscope-v1).
struct WalkRoundsRun : OpRun {
  const WalkCase& c;
  std::vector<int> rounds;
  bool authors;
  int heads, tokens, block;
  std::vector<int8_t> sigma;
  std::vector<std::vector<int>> offset;
  std::vector<std::vector<uint32_t>> head, id;

  // The rows of a layer (a GiB) are made once per case and shared by every run.
  static const WalkCaseData& rows(const WalkCase& c) {
    static std::vector<std::unique_ptr<WalkCaseData>> made(walk_cases().size());
    auto& m = made[static_cast<size_t>(&c - walk_cases().data())];
    if (!m) m = std::make_unique<WalkCaseData>(c);
    return *m;
  }
  WalkRoundsRun(const WalkCase& wc, std::vector<int> r, bool f32)
      : c(wc), rounds(std::move(r)), authors(f32) {
    const WalkBlocks& g = c.groups.front();
    heads = g.heads;
    block = g.len;
    tokens = g.blocks * g.len;
    sigma.resize(rows(c).rows());
    for (int round : rounds) {
      const int per_head = (tokens >> round) / block;
      offset.emplace_back();
      head.emplace_back();
      id.emplace_back();
      for (int h = 0; h < heads; ++h)
        for (int k = 0; k < per_head; ++k) {
          offset.back().push_back((h * per_head + k) * block);
          head.back().push_back(static_cast<uint32_t>(h));
          id.back().push_back(static_cast<uint32_t>(k));
        }
      offset.back().push_back(heads * per_head * block);
    }
  }
  WalkBatch batch(size_t i) {
    WalkBatch b;
    b.float32 = authors;
    b.value_eps = authors ? 1e-8 : 0.0;
    b.d = rows(c).d;
    b.dv = rows(c).dv;
    b.num_blocks = static_cast<int>(head[i].size());
    b.keys = rows(c).keys.data();
    b.values = rows(c).values.data();
    b.block_offset = offset[i].data();
    b.block_head = head[i].data();
    b.block_id = id[i].data();
    b.seed = 42;
    b.layer = 0;
    b.round = static_cast<uint32_t>(rounds[i]);
    b.sigma = sigma.data();
    return b;
  }
  void run(Backend& backend) override {
    for (size_t i = 0; i < rounds.size(); ++i) backend.walk_blocks(batch(i));
  }
  std::vector<std::function<void(Backend&)>> steps() override {
    std::vector<std::function<void(Backend&)>> out;
    for (size_t i = 0; i < rounds.size(); ++i)
      out.push_back([this, i](Backend& b) { b.walk_blocks(batch(i)); });
    return out;
  }
  std::string mismatch(const OpRun&) const override { return "not a parity case"; }
};

// ---- the other ops: the case's data, run on a backend, compared as the op's figures allow

// Double scores (the default) give the CPU reference's figures to rounding; float scores
// (ErrorBatch::float_scores) to 1e-4. `exact_kept` (timing): the step names a resident layer and
// runs twice, so the replayed launch is the approximate side alone.
struct ErrorRun : OpRun {
  ErrorCaseData data;
  bool exact_kept;
  ErrorRun(const ErrorCase& c, bool float_scores, bool kept = false) : data(c), exact_kept(kept) {
    data.batch.float_scores = float_scores;
    if (kept) data.batch.layer_id = 0x5eed0001;
  }
  void run(Backend& backend) override {
    data.run(backend);
    if (exact_kept) data.run(backend);
  }
  std::string mismatch(const OpRun& cpu_run) const override {
    const ErrorCaseData& cpu = as<ErrorRun>(cpu_run).data;
    const bool f = data.batch.float_scores;
    return close(data.relative, cpu.relative, f ? 1e-4 : 1e-9, f ? 1e-7 : 1e-12, "relative") +
           close(data.normalized, cpu.normalized, f ? 1e-4 : 1e-9, f ? 1e-7 : 1e-12, "normalized") +
           close(data.mass, cpu.mass, f ? 1e-5 : 1e-9, f ? 1e-7 : 1e-12, "mass");
  }
};

// Scores and stopped sums within 1e-9 relative: both accumulate in double; they differ by the
// order of the dot products and sums only.
struct ScoreRun : OpRun {
  ScoreCaseData data;
  explicit ScoreRun(const ScoreCase& c) : data(c) {}
  void run(Backend& backend) override { data.run(backend); }
  std::string mismatch(const OpRun& cpu_run) const override {
    const ScoreCaseData& cpu = as<ScoreRun>(cpu_run).data;
    std::string out;
    for (size_t h = 0; h < cpu.scores.size(); ++h) {
      out += close(data.scores[h], cpu.scores[h], 1e-9, 1e-300, "scores");
      if (data.batch.stop_rows)
        out += close(data.stopped[h], cpu.stopped[h], 1e-9, 1e-300, "stopped");
    }
    return out;
  }
};

// The same clusters for every radius (owners, sizes, capacity, early stop), identical.
struct ClusterRun : OpRun {
  ClusterCaseData data;
  explicit ClusterRun(const ClusterCase& c) : data(c) {}
  void run(Backend& backend) override { data.run(backend); }
  std::string mismatch(const OpRun& cpu_run) const override {
    const std::vector<KeyClusters>& cpu = as<ClusterRun>(cpu_run).data.out;
    if (data.out.size() != cpu.size()) return "a different number of radii\n";
    std::string out;
    for (size_t r = 0; r < cpu.size(); ++r)
      if (data.out[r].owner != cpu[r].owner || data.out[r].size != cpu[r].size ||
          data.out[r].capacity != cpu[r].capacity || data.out[r].over != cpu[r].over)
        out += "radius " + std::to_string(r) + ": other clusters\n";
    return out;
  }
};

// Every key's accumulated score within 1e-9 relative.
struct CacheScoreRun : OpRun {
  CacheScoreCaseData data;
  explicit CacheScoreRun(const CacheScoreCase& c) : data(c) {}
  void run(Backend& backend) override { data.run(backend); }
  std::string mismatch(const OpRun& cpu_run) const override {
    return close(data.acc, as<CacheScoreRun>(cpu_run).data.acc, 1e-9, 1e-300, "accumulated");
  }
};

// Every score within 1e-9 relative: the device sums the logits' dot products, the covariance and
// the softmax's denominator in other orders than Eigen (all in double).
struct ExpectedRun : OpRun {
  ExpectedCaseData data;
  explicit ExpectedRun(const ExpectedCase& c) : data(c) {}
  void run(Backend& backend) override { data.run(backend); }
  std::string mismatch(const OpRun& cpu_run) const override {
    const ExpectedCaseData& cpu = as<ExpectedRun>(cpu_run).data;
    std::string out;
    for (size_t h = 0; h < cpu.out.size(); ++h)
      out += close(data.out[h], cpu.out[h], 1e-9, 1e-300, "expected scores");
    return out;
  }
};

// Every column sum within 1e-9 relative (dot products and denominators summed in other orders
// than Eigen's, in double).
struct ChunkRun : OpRun {
  ChunkCaseData data;
  explicit ChunkRun(const ChunkCase& c) : data(c) {}
  void run(Backend& backend) override { data.run(backend); }
  std::string mismatch(const OpRun& cpu_run) const override {
    const ChunkCaseData& cpu = as<ChunkRun>(cpu_run).data;
    std::string out;
    for (size_t h = 0; h < cpu.col.size(); ++h)
      out += close(data.col[h], cpu.col[h], 1e-9, 1e-300, "column sums");
    return out;
  }
};

// The gradient within 1e-4 of its largest entry (the device sums repulsion in another order, the
// attraction in float), the KL divergence within 1e-6 relative.
struct TsneRun : OpRun {
  TsneCaseData data;
  std::vector<float> grad;
  double kl = 0;
  explicit TsneRun(const TsneCase& c) : data(c) {}
  void run(Backend& backend) override {
    grad.assign(2 * static_cast<size_t>(data.in.n), NAN);
    kl = backend.tsne_gradient(data.in, grad.data());
  }
  std::string mismatch(const OpRun& cpu_run) const override {
    const TsneRun& cpu = as<TsneRun>(cpu_run);
    double scale = 0;
    for (float g : cpu.grad) scale = std::max(scale, std::fabs(double(g)));
    std::string out = close(widen(grad), widen(cpu.grad), 0, 1e-4 * scale, "gradient");
    if (!(std::fabs(kl - cpu.kl) <= 1e-6 * std::fabs(cpu.kl) + 1e-9))
      out += "KL: device " + std::to_string(kl) + ", cpu " + std::to_string(cpu.kl) + "\n";
    return out;
  }
};

// The same picks in the same order on well-separated data, for k of one, the number of clusters
// (one pick per cluster) and three times it; and k beyond n (every row once).
struct KcenterRun : OpRun {
  KcenterCaseData data;
  std::vector<int> ks;
  std::vector<std::vector<int>> picks;
  explicit KcenterRun(const KcenterCase& c)
      : data(c),
        ks(c.clusters > 0 ? std::vector<int>{1, c.clusters, 3 * c.clusters}
                          : std::vector<int>{c.k}) {}
  void run(Backend& backend) override {
    picks.clear();
    for (int k : ks) picks.push_back(backend.kcenter(data.x.data(), data.n, data.d, k, 5));
    if (ks.size() > 1) picks.push_back(backend.kcenter(data.x.data(), 30, data.d, 50, 0));
  }
  std::string mismatch(const OpRun& cpu_run) const override {
    const KcenterRun& cpu = as<KcenterRun>(cpu_run);
    std::string out;
    for (size_t i = 0; i < picks.size(); ++i)
      if (picks[i] != cpu.picks[i]) out += "call " + std::to_string(i) + ": other picks\n";
    return out;
  }
};

}  // namespace op_cases

// A Backend that forwards every op to another one (the CPU's by default), counting the calls of
// the ops the methods run on MethodInput::backend (attention_scores, key_clusters, cache_scores,
// expected_scores, chunk_scores): the routing tests (test_methods_baselines.cpp) derive from it to
// change one op's figures, and the device parity tests (test_cuda_parity.cpp) wrap the device in
// it to see the methods reach it. A new op forwards here too (otherwise it would run Backend's
// default, the CPU reference, whatever the inner backend is).
namespace testing {
class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner = cpu_backend()) : inner_(inner) {}
  int calls = 0;  // the methods' ops called through this backend

  std::string name() const override { return "forwarding to " + inner_.name(); }
  bool parallel_in_one_call() const override { return inner_.parallel_in_one_call(); }
  void walk_blocks(const WalkBatch& b) override { inner_.walk_blocks(b); }
  void attention_errors(const ErrorBatch& b) override { inner_.attention_errors(b); }
  double tsne_gradient(const TsneGradInput& in, float* grad) override {
    return inner_.tsne_gradient(in, grad);
  }
  std::vector<int> kcenter(const float* x, int n, int d, int k, int first) override {
    return inner_.kcenter(x, n, d, k, first);
  }
  void attention_scores(const ScoreBatch& b) override {
    ++calls;
    inner_.attention_scores(b);
  }
  void key_clusters(const ClusterBatch& b) override {
    ++calls;
    inner_.key_clusters(b);
  }
  void cache_scores(const CacheScoreBatch& b) override {
    ++calls;
    inner_.cache_scores(b);
  }
  void expected_scores(const ExpectedScoreBatch& b) override {
    ++calls;
    inner_.expected_scores(b);
  }
  void chunk_scores(const ChunkScoreBatch& b) override {
    ++calls;
    inner_.chunk_scores(b);
  }

 protected:
  Backend& inner_;
};

}  // namespace testing

// Every case of every op's table, as OpCases: the parity cases (check mode) and the benchmark
// cases with their variants (timing mode), labelled as bench/bench_gpu.cpp has always named them.
inline const std::vector<OpCase>& all_op_cases() {
  using namespace op_cases;
  static const std::vector<OpCase> cases = [] {
    std::vector<OpCase> out;
    auto add = [&](const char* op, std::string label, bool parity, bool bench, bool bench_cpu,
                   std::function<std::unique_ptr<OpRun>()> make) {
      out.push_back({op, std::move(label), parity, bench, bench_cpu, std::move(make)});
    };
    for (const WalkCase& c : walk_cases()) {
      const std::string n = c.name;
      if (c.parity)
        for (bool f32 : {false, true})
          add("walk_blocks", "Walk/" + n + (f32 ? "/f32" : "/f64"), true, false, false,
              [&c, f32] { return std::make_unique<WalkParityRun>(c, f32); });
      if (!c.bench) continue;
      const bool layer = c.groups.front().heads > 1;
      for (bool f32 : {true, false}) {
        if (!layer && !f32) continue;
        add("walk_blocks", "WalkTwoRounds/" + n + (f32 ? "/f32" : "/f64"), false, true, false,
            [&c, f32] {
              return std::make_unique<WalkRoundsRun>(c, std::vector<int>{0, 1}, f32);
            });
      }
      if (layer)
        for (int round : {0, 1})
          add("walk_blocks", "WalkRound/" + n + "/" + std::to_string(round), false, true, false,
              [&c, round] {
                return std::make_unique<WalkRoundsRun>(c, std::vector<int>{round}, true);
              });
      else  // the CPU's two rounds under their own name (the GPU's label carries /f32)
        add("walk_blocks", "WalkTwoRounds/" + n, false, false, true, [&c] {
          return std::make_unique<WalkRoundsRun>(c, std::vector<int>{0, 1}, true);
        });
    }
    for (const ErrorCase& c : error_cases()) {
      const std::string n = c.name;
      if (c.parity)
        for (bool fs : {false, true})
          add("attention_errors", "Errors/" + n + (fs ? "/float" : "/double"), true, false, false,
              [&c, fs] { return std::make_unique<ErrorRun>(c, fs); });
      if (!c.bench) continue;
      for (bool fs : {false, true})
        if (c.q_heads > 1 || !fs)
          add("attention_errors", "Errors/" + n + (fs ? "/float" : "/double"), false, true, false,
              [&c, fs] { return std::make_unique<ErrorRun>(c, fs); });
      add("attention_errors", "ErrorsExactKept/" + n + "/double", false, true, false,
          [&c] { return std::make_unique<ErrorRun>(c, false, true); });
      if (c.q_heads == 1)
        add("attention_errors", "Errors/" + n, false, false, true,
            [&c] { return std::make_unique<ErrorRun>(c, false); });
    }
    for (const TsneCase& c : tsne_cases())
      add("tsne_gradient", std::string(c.parity ? "Tsne/" : "TsneGradient/") + c.name, c.parity,
          c.bench, false, [&c] { return std::make_unique<TsneRun>(c); });
    for (const TsneCase& c : tsne_cases())  // the CPU's exact gradient where it takes seconds
      if (c.bench && c.n <= 8192)
        add("tsne_gradient", std::string("TsneGradientExact/") + c.name, false, false, true,
            [&c] { return std::make_unique<TsneRun>(c); });
    for (const KcenterCase& c : kcenter_cases())
      add("kcenter", std::string("Kcenter/") + c.name, c.parity, c.bench, c.bench,
          [&c] { return std::make_unique<KcenterRun>(c); });
    for (const ScoreCase& c : score_cases())
      add("attention_scores", std::string("Scores/") + c.name, c.parity, c.bench, c.bench,
          [&c] { return std::make_unique<ScoreRun>(c); });
    for (const ClusterCase& c : cluster_cases())
      add("key_clusters", std::string("Clusters/") + c.name, c.parity, c.bench, c.bench,
          [&c] { return std::make_unique<ClusterRun>(c); });
    for (const CacheScoreCase& c : cache_score_cases())
      add("cache_scores", std::string("CacheScores/") + c.name, c.parity, c.bench, c.bench,
          [&c] { return std::make_unique<CacheScoreRun>(c); });
    for (const ExpectedCase& c : expected_cases())
      add("expected_scores", std::string("Expected/") + c.name, c.parity, c.bench, c.bench,
          [&c] { return std::make_unique<ExpectedRun>(c); });
    for (const ChunkCase& c : chunk_cases())
      add("chunk_scores", std::string("Chunks/") + c.name, c.parity, c.bench, c.bench,
          [&c] { return std::make_unique<ChunkRun>(c); });
    return out;
  }();
  return cases;
}

}  // namespace kvscope
