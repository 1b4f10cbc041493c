// kvscope-cli eval / sweep / merge end to end: the printed window and tables, the JSON, exact
// merging of shards, and one clear error per bad flag.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "engine/eval/protocol.h"
#include "engine/io/capture.h"
#include "engine/methods/method.h"
#include "tests/cli_runner.h"

namespace kvscope {
namespace {

using kvscope::testing::CliRun;
using kvscope::testing::run_cli;

namespace fs = std::filesystem;

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

class CliEval : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("kvscope_cli_eval_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    // A small synthetic capture (labelled so): 2 layers, 4 query / 2 kv heads, 256 tokens.
    CaptureData data;
    CaptureInfo& info = data.info;
    info.model = "synthetic-test";
    info.source = "test_cli_eval";
    info.synthetic = true;
    info.num_layers = 2;
    info.q_heads = 4;
    info.kv_heads = 2;
    info.head_dim = 8;
    info.value_dim = 8;
    info.num_tokens = 256;
    info.has_queries = true;
    for (int i = 0; i < info.num_tokens; ++i)
      info.tokens.push_back(std::string("t").append(std::to_string(i)));
    std::mt19937 rng(3);
    std::normal_distribution<float> dist;
    auto rnd = [&] {
      MatrixF m(info.num_tokens, 8);
      for (int i = 0; i < m.rows(); ++i)
        for (int j = 0; j < m.cols(); ++j) m(i, j) = dist(rng);
      return m;
    };
    for (int l = 0; l < info.num_layers; ++l) {
      LayerData L;
      L.layer = l;
      for (int h = 0; h < info.kv_heads; ++h) {
        L.keys.push_back(rnd());
        L.values.push_back(rnd());
      }
      for (int h = 0; h < info.q_heads; ++h) L.queries.push_back(rnd());
      L.refused.assign(info.kv_heads, "");
      data.layers.push_back(std::move(L));
    }
    capture_ = (dir_ / "synthetic.safetensors").string();
    write_capture(capture_, data);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static fs::path dir_;
  static std::string capture_;
};
fs::path CliEval::dir_;
std::string CliEval::capture_;

TEST_F(CliEval, PrintsWindowTableAndWritesJson) {
  const fs::path json = dir_ / "full.json", csv = dir_ / "full.csv";
  const CliRun r = run_cli("eval " + capture_ +
                           " --methods exact,uniform,streaming --ratios 0.5,1/8 --seeds 3 --json " +
                           json.string() + " --csv " + csv.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("s=8 E=32"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("scaled down"), std::string::npos);
  EXPECT_NE(r.output.find("SYNTHETIC"), std::string::npos);
  EXPECT_NE(r.output.find("uniform"), std::string::npos);
  EXPECT_NE(r.output.find("per-layer"), std::string::npos);
  const nlohmann::json j = read_json(json);
  EXPECT_EQ(j["window"]["s"], 8);
  EXPECT_EQ(j["window"]["E"], 32);
  ASSERT_EQ(j["summary"].size(), 6u);
  ASSERT_EQ(j["results"].size(), 3u * 2u * 2u * 2u);
  for (const auto& s : j["summary"]) {
    if (s["method"] == "exact") {
      EXPECT_LT(s["mean"].get<double>(), 1e-13);
    }
    if (s["method"] == "uniform") {
      EXPECT_GT(s["mean"].get<double>(), 0.0);
    }
  }
  std::ifstream in(csv);
  std::string header;
  std::getline(in, header);
  EXPECT_EQ(header.rfind("method,ratio,layer,kv_head,mean,std", 0), 0u);
  int rows = 0;
  for (std::string line; std::getline(in, line);) ++rows;
  EXPECT_EQ(rows, 24);
}

TEST_F(CliEval, ShardsMergeToTheUnshardedResults) {
  const std::string common =
      "eval " + capture_ + " --methods uniform,streaming --ratios 0.5,0.25 --seeds 2";
  const fs::path full = dir_ / "u.json", s0 = dir_ / "s0.json", s1 = dir_ / "s1.json",
                 merged = dir_ / "m.json";
  ASSERT_EQ(run_cli(common + " --threads 1 --json " + full.string()).code, 0);
  ASSERT_EQ(run_cli(common + " --shard 0/2 --json " + s0.string()).code, 0);
  ASSERT_EQ(run_cli(common + " --shard 1/2 --json " + s1.string()).code, 0);
  const CliRun m =
      run_cli("merge " + s1.string() + " " + s0.string() + " --json " + merged.string());
  ASSERT_EQ(m.code, 0) << m.output;
  const nlohmann::json a = read_json(full), b = read_json(merged);
  EXPECT_EQ(a["results"], b["results"]);
  EXPECT_EQ(a["summary"], b["summary"]);
  EXPECT_LT(read_json(s0)["results"].size(), a["results"].size());

  // Missing shard and duplicate shard are refused.
  CliRun bad = run_cli("merge " + s0.string() + " --json " + (dir_ / "x.json").string());
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.output.find("missing shard"), std::string::npos) << bad.output;
  bad = run_cli("merge " + s0.string() + " " + s0.string() + " " + s1.string());
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.output.find("twice"), std::string::npos) << bad.output;
}

// Merge reads every field of a report through a typed accessor; a wrong type
// (null where a number belongs, a string for a list, ...) is refused with the file and the
// field's path named, never with the JSON library's bare "type must be number, but is null".
TEST_F(CliEval, MergeNamesEveryWrongTypedField) {
  const std::string common = "eval " + capture_ + " --methods uniform --ratios 0.5 --seeds 2";
  const fs::path s0 = dir_ / "typed_s0.json", s1 = dir_ / "typed_s1.json",
                 bad = dir_ / "typed_bad.json";
  ASSERT_EQ(run_cli(common + " --shard 0/2 --json " + s0.string()).code, 0);
  ASSERT_EQ(run_cli(common + " --shard 1/2 --json " + s1.string()).code, 0);
  const nlohmann::json good = read_json(s0);
  ASSERT_FALSE(good["results"].empty());
  using nlohmann::json;
  struct Case {
    std::string pointer;  // JSON pointer of the field set to `value`
    json value;
    std::string field;  // the path the message must name
  };
  const std::vector<Case> cases = {
      {"/capture", 5, "capture"},
      {"/capture/path", nullptr, "capture.path"},
      {"/capture/model", 3, "capture.model"},
      {"/capture/source", 1, "capture.source"},
      {"/capture/synthetic", "yes", "capture.synthetic"},
      {"/capture/num_layers", nullptr, "capture.num_layers"},
      {"/capture/q_heads", "4", "capture.q_heads"},
      {"/capture/kv_heads", 2.5, "capture.kv_heads"},
      {"/capture/head_dim", nullptr, "capture.head_dim"},
      {"/capture/value_dim", "8", "capture.value_dim"},
      {"/capture/num_tokens", true, "capture.num_tokens"},
      {"/capture/has_queries", 1, "capture.has_queries"},
      {"/spec", json::array(), "spec"},
      {"/spec/methods", "uniform", "spec.methods"},
      {"/spec/methods/0", 5, "spec.methods[0]"},
      {"/spec/methods/0", "no-such-method", "spec.methods[0]"},
      {"/spec/ratios", 0.5, "spec.ratios"},
      {"/spec/ratios/0", nullptr, "spec.ratios[0]"},
      {"/spec/seeds", nullptr, "spec.seeds"},
      {"/spec/base_seed", -1, "spec.base_seed"},
      {"/spec/layers", json::object(), "spec.layers"},
      {"/spec/layers/0", "0", "spec.layers[0]"},
      {"/spec/heads/0", 1.5, "spec.heads[0]"},
      {"/spec/params", json::array(), "spec.params"},
      {"/spec/params/uniform", 1, "spec.params.uniform"},
      {"/spec/params/uniform", {{"x", "y"}}, "spec.params.uniform.x"},
      {"/spec/sink", "4", "spec.sink"},
      {"/spec/eval", nullptr, "spec.eval"},
      {"/spec/shard_index", "0", "spec.shard_index"},
      {"/spec/shard_count", 2.0, "spec.shard_count"},
      {"/spec/shard_count", 0, "spec.shard_count"},
      {"/spec/estimator", 3, "spec.estimator"},
      {"/proxy_queries", "no", "proxy_queries"},
      {"/notes", "x", "notes"},
      {"/notes", {1}, "notes[0]"},
      {"/results", json::object(), "results"},
      {"/results/0", 3, "results[0]"},
      {"/results/0/method", nullptr, "results[0].method"},
      {"/results/0/ratio", "0.5", "results[0].ratio"},
      {"/results/0/layer", nullptr, "results[0].layer"},
      {"/results/0/kv_head", "0", "results[0].kv_head"},
      {"/results/0/mean", nullptr, "results[0].mean"},
      {"/results/0/std", "x", "results[0].std"},
      {"/results/0/normalized_mean", nullptr, "results[0].normalized_mean"},
      {"/results/0/mass_mean", json::array(), "results[0].mass_mean"},
      {"/results/0/per_seed", 0.1, "results[0].per_seed"},
      {"/results/0/per_seed/0", nullptr, "results[0].per_seed[0]"},
      {"/results/0/per_query/0", "x", "results[0].per_query[0]"},
      {"/results/0/refused", 0, "results[0].refused"},
      {"/results/0/note", 5, "results[0].note"},
      {"/results/0/error", false, "results[0].error"},
      {"/results/0/kept", "3", "results[0].kept"},
      {"/results/0/budget", 1.5, "results[0].budget"},
      {"/results/0/saturation", "x", "results[0].saturation"},
  };
  for (const Case& c : cases) {
    json j = good;
    j[json::json_pointer(c.pointer)] = c.value;
    std::ofstream(bad) << j.dump();
    const CliRun r = run_cli("merge " + bad.string() + " " + s1.string() + " --quiet");
    EXPECT_EQ(r.code, 1) << c.pointer << ": " << r.output;
    EXPECT_NE(r.output.find(bad.string() + ": eval report field \"" + c.field + "\""),
              std::string::npos)
        << c.pointer << ": " << r.output;
    EXPECT_EQ(r.output.find("type must be"), std::string::npos) << r.output;
  }
  // The report itself is untouched: both shards still merge.
  EXPECT_EQ(run_cli("merge " + s0.string() + " " + s1.string() + " --quiet").code, 0);
}

// A report whose spec asks for more work items than any eval runs (merge lays them all out) is
// refused before anything is sized by it, naming "spec".
TEST_F(CliEval, MergeRefusesASpecOfTooManyWorkItems) {
  const fs::path s0 = dir_ / "big_s0.json", bad = dir_ / "big_bad.json";
  ASSERT_EQ(run_cli("eval " + capture_ + " --methods uniform --ratios 0.5 --seeds 1 --json " +
                    s0.string())
                .code,
            0);
  nlohmann::json j = read_json(s0);
  j["capture"]["num_layers"] = 4096;
  j["capture"]["kv_heads"] = 4096;
  j["capture"]["q_heads"] = 4096;
  std::vector<int> all(4096);
  for (int i = 0; i < 4096; ++i) all[static_cast<size_t>(i)] = i;
  j["spec"]["layers"] = all;
  j["spec"]["heads"] = all;
  j["spec"]["ratios"] = {0.5, 0.25, 0.125, 0.0625};
  std::ofstream(bad) << j.dump();
  const CliRun r = run_cli("merge " + bad.string() + " --quiet");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("eval report field \"spec\": asks for 67108864 work items"),
            std::string::npos)
      << r.output;
}

