// The CPU reference of the chunked-attention op (engine/ops/chunk_scores.h): the loop compactor
// (engine/methods/compactor.cpp) ran before the op existed, moved unchanged, so its figures and
// the kvpress golden test are bit for bit the same. The CUDA kernels (kernels/chunk_scores.cu)
// are tested against it (tests/test_cuda_parity.cpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/tensor.h"
#include "engine/ops/backend.h"
#include "engine/ops/chunk_scores.h"

namespace kvscope {

void check_chunk_score_batch(const ChunkScoreBatch& b) {
  const std::string who = "chunk_scores: ";
  if (b.heads.empty()) throw std::invalid_argument(who + "no heads");
  if (b.len < 1 || b.d < 1 || b.chunk < 1)
    throw std::invalid_argument(who + "bad shape len = " + std::to_string(b.len) + ", d = " +
                                std::to_string(b.d) + ", chunk = " + std::to_string(b.chunk));
  const size_t group = b.heads.front().queries.size();
  if (group == 0) throw std::invalid_argument(who + "a head has no query heads");
  for (const ChunkScoreHead& h : b.heads) {
    if (h.queries.size() != group)
      throw std::invalid_argument(who + "heads have groups of " + std::to_string(group) + " and " +
                                  std::to_string(h.queries.size()) + " query heads");
    if (!h.keys || !h.col) throw std::invalid_argument(who + "a head has no keys or no output");
    for (const float* q : h.queries)
      if (!q) throw std::invalid_argument(who + "a query head is missing");
  }
}

void cpu_chunk_scores(const ChunkScoreBatch& b) {
  check_chunk_score_batch(b);
  using ConstMapF = Eigen::Map<const MatrixF>;
  const int len = b.len, d = b.d, chunk = b.chunk;
  for (const ChunkScoreHead& head : b.heads) {
    const ConstMapF K(head.keys, len, d);
    std::vector<double> col(len, 0.0);
    const int pad = (chunk - len % chunk) % chunk;
    std::vector<double> logits;
    for (const float* queries : head.queries) {
      if (b.cancel && b.cancel->load()) throw Cancelled();
      const ConstMapF Q(queries, len, d);
      for (int c0 = 0; c0 < len; c0 += chunk) {
        const int c1 = std::min(len, c0 + chunk), valid = c1 - c0;
        const bool last = c1 == len && pad > 0;
        const MatrixD q = Q.middleRows(c0, valid).cast<double>();
        const MatrixD k = K.middleRows(c0, valid).cast<double>();
        const MatrixD dots = q * k.transpose();
        logits.resize(valid);
        for (int i = 0; i < valid; ++i) {
          double top = -std::numeric_limits<double>::infinity();
          for (int j = 0; j < valid; ++j) top = std::max(top, logits[j] = dots(i, j));
          if (last) top = std::max(top, -1e-9);
          double sum = 0;
          for (int j = 0; j < valid; ++j) sum += std::exp(logits[j] - top);
          if (last) sum += pad * std::exp(-1e-9 - top);
          for (int j = 0; j < valid; ++j) col[c0 + j] += std::exp(logits[j] - top) / sum;
        }
        if (last) {  // the padded query rows: logit 0 on real keys, -1e-9 on padded ones
          const double share = 1.0 / (valid + pad * std::exp(-1e-9));
          for (int j = 0; j < valid; ++j) col[c0 + j] += pad * share;
        }
      }
    }
    std::copy(col.begin(), col.end(), head.col);
  }
}

// rows: tokens of the region; count: the group; dv: the chunk size.
OpShape op_shape(const ChunkScoreBatch& b) {
  return {Op::chunk_scores, b.len, b.d, b.chunk, b.group(), false};
}

}  // namespace kvscope
