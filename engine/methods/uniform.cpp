// uniform (docs/methods.md): m middle tokens drawn uniformly without replacement, each
// weighted n_mid / m so that the weighted sums are unbiased estimates of the full sums.
#include <algorithm>
#include <numeric>

#include "engine/core/error.h"
#include "engine/core/random.h"
#include "engine/methods/method.h"

namespace kvscope {
namespace {

class Uniform final : public Method {
 public:
  std::string name() const override { return "uniform"; }
  std::string summary() const override {
    return "m middle tokens uniformly at random without replacement, weight n_mid/m";
  }
  Selection select(const MethodInput& in) const override {
    const int n_mid = in.mid_end - in.mid_begin;
    if (n_mid < 0) throw InputError("uniform: inverted middle");
    const int m = std::clamp(in.budget, 0, n_mid);
    // Partial Fisher-Yates: the first m entries of a uniformly shuffled 0..n_mid-1. The
    // counter-based generator makes the draw a function of (seed, layer, kv head) only.
    std::vector<int> order(n_mid);
    std::iota(order.begin(), order.end(), 0);
    CounterRng rng(in.seed, kRandUniform, static_cast<uint32_t>(in.layer),
                   static_cast<uint32_t>(in.kv_head));
    for (int i = 0; i < m; ++i) {
      const int pick = i + static_cast<int>(rng.below(static_cast<uint64_t>(n_mid - i)));
      std::swap(order[i], order[pick]);
    }
    order.resize(m);
    std::sort(order.begin(), order.end());
    Selection sel;
    sel.indices.reserve(m);
    for (int o : order) sel.indices.push_back(in.mid_begin + o);
    sel.weights.assign(m, m > 0 ? static_cast<double>(n_mid) / m : 1.0);
    return sel;
  }
};

}  // namespace

std::unique_ptr<Method> make_uniform() {
  return std::make_unique<Uniform>();
}

}  // namespace kvscope