TEST_F(CliEval, BadFlagsGiveOneClearError) {
  struct Case {
    std::string args, expect;
  };
  const std::vector<Case> cases = {
      {"--methods nosuch", "--methods: unknown method 'nosuch'"},
      {"--ratios 0.5,abc", "--ratios: 'abc' is not a number"},
      {"--ratios 0", "--ratios: keep ratio 0"},
      {"--shard 2/2", "--shard"},
      {"--shard 1", "--shard"},
      {"--param uniform.gamma=1", "--param uniform.gamma"},
      {"--param nosuch.x=1", "--param nosuch.x=1: unknown method"},
      {"--layers 7", "--layers: layer 7 out of range"},
      {"--heads 0-5", "--heads: kv head 2 out of range"},
      {"--sink 200 --eval 100", "--sink/--eval"},
      {"--seeds 0", "--seeds"},
      {"--backend tpu", "--backend"},
  };
  for (const Case& c : cases) {
    std::string base = " ";
    if (c.args.find("--methods") == std::string::npos) base += "--methods uniform ";
    if (c.args.find("--seeds") == std::string::npos) base += "--seeds 1 ";
    const CliRun r = run_cli("eval " + capture_ + base + c.args);
    EXPECT_EQ(r.code, 1) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find("kvscope-cli: error:"), std::string::npos) << r.output;
  }
  const CliRun missing = run_cli("eval " + (dir_ / "absent.safetensors").string());
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.output.find("absent.safetensors"), std::string::npos);
}

