// exact (docs/methods.md): keeps every middle token at weight 1. It is the reference point of
// every error table: its approximation equals exact attention, so its error is zero.
#include "engine/core/error.h"
#include "engine/methods/method.h"

namespace kvscope {
namespace {

class Exact final : public Method {
 public:
  std::string name() const override { return "exact"; }
  std::string summary() const override {
    return "keeps every token (no compression): the zero-error reference";
  }
  // The budget does not apply: exact is the uncompressed reference.
  bool respects_budget() const override { return false; }
  bool depends_on_seed() const override { return false; }
  bool depends_on_budget() const override { return false; }
  Selection select(const MethodInput& in) const override {
    if (in.mid_begin < 0 || in.mid_end < in.mid_begin)
      throw InputError("exact: empty or inverted middle [" + std::to_string(in.mid_begin) + ", " +
                       std::to_string(in.mid_end) + ")");
    Selection sel;
    sel.indices.reserve(in.mid_end - in.mid_begin);
    for (int i = in.mid_begin; i < in.mid_end; ++i) sel.indices.push_back(i);
    sel.weights.assign(sel.indices.size(), 1.0);
    return sel;
  }
};

}  // namespace

std::unique_ptr<Method> make_exact() {
  return std::make_unique<Exact>();
}

}  // namespace kvscope
