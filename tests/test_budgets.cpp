// Budgets as people set them (docs/evaluation.md, "Budgets"): a token budget B
// keeps exactly B middle tokens in eval, sweep and generate; a budget that does not fit is an
// error naming the setting; the kvpress preset of ratios; and which methods a capture cannot run
// (method_unavailable, the reason the app shows on a greyed method).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/eval/protocol.h"
#include "engine/io/capture.h"
#include "engine/methods/method.h"
#include "engine/model/generate.h"
#include "engine/model/llama2c.h"
#include "sample_captures.h"
#include "tests/cli_runner.h"

namespace fs = std::filesystem;
using namespace kvscope;

namespace {

using kvscope::testing::CliRun;
using kvscope::testing::run_cli;

std::string lily() {
  return kvscope::testing::sample_capture_paths()[0];
}

fs::path temp_dir() {
  fs::path d = fs::temp_directory_path() / ("kvscope_budgets_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

}  // namespace

// Every method that keeps what it is given keeps exactly B middle tokens, on every head, and the
// report says the budgets; the ratios run are B / n_mid.
TEST(Budgets, EvalKeepsExactlyTheBudget) {
  auto cap = CaptureFile::open(lily());
  EvalSpec spec;
  spec.methods = parse_method_list("uniform,snapkv,streaming,keydiff,adakv(snapkv)");
  spec.budgets = {1, 64, 100, 405};
  spec.seeds = 2;
  spec.layers = {0, 3};
  const EvalReport rep = run_eval(*cap, spec);
  const int n_mid = rep.window_example.n_mid;
  ASSERT_EQ(n_mid, 405);  // 480 tokens: s = 15, E = 60
  ASSERT_EQ(rep.spec.ratios.size(), 4u);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_DOUBLE_EQ(rep.spec.ratios[i], static_cast<double>(spec.budgets[i]) / n_mid);
  int checked = 0;
  std::map<std::pair<int, size_t>, int> adakv_layer_kept;  // (layer, budget index) -> kept
  for (const HeadEval& h : rep.results) {
    ASSERT_TRUE(h.error.empty()) << h.method << ": " << h.error;
    const size_t i = std::find(rep.spec.ratios.begin(), rep.spec.ratios.end(), h.ratio) -
                     rep.spec.ratios.begin();
    ASSERT_LT(i, 4u);
    EXPECT_EQ(h.budget, spec.budgets[i]) << h.method;
    if (h.method == "adakv(snapkv)") {  // per-head budgets: the layer holds B per head in all
      adakv_layer_kept[{h.layer, i}] += h.kept;
      continue;
    }
    EXPECT_EQ(h.kept, spec.budgets[i]) << h.method << " L" << h.layer << " H" << h.kv_head;
    ++checked;
  }
  EXPECT_EQ(checked, 4 * 4 * 2 * 4);
  ASSERT_EQ(adakv_layer_kept.size(), 2u * 4u);
  for (const auto& [key, kept] : adakv_layer_kept) EXPECT_EQ(kept, 4 * spec.budgets[key.second]);
  const nlohmann::json j = rep.to_json();
  EXPECT_EQ(j["spec"]["budgets"], nlohmann::json({1, 64, 100, 405}));
  // The report reads back (merge) with its budgets.
  EXPECT_EQ(EvalReport::from_json(j).spec.budgets, spec.budgets);
  // A report by ratio has no budgets field (reports written before budgets are unchanged).
  EvalSpec by_ratio = spec;
  by_ratio.budgets.clear();
  by_ratio.ratios = {0.5};
  by_ratio.methods = parse_method_list("uniform");
  by_ratio.layers = {0};
  EXPECT_FALSE(run_eval(*cap, by_ratio).to_json()["spec"].contains("budgets"));
}

// A budget is counted in middle tokens: above the middle (or below 1) it is an error naming the
// setting, with the middle's size; the CLI names the flag instead.
TEST(Budgets, ABudgetThatDoesNotFitNamesTheSetting) {
  for (int bad : {406, 0, -3, 100000}) {
    try {
      ratios_for_budgets({64, bad}, 480, -1, -1);
      FAIL() << bad << " was accepted";
    } catch (const SettingError& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind("budget: ", 0), 0u) << what;
      EXPECT_NE(what.find("405"), std::string::npos) << what;  // the middle it must fit
      EXPECT_EQ(what.find("--"), std::string::npos) << what;   // the engine names no flag
      EXPECT_EQ(e.cli_message().rfind("--budget: ", 0), 0u) << e.cli_message();
    }
  }
  // With s and E set, the middle is what they leave.
  EXPECT_THROW(ratios_for_budgets({401}, 480, 20, 60), SettingError);
  EXPECT_NO_THROW(ratios_for_budgets({400}, 480, 20, 60));
  EXPECT_THROW(ratios_for_budgets({64, 64}, 480, -1, -1), SettingError);  // given twice

  const CliRun r = run_cli("eval " + lily() + " --methods uniform --budget 500 --seeds 1");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--budget: 500 tokens do not fit"), std::string::npos) << r.output;
  const CliRun both =
      run_cli("eval " + lily() + " --methods uniform --budget 50 --ratios 0.5 --seeds 1");
  EXPECT_EQ(both.code, 1) << both.output;
  EXPECT_NE(both.output.find("--budget"), std::string::npos) << both.output;
  const CliRun word = run_cli("eval " + lily() + " --methods uniform --budget 5x --seeds 1");
  EXPECT_EQ(word.code, 1) << word.output;
  EXPECT_NE(word.output.find("--budget: '5x'"), std::string::npos) << word.output;
}

// eval --budget and sweep --budget through the CLI: the JSON's kept counts are the budgets.
TEST(Budgets, CliEvalAndSweepByBudget) {
  const fs::path d = temp_dir();
  const std::string out = (d / "b.json").string();
  const CliRun r = run_cli("eval " + lily() +
                           " --methods uniform,tova --budget 32,200 --seeds 1 --layers 1 "
                           "--json " +
                           out);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("budget 32"), std::string::npos) << r.output;
  std::ifstream in(out);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["spec"]["budgets"], nlohmann::json({32, 200}));
  for (const auto& res : j["results"]) EXPECT_EQ(res["kept"], res["budget"]) << res.dump();
  EXPECT_EQ(j["window"]["budgets"], nlohmann::json({32, 200}));

  const std::string sw = (d / "s.json").string();
  const CliRun s = run_cli("sweep " + lily() +
                           " --method snapkv --param window=8,32 --budget 50 --seeds 1 "
                           "--layers 0 --json " +
                           sw);
  ASSERT_EQ(s.code, 0) << s.output;
  EXPECT_NE(s.output.find("budget 50"), std::string::npos) << s.output;
  std::ifstream sin(sw);
  const nlohmann::json sj = nlohmann::json::parse(sin);
  EXPECT_EQ(sj["spec"]["budgets"], nlohmann::json({50}));
  fs::remove_all(d);
}