// A capture that lacks an input a method needs (here RoPE's rope_theta and rope_layout, as in any
// capture made by another tool or an older KVScope) is not a defect: `all` (the default) runs the
// methods it can and names those it leaves out, with why, in a note (exit 0); a method asked for
// by name that it cannot run is a bad request (exit 1, the method and the missing input named).
TEST_F(CliEval, CaptureWithoutRopeRunsWhatItCanAndRefusesWhatIsNamed) {
  const CaptureInfo info = CaptureFile::open(capture_)->info();
  ASSERT_FALSE(info.rope.known()) << "the test capture must lack RoPE metadata";
  std::vector<std::string> runnable, left_out;
  for (const Method* m : all_methods())
    (method_unavailable(*m, info).empty() ? runnable : left_out).push_back(m->name());
  ASSERT_NE(std::find(left_out.begin(), left_out.end(), "expected-attention"), left_out.end());
  ASSERT_FALSE(runnable.empty());

  for (const std::string methods : {"", " --methods all"}) {
    const fs::path json = dir_ / "all.json";
    fs::remove(json);
    const CliRun r = run_cli("eval " + capture_ + methods +
                             " --ratios 0.5 --seeds 1 --layers 0 --json " + json.string());
    ASSERT_EQ(r.code, 0) << methods << "\n" << r.output;
    EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("left out of --methods all (this capture cannot run them)"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("rope_theta"), std::string::npos) << r.output;
    const nlohmann::json j = read_json(json);
    EXPECT_TRUE(j["failures"].empty()) << j["failures"].dump();
    std::string notes;
    for (const auto& n : j["notes"]) notes += n.get<std::string>() + "\n";
    std::vector<std::string> in_summary;
    for (const auto& s : j["summary"]) in_summary.push_back(s["method"].get<std::string>());
    for (const std::string& name : left_out) {
      EXPECT_NE(notes.find(name + " (needs "), std::string::npos) << name << "\n" << notes;
      EXPECT_EQ(std::find(in_summary.begin(), in_summary.end(), name), in_summary.end()) << name;
    }
    for (const std::string& name : runnable)
      EXPECT_NE(std::find(in_summary.begin(), in_summary.end(), name), in_summary.end()) << name;
  }

  const fs::path json = dir_ / "named.json";
  const std::string quoted_ada = "'adakv(expected-attention)'";
  struct Case {
    std::string args, method;
  };
  const std::vector<Case> named = {
      {"eval " + capture_ + " --methods uniform,expected-attention", "expected-attention"},
      {"eval " + capture_ + " --methods compactor", "compactor"},
      {"eval " + capture_ + " --methods " + quoted_ada, "adakv(expected-attention)"},
      {"eval " + capture_ + " --param expected-attention.n_sink=2", "expected-attention"},
      {"sweep " + capture_ + " --method expected-attention --param n_sink=2,4",
       "expected-attention"},
      {"theory " + capture_ + " --methods uniform,expected-attention --no-discrepancy",
       "expected-attention"},
  };
  for (const Case& c : named) {
    fs::remove(json);
    const CliRun r = run_cli(c.args + " --seeds 1 --json " + json.string());
    EXPECT_EQ(r.code, 1) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find("kvscope-cli: error: "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(c.method + " cannot run on this capture"), std::string::npos)
        << c.args << "\n"
        << r.output;
    EXPECT_NE(r.output.find("\"rope_theta\" and \"rope_layout\""), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(json)) << c.args;
  }
}

