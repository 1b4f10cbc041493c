// Capture sets and evidence across prompts (docs/evaluation.md, "Capture sets"): a manifest or a
// folder opens with one clear error for every way it can be wrong; `eval SET` gives each capture
// exactly `eval FILE`'s figures and their aggregate (mean, 95% Student-t interval, wins); shards of
// a set merge to the unsharded report; `capture --prompts` writes a set and its manifest.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/student_t.h"
#include "engine/eval/capture_set.h"
#include "engine/eval/holdout.h"
#include "engine/eval/protocol.h"
#include "engine/eval/seed_stats.h"
#include "engine/eval/set_eval.h"
#include "engine/methods/method.h"
#include "engine/model/synth.h"
#include "tests/cli_runner.h"

namespace kvscope {
namespace {

namespace fs = std::filesystem;
using kvscope::testing::run_cli;

// A shell command's output (stdout and stderr), its exit status in *code.
std::string shell(const std::string& cmd, int* code) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, got);
  const int status = ::pclose(p);
  *code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

class CaptureSetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kvscope_capture_set_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "set");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A small synthetic capture (2 layers, 2 kv heads, d 16) of `tokens` tokens and seed `seed`.
  fs::path synth(const std::string& name, int tokens, uint64_t seed, int head_dim = 16) {
    SynthSpec spec = synth_preset("small");
    spec.num_tokens = tokens;
    spec.seed = seed;
    spec.head_dim = head_dim;
    const fs::path p = dir_ / "set" / name;
    write_synth_capture(p.string(), spec, DType::F32);
    return p;
  }
  fs::path write_text(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / "set" / name;
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  std::string open_error(const fs::path& p) {
    try {
      open_capture_set(p.string());
    } catch (const InputError& e) {
      return e.what();
    }
    return "(opened)";
  }

  fs::path dir_;
};

// "p<c>.safetensors", appended piece by piece: GCC 12 misreads "p" + std::to_string(c) as an
// overlapping copy (-Wrestrict).
std::string prompt_file(int c) {
  std::string name = "p";
  name += std::to_string(c);
  name += ".safetensors";
  return name;
}

EvalSpec small_spec() {
  EvalSpec spec;
  spec.methods = {find_method("uniform"), find_method("snapkv"), find_method("balancekv")};
  spec.ratios = {0.5, 0.25};
  spec.seeds = 2;
  spec.threads = 2;
  return spec;
}

TEST(StudentT, QuantilesMatchTheTables) {
  // t_{0.975, df} to 20 digits (mpmath: the root of 1 - I_{df/(df+t^2)}(df/2, 1/2) / 2 = 0.975).
  const std::vector<std::pair<int, double>> table{
      {1, 12.706204736174704646},  {2, 4.3026527297494638523}, {4, 2.7764451051977943578},
      {10, 2.2281388519862747484}, {30, 2.04227245630123831},  {1000, 1.962339080826408485}};
  for (const auto& [df, t] : table) EXPECT_NEAR(student_t_quantile(0.975, df), t, 1e-12 * t) << df;
  EXPECT_TRUE(std::isnan(student_t_quantile(0.975, 0)));
}

TEST_F(CaptureSetTest, AFolderIsItsSafetensorsSortedByName) {
  synth("b.safetensors", 96, 2);
  synth("a.safetensors", 128, 1);
  write_text("notes.txt", "not a capture");
  const CaptureSet set = open_capture_set((dir_ / "set").string());
  ASSERT_EQ(set.entries.size(), 2u);
  EXPECT_EQ(set.entries[0].path, "a.safetensors");
  EXPECT_EQ(set.entries[0].label, "a");
  EXPECT_EQ(set.entries[0].num_tokens, 128);
  EXPECT_EQ(set.entries[1].path, "b.safetensors");
  EXPECT_EQ(set.entries[1].num_tokens, 96);
  EXPECT_EQ(set.shape.num_layers, 2);
}