// kvpress counts the fraction removed (0.25, 0.5, 0.75, 0.875): the preset keeps the rest.
TEST(Budgets, KvpressPresetOfRatios) {
  const std::vector<double>* p = parse_ratio_preset("kvpress");
  ASSERT_NE(p, nullptr);
  const std::vector<double> removed{0.25, 0.5, 0.75, 0.875};
  ASSERT_EQ(p->size(), removed.size());
  for (size_t i = 0; i < removed.size(); ++i) EXPECT_DOUBLE_EQ((*p)[i], 1 - removed[i]);
  EXPECT_EQ(parse_ratio_preset("kvpres"), nullptr);

  const fs::path d = temp_dir();
  const std::string out = (d / "k.json").string();
  const CliRun r = run_cli(
      "eval " + lily() + " --methods uniform --ratios kvpress --seeds 1 --layers 0 --json " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream in(out);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["spec"]["ratios"], nlohmann::json({0.75, 0.5, 0.25, 0.125}));
  EXPECT_FALSE(j["spec"].contains("budgets"));
  fs::remove_all(d);
}

// generate --budget: the middle keeps B entries at every compression, so the cache holds
// s + B + W after the last one (plus the positions run since).
TEST(Budgets, GenerateHoldsTheCacheAtTheBudget) {
  const std::string models = std::string(KVSCOPE_SHARED_DIR) + "/models/";
  if (!fs::exists(models + "stories260K.bin")) GTEST_SKIP() << "needs ../shared/models";
  llama2c::Transformer model(models + "stories260K.bin");
  llama2c::Tokenizer tokenizer(models + "tok512.bin", model.config().vocab_size);
  GenerateSpec spec;
  spec.prompt = "Once upon a time, there was a little dog";
  spec.compress_at = 128;
  spec.steps = 48;
  spec.recompress_every = 16;
  spec.methods = {find_method("snapkv"), find_method("keydiff")};
  spec.budgets = {20, 50};
  spec.threads = 2;
  const GenerateReport rep = run_generate(model, tokenizer, spec);
  ASSERT_EQ(rep.runs.size(), 4u);
  const int n_mid = 128 - rep.sink - rep.window;
  for (const GenerateRun& r : rep.runs) {
    ASSERT_GE(r.budget, 0);
    EXPECT_DOUBLE_EQ(r.ratio, static_cast<double>(r.budget) / n_mid);
    // The last re-compression (after 32 new positions) keeps s + B + W; 16 positions ran since.
    EXPECT_DOUBLE_EQ(r.mean_cache_entries, rep.sink + r.budget + rep.window + 16) << r.method;
  }
  EXPECT_EQ(rep.to_json()["results"][0]["budget"], 20);
  spec.budgets = {n_mid + 1};
  try {
    run_generate(model, tokenizer, spec);
    FAIL() << "a budget above the middle was accepted";
  } catch (const SettingError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("budget: ", 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::to_string(n_mid)), std::string::npos) << e.what();
  }
}

