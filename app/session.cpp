// Sessions: AppState::to_session, parse_session and apply_session (declared in app_state.h).
#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>

#include "app/app_state.h"
#include "engine/core/error.h"
#include "engine/io/json_fields.h"
#include "engine/ops/backend.h"

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
  j["budget_mode"] = st.budget_mode ? "tokens" : "ratio";
  j["budget_tokens"] = st.budget_tokens;
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

// A method slot's parameter values (`params_a`, `params_b`, or a version-1 `params.<method>`):
// an object of numbers (true/false for switches), each checked against the method's ParamSpec.
ParamValues read_params(const JsonField& f, const Method* m) {
  ParamValues pv;
  for (const auto& [name, v] : f.members()) {
    const double x = v.json().is_boolean() ? (v.boolean() ? 1.0 : 0.0) : v.number();
    if (m) try {
        validate_method_params(*m, {{name, x}});
      } catch (const SettingError& e) {
        v.fail(e.detail());  // "99 is outside [0, 10]": the field path already says which
      }
    pv[name] = x;
  }
  return pv;
}

double keep_ratio(const JsonField& f) {
  const double x = f.number();
  if (!(x > 0 && x <= 1)) f.fail(f.json().dump() + " is not a keep ratio in (0, 1]");
  return x;
}

}  // namespace

Settings AppState::parse_session(const nlohmann::json& j, std::string* capture_out) const {
  // Every field is read through JsonField (engine/io/json_fields.h): a wrong type or value throws
  // InputError naming the field's path, before anything is changed.
  const JsonField doc(j, "session");
  if (!j.is_object() || !j.contains("kvscope_session"))
    doc.fail("not a KVScope session (no \"kvscope_session\" key)");
  doc.at("kvscope_session").integer(1, 2);  // the version: 1 (one params map) or 2
  Settings st;                              // fields a session leaves out take their defaults
  const std::string cap = doc.get("capture", capture_path);
  if (!cap.empty() && cap != capture_path) {
    std::error_code ec;
    if (!fs::exists(cap, ec)) doc.at("capture").fail("file " + cap + " does not exist");
    if (!fs::is_regular_file(cap, ec)) doc.at("capture").fail(cap + " is not a regular file");
  }
  if (const std::optional<JsonField> f = doc.find("focus")) {
    st.focus.layer = f->get("layer", st.focus.layer, 0, 1 << 20);
    st.focus.kv_head = f->get("kv_head", st.focus.kv_head, 0, 1 << 20);
  }
  const char* slot_field[2] = {"method_a", "method_b"};
  const char* param_field[2] = {"params_a", "params_b"};
  for (int k = 0; k < 2; ++k) {
    MethodChoice& mc = st.method[static_cast<size_t>(k)];
    mc.name = doc.get(slot_field[k], mc.name);
    const Method* m = find_method(mc.name);
    if (!m) doc.at(slot_field[k]).fail("unknown method '" + mc.name + "'");
    if (const std::optional<JsonField> p = doc.find(param_field[k])) mc.params = read_params(*p, m);
  }
  // Version-1 sessions kept one parameter map by method name: every entry is checked, the slots'
  // methods take theirs unless the session also has params_a / params_b.
  if (const std::optional<JsonField> legacy = doc.find("params")) {
    for (const auto& [name, values] : legacy->members()) {
      const Method* m = find_method(name);
      if (!m) values.fail("unknown method '" + name + "'");
      const ParamValues pv = read_params(values, m);
      for (int k = 0; k < 2; ++k) {
        MethodChoice& mc = st.method[static_cast<size_t>(k)];
        if (mc.name == name && !doc.has(param_field[k])) mc.params = pv;
      }
    }
  }
  st.ab_enabled = doc.get("ab_enabled", st.ab_enabled);
  if (const std::optional<JsonField> f = doc.find("keep_ratio")) st.keep_ratio = keep_ratio(*f);
  const std::string budget_mode = doc.get("budget_mode", "ratio");
  if (budget_mode != "ratio" && budget_mode != "tokens")
    doc.at("budget_mode").fail("'" + budget_mode + "' is not ratio or tokens");
  st.budget_mode = budget_mode == "tokens";
  st.budget_tokens = doc.get("budget_tokens", st.budget_tokens, 1, kMaxCaptureTokens);
  st.seed = doc.get("seed", st.seed, 0, 1 << 30);
  st.sink_override = doc.get("sink", st.sink_override, -1, 1 << 30);
  st.eval_override = doc.get("eval", st.eval_override, -1, 1 << 30);
  if (st.eval_override == 0) doc.at("eval").fail("needs at least 1 evaluation query (or -1)");
  const std::string estimator = doc.get("estimator", estimator_name(st.estimator));
  if (estimator != "weighted" && estimator != "authors")
    doc.at("estimator").fail("'" + estimator + "' is not weighted or authors");
  st.estimator = estimator == "authors" ? Estimator::Authors : Estimator::Weighted;
  st.backend = doc.get("backend", st.backend);
  {
    const std::vector<std::string> choices = backend_choices();
    if (std::find(choices.begin(), choices.end(), st.backend) == choices.end())
      doc.at("backend").fail("'" + st.backend + "' is not " + backend_choices_text());
  }
  st.grid_seeds = doc.get("grid_seeds", st.grid_seeds, 0, 10);
  const std::string metric = doc.get("grid_metric", "error");
  if (metric != "error" && metric != "entropy")
    doc.at("grid_metric").fail("'" + metric + "' is not error or entropy");
  st.grid_metric = metric == "entropy" ? GridMetric::Entropy : GridMetric::Error;
  st.selected_query = doc.get("selected_query", st.selected_query, -1, 1 << 30);
  st.selected_q_head = doc.get("selected_q_head", st.selected_q_head, 0, 1 << 20);
  st.active_view = doc.get("active_view", st.active_view);
  if (const std::optional<JsonField> p = doc.find("panels")) {
    if (p->size() != 2) p->fail("expected two view names, got " + std::to_string(p->size()));
    st.panel_view = {p->at(size_t{0}).string(), p->at(size_t{1}).string()};
  }
  if (const std::optional<JsonField> sw = doc.find("sweep")) {
    SweepRequest& r = st.sweep;
    if (const std::optional<JsonField> ms = sw->find("methods")) {
      r.methods.clear();
      for (const JsonField& m : ms->elements()) {
        const std::string name = m.string();
        if (!find_method(name)) m.fail("unknown method '" + name + "'");
        r.methods.push_back(name);
      }
    }
    if (const std::optional<JsonField> rs = sw->find("ratios")) {
      if (rs->size() == 0) rs->fail("expected a non-empty list of keep ratios");
      r.ratios.clear();
      for (const JsonField& x : rs->elements()) r.ratios.push_back(keep_ratio(x));
    }
    r.seeds = sw->get("seeds", r.seeds, 1, 10);
    r.focused_layer_only = sw->get("focused_layer_only", r.focused_layer_only);
  }
  // The views' own choices (AppUi::load_session hands each to its view's load_state, which
  // checks its fields): an object of objects by view name.
  if (const std::optional<JsonField> vs = doc.find("views"))
    for (const auto& [name, state] : vs->members()) state.expect_object();
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
