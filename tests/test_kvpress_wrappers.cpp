// The kvpress wrappers adakv(...), chunkkv(...), criticalkv(...) (docs/methods.md, "kvpress
// presses"): names, the layer budget, chunks, the refusal without W_O, and reports that name
// them. adakv's kept sets against kvpress's own AdaKVPress are in test_kvpress_golden.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>

#include "engine/core/error.h"
#include "engine/eval/protocol.h"
#include "engine/io/capture.h"
#include "engine/methods/method.h"

namespace kvscope {
namespace {

std::unique_ptr<CaptureFile> lily() {
  return CaptureFile::open(std::string(KVSCOPE_SOURCE_DIR) +
                           "/sample_data/stories260K_lily.safetensors");
}

std::vector<Selection> layer_selections(const Method& m, const LayerData& layer, double ratio,
                                        const ParamValues& params = {}) {
  const EvalWindow w = EvalWindow::make(static_cast<int>(layer.keys[0].rows()), ratio);
  std::vector<Selection> out;
  for (int kv = 0; kv < static_cast<int>(layer.keys.size()); ++kv)
    out.push_back(m.select(make_method_input(layer, 5, kv, w, params, 0)));
  return out;
}

TEST(KvpressWrappers, NamesParseAndComeFromTheRegistry) {
  const auto list = parse_method_list("adakv(snapkv),criticalkv(expected-attention)");
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0]->name(), "adakv(snapkv)");
  EXPECT_EQ(list[1]->name(), "criticalkv(expected-attention)");
  EXPECT_EQ(find_method("adakv(snapkv)"), list[0]);  // made once
  EXPECT_EQ(find_method("adakv(uniform)"), nullptr);
  EXPECT_EQ(find_method("adakv(nothing)"), nullptr);
  EXPECT_EQ(find_method("nowrapper(snapkv)"), nullptr);
  EXPECT_THROW(parse_method_list("adakv(uniform)"), InputError);
  EXPECT_THROW(parse_method_list("chunkkv(nothing)"), InputError);
  std::set<std::string> all;
  for (const Method* m : parse_method_list("all")) all.insert(m->name());
  EXPECT_TRUE(all.count("adakv(snapkv)"));
  EXPECT_TRUE(all.count("adakv(expected-attention)"));
  // In the list; the CLI leaves it out of a capture without W_O (runnable_methods).
  EXPECT_TRUE(all.count("criticalkv(expected-attention)"));
  // A wrapper lists its own parameters, then the inner method's; a clash is renamed.
  std::set<std::string> names;
  for (const ParamSpec& p : find_method("criticalkv(expected-attention)")->params())
    names.insert(p.name);
  EXPECT_TRUE(names.count("criticalkv_epsilon"));
  EXPECT_TRUE(names.count("epsilon"));
  EXPECT_TRUE(names.count("first_stage_ratio"));
}

TEST(KvpressWrappers, AdaKVSharesTheLayerBudgetWithASafeguard) {
  auto file = lily();
  const auto layer = file->layer(1);
  for (double ratio : {0.5, 0.25, 0.125}) {
    const auto sels = layer_selections(*find_method("adakv(snapkv)"), *layer, ratio);
    const EvalWindow w = EvalWindow::make(480, ratio);
    size_t total = 0;
    for (const Selection& s : sels) {
      total += s.indices.size();
      EXPECT_GE(static_cast<int>(s.indices.size()), static_cast<int>(std::floor(0.2 * w.budget)));
    }
    EXPECT_EQ(total, sels.size() * w.budget);
  }
  // Without the layer (a caller that builds the input by hand), it refuses.
  const EvalWindow w = EvalWindow::make(480, 0.5);
  MethodInput in = make_method_input(*layer, 5, 0, w, ParamValues{}, 0);
  in.layer_data = nullptr;
  EXPECT_THROW(find_method("adakv(snapkv)")->select(in), InputError);
}

TEST(KvpressWrappers, ChunkKVKeepsTheSameWholeChunksOnEveryHead) {
  auto file = lily();
  const auto layer = file->layer(2);
  const auto sels = layer_selections(*find_method("chunkkv(knorm)"), *layer, 0.25);
  const EvalWindow w = EvalWindow::make(480, 0.25);
  for (const Selection& s : sels) {
    EXPECT_EQ(s.indices, sels[0].indices);
    EXPECT_EQ(static_cast<int>(s.indices.size()), w.budget);
  }
  // Chunks of 20 aligned at 0 come whole, except the one the budget cuts.
  std::map<int, int> per_chunk;
  for (int t : sels[0].indices) ++per_chunk[t / 20];
  int partial = 0;
  for (const auto& [c, count] : per_chunk) {
    const int size = std::min(w.mid_end, 20 * c + 20) - std::max(w.mid_begin, 20 * c);
    partial += count != size;
  }
  EXPECT_LE(partial, 1);
}

// The press (projection = wo) reads the capture's W_O (lily carries layers.L.wo) and refuses a
// layer without it, naming W_O; identity is the approximation, said in the note.
TEST(KvpressWrappers, CriticalKVNeedsWOrAnExplicitApproximation) {
  auto file = lily();
  const auto layer = file->layer(0);
  ASSERT_TRUE(file->info().has_output_projection);
  const Method* m = find_method("criticalkv(expected-attention)");
  const EvalWindow w = EvalWindow::make(480, 0.25);
  const Selection press = m->select(make_method_input(*layer, 5, 0, w, ParamValues{}, 0));
  EXPECT_EQ(static_cast<int>(press.indices.size()), w.budget);
  EXPECT_EQ(press.note.find("approximation"), std::string::npos) << press.note;
  LayerData without = *layer;
  without.output_projection.clear();
  try {
    m->select(make_method_input(without, 5, 0, w, ParamValues{}, 0));
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("W_O"), std::string::npos) << e.what();
  }
  const Selection s =
      m->select(make_method_input(without, 5, 0, w, ParamValues{{"projection", 1}}, 0));
  EXPECT_EQ(static_cast<int>(s.indices.size()), w.budget);
  EXPECT_NE(s.note.find("approximation"), std::string::npos);
  EXPECT_NE(s.indices, press.indices) << "W_O changes which tokens stage two keeps";
  // Stage one: the inner method's top floor(m / 2) are all kept.
  const MethodInput in = make_method_input(*layer, 5, 0, w, ParamValues{}, 0);
  const Ranking inner = find_method("expected-attention")->rank(in);
  const std::set<int> kept(s.indices.begin(), s.indices.end());
  for (int i = 0; i < w.budget / 2; ++i) EXPECT_TRUE(kept.count(w.mid_begin + inner.order[i]));
}

TEST(KvpressWrappers, ReportsNameThemAndReadBack) {
  auto file = lily();
  EvalSpec spec;
  spec.methods = parse_method_list("adakv(snapkv),chunkkv(keydiff)");
  spec.ratios = {0.25};
  spec.seeds = 1;
  spec.layers = {0};
  spec.threads = 1;
  const EvalReport report = run_eval(*file, spec);
  for (const HeadEval& h : report.results) EXPECT_TRUE(h.error.empty()) << h.error;
  const EvalReport back = EvalReport::from_json(report.to_json());
  ASSERT_EQ(back.spec.methods.size(), 2u);
  EXPECT_EQ(back.spec.methods[0]->name(), "adakv(snapkv)");
  EXPECT_EQ(back.spec.methods[1]->name(), "chunkkv(keydiff)");
}

}  // namespace
}  // namespace kvscope
