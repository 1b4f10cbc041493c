// Compressed-cache generation (engine/model/generate.h, docs/generate.md) on the two bundled
// llama2.c models: exactness at ratio 1, the exact continuation against `capture`'s greedy text,
// perplexity against a direct computation, the compressed attention against a double-precision
// reference, and BalanceKV's agreement against uniform's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/eval/protocol.h"
#include "engine/methods/method.h"
#include "engine/model/generate.h"
#include "engine/model/llama2c.h"

namespace fs = std::filesystem;
using namespace kvscope;

namespace {

struct ModelFiles {
  const char* name;
  std::string model, tokenizer;
  const char* prompt;
};

const std::string kModels = std::string(KVSCOPE_SHARED_DIR) + "/models/";
const ModelFiles kStories{"stories260K", kModels + "stories260K.bin", kModels + "tok512.bin",
                          "Once upon a time, there was a little dog"};
const ModelFiles kKjv{"kjv3M", kModels + "kjv3M.bin", kModels + "tok1024.bin",
                      "In the beginning God created"};

#define REQUIRE_MODEL(files)                                                              \
  do {                                                                                    \
    if (!fs::exists((files).model) || !fs::exists((files).tokenizer))                     \
      GTEST_SKIP() << (files).model << " not found; the real-model tests need ../shared"; \
  } while (0)

const Method& method(const char* name) {
  const Method* m = find_method(name);
  if (!m) throw std::runtime_error(std::string("no method ") + name);
  return *m;
}

GenerateSpec base_spec(const ModelFiles& f, int compress_at, int steps) {
  GenerateSpec spec;
  spec.prompt = f.prompt;
  spec.compress_at = compress_at;
  spec.steps = steps;
  spec.threads = 2;
  return spec;
}

}  // namespace

// At ratio 1 every method that keeps the whole middle at weight 1 reproduces the exact cache bit
// for bit: 100% agreement, KL exactly 0, the same free-running text and perplexity, also when
// re-compressing.
TEST(Generate, RatioOneIsExact) {
  for (const ModelFiles* f : {&kStories, &kKjv}) {
    REQUIRE_MODEL(*f);
    llama2c::Transformer model(f->model);
    llama2c::Tokenizer tokenizer(f->tokenizer, model.config().vocab_size);
    GenerateSpec spec = base_spec(*f, 48, 24);
    spec.methods = {&method("exact"), &method("uniform")};
    spec.ratios = {1.0};
    spec.recompress_every = 5;
    spec.has_continuation = true;
    // Long enough to run well past the compression at 48 on both tokenizers.
    for (int i = 0; i < 4; ++i)
      spec.continuation += " And the little dog ran to the park, and the man said unto them, go.";
    const GenerateReport rep = run_generate(model, tokenizer, spec);
    ASSERT_EQ(rep.runs.size(), 2u);
    for (const GenerateRun& r : rep.runs) {
      EXPECT_EQ(r.top1_agreement, 1.0) << f->name << " " << r.method;
      EXPECT_EQ(r.mean_kl, 0.0) << f->name << " " << r.method;
      for (double kl : r.kl) EXPECT_EQ(kl, 0.0);
      EXPECT_EQ(r.tokens, rep.exact_tokens) << f->name << " " << r.method;
      EXPECT_EQ(r.first_divergence, -1);
      EXPECT_EQ(r.perplexity, rep.exact_perplexity) << f->name << " " << r.method;
      EXPECT_EQ(r.compressions, 24 / 5 + 1);
    }
  }
}

// The exact-cache run is `capture`'s greedy generation: prefix, shared token and continuation
// concatenate to llama2c::generate's tokens.
TEST(Generate, ExactContinuationIsCapturesGreedyText) {
  for (const ModelFiles* f : {&kStories, &kKjv}) {
    REQUIRE_MODEL(*f);
    llama2c::Transformer model(f->model);
    llama2c::Tokenizer tokenizer(f->tokenizer, model.config().vocab_size);
    GenerateSpec spec = base_spec(*f, 40, 30);
    spec.methods = {&method("streaming")};
    const GenerateReport rep = run_generate(model, tokenizer, spec);
    llama2c::GenerateOptions options;
    options.steps = 40 + 30 + 1;
    llama2c::Transformer fresh(f->model);
    const llama2c::Generation g = llama2c::generate(fresh, tokenizer, f->prompt, options);
    std::vector<int> joined = rep.prefix_tokens;
    joined.insert(joined.end(), rep.exact_tokens.begin(), rep.exact_tokens.end());
    EXPECT_EQ(joined, g.tokens) << f->name;
    ASSERT_EQ(rep.prefix_tokens.size(), 41u);
    std::string text;
    for (size_t i = 1; i < rep.prefix_text.size(); ++i) text += rep.prefix_text[i];
    for (const std::string& t : rep.exact_text) text += t;
    EXPECT_EQ(text, g.decoded) << f->name;
  }
}

