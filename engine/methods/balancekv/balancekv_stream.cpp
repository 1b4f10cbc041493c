// The theorem's BalanceKV (docs/balancekv.md, "balancekv-stream"): SoftmaxBalance inside
// MergeAndReduce, numerator instances per value-norm bucket and one denominator instance, with
// separate numerator and denominator selections. The algorithm lives in
// engine/methods/balancekv/softmax_balance.cpp.
#include "engine/methods/balancekv/softmax_balance.h"
#include "engine/methods/method.h"

namespace kvscope {
namespace {

class BalanceKVStream final : public Method {
 public:
  std::string name() const override { return "balancekv-stream"; }
  std::string summary() const override {
    return "BalanceKV (theorem): SoftmaxBalance in MergeAndReduce, value-norm buckets, separate "
           "numerator / denominator sets";
  }
  std::vector<ParamSpec> params() const override { return balancekv_stream_param_specs(); }
  bool produces_trace() const override { return true; }
  Selection select(const MethodInput& in) const override { return balancekv_stream_select(in); }
};

}  // namespace

std::unique_ptr<Method> make_balancekv_stream() {
  return std::make_unique<BalanceKVStream>();
}

}  // namespace kvscope
