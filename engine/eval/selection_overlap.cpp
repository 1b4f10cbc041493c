#include "engine/eval/selection_overlap.h"

#include <algorithm>
#include <iterator>

namespace kvscope {

std::vector<int> kept_set(const Selection& sel) {
  std::vector<int> out = sel.indices;
  if (sel.separate) out.insert(out.end(), sel.den_indices.begin(), sel.den_indices.end());
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

KeptOverlap kept_overlap(const Selection& a, const Selection& b) {
  const std::vector<int> sa = kept_set(a), sb = kept_set(b);
  std::vector<int> both;
  std::set_intersection(sa.begin(), sa.end(), sb.begin(), sb.end(), std::back_inserter(both));
  KeptOverlap o;
  o.a = static_cast<int>(sa.size());
  o.b = static_cast<int>(sb.size());
  o.both = static_cast<int>(both.size());
  return o;
}

}  // namespace kvscope