// Perplexity of a continuation against a direct teacher-forced loop over the model, for the exact
// cache; a compressed run scores the same tokens and is worse than exact at 1/8 on this text.
TEST(Generate, PerplexityMatchesDirectComputation) {
  REQUIRE_MODEL(kKjv);
  llama2c::Transformer model(kKjv.model);
  llama2c::Tokenizer tokenizer(kKjv.tokenizer, model.config().vocab_size);
  GenerateSpec spec = base_spec(kKjv, 0, 8);
  spec.prompt = "In the beginning God created the heaven and the earth.";
  spec.continuation =
      " And the earth was without form, and void; and darkness was upon the face of the deep. "
      "And the Spirit of God moved upon the face of the waters. And God said, Let there be "
      "light: and there was light. And God saw the light, that it was good: and God divided the "
      "light from the darkness.";
  spec.has_continuation = true;
  spec.methods = {&method("exact"), &method("streaming")};
  spec.ratios = {0.125};
  const GenerateReport rep = run_generate(model, tokenizer, spec);

  std::vector<int> seq = tokenizer.encode(spec.prompt, true, false);
  const int n = static_cast<int>(seq.size());
  EXPECT_EQ(rep.spec.compress_at, n);
  const std::vector<int> more = tokenizer.encode_continuation(spec.continuation);
  seq.insert(seq.end(), more.begin(), more.end());
  llama2c::Transformer direct(kKjv.model);
  double nll = 0;
  int scored = 0;
  for (int pos = 0; pos + 1 < static_cast<int>(seq.size()); ++pos) {
    const std::vector<float>& logits = direct.forward(seq[pos], pos);
    if (pos + 1 <= n) continue;  // scored: tokens predicted after compression at n
    double mx = -1e300, sum = 0;
    for (float v : logits) mx = std::max(mx, static_cast<double>(v));
    for (float v : logits) sum += std::exp(v - mx);
    nll -= logits[seq[pos + 1]] - mx - std::log(sum);
    ++scored;
  }
  EXPECT_EQ(rep.scored_tokens, scored);
  EXPECT_EQ(rep.scored_from, n + 1);
  const double ppl = std::exp(nll / scored);
  EXPECT_NEAR(rep.exact_perplexity, ppl, 1e-9 * ppl);
  EXPECT_NEAR(rep.find("exact", 0.125)->perplexity, ppl, 1e-9 * ppl);
  EXPECT_GT(rep.find("streaming", 0.125)->perplexity, ppl);
  std::printf("kjv3M continuation (%d tokens): exact %.4f, streaming 1/8 %.4f\n", scored, ppl,
              rep.find("streaming", 0.125)->perplexity);
}

