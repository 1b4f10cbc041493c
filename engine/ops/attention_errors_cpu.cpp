// The CPU reference of the attention-error op (engine/ops/attention_errors.h): every kv head's
// ExactReference (engine/attention/exact_attention.h) scores its numerator and denominator
// selections for the query heads of its GQA group. The CUDA kernel (kernels/attention_errors.cu) is
// tested against it (tests/test_cuda_parity.cpp).
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/attention/exact_attention.h"
#include "engine/ops/attention_errors.h"
#include "engine/ops/backend.h"

namespace kvscope {

void cpu_attention_errors(const ErrorBatch& b) {
  if (b.kv_heads <= 0 || b.q_heads <= 0 || b.q_heads % b.kv_heads != 0)
    throw std::invalid_argument("attention_errors: " + std::to_string(b.q_heads) +
                                " query heads do not form groups over " +
                                std::to_string(b.kv_heads) + " kv heads");
  check_window(b.n, b.sink, b.eval);
  const auto kv = static_cast<size_t>(b.kv_heads);
  if (b.keys.size() != kv || b.values.size() != kv || b.num_idx.size() != kv ||
      b.den_idx.size() != kv || b.num_logw.size() != kv || b.den_logw.size() != kv ||
      b.queries.size() != static_cast<size_t>(b.q_heads))
    throw std::invalid_argument("attention_errors: per-head arrays do not match the head counts");
  const int group = b.q_heads / b.kv_heads;
  for (int kvh = 0; kvh < b.kv_heads; ++kvh) {
    const std::vector<const float*> queries(b.queries.begin() + kvh * group,
                                            b.queries.begin() + (kvh + 1) * group);
    const ExactReference ref(queries, b.keys[kvh], b.values[kvh], b.n, b.d, b.dv, b.sink, b.eval);
    const auto errs =
        ref.evaluate_log(b.num_idx[kvh], b.num_logw[kvh], b.den_idx[kvh], b.den_logw[kvh]);
    for (int g = 0; g < group; ++g) {
      for (int e = 0; e < b.eval; ++e) {
        const size_t o = static_cast<size_t>(kvh * group + g) * b.eval + e;
        if (b.relative) b.relative[o] = errs[g][e].relative;
        if (b.normalized) b.normalized[o] = errs[g][e].normalized;
        if (b.mass) b.mass[o] = errs[g][e].mass;
      }
    }
  }
}

OpShape op_shape(const ErrorBatch& b) {
  return {Op::attention_errors, b.n, b.d, b.dv, b.q_heads, b.float_scores};
}

}  // namespace kvscope
