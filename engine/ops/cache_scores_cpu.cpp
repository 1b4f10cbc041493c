// The CPU reference of the cache-score op (engine/ops/cache_scores.h): BUZZ's per-step scoring
// loop moved here unchanged (engine/methods/buzz.cpp had it), over one segment of rows. The CUDA
// kernels (kernels/cache_scores.cu) are tested against it (tests/test_cuda_parity.cpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/ops/backend.h"
#include "engine/ops/cache_scores.h"

namespace kvscope {

void check_cache_score_batch(const CacheScoreBatch& b) {
  if (b.d < 1) throw std::invalid_argument("cache_scores: d must be >= 1");
  if (b.n < 0 || b.row_begin < 0 || b.row_begin > b.row_end || b.row_end > b.n)
    throw std::invalid_argument("cache_scores: rows [" + std::to_string(b.row_begin) + ", " +
                                std::to_string(b.row_end) + ") are not inside the " +
                                std::to_string(b.n) + " tokens");
  if (b.row_begin == b.row_end) return;
  if (!b.keys || !b.acc || (b.num_keys > 0 && !b.key_ids))
    throw std::invalid_argument("cache_scores: a key, key id or output array is missing");
  if (b.queries.empty()) throw std::invalid_argument("cache_scores: no query head");
  for (const float* q : b.queries)
    if (!q) throw std::invalid_argument("cache_scores: a query array is missing");
  for (int j = 0; j < b.num_keys; ++j)
    if (b.key_ids[j] < 0 || b.key_ids[j] >= b.row_end ||
        (j > 0 && b.key_ids[j] <= b.key_ids[j - 1]))
      throw std::invalid_argument("cache_scores: key ids must ascend inside [0, row_end)");
  if (b.num_keys == 0 || b.key_ids[0] > b.row_begin)
    throw std::invalid_argument("cache_scores: row " + std::to_string(b.row_begin) +
                                " sees no key");
}

void cpu_cache_scores(const CacheScoreBatch& b) {
  check_cache_score_batch(b);
  const int d = b.d;
  const double inv_sqrt_d = 1.0 / std::sqrt(static_cast<double>(d));
  const double group = static_cast<double>(b.queries.size());
  std::vector<double> logits;
  int seen = 0;  // keys of key_ids with position <= t
  for (int t = b.row_begin; t < b.row_end; ++t) {
    if ((t - b.row_begin) % 64 == 0 && b.cancel && b.cancel->load(std::memory_order_relaxed))
      throw Cancelled();
    while (seen < b.num_keys && b.key_ids[seen] <= t) ++seen;
    const double scale =
        inv_sqrt_d * (b.log_n ? std::log(static_cast<double>(seen)) / std::log(512.0) : 1.0);
    logits.resize(seen);
    for (const float* q : b.queries) {
      const float* qt = q + static_cast<size_t>(t) * d;
      double mx = -std::numeric_limits<double>::infinity();
      for (int j = 0; j < seen; ++j) {
        const float* k = b.keys + static_cast<size_t>(b.key_ids[j]) * d;
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += static_cast<double>(qt[c]) * static_cast<double>(k[c]);
        logits[j] = dot * scale;
        mx = std::max(mx, logits[j]);
      }
      double z = 0;
      for (double& x : logits) z += (x = std::exp(x - mx));
      const double norm = 1.0 / (z * group);
      for (int j = 0; j < seen; ++j) b.acc[b.key_ids[j]] += logits[j] * norm;
    }
  }
}

OpShape op_shape(const CacheScoreBatch& b) {
  return {Op::cache_scores, b.n, b.d, b.num_keys, b.group(), false};
}

}  // namespace kvscope
