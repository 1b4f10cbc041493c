// kvscope-cli theory on a sample capture: the JSON schema (discrepancy runs and curves with fits
// and saturation, error curves under three measures with alpha and its interval, the fit method
// and the bound note), the CSV rows, the SVG panels, and one clear error per bad flag.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tests/cli_runner.h"

namespace {

using kvscope::testing::CliRun;
using kvscope::testing::run_cli;

namespace fs = std::filesystem;
const std::string kCapture =
    std::string(KVSCOPE_SOURCE_DIR) + "/sample_data/stories260K_lily.safetensors";

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(CliTheory, JsonCsvAndSvgHaveTheirSchema) {
  const fs::path dir = fs::temp_directory_path() / ("kvscope_theory_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const CliRun r = run_cli("theory " + kCapture +
                           " --layers 1 --heads 0 --methods balancekv,uniform,subgen "
                           "--seeds 2 --disc-seeds 2 --max-n 64 --json " +
                           (dir / "t.json").string() + " --csv " + (dir / "t.csv").string() +
                           " --svg " + (dir / "t.svg").string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("discrepancy vs n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("error vs budget"), std::string::npos) << r.output;
  const nlohmann::json j = nlohmann::json::parse(slurp(dir / "t.json"));
  EXPECT_EQ(j["scope"], "layer 1 kv head 0");
  EXPECT_EQ(j["heads"], 1);
  EXPECT_TRUE(j["fit_method"].get<std::string>().find("Student-t") != std::string::npos);
  EXPECT_TRUE(j["bound"].get<std::string>().find("not drawn") != std::string::npos);
  const auto& disc = j["discrepancy"];
  EXPECT_EQ(disc["sizes"], "prefixes");
  EXPECT_EQ(disc["n"], nlohmann::json({4, 8, 16, 32, 64}));
  ASSERT_EQ(disc["runs"].size(), 2u);
  int csv_points = 0;
  for (const auto& run : disc["runs"]) {
    for (const char* k : {"denominator", "numerator"}) {
      const double sat = run["saturation"][k];
      EXPECT_GE(sat, 0);
      EXPECT_LE(sat, 1);
    }
    EXPECT_TRUE(run["params"].contains("gamma"));
    ASSERT_EQ(run["curves"].size(), 8u);
    for (const auto& c : run["curves"]) {
      EXPECT_TRUE(c["signs"] == "walk" || c["signs"] == "random");
      EXPECT_TRUE(c["measure"] == "query" || c["measure"] == "kernel");
      ASSERT_EQ(c["points"].size(), 5u);
      for (const auto& p : c["points"]) {
        EXPECT_EQ(p["samples"], 2);
        EXPECT_LE(p["min"].get<double>(), p["mean"].get<double>());
        EXPECT_GE(p["max"].get<double>(), p["mean"].get<double>());
      }
      ASSERT_TRUE(c["fit"].is_object());
      EXPECT_LE(c["fit"]["ci_low"].get<double>(), c["fit"]["slope"].get<double>());
      EXPECT_GE(c["fit"]["ci_high"].get<double>(), c["fit"]["slope"].get<double>());
      csv_points += 5;
    }
  }
  ASSERT_EQ(j["error"]["methods"].size(), 3u);
  for (const auto& m : j["error"]["methods"]) {
    EXPECT_EQ(m["budgets"].size(), 5u);
    for (const char* meas : {"relative", "frobenius", "operator"}) {
      ASSERT_TRUE(m.contains(meas)) << m["method"] << " " << meas;
      const auto& c = m[meas];
      EXPECT_EQ(c["points"].size(), 5u);
      ASSERT_TRUE(c.contains("alpha"));
      EXPECT_NEAR(c["alpha"]["value"].get<double>(), -c["fit"]["slope"].get<double>(), 1e-12);
      EXPECT_LE(c["alpha"]["ci_low"].get<double>(), c["alpha"]["value"].get<double>());
      csv_points += 5;
    }
    // Eq. 3 (operator norm) is never below Eq. 2 (Frobenius).
    for (size_t p = 0; p < 5; ++p)
      EXPECT_GE(m["operator"]["points"][p]["mean"].get<double>(),
                m["frobenius"]["points"][p]["mean"].get<double>() * (1 - 1e-12));
  }
  // CSV: a header and one row per curve point.
  std::istringstream csv(slurp(dir / "t.csv"));
  std::string line;
  std::getline(csv, line);
  EXPECT_EQ(line, "figure,run,instance,measure,signs,x,mean,min,max,samples");
  int rows = 0;
  while (std::getline(csv, line))
    if (!line.empty()) ++rows;
  EXPECT_EQ(rows, csv_points);
  const std::string svg = slurp(dir / "t.svg");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("discrepancy along the evaluation queries"), std::string::npos);
  EXPECT_NE(svg.find("in kernel norm"), std::string::npos);
  EXPECT_NE(svg.find("SubGen Eq. 3"), std::string::npos);
  EXPECT_NE(svg.find("reference m^-1/2"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  fs::remove_all(dir);
}

TEST(CliTheory, BadFlagsGiveOneClearError) {
  struct Case {
    std::string args, message;
  } cases[] = {
      {" --sizes sideways", "--sizes sideways: expected prefixes or blocks"},
      {" --max-n 2", "--max-n"},
      {" --seeds 0", "--seeds"},
      {" --layers 9", "--layers"},
      {" --methods nosuch", "nosuch"},
      {" --param snapkv.window=4", "not among --methods"},
      {" --ratios 2", "--ratios"},
  };
  for (const Case& c : cases) {
    const bool seeds = c.args.find("--seeds") != std::string::npos;
    const CliRun r =
        run_cli("theory " + kCapture + c.args + " --no-discrepancy" + (seeds ? "" : " --seeds 1"));
    EXPECT_EQ(r.code, 1) << c.args << ": " << r.output;
    EXPECT_NE(r.output.find("kvscope-cli: error:"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << ": " << r.output;
  }
}

}  // namespace

// The Theory view through the headless renderer: its planned result runs through reconcile()
// and the figure shows both discrepancy panels and a fitted alpha for each default method.
TEST(CliTheory, RenderDrawsTheTheoryView) {
  const fs::path out =
      fs::temp_directory_path() / ("kvscope_theory_view_" + std::to_string(::getpid()) + ".svg");
  const CliRun r =
      run_cli("render " + std::string(KVSCOPE_SOURCE_DIR) +
              "/sample_data/kjv3M_beginning.safetensors --view theory --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string svg = slurp(out);
  EXPECT_NE(svg.find("denominator instance: discrepancy along the evaluation queries"),
            std::string::npos);
  EXPECT_NE(svg.find("numerator instance: discrepancy along the evaluation queries"),
            std::string::npos);
  for (const char* m : {"balancekv: alpha", "uniform: alpha", "subgen: alpha"})
    EXPECT_NE(svg.find(m), std::string::npos) << m;
  EXPECT_NE(svg.find("% sat"), std::string::npos);  // the saturation share beside each walk
  EXPECT_NE(svg.find("Eq. 3 (operator)"), std::string::npos);
  fs::remove(out);
}
