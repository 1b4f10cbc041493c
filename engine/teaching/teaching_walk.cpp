#include "engine/teaching/teaching_walk.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "engine/core/error.h"
#include "engine/core/random.h"

namespace kvscope {

TeachingWalk::TeachingWalk(std::vector<Vec2> vectors, Vec2 z, Rule rule, double c, uint64_t seed)
    : vectors_(std::move(vectors)), z_(z), rule_(rule), c_(c), seed_(seed) {
  if (vectors_.empty()) throw InputError("teaching walk: no vectors given");
  for (const Vec2& u : vectors_)
    if (!std::isfinite(u[0]) || !std::isfinite(u[1]))
      throw InputError("teaching walk: a vector has a non-finite coordinate");
  const double norm = std::hypot(z_[0], z_[1]);
  if (!(norm > 0) || !std::isfinite(norm))
    throw InputError("teaching walk: direction z must be a non-zero finite vector");
  // z is a direction: only <u, z> / |z| matters, so store it normalised.
  z_ = {z_[0] / norm, z_[1] / norm};
  if (!(c_ > 0) || !std::isfinite(c_)) throw InputError("teaching walk: c must be > 0");
}

TeachingWalk TeachingWalk::talk_example() {
  // The talk gives only the projections on z; the perpendicular parts fan the vectors out so
  // that each arrow and label stands apart in the plane (they do not change any sign or sum
  // along z).
  return TeachingWalk({{0.1, 0.9}, {0.8, 0.45}, {0.5, -0.45}, {0.7, -0.85}, {0.3, 0.3}}, {1, 0},
                      Rule::KnownDirection);
}

bool TeachingWalk::step() {
  if (done()) return false;
  Step s;
  s.index = static_cast<int>(steps_.size());
  s.u = vectors_[s.index];
  s.along_z = s.u[0] * z_[0] + s.u[1] * z_[1];
  const Vec2 before = steps_.empty() ? Vec2{0, 0} : steps_.back().prefix;
  const double before_z = steps_.empty() ? 0.0 : steps_.back().prefix_along_z;
  if (rule_ == Rule::KnownDirection) {
    // Choose the sign that pulls the prefix along z back towards 0: minus when the prefix and
    // <u, z> point the same way; a zero product (e.g. the first step) takes +.
    s.inner = before_z;
    s.sigma = before_z * s.along_z > 0 ? -1 : +1;
    s.p = s.sigma > 0 ? 1.0 : 0.0;
  } else {
    s.inner = before[0] * s.u[0] + before[1] * s.u[1];
    s.p = 0.5 - s.inner / (2.0 * c_);
    s.uniform = counter_uniform(seed_, kRandMisc, 0, 0, 0, 0xFEEDu, static_cast<uint32_t>(s.index));
    s.sigma = s.uniform < std::clamp(s.p, 0.0, 1.0) ? +1 : -1;
  }
  s.prefix = {before[0] + s.sigma * s.u[0], before[1] + s.sigma * s.u[1]};
  s.prefix_along_z = s.prefix[0] * z_[0] + s.prefix[1] * z_[1];
  steps_.push_back(s);
  return true;
}

void TeachingWalk::run() {
  while (step()) {
  }
}

void TeachingWalk::reset() {
  steps_.clear();
}

double TeachingWalk::max_abs_prefix_along_z() const {
  double m = 0;
  for (const Step& s : steps_) m = std::max(m, std::abs(s.prefix_along_z));
  return m;
}

std::string TeachingWalk::table() const {
  std::ostringstream os;
  auto cell = [&](const std::string& text) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%8s", text.c_str());
    os << buf;
  };
  auto num = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", v);
    return std::string(buf);
  };
  const int n = static_cast<int>(vectors_.size());
  os << "                 ";
  // append(), not operator+: GCC 12 reports a false -Wrestrict on "literal" + std::string.
  for (int i = 0; i < n; ++i) cell(std::string("u").append(std::to_string(i + 1)));
  os << "\n<u_i, z>         ";
  for (int i = 0; i < n; ++i) cell(num(vectors_[i][0] * z_[0] + vectors_[i][1] * z_[1]));
  os << "\nsign            ";
  for (int i = 0; i < n; ++i)
    cell(i < static_cast<int>(steps_.size()) ? (steps_[i].sigma > 0 ? "+" : "-") : "");
  os << "\nP(sign = +)     ";
  for (int i = 0; i < n; ++i)
    cell(i < static_cast<int>(steps_.size()) ? num(std::clamp(steps_[i].p, 0.0, 1.0)) : "");
  os << "\nprefix along z  ";
  for (int i = 0; i < n; ++i)
    cell(i < static_cast<int>(steps_.size()) ? num(steps_[i].prefix_along_z) : "");
  os << "\n";
  return os.str();
}

}  // namespace kvscope