// What the app greys out, and why: queries, RoPE, W_O.
TEST(Budgets, MethodsACaptureCannotRunSayWhy) {
  CaptureInfo info;
  info.has_queries = true;
  info.rope.layout = RopeInfo::Layout::Interleaved;
  info.rope.theta = 10000;
  const Method& ea = *find_method("expected-attention");
  const Method& ada_ea = *find_method("adakv(expected-attention)");
  const Method& crit = *find_method("criticalkv(expected-attention)");
  const Method& snap = *find_method("snapkv");
  const Method& knorm = *find_method("knorm");
  EXPECT_EQ(method_unavailable(ea, info), "");
  EXPECT_EQ(method_unavailable(ada_ea, info), "");
  EXPECT_EQ(method_unavailable(*find_method("compactor"), info), "");
  // criticalkv's press needs W_O; its projection=identity does without.
  EXPECT_NE(method_unavailable(crit, info).find("W_O"), std::string::npos);
  EXPECT_EQ(method_unavailable(crit, info, {{"projection", 1}}), "");
  CaptureInfo with_wo = info;  // a capture that carries layers.L.wo runs the press
  with_wo.has_output_projection = true;
  EXPECT_EQ(method_unavailable(crit, with_wo), "");

  CaptureInfo no_rope = info;
  no_rope.rope = RopeInfo();
  no_rope.rope.missing = "the capture metadata has no \"rope_theta\" and \"rope_layout\"";
  for (const Method* m :
       {&ea, &ada_ea, find_method("compactor"), find_method("chunkkv(expected-attention)")}) {
    const std::string why = method_unavailable(*m, no_rope);
    EXPECT_NE(why.find("RoPE"), std::string::npos) << m->name() << ": " << why;
    EXPECT_NE(why.find("rope_theta"), std::string::npos) << m->name() << ": " << why;
  }
  EXPECT_EQ(method_unavailable(snap, no_rope), "");
  EXPECT_EQ(method_unavailable(knorm, no_rope), "");

  CaptureInfo keys_only = info;
  keys_only.has_queries = false;
  EXPECT_NE(method_unavailable(snap, keys_only).find("queries"), std::string::npos);
  EXPECT_NE(method_unavailable(*find_method("adakv(snapkv)"), keys_only).find("queries"),
            std::string::npos);
  EXPECT_EQ(method_unavailable(knorm, keys_only), "");

  // The sample captures carry RoPE and W_O (docs/capture-format.md): every method runs on them.
  for (const std::string& path : kvscope::testing::sample_capture_paths()) {
    auto cap = CaptureFile::open(path);
    EXPECT_TRUE(cap->info().has_output_projection) << path;
    for (const Method* m : all_methods())
      EXPECT_EQ(method_unavailable(*m, cap->info()), "") << path << " " << m->name();
  }
}

// The sample captures and every new llama2.c capture store RoPE's theta and layout
// (docs/capture-format.md); a capture without them still opens, and the methods that need them
// say why they cannot run.
TEST(Budgets, CapturesCarryRope) {
  for (const std::string& path : kvscope::testing::sample_capture_paths()) {
    auto cap = CaptureFile::open(path);
    const auto& meta = cap->info().metadata;
    ASSERT_TRUE(meta.count("rope_theta")) << path;
    EXPECT_EQ(meta.at("rope_theta"), "10000") << path;
    EXPECT_EQ(meta.at("rope_layout"), "interleaved") << path;
  }
  const std::string models = std::string(KVSCOPE_SHARED_DIR) + "/models/";
  if (!fs::exists(models + "stories260K.bin")) GTEST_SKIP() << "needs ../shared/models";
  const fs::path d = temp_dir();
  const std::string out = (d / "c.safetensors").string();
  const CliRun r = run_cli("capture --model " + models + "stories260K.bin --tokenizer " + models +
                           "tok512.bin --prompt Hi --steps 40 --out " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  auto cap = CaptureFile::open(out);
  EXPECT_EQ(cap->info().metadata.at("rope_theta"), "10000");
  EXPECT_EQ(cap->info().metadata.at("rope_layout"), "interleaved");
  EXPECT_TRUE(cap->info().rope.known());
  fs::remove_all(d);
}
