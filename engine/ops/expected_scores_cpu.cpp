// The CPU reference of the expected-attention op (engine/ops/expected_scores.h): the code
// expected-attention (engine/methods/expected_attention.cpp) ran before the op existed, moved
// unchanged, so its figures, the kvpress golden test and the eval fixtures are bit for bit the
// same. The CUDA kernels (kernels/expected_scores.cu) are tested against it
// (tests/test_cuda_parity.cpp).
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/tensor.h"
#include "engine/ops/backend.h"
#include "engine/ops/expected_scores.h"

namespace kvscope {

void check_expected_score_batch(const ExpectedScoreBatch& b) {
  const std::string who = "expected_scores: ";
  if (b.heads.empty()) throw std::invalid_argument(who + "no heads");
  if (b.count < 1 || b.d < 1 || (b.use_vnorm && b.dv < 1))
    throw std::invalid_argument(who + "bad shape count = " + std::to_string(b.count) +
                                ", d = " + std::to_string(b.d) + ", dv = " + std::to_string(b.dv));
  if (!b.rotation) throw std::invalid_argument(who + "no rotation");
  const size_t group = b.heads.front().queries.size();
  if (group == 0) throw std::invalid_argument(who + "a head has no query heads");
  for (const ExpectedScoreHead& h : b.heads) {
    if (h.queries.size() != group)
      throw std::invalid_argument(who + "heads have groups of " + std::to_string(group) + " and " +
                                  std::to_string(h.queries.size()) + " query heads");
    if (!h.keys || !h.scores || (b.use_vnorm && !h.values))
      throw std::invalid_argument(who + "a head has no keys, values or output");
    for (const double* q : h.queries)
      if (!q) throw std::invalid_argument(who + "a query head is missing");
  }
}

void cpu_expected_scores(const ExpectedScoreBatch& b) {
  check_expected_score_batch(b);
  using ConstMapF = Eigen::Map<const MatrixF>;
  using ConstMapD = Eigen::Map<const MatrixD>;
  const int count = b.count, d = b.d;
  const MatrixD R = ConstMapD(b.rotation, d, d);
  for (const ExpectedScoreHead& head : b.heads) {
    const MatrixD K = ConstMapF(head.keys, count, d).cast<double>();
    std::vector<double> mean_probs(count, 0.0);
    for (const double* queries : head.queries) {
      if (b.cancel && b.cancel->load()) throw Cancelled();
      const MatrixD q = ConstMapD(queries, count, d);
      const Eigen::RowVectorXd mu = q.colwise().mean();
      const Eigen::VectorXd mu_r = R * mu.transpose();
      Eigen::VectorXd logits = K * mu_r / std::sqrt(static_cast<double>(d));
      if (b.use_covariance) {
        const MatrixD centred = q.rowwise() - mu;
        const MatrixD cov = (centred.transpose() * centred) / static_cast<double>(count);
        const MatrixD cov_r = R * cov * R.transpose();
        const MatrixD KC = K * cov_r;
        logits += (KC.cwiseProduct(K)).rowwise().sum() / static_cast<double>(d) / 2.0;
      }
      const double top = logits.maxCoeff();
      double sum = 0;
      for (int j = 0; j < count; ++j) sum += std::exp(logits[j] - top);
      for (int j = 0; j < count; ++j)
        mean_probs[j] += std::exp(logits[j] - top) / sum / static_cast<double>(head.queries.size());
    }
    if (b.use_vnorm) {
      const ConstMapF V(head.values, count, b.dv);
      for (int j = 0; j < count; ++j)
        mean_probs[j] = (mean_probs[j] + b.epsilon) * V.row(j).cast<double>().norm();
    }
    std::copy(mean_probs.begin(), mean_probs.end(), head.scores);
  }
}

// rows: tokens scored; dv: the value width; count: the group.
OpShape op_shape(const ExpectedScoreBatch& b) {
  return {Op::expected_scores, b.count, b.d, b.dv, b.group(), false};
}

}  // namespace kvscope