TEST_F(CaptureSetTest, AManifestNamesPathsRelativeToItselfWithLabelsAndPrompts) {
  synth("one.safetensors", 96, 1);
  fs::create_directories(dir_ / "set" / "sub");
  {
    SynthSpec spec = synth_preset("small");
    spec.num_tokens = 112;
    spec.seed = 7;
    write_synth_capture((dir_ / "set" / "sub" / "two.safetensors").string(), spec, DType::F32);
  }
  const fs::path m = write_text(
      "manifest.jsonl",
      "{\"path\": \"one.safetensors\", \"label\": \"first\", \"prompt\": \"Once upon\"}\n\n"
      "{\"path\": \"sub/two.safetensors\"}\n");
  const CaptureSet set = open_capture_set(m.string());
  ASSERT_EQ(set.entries.size(), 2u);
  EXPECT_EQ(set.entries[0].label, "first");
  EXPECT_EQ(set.entries[0].prompt, "Once upon");
  EXPECT_EQ(set.entries[1].path, "sub/two.safetensors");
  EXPECT_EQ(set.entries[1].label, "two");
  EXPECT_EQ(fs::path(set.entries[1].resolved), (dir_ / "set" / "sub" / "two.safetensors"));
  EXPECT_EQ(manifest_text({set.entries[0]}),
            "{\"label\":\"first\",\"path\":\"one.safetensors\",\"prompt\":\"Once upon\"}\n");
}

TEST_F(CaptureSetTest, EveryWayASetIsWrongIsOneErrorNamingTheEntry) {
  synth("one.safetensors", 96, 1);
  synth("wide.safetensors", 96, 3, 32);
  fs::copy_file(dir_ / "set" / "one.safetensors", dir_ / "set" / "copy.safetensors");
  write_text("bad.safetensors", "not a safetensors file at all");
  const auto expect = [&](const std::string& text, const std::string& what) {
    const std::string err = open_error(write_text("m.jsonl", text));
    EXPECT_NE(err.find(what), std::string::npos) << "manifest:\n" << text << "error: " << err;
  };
  expect("{\"path\": \"one.safetensors\"}\nnot json\n", "line 2: not JSON");
  expect("[1, 2]\n", "line 1: expected a JSON object");
  expect("{\"label\": \"x\"}\n", "line 1: no \"path\"");
  expect("{\"path\": \"one.safetensors\", \"label\": 3}\n", "\"label\" is not a string");
  expect("{\"path\": \"missing.safetensors\"}\n", "entry 1 (missing.safetensors): no such file");
  expect("{\"path\": \"one.safetensors\"}\n{\"path\": \"bad.safetensors\"}\n",
         "entry 2 (bad.safetensors)");
  expect("{\"path\": \"one.safetensors\"}\n{\"path\": \"wide.safetensors\"}\n",
         "entry 2 (wide.safetensors): head dim 32 where the set's first capture has 16");
  expect("{\"path\": \"one.safetensors\"}\n{\"path\": \"copy.safetensors\"}\n",
         "entry 2 (copy.safetensors): the same capture as entry 1 (one.safetensors)");
  expect("\n\n", "lists no capture");
  EXPECT_NE(open_error(dir_ / "set" / "none.jsonl").find("no such manifest"), std::string::npos);
  fs::create_directories(dir_ / "empty");
  EXPECT_NE(open_error(dir_ / "empty").find("holds no *.safetensors"), std::string::npos);
}

