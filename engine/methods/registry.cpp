#include <sstream>
#include <stdexcept>

#include "engine/error.h"
#include "engine/method.h"

namespace kvscope {

const std::vector<const Method*>& all_methods() {
  static const std::vector<std::unique_ptr<Method>> owned = [] {
    std::vector<std::unique_ptr<Method>> m;
    m.push_back(make_exact());
    m.push_back(make_uniform());
    m.push_back(make_streaming());
    m.push_back(make_h2o());
    m.push_back(make_snapkv());
    m.push_back(make_pyramidkv());
    m.push_back(make_tova());
    m.push_back(make_knorm());
    m.push_back(make_keydiff());
    m.push_back(make_lagkv());
    m.push_back(make_cur());
    m.push_back(make_expected_attention());
    m.push_back(make_subgen());
    m.push_back(make_subgen_kcenter());
    m.push_back(make_buzz());
    m.push_back(make_balancekv());
    m.push_back(make_balancekv_stream());
    return m;
  }();
  static const std::vector<const Method*> view = [] {
    std::vector<const Method*> v;
    for (const auto& m : owned) v.push_back(m.get());
    return v;
  }();
  return view;
}

Ranking Method::rank(const MethodInput&) const {
  throw std::logic_error(name() + " does not rank by score");
}

Selection Method::ranked_selection(const MethodInput&, const Ranking&) const {
  throw std::logic_error(name() + " does not rank by score");
}

const Method* find_method(const std::string& name) {
  for (const Method* m : all_methods())
    if (m->name() == name) return m;
  return nullptr;
}

std::vector<const Method*> parse_method_list(const std::string& list) {
  if (list == "all") return all_methods();
  std::vector<const Method*> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const Method* m = find_method(item);
    if (!m) {
      std::string known;
      for (const Method* k : all_methods()) known += (known.empty() ? "" : ", ") + k->name();
      throw InputError("--methods: unknown method '" + item + "' (known: " + known + ")");
    }
    out.push_back(m);
  }
  if (out.empty()) throw InputError("--methods: no method given");
  return out;
}

double param_value(const std::vector<ParamSpec>& specs, const ParamValues& values,
                   const std::string& name) {
  for (const ParamSpec& s : specs) {
    if (s.name != name) continue;
    auto it = values.find(name);
    return it == values.end() ? s.default_value : it->second;
  }
  throw InputError("unknown parameter '" + name + "'");
}

const ParamSpec& find_param_spec(const std::vector<ParamSpec>& specs, const std::string& name,
                                 const std::string& method) {
  for (const ParamSpec& s : specs)
    if (s.name == name) return s;
  std::string known;
  for (const ParamSpec& s : specs) known += (known.empty() ? "" : ", ") + s.name;
  throw InputError(method + ": unknown parameter '" + name + "' (known: " + known + ")");
}

}  // namespace kvscope
