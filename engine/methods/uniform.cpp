// PLACEHOLDER: replaced by the real implementation.
#include <stdexcept>

#include "engine/method.h"

namespace kvscope {
namespace {
class Placeholder final : public Method {
 public:
  std::string name() const override { return "uniform"; }
  std::string summary() const override { return "not implemented yet"; }
  Selection select(const MethodInput&) const override { throw std::runtime_error("uniform: not implemented"); }
};
}  // namespace
std::unique_ptr<Method> make_uniform() { return std::make_unique<Placeholder>(); }
}  // namespace kvscope