TEST_F(CaptureSetTest, EachCapturesFiguresAreEvalsAndTheAggregateIsTheirMeanWithAnInterval) {
  synth("a.safetensors", 128, 1);
  synth("b.safetensors", 96, 2);
  synth("c.safetensors", 112, 3);
  const CaptureSet set = open_capture_set((dir_ / "set").string());
  const EvalSpec spec = small_spec();
  const SetEvalReport rep = run_set_eval(set, spec);
  ASSERT_EQ(rep.captures.size(), 3u);
  for (size_t c = 0; c < 3; ++c) {
    auto capture = CaptureFile::open(set.entries[c].resolved);
    EvalReport alone = run_eval(*capture, spec);
    alone.capture_path = set.entries[c].path;
    EXPECT_EQ(rep.captures[c].to_json().dump(), alone.to_json().dump()) << set.entries[c].path;
  }
  const std::vector<SetRow> rows = rep.summary();
  int whole = 0;
  for (const SetRow& r : rows) {
    std::vector<double> values;
    for (const EvalReport& c : rep.captures) {
      if (r.layer == kAllLayers) {
        for (const EvalSummary& s : c.summary())
          if (s.method == r.method && s.ratio == c.spec.ratios[r.column]) values.push_back(s.mean);
      } else {
        for (const HeadEval& he : c.results)
          if (he.method == r.method && he.ratio == c.spec.ratios[r.column] && he.layer == r.layer &&
              he.kv_head == r.kv_head)
            values.push_back(he.mean);
      }
    }
    ASSERT_EQ(values.size(), 3u) << r.method;
    const auto [mean, sd] = mean_std(values);
    EXPECT_EQ(r.mean, mean);
    EXPECT_EQ(r.prompts, 3);
    const double half = student_t_quantile(0.975, 2) * sd / std::sqrt(3.0);
    EXPECT_EQ(r.ci_high, mean + half);
    EXPECT_EQ(r.ci_low, mean - half);
    whole += r.layer == kAllLayers;
  }
  EXPECT_EQ(whole, 3 * 2);  // methods x ratios
  // Wins: per prompt, the method with the lowest figure at each ratio; they add up to 3 prompts
  // per ratio (no ties on these heads).
  std::map<int, int> wins;
  for (const SetRow& r : rows)
    if (r.layer == kAllLayers) wins[r.column] += r.wins;
  EXPECT_EQ(wins[0], 3);
  EXPECT_EQ(wins[1], 3);
  // The CSV forms: a capture column first, then eval's; the aggregate with "all".
  const std::string csv = rep.captures_csv();
  EXPECT_EQ(csv.substr(0, csv.find('\n')),
            "capture,method,ratio,layer,kv_head,mean,std,normalized_mean,mass_mean,refused,error");
  EXPECT_NE(csv.find("\n\"b.safetensors\",uniform,0.5,"), std::string::npos);
  const std::string sum = rep.summary_csv();
  EXPECT_EQ(sum.substr(0, sum.find('\n')),
            "method,ratio,layer,kv_head,mean,ci_low,ci_high,prompts,wins");
  EXPECT_NE(sum.find("\nuniform,0.5,all,all,"), std::string::npos);
  // The JSON holds both and reads back to the same report.
  const nlohmann::json j = rep.to_json();
  EXPECT_EQ(j["summary"].size(), rows.size());
  EXPECT_EQ(SetEvalReport::from_json(j).to_json().dump(), j.dump());
}

TEST_F(CaptureSetTest, TwoCapturesAtATimeGiveTheFiguresOfOneAtATime) {
  for (int c = 0; c < 5; ++c) synth(prompt_file(c), 96 + 8 * c, 10 + c);
  const CaptureSet set = open_capture_set((dir_ / "set").string());
  EvalSpec spec = small_spec();
  ASSERT_EQ(set_eval_lanes(set, spec, nullptr), 2);
  const SetEvalReport two = run_set_eval(set, spec);
  spec.threads = 1;
  ASSERT_EQ(set_eval_lanes(set, spec, nullptr), 1);
  const SetEvalReport one = run_set_eval(set, spec);
  EXPECT_EQ(two.to_json().dump(), one.to_json().dump());
  EXPECT_EQ(two.captures[3].spec.threads, 2);  // the set's thread count, not a lane's
  // Progress ends at the whole set, and a set cancel flag throws Cancelled with no capture left
  // running.
  spec.threads = 2;
  int last_done = -1, last_total = -1;
  run_set_eval(set, spec, [&](int done, int total) {
    EXPECT_GE(done, last_done);
    last_done = done;
    last_total = total;
  });
  EXPECT_EQ(last_done, last_total);
  std::atomic<bool> cancel{false};
  EXPECT_THROW(run_set_eval(
                   set, spec, [&](int done, int) { cancel = cancel || done > 1500; }, &cancel),
               Cancelled);
}