// One exit status per outcome for every subcommand: a flag that does not parse, an unknown flag,
// a missing argument or file are bad input (1), never CLI11's own codes (104, 106, 109, ...).
TEST_F(CliEval, EverySubcommandExitsOneOnBadInput) {
  const std::string out = (dir_ / "out.safetensors").string();
  const std::vector<std::string> cases = {
      "",
      "nosuch",
      "eval " + capture_ + " --seeds abc",
      "eval " + capture_ + " --nosuch-flag",
      "eval " + capture_ + " --param uniform",
      "eval",
      "sweep " + capture_ + " --method uniform --seeds 1.5",
      "merge",
      "info " + (dir_ / "absent.safetensors").string(),
      "info " + capture_ + " --tokens many",
      "synth --tokens abc --out " + out,
      "bench --n abc",
      "embed " + capture_ + " --layer x --head 0 --out " + (dir_ / "e.csv").string(),
      "theory " + capture_ + " --seeds abc",
      "render " + capture_ + " --ratio abc --out " + (dir_ / "r.png").string(),
      "generate --steps abc",
      "capture --nosuch-flag",
  };
  for (const std::string& c : cases) {
    const CliRun r = run_cli(c);
    EXPECT_EQ(r.code, 1) << "kvscope-cli " << c << "\n" << r.output;
    EXPECT_EQ(r.output.find("internal error"), std::string::npos) << c << "\n" << r.output;
  }
  EXPECT_EQ(run_cli("--help").code, 0);
  EXPECT_EQ(run_cli("eval --help").code, 0);
}

