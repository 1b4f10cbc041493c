#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include "engine/core/error.h"
#include "engine/methods/method.h"
#include "engine/methods/scoring.h"

namespace kvscope {

// The built-in methods, in display order: one line each. Adding a method is its file in
// engine/methods/ (defining `std::unique_ptr<Method> make_<id>()` in namespace kvscope, the
// method's name() free to differ from <id>) plus its line here; nothing else names it
// (docs/methods.md, "Adding a method"). An explicit list rather than self-registering statics,
// which the linker drops from a static library when nothing else references their file.
#define KVSCOPE_BUILTIN_METHODS(X) \
  X(exact)                         \
  X(uniform)                       \
  X(streaming)                     \
  X(h2o)                           \
  X(snapkv)                        \
  X(pyramidkv)                     \
  X(tova)                          \
  X(knorm)                         \
  X(keydiff)                       \
  X(lagkv)                         \
  X(cur)                           \
  X(expected_attention)            \
  X(compactor)                     \
  X(subgen)                        \
  X(subgen_kcenter)                \
  X(buzz)                          \
  X(balancekv)                     \
  X(balancekv_stream)

// Their factories, one per file of engine/methods/.
#define KVSCOPE_DECLARE_FACTORY(id) std::unique_ptr<Method> make_##id();
KVSCOPE_BUILTIN_METHODS(KVSCOPE_DECLARE_FACTORY)
#undef KVSCOPE_DECLARE_FACTORY
// The wrappers of kvpress (docs/methods.md; wrapper_names() below): `inner` must rank by score
// and outlive the result.
std::unique_ptr<Method> make_adakv(const Method& inner);
std::unique_ptr<Method> make_chunkkv(const Method& inner);
std::unique_ptr<Method> make_criticalkv(const Method& inner);

namespace {

// The built-in methods, then those given to register_method.
std::vector<std::unique_ptr<Method>>& base_methods() {
  static std::vector<std::unique_ptr<Method>> owned = [] {
    std::vector<std::unique_ptr<Method>> m;
#define KVSCOPE_MAKE_METHOD(id) m.push_back(make_##id());
    KVSCOPE_BUILTIN_METHODS(KVSCOPE_MAKE_METHOD)
#undef KVSCOPE_MAKE_METHOD
    return m;
  }();
  return owned;
}

const Method* find_base(const std::string& name) {
  for (const auto& m : base_methods())
    if (m->name() == name) return m.get();
  return nullptr;
}

// Wrapped methods made so far, by name; they live as long as the program.
std::mutex wrapped_mutex;
std::map<std::string, std::unique_ptr<Method>>& wrapped() {
  static std::map<std::string, std::unique_ptr<Method>> made;
  return made;
}

// "wrapper(inner)" made (once) or found; nullptr when `name` has no such shape, names no
// wrapper, or its inner method is unknown or cannot be wrapped (then `why`, when given, says so).
const Method* find_wrapped(const std::string& name, std::string* why = nullptr) {
  const size_t open = name.find('(');
  if (open == std::string::npos || name.size() < open + 3 || name.back() != ')') return nullptr;
  const std::string wrapper = name.substr(0, open),
                    inner_name = name.substr(open + 1, name.size() - open - 2);
  const auto& names = wrapper_names();
  if (std::find(names.begin(), names.end(), wrapper) == names.end()) return nullptr;
  const Method* inner = find_base(inner_name);
  if (!inner) {
    std::string known;
    for (const auto& m : base_methods())
      if (m->ranks_with_scores()) known += (known.empty() ? "" : ", ") + m->name();
    if (why)
      *why = name + ": unknown inner method '" + inner_name +
             "' (a wrapper takes a score-ranking method: " + known + ")";
    return nullptr;
  }
  if (!inner->ranks_with_scores()) {
    if (why)
      *why =
          name + ": " + inner_name + " does not rank by scores, so " + wrapper + " cannot wrap it";
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(wrapped_mutex);
  auto& slot = wrapped()[wrapper + "(" + inner_name + ")"];
  if (!slot) {
    if (wrapper == "adakv")
      slot = make_adakv(*inner);
    else if (wrapper == "chunkkv")
      slot = make_chunkkv(*inner);
    else
      slot = make_criticalkv(*inner);
  }
  return slot.get();
}

}  // namespace

const std::vector<std::string>& wrapper_names() {
  static const std::vector<std::string> names = {"adakv", "chunkkv", "criticalkv"};
  return names;
}

namespace {

// all_methods()' list; register_method appends to it.
std::vector<const Method*>& all_list() {
  static std::vector<const Method*> view = [] {
    std::vector<const Method*> v;
    for (const auto& m : base_methods()) v.push_back(m.get());
    // The wrapped methods `--methods all` runs (criticalkv only on captures that carry W_O: the
    // CLI leaves out what a capture cannot run, engine/eval/protocol.h runnable_methods).
    for (const char* name :
         {"adakv(snapkv)", "adakv(expected-attention)", "criticalkv(expected-attention)"})
      v.push_back(find_wrapped(name));
    return v;
  }();
  return view;
}

}  // namespace

const std::vector<const Method*>& all_methods() {
  return all_list();
}

void register_method(std::unique_ptr<Method> method) {
  if (!method) throw std::invalid_argument("register_method: no method");
  const std::string name = method->name();
  if (name.empty() || name.find_first_of("(),") != std::string::npos)
    throw std::invalid_argument("register_method: '" + name +
                                "' is not a method name (empty, or holds '(', ')' or ',')");
  if (find_method(name)) throw std::invalid_argument("register_method: '" + name + "' exists");
  all_list();  // built first, so the wrapped methods keep their place before the new one
  const Method* m = method.get();
  base_methods().push_back(std::move(method));
  all_list().push_back(m);
}

Selection ScoreRankingMethod::ranked_selection(const MethodInput& in, const Ranking& r) const {
  return prefix_selection(in, r, in.budget);
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
  return find_wrapped(name);
}

std::vector<const Method*> parse_method_list(const std::string& list) {
  if (list == "all") return all_methods();
  std::vector<const Method*> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const Method* m = find_method(item);
    std::string why;
    if (!m && find_wrapped(item, &why) == nullptr && !why.empty())
      throw SettingError("methods", "--methods", why);
    if (!m) {
      std::string known;
      for (const Method* k : all_methods()) known += (known.empty() ? "" : ", ") + k->name();
      std::string wrappers;
      for (const std::string& w : wrapper_names()) wrappers += (wrappers.empty() ? "" : ", ") + w;
      throw SettingError("methods", "--methods",
                         "unknown method '" + item + "' (known: " + known +
                             "; wrappers of a score-ranking method: " + wrappers + ")");
    }
    out.push_back(m);
  }
  if (out.empty()) throw SettingError("methods", "--methods", "no method given");
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

void validate_params(const std::vector<ParamSpec>& specs, const ParamValues& values,
                     const std::string& method) {
  auto number = [](double v) {
    std::ostringstream os;
    os << v;
    return os.str();
  };
  for (const auto& [name, value] : values) {
    // The app shows "balancekv.gamma: ..."; the CLI "--param balancekv.gamma: ..." (SettingError).
    const std::string setting = method + "." + name, flag = "--param " + setting;
    auto it = std::find_if(specs.begin(), specs.end(),
                           [&](const ParamSpec& p) { return p.name == name; });
    if (it == specs.end()) {
      std::string known;
      for (const ParamSpec& p : specs) known += (known.empty() ? "" : ", ") + p.name;
      throw SettingError(setting, flag,
                         "unknown parameter (" +
                             (known.empty() ? method + " has no parameters" : "known: " + known) +
                             ")");
    }
    if (!std::isfinite(value)) throw SettingError(setting, flag, "value is not a finite number");
    double lo = it->min, hi = it->max;
    if (it->type == ParamSpec::Type::Bool) lo = 0, hi = 1;
    if (it->type == ParamSpec::Type::Choice)
      lo = 0, hi = static_cast<double>(it->choices.size()) - 1;
    if (it->type != ParamSpec::Type::Float && value != std::floor(value))
      throw SettingError(setting, flag, number(value) + " is not an integer");
    if (value < lo || value > hi)
      throw SettingError(setting, flag,
                         number(value) + " is outside [" + number(lo) + ", " + number(hi) + "]");
  }
}

}  // namespace kvscope