TEST_F(CaptureSetTest, ACaptureThatFailsInTheMiddleStopsTheSetWithItsOwnError) {
  for (int c = 0; c < 4; ++c) synth(prompt_file(c), 96, 20 + c);
  const CaptureSet set = open_capture_set((dir_ / "set").string());
  // The third capture becomes unreadable after the set was opened (a disk or a network share
  // failing under a long run): the error names it, whichever lane met it.
  write_text("p2.safetensors", "not a capture");
  try {
    run_set_eval(set, small_spec());
    ADD_FAILURE() << "the set evaluated with an unreadable capture";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("p2.safetensors"), std::string::npos) << e.what();
  }
}

TEST_F(CaptureSetTest, ShardsOfASetMergeToTheUnshardedReport) {
  synth("a.safetensors", 128, 1);
  synth("b.safetensors", 96, 2);
  const CaptureSet set = open_capture_set((dir_ / "set").string());
  EvalSpec spec = small_spec();
  const SetEvalReport whole = run_set_eval(set, spec);
  std::vector<SetEvalReport> parts;
  for (int i = 0; i < 3; ++i) {
    spec.shard_index = i;
    spec.shard_count = 3;
    parts.push_back(SetEvalReport::from_json(run_set_eval(set, spec).to_json()));
    EXPECT_THROW(parts.back().summary(), InputError);  // a shard has no figures across prompts
  }
  EXPECT_EQ(merge_set_reports(parts).to_json().dump(), whole.to_json().dump());
  parts.pop_back();
  EXPECT_THROW(merge_set_reports(parts), InputError);  // a shard missing
}

TEST_F(CaptureSetTest, TheCliEvaluatesASetWritesItsFormsAndMergesShardsFromTheEnvironment) {
  synth("a.safetensors", 128, 1);
  synth("b.safetensors", 96, 2);
  const std::string set = (dir_ / "set").string();
  const std::string flags = " --methods uniform,snapkv --ratios 0.5,0.25 --seeds 2";
  const fs::path json = dir_ / "whole.json", csv = dir_ / "rows.csv", sum = dir_ / "sum.csv";
  int code = 0;
  const std::string out =
      run_cli("eval \"" + set + "\"" + flags + " --json \"" + json.string() + "\" --csv \"" +
                  csv.string() + "\" --summary-csv \"" + sum.string() + "\"",
              &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("2 captures"), std::string::npos) << out;
  EXPECT_NE(out.find("across 2 prompts"), std::string::npos) << out;
  ASSERT_TRUE(fs::exists(csv) && fs::exists(sum)) << out;
  // Shards from a Slurm array's environment (ids 1-2, as --array=1-2 gives), merged.
  std::vector<std::string> shards;
  for (int id = 1; id <= 2; ++id) {
    const std::string part = (dir_ / ("part" + std::to_string(id) + ".json")).string();
    const std::string r =
        shell("SLURM_ARRAY_TASK_ID=" + std::to_string(id) +
                  " SLURM_ARRAY_TASK_MIN=1 SLURM_ARRAY_TASK_COUNT=2 \"" + std::string(KVSCOPE_CLI) +
                  "\" eval \"" + set + "\"" + flags + " --shard auto --json \"" + part + "\"",
              &code);
    ASSERT_EQ(code, 0) << r;
    EXPECT_NE(r.find("shard    " + std::to_string(id - 1) + "/2"), std::string::npos) << r;
    shards.push_back(part);
  }
  const fs::path merged = dir_ / "merged.json";
  const std::string m = run_cli(
      "merge \"" + shards[0] + "\" \"" + shards[1] + "\" --json \"" + merged.string() + "\"",
      &code);
  ASSERT_EQ(code, 0) << m;
  std::ifstream a(json), b(merged);
  EXPECT_EQ(nlohmann::json::parse(a), nlohmann::json::parse(b));
  // --shard auto without an array environment names the variables.
  const std::string bad = run_cli("eval \"" + set + "\"" + flags + " --shard auto", &code);
  EXPECT_EQ(code, 1) << bad;
  EXPECT_NE(bad.find("SLURM_ARRAY_TASK_ID"), std::string::npos) << bad;
  // A bad entry is an input error (exit 1) naming it.
  write_text("manifest.jsonl", "{\"path\": \"a.safetensors\"}\n{\"path\": \"gone.safetensors\"}\n");
  const std::string gone =
      run_cli("eval \"" + (dir_ / "set" / "manifest.jsonl").string() + "\"" + flags, &code);
  EXPECT_EQ(code, 1) << gone;
  EXPECT_NE(gone.find("entry 2 (gone.safetensors): no such file"), std::string::npos) << gone;
}