// What the compressed cache feeds attention: sinks, the method's selection with log w biases
// (separate numerator/denominator sets included) and the window, checked against a
// double-precision softmax written out here.
TEST(Generate, CompressedAttentionIsTheWeightedEstimator) {
  REQUIRE_MODEL(kStories);
  for (const char* name : {"uniform", "snapkv", "subgen"}) {
    llama2c::Transformer model(kStories.model);
    llama2c::Tokenizer tokenizer(kStories.tokenizer, model.config().vocab_size);
    const llama2c::Config& c = model.config();
    const int N = 96, hs = c.head_size();
    llama2c::GenerateOptions options;
    options.steps = N;
    llama2c::generate(model, tokenizer, kStories.prompt, options);
    const EvalWindow w = EvalWindow::make(N, 0.25);
    compress_cache(model, method(name), 0.25, {}, w.sink, w.eval, 5);
    ASSERT_TRUE(model.is_compressed());
    const llama2c::CompressedCache& cache = model.compressed_cache();
    EXPECT_EQ(cache.covered, N);
    model.forward(17, N);

    const int layer = 2, kv = 1;
    // The entries are the sinks, the method's own selection on this head, then the window.
    MethodInput in;
    const MatrixF K = model.keys(layer).block(0, kv * hs, N, hs);
    const MatrixF V = model.values(layer).block(0, kv * hs, N, hs);
    std::vector<MatrixF> Q;
    for (int g = 0; g < c.kv_group(); ++g)
      Q.push_back(model.queries(layer).block(0, (kv * c.kv_group() + g) * hs, N, hs));
    in.keys = &K;
    in.values = &V;
    for (const MatrixF& q : Q) in.queries.push_back(&q);
    in.n = N;
    in.sink = w.sink;
    in.eval = w.eval;
    in.mid_begin = w.mid_begin;
    in.mid_end = w.mid_end;
    in.budget = w.budget;
    in.keep_ratio = static_cast<double>(w.budget) / w.n_mid;
    in.layer = layer;
    in.num_layers = c.n_layers;
    in.kv_head = kv;
    in.seed = 5;
    const Selection sel = method(name).select(in);
    const llama2c::CompressedHead& head = cache.heads[layer][kv];
    std::vector<double> num(N, -INFINITY), den(N, -INFINITY);
    for (int t = 0; t < w.sink; ++t) num[t] = den[t] = 0;
    for (int t = w.mid_end; t < N; ++t) num[t] = den[t] = 0;
    for (size_t i = 0; i < sel.indices.size(); ++i) num[sel.indices[i]] = std::log(sel.weights[i]);
    const auto& di = sel.separate ? sel.den_indices : sel.indices;
    const auto& dw = sel.separate ? sel.den_weights : sel.weights;
    for (size_t i = 0; i < di.size(); ++i) den[di[i]] = std::log(dw[i]);
    size_t e = 0;
    for (int t = 0; t < N; ++t) {
      if (num[t] == -INFINITY && den[t] == -INFINITY) continue;
      ASSERT_LT(e, head.positions.size()) << name;
      EXPECT_EQ(head.positions[e], t) << name;
      for (auto [got, want] : {std::pair<double, double>{head.num_logw[e], num[t]},
                               std::pair<double, double>{head.den_logw[e], den[t]}}) {
        if (std::isinf(want))
          EXPECT_EQ(got, want) << name << " entry " << t;  // absent from that sum
        else
          EXPECT_NEAR(got, want, 1e-6) << name << " entry " << t;
      }
      ++e;
    }
    EXPECT_EQ(e, head.positions.size()) << name;
    EXPECT_EQ(head.separate, sel.separate) << name;

    // Attention output of each query head of the group at position N (which sees itself too).
    for (int g = 0; g < c.kv_group(); ++g) {
      const int h = kv * c.kv_group() + g;
      std::vector<double> logits(N + 1);
      double shift = -INFINITY;
      for (int t = 0; t <= N; ++t) {
        double dot = 0;
        for (int i = 0; i < hs; ++i)
          dot += static_cast<double>(model.queries(layer)(N, h * hs + i)) *
                 model.keys(layer)(t, kv * hs + i);
        logits[t] = dot / std::sqrt(static_cast<double>(hs));
        if (t == N) num.push_back(0), den.push_back(0);
        shift = std::max(shift, logits[t] + std::max(num[t], den[t]));
      }
      std::vector<double> out(hs, 0.0);
      double z = 0;
      for (int t = 0; t <= N; ++t) {
        if (den[t] > -INFINITY) z += std::exp(logits[t] + den[t] - shift);
        if (num[t] == -INFINITY) continue;
        const double a = std::exp(logits[t] + num[t] - shift);
        for (int i = 0; i < hs; ++i) out[i] += a * model.values(layer)(t, kv * hs + i);
      }
      for (int i = 0; i < hs; ++i)
        EXPECT_NEAR(model.head_outputs(layer)(N, h * hs + i), out[i] / z,
                    1e-4 * std::max(1.0, std::abs(out[i] / z)))
            << name << " head " << h << " dim " << i;
      num.resize(N), den.resize(N);
    }
  }
}

