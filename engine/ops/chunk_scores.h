// The chunked-attention op (Backend::chunk_scores, engine/ops/backend.h): the hot part of compactor
// (engine/methods/compactor.cpp, kvpress's CompactorPress and its non-causal attention press).
// Its batch type and its CPU reference, cpu_chunk_scores (engine/ops/chunk_scores_cpu.cpp). The
// CUDA kernels are kernels/chunk_scores.cu.
//
// For one kv head: `len` keys k_0..k_{len-1} of region R and, per query head of the group, the
// queries of the same tokens. R is cut into chunks of `chunk` tokens from its start; inside a
// chunk every query row sees every key of the chunk (non-causal, logits <q_i, k_j> unscaled, as
// the press computes them), and each key's column sum over the chunk's rows is added up over the
// group's query heads (in order):
//   col_j = sum_h [ sum_{i in chunk(j)} exp(l_hij - max_j' l_hij') / sum_j' exp(l_hij' - max)
//                   + (last partial chunk) pad / (valid + pad e^{-1e-9}) ]
// in double precision. In the last, partial chunk (valid < chunk real tokens, pad = chunk -
// valid) the press pads keys and queries with zeros and masks padded keys' logits to -1e-9: each
// real row's softmax also counts pad keys of logit -1e-9, and the pad padded rows (logit 0 on real
// keys) add the last term. The method divides by the group size, scales by |v|, pools and
// z-normalises on the CPU (linear in len). Cost: len x chunk x d per query head.
#pragma once

#include <atomic>
#include <vector>

namespace kvscope {

struct ChunkScoreHead {
  const float* keys = nullptr;        // len x d row-major: region R's keys
  std::vector<const float*> queries;  // the GQA group, len x d each: R's queries
  double* col = nullptr;              // [len]: the column sums
};

struct ChunkScoreBatch {
  int len = 0, d = 0, chunk = 0;
  std::vector<ChunkScoreHead> heads;  // every head has the same group size
  // Checked by the CPU reference before each query head (throws Cancelled), and before a device
  // launch.
  const std::atomic<bool>* cancel = nullptr;

  int group() const { return heads.empty() ? 0 : static_cast<int>(heads.front().queries.size()); }
};

// Throws std::invalid_argument when the batch is inconsistent (no heads, len < 1, d < 1,
// chunk < 1, a missing array, unequal or empty groups).
void check_chunk_score_batch(const ChunkScoreBatch& batch);

// The op and its sizes, for Backend::supports() (OpShape: engine/ops/backend.h).
struct OpShape;
OpShape op_shape(const ChunkScoreBatch& b);

// The CPU reference: per chunk a double-precision Eigen product of its queries and keys, each
// row's softmax summed in key order (the code compactor had before the op existed, moved).
void cpu_chunk_scores(const ChunkScoreBatch& batch);

}  // namespace kvscope
