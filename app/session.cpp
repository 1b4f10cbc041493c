// Sessions: AppState::to_session, parse_session and apply_session (declared in app_state.h).
#include <filesystem>
#include <string>

#include "app/app_state.h"
#include "engine/error.h"

namespace kvscope::app {
namespace fs = std::filesystem;

nlohmann::json AppState::to_session() const {
  const Settings& st = settings;
  nlohmann::json j;
  j["kvscope_session"] = 2;
  j["capture"] = capture_path;
  j["focus"] = {{"layer", st.focus.layer}, {"kv_head", st.focus.kv_head}};
  j["method_a"] = st.method[0].name;
  j["method_b"] = st.method[1].name;
  j["params_a"] = st.method[0].params;
  j["params_b"] = st.method[1].params;
  j["ab_enabled"] = st.ab_enabled;
  j["keep_ratio"] = st.keep_ratio;
  j["seed"] = st.seed;
  j["sink"] = st.sink_override;
  j["eval"] = st.eval_override;
  j["estimator"] = estimator_name(st.estimator);
  j["backend"] = st.backend;
  j["grid_seeds"] = st.grid_seeds;
  j["grid_metric"] = st.grid_metric == GridMetric::Error ? "error" : "entropy";
  j["selected_query"] = st.selected_query;
  j["selected_q_head"] = st.selected_q_head;
  j["active_view"] = st.active_view;
  j["panels"] = {st.panel_view[0], st.panel_view[1]};
  j["sweep"] = {{"methods", st.sweep.methods},
                {"ratios", st.sweep.ratios},
                {"seeds", st.sweep.seeds},
                {"focused_layer_only", st.sweep.focused_layer_only}};
  return j;
}

namespace {

// Typed field access that names the field and the problem.
struct SessionReader {
  const nlohmann::json& j;
  std::string prefix;

