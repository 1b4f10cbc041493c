// The protocol's selection rules (engine/eval/selection_check.h), shared by eval and generate: each
// rule a method can break is refused with a message naming the method and what is wrong.
#include <gtest/gtest.h>

#include <limits>
#include <stdexcept>
#include <string>

#include "engine/eval/selection_check.h"

using namespace kvscope;

namespace {

class FakeMethod : public Method {
 public:
  explicit FakeMethod(bool budget = true) : budget_(budget) {}
  std::string name() const override { return "fake"; }
  std::string summary() const override { return "test double"; }
  bool respects_budget() const override { return budget_; }
  Selection select(const MethodInput&) const override { return {}; }

 private:
  bool budget_;
};

Selection make(std::vector<int> idx, std::vector<double> wt) {
  Selection s;
  s.indices = std::move(idx);
  s.weights = std::move(wt);
  return s;
}

// The message of the error check_selection throws, or "" when it accepts.
std::string refusal(const Selection& sel, int budget = 3, bool respects_budget = true,
                    SelectionUnit unit = SelectionUnit::Token) {
  try {
    check_selection(sel, 4, 10, budget, FakeMethod(respects_budget), unit);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(SelectionCheck, AcceptsAValidSelection) {
  EXPECT_EQ(refusal(make({4, 9, 6}, {1, 2, 0.5})), "");
  EXPECT_EQ(refusal(make({}, {})), "");
}

TEST(SelectionCheck, RefusesEachBrokenRule) {
  EXPECT_EQ(refusal(make({4, 5}, {1})), "fake: selection has 2 indices but 1 weights");
  EXPECT_EQ(refusal(make({3}, {1})), "fake: index 3 is outside the middle [4, 10)");
  EXPECT_EQ(refusal(make({10}, {1})), "fake: index 10 is outside the middle [4, 10)");
  EXPECT_EQ(refusal(make({5, 5}, {1, 1})), "fake: selection holds token 5 twice");
  EXPECT_EQ(refusal(make({5}, {0})), "fake: weight 0 of token 5 is not positive and finite");
  EXPECT_EQ(refusal(make({5}, {std::numeric_limits<double>::quiet_NaN()})),
            "fake: weight nan of token 5 is not positive and finite");
  EXPECT_EQ(refusal(make({5}, {std::numeric_limits<double>::infinity()})),
            "fake: weight inf of token 5 is not positive and finite");
  EXPECT_EQ(refusal(make({4, 5, 6, 7}, {1, 1, 1, 1})),
            "fake: kept 4 middle tokens, over the budget m = 3");
}

TEST(SelectionCheck, BudgetOnlyForMethodsThatRespectIt) {
  EXPECT_EQ(refusal(make({4, 5, 6, 7}, {1, 1, 1, 1}), 3, /*respects_budget=*/false), "");
}

TEST(SelectionCheck, SeparateDenominatorIsCheckedToo) {
  Selection sel = make({4}, {1});
  sel.separate = true;
  sel.den_indices = {6, 6};
  sel.den_weights = {1, 1};
  EXPECT_EQ(refusal(sel), "fake: denominator selection holds token 6 twice");
  sel.den_indices = {6, 11};
  EXPECT_EQ(refusal(sel), "fake: denominator index 11 is outside the middle [4, 10)");
}

TEST(SelectionCheck, GenerationNamesCacheEntries) {
  EXPECT_EQ(refusal(make({5, 5}, {1, 1}), 3, true, SelectionUnit::CacheEntry),
            "fake: selection holds entry 5 twice");
  EXPECT_EQ(refusal(make({4, 5, 6, 7}, {1, 1, 1, 1}), 3, true, SelectionUnit::CacheEntry),
            "fake: kept 4 middle entries, over the budget m = 3");
}