// Bad set reports given to `merge` are input errors (exit 1) naming the file and what is wrong,
// never an internal error: a format that is not a string, no captures, a shard that is not one,
// an entry without its fields, a capture report that does not read.
TEST_F(CaptureSetTest, MergeRefusesBadSetReportsByName) {
  synth("a.safetensors", 96, 1);
  const CaptureSet set = open_capture_set((dir_ / "set").string());
  EvalSpec spec = small_spec();
  spec.shard_count = 2;
  const nlohmann::json good = run_set_eval(set, spec).to_json();
  const auto refuse = [&](nlohmann::json bad, const std::string& what) {
    const fs::path p = dir_ / "bad.json";
    std::ofstream(p) << bad.dump();
    int code = 0;
    const std::string out = run_cli("merge \"" + p.string() + "\"", &code);
    EXPECT_EQ(code, 1) << what << ": " << out;
    EXPECT_NE(out.find("bad.json"), std::string::npos) << out;
    EXPECT_NE(out.find(what), std::string::npos) << out;
  };
  nlohmann::json j = good;
  j["format"] = 3;
  refuse(j, "kvscope-eval/1");  // not a set report: read as one capture's, which names the format
  j = good;
  j.erase("captures");
  refuse(j, "no \"captures\"");
  j = good;
  j["shard_index"] = 5;
  refuse(j, "is not a shard");
  j = good;
  j["entries"][0].erase("path");
  refuse(j, "set report");
  j = good;
  j["captures"][0] = nlohmann::json::object();
  refuse(j, "capture a.safetensors");
}

TEST(PromptSplit, HoldsOutTheShareAskedForTheSameWayEverywhere) {
  const PromptSplit s = split_prompts(10, 0.3, 7);
  EXPECT_EQ(s.held_out.size(), 3u);
  EXPECT_EQ(s.tuning.size(), 7u);
  std::vector<int> all = s.tuning;
  all.insert(all.end(), s.held_out.begin(), s.held_out.end());
  std::sort(all.begin(), all.end());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(all[i], i);
  const PromptSplit again = split_prompts(10, 0.3, 7);
  EXPECT_EQ(again.held_out, s.held_out);
  bool differs = false;
  for (uint64_t seed = 8; seed < 16; ++seed)
    differs |= split_prompts(10, 0.3, seed).held_out != s.held_out;
  EXPECT_TRUE(differs);
  EXPECT_EQ(split_prompts(4, 0, 1).tuning.size(), 4u);
  EXPECT_TRUE(split_prompts(4, 0, 1).held_out.empty());
  EXPECT_EQ(split_prompts(2, 0.01, 1).held_out.size(), 1u);  // at least one held out
  EXPECT_EQ(split_prompts(2, 0.9, 1).tuning.size(), 1u);     // at least one to tune on
  EXPECT_THROW(split_prompts(5, 1.0, 1), SettingError);
  EXPECT_THROW(split_prompts(1, 0.5, 1), SettingError);
}

