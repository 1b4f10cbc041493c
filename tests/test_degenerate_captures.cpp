// Every method the registry knows, on captures with next to nothing in them: one token, two
// tokens with no sinks and an evaluation window of one (nothing to compress), identical keys,
// zero values, identical tokens. Each method either gives figures there or is refused with the
// reason method_unavailable gives (engine/eval/protocol.h); none may throw. Where the answer does
// not depend on the method every method's figures must be exact's: with nothing to compress all of
// them (errors and mass), with zero values the errors (the mass still depends on which tokens
// are kept). The methods are read from the registry (all_methods()), so a method
// registered later is covered without touching this file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "engine/eval/protocol.h"
#include "engine/methods/method.h"
#include "tests/memory_capture.h"

namespace kvscope {
namespace {

using kvscope::testing::MemoryCapture;

// Which tensor an entry belongs to, for the fill functions.
enum class Part { Key, Value, Query };

struct Degenerate {
  std::string name;
  int tokens = 0;
  int sink = -1, eval = -1;  // -1: the protocol's defaults
  // The value of element (row, col) of kv head (or query head) `head`'s tensor `part`.
  std::function<float(Part part, int head, int row, int col)> fill;
  // What must equal exact's figures: nothing (the kept set changes the answer), the errors, or
  // everything (nothing is compressed).
  enum class Same { Nothing, Errors, Everything } same = Same::Nothing;
};

// One layer, 2 kv heads of 2 query heads each, d = 4, RoPE known (so that the methods that undo
// it run), queries present.
CaptureData make_capture(const Degenerate& c) {
  constexpr int kKvHeads = 2, kQHeads = 4, kDim = 4;
  CaptureData data;
  CaptureInfo& info = data.info;
  info.model = "degenerate-test";
  info.source = "test_degenerate_captures";
  info.synthetic = true;
  info.num_layers = 1;
  info.q_heads = kQHeads;
  info.kv_heads = kKvHeads;
  info.head_dim = kDim;
  info.value_dim = kDim;
  info.num_tokens = c.tokens;
  info.has_queries = true;
  info.rope.layout = RopeInfo::Layout::Half;
  info.rope.theta = 10000;
  for (int i = 0; i < c.tokens; ++i)
    info.tokens.push_back(std::string("t").append(std::to_string(i)));
  auto tensor = [&](Part part, int head) {
    MatrixF m(c.tokens, kDim);
    for (int i = 0; i < c.tokens; ++i)
      for (int j = 0; j < kDim; ++j) m(i, j) = c.fill(part, head, i, j);
    return m;
  };
  LayerData L;
  L.layer = 0;
  L.rope = info.rope;
  for (int h = 0; h < kKvHeads; ++h) {
    L.keys.push_back(tensor(Part::Key, h));
    L.values.push_back(tensor(Part::Value, h));
  }
  for (int h = 0; h < kQHeads; ++h) L.queries.push_back(tensor(Part::Query, h));
  L.refused.assign(kKvHeads, "");
  data.layers.push_back(std::move(L));
  return data;
}

// A fixed pseudo-random value of each element, so every capture is the same on every run.
float noise(Part part, int head, int row, int col) {
  std::mt19937 rng(
      static_cast<unsigned>(((static_cast<int>(part) * 16 + head) * 4096 + row) * 64 + col));
  return std::normal_distribution<float>()(rng);
}

std::vector<Degenerate> degenerate_captures() {
  std::vector<Degenerate> out;
  // One token: it is the evaluation window, the middle is empty.
  out.push_back({"one token", 1, 0, 1, noise, Degenerate::Same::Everything});
  // Two tokens, no sinks, window 1: one middle token, and at ratio 0.5 the budget keeps it.
  out.push_back({"two tokens, no sinks, window 1", 2, 0, 1, noise, Degenerate::Same::Everything});
  // Every key the same: every score ties.
  out.push_back({"identical keys", 48, -1, -1,
                 [](Part p, int h, int i, int j) {
                   return p == Part::Key ? noise(p, h, 0, j) : noise(p, h, i, j);
                 },
                 Degenerate::Same::Nothing});
  // Every value zero: the exact output is zero, so every method's error is the absolute one, 0.
  out.push_back(
      {"zero values", 48, -1, -1,
       [](Part p, int h, int i, int j) { return p == Part::Value ? 0.0f : noise(p, h, i, j); },
       Degenerate::Same::Errors});
  // Every key and every value the same: a selection whose numerator and denominator are one
  // weighted set averages to the one value, but separate sets (balancekv-stream) need not.
  out.push_back({"identical tokens", 48, -1, -1,
                 [](Part p, int h, int i, int j) {
                   return p == Part::Query ? noise(p, h, i, j) : noise(p, h, 0, j);
                 },
                 Degenerate::Same::Nothing});
  return out;
}

EvalReport evaluate(MemoryCapture& capture, const Degenerate& c, const Method* method) {
  EvalSpec spec;
  spec.methods = {method};
  spec.ratios = {0.5};
  spec.seeds = 2;
  spec.sink = c.sink;
  spec.eval = c.eval;
  spec.threads = 1;
  spec.harm = true;  // as kvscope-cli eval runs it
  return run_eval(capture, spec);
}

TEST(DegenerateCaptures, EveryMethodGivesDefinedFiguresOrOneClearRefusal) {
  const std::vector<const Method*>& methods = all_methods();
  ASSERT_GT(methods.size(), 10u);
  for (const Degenerate& c : degenerate_captures()) {
    MemoryCapture capture(make_capture(c));
    const EvalReport exact = evaluate(capture, c, find_method("exact"));
    ASSERT_EQ(exact.results.size(), 2u) << c.name;
    for (const Method* m : methods) {
      const std::string at = c.name + ", " + m->name();
      const EvalReport rep = evaluate(capture, c, m);
      ASSERT_EQ(rep.results.size(), exact.results.size()) << at;
      const std::string why = method_unavailable(*m, capture.info());
      for (size_t k = 0; k < rep.results.size(); ++k) {
        const HeadEval& he = rep.results[k];
        const HeadEval& ex = exact.results[k];
        EXPECT_EQ(he.error, "") << at;
        if (!why.empty()) {
          // The one refusal: the reason the app greys the method out with.
          EXPECT_TRUE(he.refused) << at;
          EXPECT_EQ(he.note, m->name() + " " + why) << at;
          continue;
        }
        ASSERT_FALSE(he.refused) << at << ": " << he.note;
        EXPECT_TRUE(std::isfinite(he.mean) && he.mean >= 0) << at << ": " << he.mean;
        EXPECT_TRUE(std::isfinite(he.normalized_mean)) << at;
        EXPECT_TRUE(std::isfinite(he.mass_mean)) << at;
        if (m->respects_budget()) {
          EXPECT_LE(he.kept, he.budget) << at;
        }
        if (c.same == Degenerate::Same::Nothing) continue;
        if (c.same == Degenerate::Same::Everything) {
          EXPECT_EQ(he.kept, he.budget) << at;
          EXPECT_EQ(he.mass_mean, ex.mass_mean) << at;
        }
        EXPECT_EQ(he.mean, ex.mean) << at;
        EXPECT_EQ(he.normalized_mean, ex.normalized_mean) << at;
        EXPECT_EQ(he.per_query, ex.per_query) << at;
      }
    }
  }
}

}  // namespace
}  // namespace kvscope