// Re-compression holds the cache near sink + window + ratio * (positions - sink - window).
TEST(Generate, RecompressionBoundsTheCache) {
  REQUIRE_MODEL(kStories);
  llama2c::Transformer model(kStories.model);
  llama2c::Tokenizer tokenizer(kStories.tokenizer, model.config().vocab_size);
  GenerateSpec spec = base_spec(kStories, 128, 96);
  spec.methods = {&method("uniform")};
  spec.ratios = {0.25};
  spec.recompress_every = 16;
  const GenerateReport once = [&] {
    GenerateSpec s = spec;
    s.recompress_every = 0;
    return run_generate(model, tokenizer, s);
  }();
  const GenerateReport re = run_generate(model, tokenizer, spec);
  const int s = re.sink, W = re.window, last = 128 + 96;
  // After the last re-compression at position 128 + 80 the cache holds the kept entries plus
  // the 16 positions run since.
  const double expected = s + W + std::llround(0.25 * (128 + 80 - s - W)) + 16;
  EXPECT_NEAR(re.runs[0].mean_cache_entries, expected, 1.0);
  EXPECT_EQ(re.runs[0].compressions, 96 / 16);
  EXPECT_NEAR(once.runs[0].mean_cache_entries, s + W + std::llround(0.25 * (128 - s - W)) + 96,
              1.0);
  EXPECT_LT(re.runs[0].mean_cache_entries, last);
}

// BalanceKV against uniform at 1/4, teacher-forced on the exact run, over a fixed set of prompts
// and seeds {0, 1} (N = 128, 64 steps; docs/generate.md has the figures). On kjv3M (head dim 64)
// BalanceKV's top-1 agreement is not below uniform's (0.974 vs 0.956 on this set) and its mean KL
// is lower. On stories260K (head dim 8, the walk saturated) its agreement is NOT above uniform's
// (0.906 vs 0.930 on this set, 0.916 vs 0.917 over 5 prompts x 3 seeds), so there only the lower
// KL is asserted (0.034 vs 0.058 here).
TEST(Generate, BalanceKVAgainstUniformAtQuarter) {
  for (const ModelFiles* f : {&kStories, &kKjv}) {
    REQUIRE_MODEL(*f);
    llama2c::Transformer model(f->model);
    llama2c::Tokenizer tokenizer(f->tokenizer, model.config().vocab_size);
    const std::vector<std::string> prompts =
        f == &kStories ? std::vector<std::string>{"Once upon a time",
                                                  "Tom and Sue went to the park", "The little bird"}
                       : std::vector<std::string>{"In the beginning",
                                                  "And the LORD said unto Moses", "Blessed are"};
    double agree_b = 0, agree_u = 0, kl_b = 0, kl_u = 0;
    int runs = 0;
    for (const std::string& p : prompts)
      for (uint64_t seed : {0, 1}) {
        GenerateSpec spec;
        spec.prompt = p;
        spec.compress_at = 128;
        spec.steps = 64;
        spec.seed = seed;
        spec.threads = 2;
        spec.methods = {&method("balancekv"), &method("uniform")};
        spec.ratios = {0.25};
        const GenerateReport rep = run_generate(model, tokenizer, spec);
        agree_b += rep.runs[0].top1_agreement;
        agree_u += rep.runs[1].top1_agreement;
        kl_b += rep.runs[0].mean_kl;
        kl_u += rep.runs[1].mean_kl;
        ++runs;
      }
    std::printf("%s 1/4: balancekv agreement %.4f KL %.4f, uniform agreement %.4f KL %.4f\n",
                f->name, agree_b / runs, kl_b / runs, agree_u / runs, kl_u / runs);
    EXPECT_LT(kl_b, kl_u) << f->name;
    if (f == &kKjv) {
      EXPECT_GE(agree_b, agree_u) << f->name;
    }
  }
}

