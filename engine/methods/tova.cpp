// PLACEHOLDER: replaced by the real implementation.
#include <stdexcept>

#include "engine/method.h"

namespace kvscope {
namespace {
class Placeholder final : public Method {
 public:
  std::string name() const override { return "tova"; }
  std::string summary() const override { return "not implemented yet"; }
  Selection select(const MethodInput&) const override { throw std::runtime_error("tova: not implemented"); }
};
}  // namespace
std::unique_ptr<Method> make_tova() { return std::make_unique<Placeholder>(); }
}  // namespace kvscope
