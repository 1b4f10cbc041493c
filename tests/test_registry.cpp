// The method registry: every list of methods comes from it, so a method added
// by its own file and one registration line (register_method here, its X(<id>) line of
// KVSCOPE_BUILTIN_METHODS in engine/methods/registry.cpp for the engine's own) is known everywhere:
// find_method, `--methods all`, the CLI's list of known methods, the wrappers and run_eval. And
// docs/methods.md lists every method the registry holds. (The app's side, the method combos and the
// views: tests/gui/test_app_unit.cpp, "Registry".)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/eval/protocol.h"
#include "engine/io/capture.h"
#include "engine/methods/method.h"
#include "engine/methods/scoring.h"
#include "sample_captures.h"

using namespace kvscope;

namespace {

// A toy method: the m oldest middle tokens (score -position), weight 1.
class Oldest final : public ScoreRankingMethod {
 public:
  std::string name() const override { return "test-oldest"; }
  std::string summary() const override { return "the m oldest middle tokens (a test's method)"; }
  bool depends_on_seed() const override { return false; }
  Ranking rank(const MethodInput& in) const override {
    const int n_mid = in.mid_end - in.mid_begin;
    std::vector<double> scores(static_cast<size_t>(n_mid));
    for (int i = 0; i < n_mid; ++i) scores[static_cast<size_t>(i)] = -i;
    return rank_by_scores(scores, scores);
  }
};

std::vector<std::string> names(const std::vector<const Method*>& ms) {
  std::vector<std::string> out;
  for (const Method* m : ms) out.push_back(m->name());
  return out;
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// The message parse_method_list gives for an unknown name: the CLI's list of known methods.
std::string known_methods_text() {
  try {
    parse_method_list("no-such-method");
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST(Registry, AMethodRegisteredInATestIsKnownEverywhereMethodsAreListed) {
  ASSERT_EQ(find_method("test-oldest"), nullptr);
  EXPECT_FALSE(contains(names(parse_method_list("all")), "test-oldest"));
  EXPECT_EQ(known_methods_text().find("test-oldest"), std::string::npos);
  const size_t before = all_methods().size();

  register_method(std::make_unique<Oldest>());

  const Method* m = find_method("test-oldest");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->name(), "test-oldest");
  EXPECT_EQ(all_methods().size(), before + 1);
  EXPECT_EQ(all_methods().back(), m);  // after the others
  EXPECT_TRUE(contains(names(parse_method_list("all")), "test-oldest"));
  EXPECT_EQ(names(parse_method_list("uniform,test-oldest")),
            (std::vector<std::string>{"uniform", "test-oldest"}));
  EXPECT_NE(known_methods_text().find("test-oldest"), std::string::npos) << known_methods_text();
  // The wrappers take it like any score-ranking method.
  const Method* wrapped = find_method("adakv(test-oldest)");
  ASSERT_NE(wrapped, nullptr);
  EXPECT_TRUE(wrapped->ranks_by_score());
  // A name taken, or one that is not a plain name, is refused.
  EXPECT_THROW(register_method(std::make_unique<Oldest>()), std::invalid_argument);
  EXPECT_THROW(register_method(nullptr), std::invalid_argument);

  // run_eval runs it: it keeps exactly m tokens, the oldest, so its error differs from
  // streaming's (the m newest) on the same head.
  auto cap = CaptureFile::open(kvscope::testing::sample_capture_paths()[0]);
  EvalSpec spec;
  spec.methods = parse_method_list("test-oldest,streaming,adakv(test-oldest)");
  spec.ratios = {0.25};
  spec.seeds = 1;
  spec.layers = {0};
  spec.heads = {0};
  const EvalReport rep = run_eval(*cap, spec);
  const HeadEval *oldest = nullptr, *streaming = nullptr, *ada = nullptr;
  for (const HeadEval& h : rep.results) {
    if (h.method == "test-oldest") oldest = &h;
    if (h.method == "streaming") streaming = &h;
    if (h.method == "adakv(test-oldest)") ada = &h;
  }
  ASSERT_NE(oldest, nullptr);
  ASSERT_NE(streaming, nullptr);
  ASSERT_NE(ada, nullptr);
  EXPECT_TRUE(oldest->error.empty()) << oldest->error;
  EXPECT_FALSE(oldest->refused);
  EXPECT_EQ(oldest->kept, oldest->budget);
  EXPECT_GT(oldest->budget, 0);
  EXPECT_TRUE(std::isfinite(oldest->mean));
  EXPECT_GT(oldest->mean, 0);
  EXPECT_NE(oldest->mean, streaming->mean);
  bool summarised = false;
  for (const EvalSummary& s : rep.summary()) summarised |= s.method == "test-oldest";
  EXPECT_TRUE(summarised);
}

// docs/methods.md's table has a row for every method the registry holds (a wrapped one, w(inner),
// as the wrapper's row "w(X)" and its inner method's row), and a section for each base method.
TEST(Registry, DocsListEveryRegisteredMethod) {
  const std::string doc = read_text(std::string(KVSCOPE_SOURCE_DIR) + "/docs/methods.md");
  ASSERT_FALSE(doc.empty());
  auto row = [&](const std::string& name) {
    return doc.find("\n| " + name + " |") != std::string::npos;
  };
  int checked = 0;
  for (const Method* m : all_methods()) {
    const std::string name = m->name();
    if (name.rfind("test-", 0) == 0) continue;  // a test's own (the test above)
    const size_t open = name.find('(');
    if (open == std::string::npos) {
      EXPECT_TRUE(row(name)) << name << " has no row in docs/methods.md's table";
    } else {
      const std::string wrapper = name.substr(0, open);
      EXPECT_TRUE(row(wrapper + "(X)")) << wrapper << "(X) has no row in docs/methods.md";
      EXPECT_TRUE(row(name.substr(open + 1, name.size() - open - 2))) << name;
    }
    ++checked;
  }
  for (const std::string& w : wrapper_names())
    EXPECT_TRUE(row(w + "(X)")) << w << "(X) has no row in docs/methods.md";
  EXPECT_GE(checked, 18);
  // The check can fail: a name the registry does not hold has no row.
  EXPECT_FALSE(row("test-oldest"));
}

// A wrapper takes a method whose ranking carries scores; one that ranks by position alone
// (streaming) is refused by name as a setting (exit 1), never accepted to fail at every item.
TEST(Registry, AWrapperRefusesAnInnerMethodWithoutScores) {
  for (const std::string wrapper : {"adakv", "chunkkv", "criticalkv"}) {
    const std::string name = wrapper + "(streaming)";
    EXPECT_EQ(find_method(name), nullptr) << name;
    try {
      parse_method_list(name);
      ADD_FAILURE() << name << " accepted";
    } catch (const SettingError& e) {
      EXPECT_NE(std::string(e.what()).find("does not rank by scores"), std::string::npos)
          << e.what();
    }
    EXPECT_NE(find_method(wrapper + "(snapkv)"), nullptr) << wrapper;
  }
  for (const Method* m : all_methods()) {
    if (m->ranks_with_scores()) {
      EXPECT_TRUE(m->ranks_by_score()) << m->name();
    }
  }
}