  const nlohmann::json* find(const char* field) const {
    auto it = j.find(field);
    return it == j.end() ? nullptr : &*it;
  }
  [[noreturn]] void fail(const std::string& field, const std::string& problem) const {
    throw InputError("session field \"" + prefix + field + "\": " + problem);
  }
  std::string kind(const nlohmann::json& v) const { return v.type_name(); }
  void get(const char* field, int& out, int lo, int hi) const {
    const nlohmann::json* v = find(field);
    if (!v) return;
    if (!v->is_number_integer()) fail(field, "expected an integer, got " + kind(*v));
    const long long x = v->get<long long>();
    if (x < lo || x > hi)
      fail(field, std::to_string(x) + " is outside [" + std::to_string(lo) + ", " +
                      std::to_string(hi) + "]");
    out = static_cast<int>(x);
  }
  void get(const char* field, double& out) const {
    const nlohmann::json* v = find(field);
    if (!v) return;
    if (!v->is_number()) fail(field, "expected a number, got " + kind(*v));
    out = v->get<double>();
  }
  void get(const char* field, bool& out) const {
    const nlohmann::json* v = find(field);
    if (!v) return;
    if (!v->is_boolean()) fail(field, "expected true or false, got " + kind(*v));
    out = v->get<bool>();
  }
  void get(const char* field, std::string& out) const {
    const nlohmann::json* v = find(field);
    if (!v) return;
    if (!v->is_string()) fail(field, "expected a string, got " + kind(*v));
    out = v->get<std::string>();
  }
  ParamValues params(const char* field, const Method* m) const {
    ParamValues pv;
    const nlohmann::json* v = find(field);
    if (!v) return pv;
    if (!v->is_object()) fail(field, "expected an object of parameter values, got " + kind(*v));
    for (const auto& [k, x] : v->items()) {
      if (!x.is_number() && !x.is_boolean())
        fail(std::string(field) + "." + k, "expected a number, got " + kind(x));
      pv[k] = x.is_boolean() ? (x.get<bool>() ? 1.0 : 0.0) : x.get<double>();
    }
    if (m) try {
        validate_method_params(*m, pv);
      } catch (const InputError& e) {
        fail(field, e.what());
      }
    return pv;
  }
};

}  // namespace

Settings AppState::parse_session(const nlohmann::json& j, std::string* capture_out) const {
  if (!j.is_object() || !j.contains("kvscope_session"))
    throw InputError("not a KVScope session (no \"kvscope_session\" key)");
  Settings st;  // fields a session leaves out take their defaults
  SessionReader rd{j, ""};
  std::string cap = capture_path;
  rd.get("capture", cap);
  if (!cap.empty() && cap != capture_path) {
    std::error_code ec;
    if (!fs::exists(cap, ec)) rd.fail("capture", "file " + cap + " does not exist");
    if (!fs::is_regular_file(cap, ec)) rd.fail("capture", cap + " is not a regular file");
  }
  if (const nlohmann::json* f = rd.find("focus")) {
    if (!f->is_object()) rd.fail("focus", "expected an object {layer, kv_head}");
    SessionReader fr{*f, "focus."};
    fr.get("layer", st.focus.layer, 0, 1 << 20);
    fr.get("kv_head", st.focus.kv_head, 0, 1 << 20);
  }
  const char* slot_field[2] = {"method_a", "method_b"};
  const char* param_field[2] = {"params_a", "params_b"};
  for (int k = 0; k < 2; ++k) {
    MethodChoice& mc = st.method[static_cast<size_t>(k)];
    rd.get(slot_field[k], mc.name);
    const Method* m = find_method(mc.name);
    if (!m) rd.fail(slot_field[k], "unknown method '" + mc.name + "'");
    mc.params = rd.params(param_field[k], m);
  }
  // Version-1 sessions kept one parameter map by method name.
  if (const nlohmann::json* legacy = rd.find("params")) {
    if (!legacy->is_object()) rd.fail("params", "expected an object by method name");
    for (int k = 0; k < 2; ++k) {
      MethodChoice& mc = st.method[static_cast<size_t>(k)];
      if (legacy->contains(mc.name) && !j.contains(param_field[k])) {
        SessionReader lr{*legacy, "params."};
        mc.params = lr.params(mc.name.c_str(), find_method(mc.name));
      }
    }
  }
  rd.get("ab_enabled", st.ab_enabled);
  rd.get("keep_ratio", st.keep_ratio);
  if (!(st.keep_ratio > 0 && st.keep_ratio <= 1))
    rd.fail("keep_ratio", std::to_string(st.keep_ratio) + " is not in (0, 1]");
  rd.get("seed", st.seed, 0, 1 << 30);
  rd.get("sink", st.sink_override, -1, 1 << 30);
  rd.get("eval", st.eval_override, -1, 1 << 30);
  if (st.eval_override == 0) rd.fail("eval", "needs at least 1 evaluation query (or -1)");
  std::string estimator = estimator_name(st.estimator);
  rd.get("estimator", estimator);
  if (estimator != "weighted" && estimator != "authors")
    rd.fail("estimator", "'" + estimator + "' is not weighted or authors");
  st.estimator = estimator == "authors" ? Estimator::Authors : Estimator::Weighted;
  rd.get("backend", st.backend);
  if (st.backend != "cpu" && st.backend != "cuda" && st.backend != "auto")
    rd.fail("backend", "'" + st.backend + "' is not cpu, cuda or auto");
  rd.get("grid_seeds", st.grid_seeds, 0, 10);
  std::string metric = "error";
  rd.get("grid_metric", metric);
  if (metric != "error" && metric != "entropy")
    rd.fail("grid_metric", "'" + metric + "' is not error or entropy");
  st.grid_metric = metric == "entropy" ? GridMetric::Entropy : GridMetric::Error;
  rd.get("selected_query", st.selected_query, -1, 1 << 30);
  rd.get("selected_q_head", st.selected_q_head, 0, 1 << 20);
  rd.get("active_view", st.active_view);
  if (const nlohmann::json* p = rd.find("panels")) {
    if (!p->is_array() || p->size() != 2 || !(*p)[0].is_string() || !(*p)[1].is_string())
      rd.fail("panels", "expected two view names");
    st.panel_view = {(*p)[0].get<std::string>(), (*p)[1].get<std::string>()};
  }
  if (const nlohmann::json* sw = rd.find("sweep")) {
    if (!sw->is_object()) rd.fail("sweep", "expected an object");
    SessionReader sr{*sw, "sweep."};
    SweepRequest& r = st.sweep;
    if (const nlohmann::json* ms = sr.find("methods")) {
      if (!ms->is_array()) sr.fail("methods", "expected a list of method names");
      r.methods.clear();
      for (const auto& m : *ms) {
        if (!m.is_string() || !find_method(m.get<std::string>()))
          sr.fail("methods", "unknown method " + m.dump());
        r.methods.push_back(m.get<std::string>());
      }
    }
    if (const nlohmann::json* rs = sr.find("ratios")) {
      if (!rs->is_array() || rs->empty()) sr.fail("ratios", "expected a non-empty list");
      r.ratios.clear();
      for (const auto& x : *rs) {
        if (!x.is_number() || !(x.get<double>() > 0 && x.get<double>() <= 1))
          sr.fail("ratios", x.dump() + " is not a keep ratio in (0, 1]");
        r.ratios.push_back(x.get<double>());
      }
    }
    sr.get("seeds", r.seeds, 1, 10);
    sr.get("focused_layer_only", r.focused_layer_only);
  }
  if (capture_out) *capture_out = cap;
  return st;
}

void AppState::apply_session(const nlohmann::json& j) {
  std::string path;
  Settings st = parse_session(j, &path);  // throws before anything changes
  settings = st;
  if (!path.empty() && path != capture_path) {
    request_open(path, true);  // settings are fitted to the file once it is open
  } else {
    fit_settings_to_capture(true);
  }
}

}  // namespace kvscope::app
