// Compressed-cache generation on kjv3M (docs/generate.md, docs/performance.md): 256 greedy
// tokens after compressing every layer's cache at position 128, on one thread, for the exact
// cache and for methods at keep ratio 1/4 (compressed once, and re-compressed every 32 tokens).
// One iteration = one free-running continuation of 256 tokens from a copy of the model at N.
// Set KVSCOPE_MODELS to a folder with kjv3M.bin and tok1024.bin (default: ../shared/models
// next to the source tree).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>

#include "engine/eval/protocol.h"
#include "engine/methods/method.h"
#include "engine/model/generate.h"
#include "engine/model/llama2c.h"

namespace {

using namespace kvscope;

constexpr int kCompressAt = 128;
constexpr int kSteps = 256;

std::string models_dir() {
  const char* env = std::getenv("KVSCOPE_MODELS");
  return env ? env : std::string(KVSCOPE_SOURCE_DIR) + "/../shared/models";
}

// The model after the prompt and greedy tokens up to position N, and the token at N.
struct Branch {
  std::unique_ptr<llama2c::Transformer> model;
  int token = 0;
};

const Branch& branch() {
  static const Branch b = [] {
    Branch out;
    out.model = std::make_unique<llama2c::Transformer>(models_dir() + "/kjv3M.bin");
    llama2c::Tokenizer tok(models_dir() + "/tok1024.bin", out.model->config().vocab_size);
    std::vector<int> tokens = tok.encode("In the beginning", true, false);
    for (int pos = 0; pos < kCompressAt; ++pos) {
      const std::vector<float>& logits = out.model->forward(tokens[pos], pos);
      if (pos + 1 >= static_cast<int>(tokens.size()))
        tokens.push_back(
            static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    }
    out.token = tokens[kCompressAt];
    return out;
  }();
  return b;
}

// args: method index in all_methods() (-1: exact cache, no compression), re-compress interval.
void BM_Generate256(benchmark::State& state) {
  const Branch& b = branch();
  const int method_index = static_cast<int>(state.range(0));
  const int every = static_cast<int>(state.range(1));
  const Method* method = method_index >= 0 ? all_methods()[method_index] : nullptr;
  const EvalWindow w = EvalWindow::make(kCompressAt, 0.25);
  state.SetLabel(method ? method->name() + " 1/4" + (every ? " every " + std::to_string(every) : "")
                        : "exact cache");
  for (auto _ : state) {
    llama2c::Transformer m = *b.model;
    int round = 0;
    if (method) compress_cache(m, *method, 0.25, {}, w.sink, w.eval, 0, round);
    int token = b.token;
    for (int t = 0; t < kSteps; ++t) {
      const std::vector<float>& logits = m.forward(token, kCompressAt + t);
      token = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      if (method && every > 0 && (t + 1) % every == 0 && t + 1 < kSteps)
        compress_cache(m, *method, 0.25, {}, w.sink, w.eval, 0, ++round);
    }
    benchmark::DoNotOptimize(token);
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(kSteps) * state.iterations(),
                                                  benchmark::Counter::kIsRate);
}

void Args(benchmark::internal::Benchmark* b) {
  b->Args({-1, 0});
  const auto& all = all_methods();
  for (size_t i = 0; i < all.size(); ++i) {
    const std::string name = all[i]->name();
    if (name == "uniform" || name == "snapkv" || name == "balancekv") {
      b->Args({static_cast<long>(i), 0});
      b->Args({static_cast<long>(i), 32});
    }
  }
  b->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_Generate256)->Apply(Args);

}  // namespace

BENCHMARK_MAIN();
