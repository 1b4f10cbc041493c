#include "engine/core/rope.h"

#include <cmath>
#include <vector>

namespace kvscope {

const char* rope_layout_name(RopeInfo::Layout l) {
  switch (l) {
    case RopeInfo::Layout::Interleaved:
      return "interleaved";
    case RopeInfo::Layout::Half:
      return "half";
    case RopeInfo::Layout::Unknown:
      break;
  }
  return "unknown";
}

MatrixD unrotate_rows(const MatrixF& x, int begin, int end, const RopeInfo& rope,
                      const std::vector<int>* positions) {
  const int d = static_cast<int>(x.cols()), half = d / 2;
  MatrixD out(end - begin, d);
  std::vector<double> freq(half);
  for (int i = 0; i < half; ++i) freq[i] = std::pow(rope.theta, -2.0 * i / d);
  for (int t = begin; t < end; ++t) {
    const float* src = x.row(t).data();
    double* dst = out.row(t - begin).data();
    for (int i = 0; i < half; ++i) {
      const int a = rope_first(rope.layout, d, i), b = rope_second(rope.layout, d, i);
      const double angle = static_cast<double>(positions ? (*positions)[t] : t) * freq[i];
      const double c = std::cos(angle), s = std::sin(angle);
      // Forward: a' = a c - b s, b' = a s + b c; the inverse rotates by -angle.
      dst[a] = src[a] * c + src[b] * s;
      dst[b] = -src[a] * s + src[b] * c;
    }
  }
  return out;
}

}  // namespace kvscope
