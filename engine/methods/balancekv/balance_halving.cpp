// Halving of one round of the practical walk (engine/methods/balancekv/balance_walk.h,
// docs/balancekv.md): which elements survive given the round's signs, under the authors' rule or
// the balanced one, and the schedule of round sizes.
#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "engine/methods/balancekv/balance_walk.h"

namespace kvscope {

// ---------------------------------------------------------------------------------------------
// Halving.

Halving exact_halving(const std::vector<int8_t>& sigma, int keep) {
  const int n = static_cast<int>(sigma.size());
  if (n < 2 || (keep != n / 2 && keep != (n + 1) / 2))
    throw std::invalid_argument("exact_halving: keep must be floor(n/2) or ceil(n/2), n >= 2");
  const int quota = n - keep;  // how many the majority sign gives up
  Halving h;
  int plus = 0, minus = 0;
  for (int i = 0; i < n; ++i) {
    (sigma[i] > 0 ? plus : minus)++;
    if (plus == quota || minus == quota) {
      h.cut = i;
      h.majority_sign = plus == quota ? +1 : -1;
      break;
    }
  }
  // A sign always reaches the quota: quota <= ceil(n/2) <= max(plus, minus) at the end.
  h.kept.reserve(keep);
  h.factor.reserve(keep);
  for (int i = 0; i <= h.cut; ++i)
    if (sigma[i] != h.majority_sign) {
      h.kept.push_back(i);
      h.factor.push_back(2.0);
    }
  for (int i = h.cut + 1; i < n; ++i) {
    h.kept.push_back(i);
    h.factor.push_back(1.0);
  }
  return h;
}

Halving authors_halving(const std::vector<int8_t>& sigma, int keep) {
  const int n = static_cast<int>(sigma.size());
  if (keep < 0 || keep > (n + 1) / 2)
    throw std::invalid_argument("authors_halving: keep must be in [0, ceil(n/2)]");
  Halving h;
  if (n == 0) return h;
  // argmax of (running count == n//2): the first index where it holds, 0 when it never does.
  const int half = n / 2;
  int neg = 0, pos = 0, c_neg = -1, c_pos = -1;
  for (int i = 0; i < n; ++i) {
    (sigma[i] > 0 ? pos : neg)++;
    if (c_neg < 0 && neg == half) c_neg = i;
    if (c_pos < 0 && pos == half) c_pos = i;
  }
  const int c = std::max(std::max(c_neg, 0), std::max(c_pos, 0));
  h.cut = c;
  // Weight 2 * sigma_i up to c, negated when sigma_c = +1: the sign at c is dropped up to c.
  h.majority_sign = sigma[c] > 0 ? +1 : -1;
  // Stable descending order of the weights {2, 1, -2}: the 2s (all <= c) in order, then the 1s
  // (all > c) in order, then the -2s. The first `keep` survive; since there are ceil(n/2) 2s and
  // 1s together, no -2 survives and the survivors stay in walk order.
  for (int i = 0; i <= c && static_cast<int>(h.kept.size()) < keep; ++i)
    if (sigma[i] != h.majority_sign) {
      h.kept.push_back(i);
      h.factor.push_back(2.0);
    }
  for (int i = c + 1; i < n && static_cast<int>(h.kept.size()) < keep; ++i) {
    h.kept.push_back(i);
    h.factor.push_back(1.0);
  }
  if (static_cast<int>(h.kept.size()) != keep)
    throw std::logic_error("authors_halving: fewer than keep positions of weight 2 or 1");
  return h;
}

std::vector<int> floor_halving_schedule(int n0, int target) {
  std::vector<int> s;
  if (target <= 0 || target >= n0) return s;
  for (int size = n0 / 2;; size /= 2) {
    s.push_back(size);
    if (size <= target) break;
  }
  return s;
}

std::vector<int> halving_schedule(int n0, int target) {
  std::vector<int> s;
  if (target <= 0 || target >= n0) return s;
  for (int r = 1; r < 63; ++r) {
    const int size = static_cast<int>(std::floor(std::ldexp(static_cast<double>(n0), -r) + 0.5));
    s.push_back(size);
    if (size <= target) break;
  }
  return s;
}

}  // namespace kvscope
