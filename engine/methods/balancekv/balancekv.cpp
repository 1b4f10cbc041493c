// Practical BalanceKV (docs/balancekv.md): the authors' blocked self-balancing walk with exact
// halving, T = log2(1/ratio) rounds. The algorithm lives in
// engine/methods/balancekv/balance_walk.cpp so the layer-level entry point (balancekv_layer) and
// this per-head method share one implementation.
#include "engine/methods/balancekv/balance_walk.h"
#include "engine/methods/method.h"

namespace kvscope {
namespace {

class BalanceKV final : public Method {
 public:
  std::string name() const override { return "balancekv"; }
  std::string summary() const override {
    return "BalanceKV (practical): blocked self-balancing walk on the exp kernel x value kernel, "
           "exact halving per round, weights 2 / 1";
  }
  std::vector<ParamSpec> params() const override { return balancekv_param_specs(); }
  bool produces_trace() const override { return true; }
  Selection select(const MethodInput& in) const override { return balancekv_select(in); }
};

}  // namespace

std::unique_ptr<Method> make_balancekv() {
  return std::make_unique<BalanceKV>();
}

}  // namespace kvscope