// The engine names the setting in words (the Output view shows the message as it is); the CLI
// prints the flag instead (SettingError::cli_message).
TEST(Generate, BadSpecsNameTheSetting) {
  REQUIRE_MODEL(kStories);
  llama2c::Transformer model(kStories.model);
  llama2c::Tokenizer tokenizer(kStories.tokenizer, model.config().vocab_size);
  std::string cli;  // the last SettingError's CLI message
  auto message = [&](GenerateSpec spec) -> std::string {
    cli.clear();
    try {
      run_generate(model, tokenizer, spec);
    } catch (const SettingError& e) {
      cli = e.cli_message();
      EXPECT_EQ(std::string(e.what()).find("--"), std::string::npos)
          << "reads like a command line: " << e.what();
      return e.what();
    } catch (const InputError& e) {
      return e.what();
    }
    return "no error";
  };
  GenerateSpec ok = base_spec(kStories, 64, 8);
  ok.methods = {&method("uniform")};
  GenerateSpec s = ok;
  s.ratios = {0.0};
  EXPECT_NE(message(s).find("ratios: keep ratio 0 is not in"), std::string::npos) << message(s);
  s = ok;
  s.compress_at = 3;
  EXPECT_NE(message(s).find("compress at: 3 is inside the prompt"), std::string::npos)
      << message(s);
  EXPECT_EQ(cli.rfind("--compress-at: 3 is inside the prompt", 0), 0u) << cli;
  s = ok;
  s.steps = 500;
  EXPECT_NE(message(s).find("exceed the model's context"), std::string::npos) << message(s);
  s = ok;
  s.methods.clear();
  EXPECT_NE(message(s).find("methods: no method given"), std::string::npos) << message(s);
  s = ok;
  s.has_continuation = true;
  s.continuation = "";
  EXPECT_NE(message(s).find("continuation: prompt and continuation make"), std::string::npos)
      << message(s);
  EXPECT_EQ(cli.rfind("--continuation: ", 0), 0u) << cli;
  s = ok;
  s.sink = 60;
  s.window = 10;
  EXPECT_NE(message(s).find("sink/window: s + W = 60 + 10 exceeds"), std::string::npos)
      << message(s);
  EXPECT_EQ(cli.rfind("--sink/--window: s + W", 0), 0u) << cli;
  s = ok;
  s.params["uniform"]["nope"] = 1;
  EXPECT_NE(message(s).find("uniform.nope: unknown parameter"), std::string::npos) << message(s);
  EXPECT_EQ(cli.rfind("--param uniform.nope: ", 0), 0u) << cli;
}

// The CLI end to end: the JSON has the fields docs/generate.md lists.
TEST(Generate, CliWritesTheJsonReport) {
  REQUIRE_MODEL(kStories);
  const std::string out =
      (fs::temp_directory_path() / ("kvscope_generate_" + std::to_string(::getpid()) + ".json"))
          .string();
  const std::string cont =
      (fs::temp_directory_path() / ("kvscope_generate_" + std::to_string(::getpid()) + ".txt"))
          .string();
  {
    std::ofstream text(cont);  // past position 40 + 1: scored after the compression
    for (int i = 0; i < 6; ++i)
      text << " and they played all day in the sun with the big red ball.";
  }
  const std::string cmd = std::string(KVSCOPE_CLI) + " generate --model " + kStories.model +
                          " --tokenizer " + kStories.tokenizer +
                          " --prompt 'Once upon a time' --methods exact,balancekv --ratios 1/2,1/8"
                          " --compress-at 40 --steps 12 --recompress-every 4 --continuation " +
                          cont + " --quiet --json " + out + " > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(out);
  const nlohmann::json j = nlohmann::json::parse(in);
  fs::remove(out);
  fs::remove(cont);
  EXPECT_EQ(j["compress_at"], 40);
  EXPECT_EQ(j["steps"], 12);
  EXPECT_EQ(j["recompress_every"], 4);
  ASSERT_EQ(j["results"].size(), 4u);
  for (const auto& r : j["results"]) {
    for (const char* key : {"method", "ratio", "top1_agreement", "mean_kl", "perplexity", "kl",
                            "tokens", "text", "top1"})
      EXPECT_TRUE(r.contains(key)) << key;
    EXPECT_EQ(r["kl"].size(), 12u);
    EXPECT_EQ(r["tokens"].size(), 12u);
  }
  EXPECT_EQ(j["results"][0]["top1_agreement"], 1.0);
  EXPECT_EQ(j["results"][0]["mean_kl"], 0.0);
  EXPECT_DOUBLE_EQ(j["results"][1]["ratio"].get<double>(), 0.125);
  EXPECT_TRUE(j["continuation"].contains("exact_perplexity"));

  const std::string bad = std::string(KVSCOPE_CLI) + " generate --model " + kStories.model +
                          " --tokenizer " + kStories.tokenizer +
                          " --ratios abc --quiet 2> /dev/null";
  EXPECT_NE(std::system(bad.c_str()), 0);
}
