// The views' own jobs derive their keys from their inputs (JobPlan::derive,
// app/views/view_jobs.h) as the app's do
// (Results.KeysChangeWithEverySettingTheJobReadsAndNothingElse in test_app_unit.cpp). For every
// view plan, each setting or view choice its job reads changes its key, and every other one leaves
// the key as it is (a forgotten field would show a stale result as fresh; an extra one would
// recompute for nothing).
#include <gtest/gtest.h>
#include <imgui.h>

#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "app/app_frame.h"
#include "app/app_state.h"
#include "app/overlap_grid.h"
#include "app/soft_render.h"
#include "app/views/view.h"

using namespace kvscope;
using namespace kvscope::app;
using nlohmann::json;

namespace {

const std::string kLily =
    std::string(KVSCOPE_SOURCE_DIR) + "/sample_data/stories260K_lily.safetensors";

// One change of the settings and/or the view's choices, and the results whose keys it changes.
struct Change {
  std::string what;
  std::function<void(Settings&)> settings;
  json view;                    // merged into the view's state (load_state)
  std::set<std::string> moves;  // results whose key it changes; every other stays
};

// The settings every view reads or ignores; `moves` is filled per view.
Change keep_ratio() {
  return {"keep ratio", [](Settings& st) { st.keep_ratio = 0.125; }, {}, {}};
}
Change seed() {
  return {"seed", [](Settings& st) { st.seed = 7; }, {}, {}};
}
Change a_param() {
  return {"A's parameter", [](Settings& st) { st.method[0].params["gamma"] = 2; }, {}, {}};
}
Change a_method() {
  return {"A's method", [](Settings& st) { st.method[0].name = "balancekv-stream"; }, {}, {}};
}
Change b_method() {
  return {"B's method", [](Settings& st) { st.method[1].name = "snapkv"; }, {}, {}};
}
Change ab_off() {
  return {"B off", [](Settings& st) { st.ab_enabled = false; }, {}, {}};
}
Change sink() {
  return {"sink", [](Settings& st) { st.sink_override = 3; }, {}, {}};
}
Change eval() {
  return {"eval", [](Settings& st) { st.eval_override = 5; }, {}, {}};
}
Change estimator() {
  return {"estimator", [](Settings& st) { st.estimator = Estimator::Authors; }, {}, {}};
}
Change layer() {
  return {"layer", [](Settings& st) { st.focus.layer = 1; }, {}, {}};
}
Change kv_head() {
  return {"kv head", [](Settings& st) { st.focus.kv_head = 1; }, {}, {}};
}
Change q_head() {
  return {"query head", [](Settings& st) { st.selected_q_head = 1; }, {}, {}};
}
Change grid() {
  return {"grid seeds and metric",
          [](Settings& st) {
            st.grid_seeds = 5;
            st.grid_metric = GridMetric::Entropy;
          },
          {},
          {}};
}
Change sweep() {
  return {"sweep", [](Settings& st) { st.sweep.seeds = 1; }, {}, {}};
}
// Which views are shown: the theory view stays shown (it is planned only then).
Change views_shown() {
  return {"views shown",
          [](Settings& st) {
            st.active_view = "geometry";
            st.panel_view = {"walk", "theory"};
          },
          {},
          {}};
}
Change view(const std::string& what, json state) {
  return {what, [](Settings&) {}, std::move(state), {}};
}
Change moves(Change c, std::set<std::string> results) {
  c.moves = std::move(results);
  return c;
}

// An open capture with the focused layer loaded (A balancekv, B uniform, the theory view shown).
struct Open {
  AppState s;
  Open() {
    s.settings.method = {MethodChoice{"balancekv", {}}, MethodChoice{"uniform", {}}};
    s.settings.panel_view = {"capture", "theory"};
    s.request_open(kLily);
    const auto t0 = std::chrono::steady_clock::now();
    while (!(s.result(kLayer).fresh() && s.focus_layer()) &&
           std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
      s.reconcile();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
};

std::unique_ptr<View> make_view(const std::string& name) {
  for (std::unique_ptr<View>& v : make_views())
    if (v->name() == name) return std::move(v);
  return nullptr;
}

using Planner = std::function<std::map<std::string, std::string>(const AppState&, View*)>;

std::map<std::string, std::string> view_keys(const AppState& s, View* v) {
  std::vector<NamedPlan> out;
  v->plan(s, out);
  std::map<std::string, std::string> keys;
  for (const auto& [name, p] : out) keys[name] = p.key;
  return keys;
}

// Plans with the base settings and view state, then with each change; checks which keys moved.
void check_keys(AppState& s, View* v, json state, const std::vector<Change>& changes,
                const Planner& plan = view_keys) {
  const Settings base = s.settings;
  // Every field of the view's state, so that a change is undone by the next load_state.
  if (v) {
    json full = v->save_state();
    full.merge_patch(state);
    state = full;
    v->load_state(state);
  }
  const std::map<std::string, std::string> before = plan(s, v);
  ASSERT_FALSE(before.empty());
  for (const auto& [name, key] : before) {
    if (key.empty()) continue;  // not wanted in the base state (e.g. the Walk view's comparison)
    EXPECT_EQ(key.find('|'), key.find("|{")) << name << ": not a derived key: " << key;
  }
  int wanted = 0;
  for (const auto& [name, key] : before) wanted += !key.empty();
  ASSERT_GT(wanted, 0) << "no result is wanted in the base state";
  for (const Change& c : changes) {
    s.settings = base;
    c.settings(s.settings);
    json st = state;
    if (!c.view.is_null()) st.merge_patch(c.view);
    if (v) v->load_state(st);
    const std::map<std::string, std::string> after = plan(s, v);
    for (const auto& [name, key] : before) {
      if (key.empty()) continue;
      const auto it = after.find(name);
      const std::string now = it == after.end() ? "" : it->second;
      if (c.moves.count(name))
        EXPECT_NE(now, key) << c.what << " is read by " << name << " but left its key";
      else
        EXPECT_EQ(now, key) << c.what << " is not read by " << name << " but changed its key";
    }
  }
  s.settings = base;
  if (v) v->load_state(state);
  EXPECT_EQ(plan(s, v), before) << "the same settings gave another key";
}

}  // namespace

TEST(ViewKeys, TheAOverlapReadsBothMethodsTheRatioTheSeedAndTheWindow) {
  Open o;
  ASSERT_TRUE(o.s.focus_layer()) << o.s.load_error;
  const std::set<std::string> m{kOverlap};
  check_keys(o.s, nullptr, nullptr,
             {moves(keep_ratio(), m), moves(seed(), m), moves(a_param(), m), moves(a_method(), m),
              moves(b_method(), m), moves(ab_off(), m), moves(sink(), m), moves(eval(), m),
              estimator(), layer(), kv_head(), q_head(), grid(), sweep(), views_shown()},
             [](const AppState& s, View*) {
               return std::map<std::string, std::string>{{kOverlap, plan_overlap(s).key}};
             });
}

TEST(ViewKeys, TheTuningGridReadsMethodAItsAxesAndTheFocusOfItsScope) {
  Open o;
  ASSERT_TRUE(o.s.focus_layer()) << o.s.load_error;
  std::unique_ptr<View> v = make_view(kErrorView);
  ASSERT_TRUE(v);
  const json state = {{"mode", "tune"},
                      {"tune",
                       {{"method", "balancekv"},
                        {"rows", "gamma"},
                        {"row_values", "0,1,2"},
                        {"cols", "temp"},
                        {"col_values", "0.1,0.3"},
                        {"seeds", 2},
                        {"scope", 0}}}};
  const std::set<std::string> m{"tune2"};
  check_keys(
      o.s, v.get(), state,
      {moves(keep_ratio(), m), moves(seed(), m), moves(a_param(), m), moves(a_method(), m),
       moves(sink(), m), moves(eval(), m), moves(estimator(), m), moves(layer(), m),
       moves(kv_head(), m), moves(view("row values", {{"tune", {{"row_values", "0,1"}}}}), m),
       moves(view("columns", {{"tune", {{"cols", "beta"}, {"col_values", "1,2"}}}}), m),
       moves(view("seeds", {{"tune", {{"seeds", 3}}}}), m),
       moves(view("scope", {{"tune", {{"scope", 1}}}}), m), b_method(), ab_off(), q_head(), grid(),
       sweep(), views_shown()});
  // Over the whole capture the focus is not read.
  json whole = state;
  whole["tune"]["scope"] = 2;
  check_keys(o.s, v.get(), whole, {layer(), kv_head(), moves(seed(), m)});
}

TEST(ViewKeys, TheGeometryMapsAndCentresReadTheFocusedHeadAndTheirOwnChoices) {
  Open o;
  ASSERT_TRUE(o.s.focus_layer()) << o.s.load_error;
  std::unique_ptr<View> v = make_view("geometry");
  ASSERT_TRUE(v);
  const json state = {{"projection", "pca"}, {"points", "both"}, {"with_queries", true}};
  const std::set<std::string> all{"geometry.projection", "geometry.projection.values",
                                  "geometry.kcenter.keys", "geometry.kcenter.values"};
  const std::set<std::string> maps{"geometry.projection", "geometry.projection.values"};
  const std::set<std::string> centres{"geometry.kcenter.keys", "geometry.kcenter.values"};
  check_keys(o.s, v.get(), state,
             {moves(layer(), all), moves(kv_head(), all),
              // The keys' map is joint with the selected query head's queries.
              moves(q_head(), {"geometry.projection"}),
              moves(view("projection", {{"projection", "tsne"}}), maps),
              moves(view("clusters", {{"clusters", 5}}), centres),
              moves(view("radius", {{"radius_factor", 0.25}}), centres),
              moves(view("queries", {{"with_queries", false}}), {"geometry.projection"}),
              keep_ratio(), seed(), a_param(), a_method(), b_method(), ab_off(), sink(), eval(),
              estimator(), grid(), sweep(), views_shown()});
  // t-SNE reads its perplexity and iterations; PCA reads neither.
  check_keys(o.s, v.get(), state,
             {view("perplexity", {{"perplexity", 10}}), view("iterations", {{"iterations", 500}})});
  json tsne = state;
  tsne["projection"] = "tsne";
  check_keys(o.s, v.get(), tsne,
             {moves(view("perplexity", {{"perplexity", 10}}), maps),
              moves(view("iterations", {{"iterations", 500}}), maps)});
}

TEST(ViewKeys, TheTheoryRunReadsTheWindowTheSeedTheSlotsParametersAndItsChoices) {
  Open o;
  ASSERT_TRUE(o.s.focus_layer()) << o.s.load_error;
  std::unique_ptr<View> v = make_view("theory");
  ASSERT_TRUE(v);
  const json state = v->save_state();
  const std::set<std::string> m{"theory"};
  check_keys(
      o.s, v.get(), state,
      {moves(seed(), m), moves(a_param(), m), moves(sink(), m), moves(eval(), m),
       moves(estimator(), m), moves(layer(), m), moves(kv_head(), m),
       moves(view("seeds", {{"seeds", 3}}), m), moves(view("walk seeds", {{"disc_seeds", 4}}), m),
       moves(view("largest n", {{"max_n_log", 8}}), m), moves(view("sizes", {{"sizes", 1}}), m),
       moves(view("unsaturated temp", {{"unsat_temp", 0.05}}), m),
       moves(view("unsaturated gamma", {{"unsat_gamma", 0.2}}), m),
       moves(view("methods", {{"methods", {"uniform", "snapkv"}}}), m),
       moves(view("scope", {{"scope", 1}}), m),
       // Its ratios are its own; A's method matters only through its parameters (none
       // here), B's is not in its list.
       keep_ratio(), a_method(), b_method(), ab_off(), q_head(), grid(), sweep(), views_shown()});
  json whole = state;
  whole["scope"] = 1;
  check_keys(o.s, v.get(), whole, {layer(), kv_head(), moves(seed(), m)});
}

TEST(ViewKeys, TheTokenHarmReadsTheFocusedHeadAndTheWindowOnly) {
  Open o;
  ASSERT_TRUE(o.s.focus_layer()) << o.s.load_error;
  std::unique_ptr<View> v = make_view("tokens");
  ASSERT_TRUE(v);
  const std::set<std::string> m{"tokens.harm"};
  check_keys(o.s, v.get(), v->save_state(),
             {moves(layer(), m), moves(kv_head(), m), moves(sink(), m), moves(eval(), m),
              keep_ratio(), seed(), a_param(), a_method(), b_method(), ab_off(), estimator(),
              q_head(), grid(), sweep(), views_shown()});
}

TEST(ViewKeys, TheWalkTraceReadsMethodAsRunTheFocusedHeadAndTheQuery) {
  Open o;
  ASSERT_TRUE(o.s.focus_layer()) << o.s.load_error;
  std::unique_ptr<View> v = make_view("walk");
  ASSERT_TRUE(v);
  const json state = {{"query", 9}};
  const std::set<std::string> m{"walk.query"};
  check_keys(o.s, v.get(), state,
             {moves(keep_ratio(), m), moves(seed(), m), moves(a_param(), m), moves(a_method(), m),
              moves(sink(), m), moves(eval(), m), moves(estimator(), m), moves(layer(), m),
              moves(kv_head(), m), moves(view("query", {{"query", 12}}), m), b_method(), ab_off(),
              q_head(), grid(), sweep(), views_shown()});
}

// The Output view's generation reads its request (the controls at Run, or the open capture's
// model and prompt) and no setting; an unused continuation is not part of it.
TEST(ViewKeys, TheOutputRunReadsItsRequestAndNoSetting) {
  [[maybe_unused]] SoftTexture font = soft_init(1280, 800);
  {
    Open o;
    AppState& s = o.s;
    ASSERT_TRUE(s.focus_layer()) << s.load_error;
    AppUi ui(s);
    ui.show_view("output");
    View* v = ui.find_view("output");
    ASSERT_NE(v, nullptr);
    auto frame = [&] {
      ImGui::GetIO().DeltaTime = 1.0f / 60.0f;
      ImGui::NewFrame();
      ui.draw();
      ImGui::Render();
    };
    auto key = [&] {
      const std::map<std::string, std::string> k = view_keys(s, v);
      return k.count("output.generate") ? k.at("output.generate") : std::string();
    };
    for (int f = 0; f < 20 && key().empty(); ++f) frame();
    ASSERT_FALSE(key().empty()) << "the view asked for no generation";
    const json state = v->save_state();
    const std::string base = key();
    EXPECT_EQ(base.rfind("output|{", 0), 0u) << base;
    for (const Change& c :
         {keep_ratio(), seed(), a_param(), a_method(), b_method(), ab_off(), sink(), eval(),
          estimator(), layer(), kv_head(), q_head(), grid(), sweep()}) {
      const Settings before = s.settings;
      c.settings(s.settings);
      EXPECT_EQ(key(), base) << c.what << " is not read by the generation but changed its key";
      s.settings = before;
    }
    const std::vector<std::pair<std::string, json>> reads = {
        {"prompt", {{"prompt", "Once there was"}}},
        {"continuation used", {{"use_continuation", true}, {"continuation", "a cat"}}},
        {"compress at", {{"compress_at", 64}}},
        {"steps", {{"steps", 32}}},
        {"recompress every", {{"recompress_every", 8}}},
        {"seed", {{"seed", 3}}},
        {"methods", {{"methods", {"uniform"}}}},
        {"ratios", {{"ratios", {0.5}}}},
        {"tokenizer", {{"tokenizer", "other.bin"}}},
        {"checkpoint", {{"checkpoint", "other.bin"}}}};
    for (const auto& [what, change] : reads) {
      json st = state;
      st.merge_patch(change);
      v->load_state(st);
      frame();
      EXPECT_NE(key(), base) << what << " is read by the generation but left its key";
      v->load_state(state);
      frame();
      EXPECT_EQ(key(), base) << what;
    }
    json unused = state;
    unused["use_continuation"] = false;
    unused["continuation"] = "not used";
    v->load_state(unused);
    frame();
    EXPECT_EQ(key(), base) << "an unused continuation changed the key";
    s.cancel_job("output.generate");
  }
  ImGui::DestroyContext();
}
