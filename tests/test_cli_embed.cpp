// kvscope-cli embed on the shipped stories260K capture: CSV shape and content, PCA against the
// engine, the joint key/query map, and one clear error per bad flag.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/geometry/pca.h"
#include "engine/io/capture.h"
#include "tests/cli_runner.h"

namespace kvscope {
namespace {

using kvscope::testing::CliRun;
using kvscope::testing::run_cli;

const std::string kCapture =
    std::string(KVSCOPE_SOURCE_DIR) + "/sample_data/stories260K_lily.safetensors";

struct Csv {
  std::string header;
  std::vector<std::vector<std::string>> rows;
};

Csv read_csv(const std::string& path) {
  Csv csv;
  std::ifstream in(path);
  std::getline(in, csv.header);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ',')) cells.push_back(cell);
    csv.rows.push_back(cells);
  }
  return csv;
}

class CliEmbed : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(kCapture)) << "sample capture " << kCapture << " is absent";
    out_ = (std::filesystem::temp_directory_path() /
            ("kvscope_embed_" + std::to_string(::getpid()) + ".csv"))
               .string();
  }
  void TearDown() override {
    if (!out_.empty()) std::filesystem::remove(out_);
  }
  std::string out_;
};

TEST_F(CliEmbed, PcaMatchesTheEngine) {
  const CliRun r =
      run_cli("embed \"" + kCapture + "\" --layer 1 --head 2 --method pca --out \"" + out_ + "\"");
  ASSERT_EQ(r.code, 0) << r.output;
  auto capture = CaptureFile::open(kCapture);
  const MatrixF expected = pca_2d(capture->layer(1)->keys[2]);
  const Csv csv = read_csv(out_);
  EXPECT_EQ(csv.header, "token,x,y");
  ASSERT_EQ(static_cast<int>(csv.rows.size()), capture->info().num_tokens);
  for (size_t i = 0; i < csv.rows.size(); ++i) {
    ASSERT_EQ(csv.rows[i].size(), 3u);
    EXPECT_EQ(std::stoi(csv.rows[i][0]), static_cast<int>(i));
    EXPECT_NEAR(std::stod(csv.rows[i][1]), expected(i, 0), 1e-4 * (1 + std::abs(expected(i, 0))));
    EXPECT_NEAR(std::stod(csv.rows[i][2]), expected(i, 1), 1e-4 * (1 + std::abs(expected(i, 1))));
  }
  EXPECT_NE(r.output.find("pca: axes show"), std::string::npos) << r.output;
}

TEST_F(CliEmbed, TsneWritesOneFiniteRowPerToken) {
  const CliRun r =
      run_cli("embed \"" + kCapture +
              "\" --layer 0 --head 0 --iterations 300 --perplexity 20 --out \"" + out_ + "\"");
  ASSERT_EQ(r.code, 0) << r.output;
  const Csv csv = read_csv(out_);
  EXPECT_EQ(csv.header, "token,x,y");
  auto capture = CaptureFile::open(kCapture);
  ASSERT_EQ(static_cast<int>(csv.rows.size()), capture->info().num_tokens);
  double spread = 0;
  for (const auto& row : csv.rows) {
    const double x = std::stod(row[1]), y = std::stod(row[2]);
    ASSERT_TRUE(std::isfinite(x) && std::isfinite(y));
    spread = std::max(spread, std::abs(x) + std::abs(y));
  }
  EXPECT_GT(spread, 1.0);  // t-SNE grew the 1e-4 initialisation into a real map
  EXPECT_NE(r.output.find("perplexity 20, 300 iterations"), std::string::npos) << r.output;
}

TEST_F(CliEmbed, WithQueriesAddsQueryRows) {
  const CliRun r =
      run_cli("embed \"" + kCapture + "\" --layer 3 --head 1 --method pca --with-queries --out \"" +
              out_ + "\"");
  ASSERT_EQ(r.code, 0) << r.output;
  auto capture = CaptureFile::open(kCapture);
  const int n = capture->info().num_tokens;
  const Csv csv = read_csv(out_);
  EXPECT_EQ(csv.header, "token,x,y,kind");
  ASSERT_EQ(static_cast<int>(csv.rows.size()), 2 * n);
  EXPECT_EQ(csv.rows[0][3], "key");
  EXPECT_EQ(csv.rows[n][3], "query");
  EXPECT_EQ(std::stoi(csv.rows[n][0]), 0);
  EXPECT_NE(r.output.find("query head 2"), std::string::npos) << r.output;  // first of group 1
}

TEST_F(CliEmbed, BadFlagsGiveOneClearError) {
  struct Case {
    std::string args, expect;
  };
  const std::vector<Case> cases = {
      {"--layer 99 --head 0", "--layer 99"},
      {"--layer 0 --head 9", "--head 9"},
      {"--layer 0 --head -1", "--head -1"},
      {"--layer 0 --head 0 --method umap", "--method: 'umap'"},
      {"--layer 0 --head 0 --perplexity 0", "--perplexity"},
      {"--layer 0 --head 0 --with-queries --query-head 7", "--query-head 7"},
  };
  for (const Case& c : cases) {
    const CliRun r = run_cli("embed \"" + kCapture + "\" " + c.args + " --out \"" + out_ + "\"");
    EXPECT_EQ(r.code, 1) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find("kvscope-cli: error: " + c.expect), std::string::npos) << c.args << "\n"
                                                                                   << r.output;
  }
  const CliRun missing =
      run_cli("embed /nonexistent/x.safetensors --layer 0 --head 0 --out \"" + out_ + "\"");
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.output.find("/nonexistent/x.safetensors"), std::string::npos) << missing.output;
}

}  // namespace
}  // namespace kvscope