TEST_F(CaptureSetTest, HeldOutTuningPicksOnTuningPromptsAndReportsTheOthers) {
  for (int i = 0; i < 4; ++i) synth("p" + std::to_string(i) + ".safetensors", 96 + 16 * i, i + 1);
  const CaptureSet set = open_capture_set((dir_ / "set").string());
  EvalSpec spec = small_spec();
  spec.methods = {find_method("balancekv")};
  const std::vector<ParamValues> points{{{"gamma", 0.5}}, {{"gamma", 2.0}}, {{"gamma", 8.0}}};
  spec.points = points;
  std::vector<std::vector<EvalReport>> reports;
  for (const CaptureSetEntry& e : set.entries) {
    auto capture = CaptureFile::open(e.resolved);
    reports.push_back(run_eval(*capture, spec).split_points());
  }
  const PromptSplit split = split_prompts(4, 0.5, 3);
  const HoldoutReport h = holdout_tuning(reports, points, 1, split, true);
  // The figure of one capture at one point: its whole-capture mean.
  const auto figure = [&](int c, int p, int column) {
    for (const EvalSummary& s : reports[c][p].summary())
      if (s.ratio == reports[c][p].spec.ratios[column]) return s.mean;
    return std::nan("");
  };
  const auto mean_over = [&](const std::vector<int>& prompts, int p, int column) {
    std::vector<double> v;
    for (int c : prompts) v.push_back(figure(c, p, column));
    return mean_std(v).first;
  };
  int whole_rows = 0, layer_rows = 0;
  for (const HoldoutRow& r : h.rows) {
    ASSERT_GE(r.best_point, 0);
    if (r.layer != kAllLayers) {
      ++layer_rows;
      continue;
    }
    ++whole_rows;
    for (int p = 0; p < 3; ++p)
      EXPECT_LE(r.best_tuning.mean, mean_over(split.tuning, p, r.column)) << "point " << p;
    EXPECT_EQ(r.best_tuning.mean, mean_over(split.tuning, r.best_point, r.column));
    EXPECT_EQ(r.best_held_out.mean, mean_over(split.held_out, r.best_point, r.column));
    EXPECT_EQ(r.default_held_out.mean, mean_over(split.held_out, 1, r.column));
    EXPECT_EQ(r.best_held_out.prompts, 2);
    EXPECT_DOUBLE_EQ(r.held_out_gain(), r.default_held_out.mean - r.best_held_out.mean);
  }
  EXPECT_EQ(whole_rows, 2);
  EXPECT_EQ(layer_rows, 2 * 2);  // two layers x two ratios
  EXPECT_EQ(h.to_json()["rows"].size(), h.rows.size());
}

TEST_F(CaptureSetTest, TheCliSweepsASetWithAHeldOutSplit) {
  for (int i = 0; i < 3; ++i) synth("p" + std::to_string(i) + ".safetensors", 96 + 16 * i, i + 1);
  const fs::path json = dir_ / "sweep.json";
  int code = 0;
  const std::string out =
      run_cli("sweep \"" + (dir_ / "set").string() +
                  "\" --method balancekv --param gamma=0.5,8 --ratios 0.5 --seeds 2 --holdout 0.34 "
                  "--split-seed 5 --per-layer --json \"" +
                  json.string() + "\"",
              &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("held out 1 prompts"), std::string::npos) << out;
  EXPECT_NE(out.find("(default)"), std::string::npos) << out;  // gamma's default joins the grid
  std::ifstream f(json);
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j["format"], "kvscope-set-sweep/1");
  EXPECT_EQ(j["points"].size(), 3u);
  EXPECT_EQ(j["held_out_prompts"].size(), 1u);
  EXPECT_EQ(j["rows"].size(), 1u + 2u);  // all layers, then layers 0 and 1
  EXPECT_TRUE(j["rows"][0]["held_out_gain"].is_number()) << j["rows"][0].dump();
  const std::string single = run_cli("sweep \"" + (dir_ / "set" / "p0.safetensors").string() +
                                         "\" --method balancekv --param gamma=1 --holdout 0.3",
                                     &code);
  EXPECT_EQ(code, 1) << single;
  EXPECT_NE(single.find("only for a capture set"), std::string::npos) << single;
}