TEST_F(CliEval, SweepPrintsErrorPerGridValue) {
  // Any method with a Float parameter will do; the simple methods have none.
  const Method* tunable = nullptr;
  const ParamSpec* param = nullptr;
  static std::vector<ParamSpec> specs;
  for (const Method* m : all_methods()) {
    specs = m->params();
    for (const ParamSpec& p : specs)
      if (p.type == ParamSpec::Type::Float && p.max > p.min) {
        tunable = m;
        param = &p;
        break;
      }
    if (tunable) break;
  }
  const CliRun none = run_cli("sweep " + capture_ + " --method uniform --param k=1,2");
  EXPECT_EQ(none.code, 1);
  EXPECT_NE(none.output.find("--param uniform.k"), std::string::npos) << none.output;
  ASSERT_NE(tunable, nullptr) << "no method with a Float parameter is registered";

  const double lo = param->min, hi = param->max, mid = param->default_value;
  char values[128];
  std::snprintf(values, sizeof values, "%.17g,%.17g", lo, mid);
  const fs::path json = dir_ / "sweep.json";
  const CliRun r =
      run_cli("sweep " + capture_ + " --method " + tunable->name() + " --param " + param->name +
              "=" + values + " --ratios 0.5 --seeds 1 --layers 0 --json " + json.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json j = read_json(json);
  ASSERT_EQ(j["points"].size(), 2u);
  EXPECT_EQ(j["points"][0]["params"][param->name], lo);
  EXPECT_EQ(j["points"][1]["params"][param->name], mid);
  EXPECT_NE(r.output.find(param->name + "="), std::string::npos);
  EXPECT_NE(r.output.find("best at ratio 0.5"), std::string::npos) << r.output;

  char out_of_range[64];
  std::snprintf(out_of_range, sizeof out_of_range, "%.17g", hi + 1 + std::abs(hi));
  const CliRun bad = run_cli("sweep " + capture_ + " --method " + tunable->name() + " --param " +
                             param->name + "=" + out_of_range);
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.output.find("outside"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace kvscope
