// Views registered at run time (view.h, register_view): make_views() appends them.
#include <stdexcept>

#include "app/views/view.h"

namespace kvscope::app {

namespace {
std::vector<ViewFactory>& factories() {
  static std::vector<ViewFactory> f;
  return f;
}
}  // namespace

const std::vector<ViewFactory>& registered_views() {
  return factories();
}

void register_view(ViewFactory factory) {
  if (!factory) throw std::invalid_argument("register_view: no factory");
  const std::unique_ptr<View> probe = factory();
  if (!probe) throw std::invalid_argument("register_view: the factory made no view");
  const std::string name = probe->name();
  for (const std::string& n : view_names())
    if (n == name) throw std::invalid_argument("register_view: view '" + name + "' exists");
  factories().push_back(std::move(factory));
}

void unregister_view(const std::string& name) {
  auto& f = factories();
  std::erase_if(f, [&](const ViewFactory& make) { return make()->name() == name; });
}

}  // namespace kvscope::app