TEST_F(CaptureSetTest, CaptureWithPromptsWritesASetThatEvaluates) {
  const std::string models = std::string(KVSCOPE_SHARED_DIR) + "/models/";
  if (!fs::exists(models + "stories260K.bin")) GTEST_SKIP() << "no " << models << "stories260K.bin";
  const fs::path prompts = write_text("prompts.jsonl",
                                      "{\"prompt\": \"Lily went\", \"label\": \"lily\"}\n"
                                      "{\"prompt\": \"The dragon\", \"label\": \"A dragon!\"}\n"
                                      "{\"prompt\": \"Tom had a ball\"}\n");
  const fs::path out = dir_ / "captures";
  int code = 0;
  const std::string base = "capture --model \"" + models + "stories260K.bin\" --tokenizer \"" +
                           models + "tok512.bin\" --steps 48 --quiet";
  const std::string r = run_cli(
      base + " --prompts \"" + prompts.string() + "\" --out-dir \"" + out.string() + "\"", &code);
  ASSERT_EQ(code, 0) << r;
  const CaptureSet set = open_capture_set((out / "manifest.jsonl").string());
  ASSERT_EQ(set.entries.size(), 3u);
  EXPECT_EQ(set.entries[0].path, "000-lily.safetensors");
  EXPECT_EQ(set.entries[1].path, "001-a-dragon.safetensors");
  EXPECT_EQ(set.entries[2].path, "002.safetensors");
  EXPECT_EQ(set.entries[1].prompt, "The dragon");
  EXPECT_EQ(set.entries[2].label, "prompt 2");
  // One of these captures is the capture of that prompt alone, byte for byte.
  const fs::path alone = dir_ / "alone.safetensors";
  ASSERT_EQ(run_cli(base + " --prompt \"The dragon\" --out \"" + alone.string() + "\"").code, 0);
  std::ifstream x(alone, std::ios::binary), y(out / set.entries[1].path, std::ios::binary);
  const std::string xs{std::istreambuf_iterator<char>(x), {}},
      ys{std::istreambuf_iterator<char>(y), {}};
  EXPECT_TRUE(!xs.empty() && xs == ys);
  // A second run into the same folder is refused before the model runs; so is a repeated
  // prompt under greedy decoding; nothing is left behind.
  const std::string again = run_cli(
      base + " --prompts \"" + prompts.string() + "\" --out-dir \"" + out.string() + "\"", &code);
  EXPECT_EQ(code, 1) << again;
  EXPECT_NE(again.find("already holds a manifest.jsonl"), std::string::npos) << again;
  const fs::path twice = write_text("twice.jsonl", "{\"prompt\": \"a\"}\n{\"prompt\": \"a\"}\n");
  const std::string dup = run_cli(
      base + " --prompts \"" + twice.string() + "\" --out-dir \"" + (dir_ / "dup").string() + "\"",
      &code);
  EXPECT_EQ(code, 1) << dup;
  EXPECT_NE(dup.find("line 2: the same prompt as line 1"), std::string::npos) << dup;
  EXPECT_FALSE(fs::exists(dir_ / "dup" / "manifest.jsonl"));
}

}  // namespace
}  // namespace kvscope
