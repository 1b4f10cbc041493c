// Two parameters at once (engine/eval/sweep_grid.h) and `kvscope-cli sweep --grid2`: every cell is
// exactly the protocol's result for its parameters, the best cell is the smallest mean, the
// default cell is found, bad grids are InputErrors naming the flag, and the CLI writes the table,
// JSON and CSV.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/core/error.h"
#include "engine/eval/sweep_grid.h"
#include "engine/io/capture.h"
#include "engine/methods/method.h"
#include "tests/cli_runner.h"

namespace fs = std::filesystem;
using namespace kvscope;

namespace {

using kvscope::testing::run_cli;

const std::string kSample =
    std::string(KVSCOPE_SOURCE_DIR) + "/sample_data/stories260K_lily.safetensors";

EvalSpec small_spec() {
  EvalSpec spec;
  spec.ratios = {0.25};
  spec.seeds = 2;
  spec.layers = {1};
  spec.heads = {0, 1};
  spec.threads = 1;
  return spec;
}

TEST(SweepGrid, CellsAreTheProtocolsResults) {
  auto cap = CaptureFile::open(kSample);
  const Method* m = find_method("balancekv");
  ASSERT_NE(m, nullptr);
  Grid2Spec g;
  g.method = m;
  g.rows = {"gamma", {0, 4}};
  g.cols = {"temp", {0.1, 1}};
  const EvalSpec spec = small_spec();
  int calls = 0;
  const Grid2Result r = run_grid2(*cap, spec, g, [&](int done, int total) {
    ++calls;
    EXPECT_EQ(total, 8);  // work items: 4 cells x 2 heads x 1 ratio
    EXPECT_EQ(done, calls);
  });
  EXPECT_EQ(calls, 8);
  ASSERT_EQ(r.mean.size(), 1u);
  ASSERT_EQ(r.heads.size(), 2u);
  // Cell (gamma 0, temp 1) against a direct run of the protocol.
  EvalSpec direct = spec;
  direct.methods = {m};
  direct.params = {{"balancekv", {{"gamma", 0.0}, {"temp", 1.0}}}};
  const EvalReport rep = run_eval(*cap, direct);
  const auto sum = rep.summary();
  ASSERT_EQ(sum.size(), 1u);
  EXPECT_DOUBLE_EQ(r.mean[0][0][1], sum[0].mean);
  EXPECT_DOUBLE_EQ(r.seed_std[0][0][1], sum[0].std);
  double head_avg = 0;
  for (double v : r.head_mean[0][0][1]) head_avg += v / 2;
  EXPECT_NEAR(head_avg, sum[0].mean, 1e-12);
  // Best = the smallest mean; the defaults (gamma 4, temp 1) are cell (1, 1).
  const auto best = r.best(0);
  for (size_t i = 0; i < 2; ++i)
    for (size_t j = 0; j < 2; ++j) EXPECT_LE(r.mean[0][best.first][best.second], r.mean[0][i][j]);
  EXPECT_EQ(r.default_cell(), std::make_pair(1, 1));
  // Exports.
  const nlohmann::json j = r.to_json();
  EXPECT_EQ(j["format"], "kvscope-sweep-grid2/1");
  EXPECT_EQ(j["rows"]["param"], "gamma");
  EXPECT_EQ(j["ratios"][0]["mean"].size(), 2u);
  EXPECT_EQ(j["ratios"][0]["head_mean"][0][0].size(), 2u);
  EXPECT_EQ(j["ratios"][0]["default"]["row"], 1);
  std::istringstream csv(r.to_csv(false));
  std::string line;
  int lines = 0;
  while (std::getline(csv, line)) ++lines;
  EXPECT_EQ(lines, 1 + 4);
  std::istringstream per_head(r.to_csv(true));
  lines = 0;
  while (std::getline(per_head, line)) ++lines;
  EXPECT_EQ(lines, 1 + 4 * 2);
}

TEST(SweepGrid, BadGridsAreInputErrors) {
  auto cap = CaptureFile::open(kSample);
  Grid2Spec g;
  g.method = find_method("balancekv");
  g.rows = {"gamma", {1}};
  g.cols = {"gamma", {2}};
  EXPECT_THROW(run_grid2(*cap, small_spec(), g), InputError);
  g.cols = {"nope", {2}};
  EXPECT_THROW(run_grid2(*cap, small_spec(), g), InputError);
  g.cols = {"temp", {-1}};  // outside [0, 10]
  EXPECT_THROW(run_grid2(*cap, small_spec(), g), InputError);
}

TEST(SweepGridCli, TableJsonAndCsv) {
  const fs::path dir = fs::temp_directory_path() / "kvscope_grid2_cli";
  fs::create_directories(dir);
  int rc = 0;
  const std::string out = run_cli(
      "sweep \"" + kSample + "\" --method balancekv --grid2 gamma=0,4 temp=0.1,1 --ratios 0.25 " +
          "--seeds 2 --layers 1 --heads 0 --json " + (dir / "g.json").string() + " --csv " +
          (dir / "g.csv").string(),
      &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("gamma \\ temp"), std::string::npos) << out;
  EXPECT_NE(out.find(" *"), std::string::npos) << out;  // the best cell
  EXPECT_NE(out.find(" d"), std::string::npos) << out;  // the default cell (4, 1)
  EXPECT_NE(out.find("best: gamma="), std::string::npos) << out;
  std::ifstream jf(dir / "g.json");
  const nlohmann::json j = nlohmann::json::parse(jf);
  EXPECT_EQ(j["cols"]["values"].size(), 2u);
  std::ifstream cf(dir / "g.csv");
  std::string header;
  std::getline(cf, header);
  EXPECT_EQ(header, "ratio,gamma,temp,mean,seed_std,is_best,is_default");
  // Bad input names the flag.
  const std::string bad =
      run_cli("sweep \"" + kSample + "\" --method balancekv --grid2 gamma=0,1 gamma=2", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(bad.find("--grid2"), std::string::npos) << bad;
  const std::string csv_alone =
      run_cli("sweep \"" + kSample + "\" --method balancekv --param gamma=0,1 --csv x.csv", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(csv_alone.find("--csv"), std::string::npos) << csv_alone;
  fs::remove_all(dir);
}

}  // namespace
