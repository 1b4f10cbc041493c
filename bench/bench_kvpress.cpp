// The kvpress ports' selection on one head: n = 8192 tokens, d = 128, one kv head read
// by a GQA group of 4 query heads (a synthetic Llama-3-shaped layer, engine/model/synth.h), budget
// at ratio 1/4, against what evaluating uniform on that head costs (run_head: its selection and the
// errors of the E = 256 evaluation queries of the group, exact side included).
// docs/methods.md divides each method's CPU time by BM_UniformEval's.
//   build-*/bench/bench_kvpress --benchmark_min_time=1
#include <benchmark/benchmark.h>

#include <memory>
#include <string>

#include "engine/eval/protocol.h"
#include "engine/methods/method.h"
#include "engine/model/synth.h"

using namespace kvscope;

namespace {

const LayerData& head_layer() {
  static const LayerData layer = [] {
    SynthSpec spec = synth_preset("llama3-8b");
    spec.num_layers = 1;
    spec.q_heads = 4;
    spec.kv_heads = 1;
    spec.num_tokens = 8192;
    return SynthGenerator(spec).layer(0);
  }();
  return layer;
}

constexpr double kRatio = 0.25;

void BM_UniformEval(benchmark::State& state) {
  const LayerData& layer = head_layer();
  MethodSettings s;
  s.method = find_method("uniform");
  s.keep_ratio = kRatio;
  for (auto _ : state) {
    HeadRun run = run_head(layer, 1, 0, s, 0);
    benchmark::DoNotOptimize(run.mean_relative);
  }
}

void BM_Select(benchmark::State& state, const std::string& name, ParamValues params) {
  // A copy whose token 0 (a sink) changes every iteration, so that compactor's memo of a layer's
  // scores (engine/methods/compactor.cpp) never hits: the figures are cold selections.
  LayerData layer = head_layer();
  const Method* m = find_method(name);
  const EvalWindow w = EvalWindow::make(static_cast<int>(layer.keys[0].rows()), kRatio);
  const MethodInput in = make_method_input(layer, 1, 0, w, params, 0);
  static float bump = 0;  // never the same value twice in one program, repetitions included
  for (auto _ : state) {
    state.PauseTiming();
    layer.keys[0](0, 0) = head_layer().keys[0](0, 0) + (bump += 1.0f);
    state.ResumeTiming();
    Selection sel = m->ranks_by_score() ? m->ranked_selection(in, m->rank(in)) : m->select(in);
    benchmark::DoNotOptimize(sel.indices.data());
  }
}

}  // namespace

BENCHMARK(BM_UniformEval)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Select, snapkv, "snapkv", {})->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Select, keydiff, "keydiff", {})->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Select, lagkv, "lagkv", {})->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Select, cur, "cur", {})->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Select, expected_attention, "expected-attention", {})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Select, compactor, "compactor", {})->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Select, adakv_snapkv, "adakv(snapkv)", {})->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Select, adakv_expected_attention, "adakv(expected-attention)", {})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Select, chunkkv_snapkv, "chunkkv(snapkv)", {})->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Select, criticalkv_expected_attention_identity,
                  "criticalkv(expected-attention)", {{"projection", 1}})
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
