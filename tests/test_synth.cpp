// Synthetic captures: shapes and labels, determinism per seed, round trip through the writer,
// the structure they promise (sink, peaked-but-spread attention, outlier channels, RoPE,
// topic-correlated values), and the `kvscope-cli synth` command.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "engine/core/error.h"
#include "engine/io/capture.h"
#include "engine/model/synth.h"
#include "tests/cli_runner.h"

namespace fs = std::filesystem;
using namespace kvscope;

namespace {

using kvscope::testing::run_cli;

fs::path scratch() {
  fs::path dir = fs::temp_directory_path() / ("kvscope_test_synth_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

class ScratchCleanup : public ::testing::Environment {
 public:
  void TearDown() override { fs::remove_all(scratch()); }
};
const auto* const kCleanup = ::testing::AddGlobalTestEnvironment(new ScratchCleanup);

SynthSpec small_spec(int tokens, uint64_t seed) {
  SynthSpec s = synth_preset("small");
  s.num_tokens = tokens;
  s.seed = seed;
  return s;
}

std::vector<char> file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

TEST(Synth, PresetsHaveTheDocumentedShapes) {
  SynthSpec llama = synth_preset("llama3-8b");
  EXPECT_EQ(llama.num_layers, 32);
  EXPECT_EQ(llama.q_heads, 32);
  EXPECT_EQ(llama.kv_heads, 8);
  EXPECT_EQ(llama.head_dim, 128);
  SynthSpec small = synth_preset("small");
  EXPECT_EQ(small.q_heads % small.kv_heads, 0);
  try {
    synth_preset("gpt5");
    FAIL() << "unknown shape accepted";
  } catch (const SettingError& e) {
    EXPECT_NE(e.cli_message().find("--shape"), std::string::npos) << e.cli_message();
  }
  SynthSpec bad = small_spec(1, 0);
  EXPECT_THROW(SynthGenerator{bad}, InputError);
}

TEST(Synth, WrittenCaptureIsLabelledAndReopensExactly) {
  const SynthSpec spec = small_spec(96, 11);
  const fs::path path = scratch() / "small.safetensors";
  int progress_calls = 0;
  write_synth_capture(path.string(), spec, DType::F32, [&](int) { ++progress_calls; });
  EXPECT_EQ(progress_calls, spec.num_layers);
  auto cap = CaptureFile::open(path.string());
  const CaptureInfo& info = cap->info();
  EXPECT_TRUE(info.synthetic);
  EXPECT_EQ(info.metadata.at("synthetic"), "true");
  EXPECT_EQ(info.source, "kvscope-cli synth (synthetic)");
  EXPECT_EQ(info.model, "synthetic-small");
  EXPECT_EQ(info.num_layers, spec.num_layers);
  EXPECT_EQ(info.q_heads, spec.q_heads);
  EXPECT_EQ(info.kv_heads, spec.kv_heads);
  EXPECT_EQ(info.head_dim, spec.head_dim);
  EXPECT_EQ(info.value_dim, spec.head_dim);
  EXPECT_EQ(info.num_tokens, 96);
  EXPECT_TRUE(info.has_queries);
  EXPECT_EQ(info.tokens.at(5), "<syn 5>");
  SynthGenerator generator(spec);
  for (int L = 0; L < spec.num_layers; ++L) {
    LayerData want = generator.layer(L);
    auto got = cap->layer(L);
    for (int h = 0; h < spec.kv_heads; ++h) {
      EXPECT_EQ(want.keys[h], got->keys[h]);
      EXPECT_EQ(want.values[h], got->values[h]);
      EXPECT_TRUE(got->refused[h].empty());
    }
    for (int h = 0; h < spec.q_heads; ++h) EXPECT_EQ(want.queries[h], got->queries[h]);
  }
}

TEST(Synth, SameSeedSameBytesOtherSeedOtherData) {
  const fs::path a = scratch() / "a.safetensors", b = scratch() / "b.safetensors",
                 c = scratch() / "c.safetensors";
  write_synth_capture(a.string(), small_spec(64, 5), DType::BF16);
  write_synth_capture(b.string(), small_spec(64, 5), DType::BF16);
  write_synth_capture(c.string(), small_spec(64, 6), DType::BF16);
  EXPECT_EQ(file_bytes(a), file_bytes(b));
  EXPECT_EQ(file_bytes(a).size(), file_bytes(c).size());
  EXPECT_NE(file_bytes(a), file_bytes(c));
}

// Softmax over the causal prefix of query t, in double precision.
std::vector<double> attention(const MatrixF& Q, const MatrixF& K, int t) {
  std::vector<double> w(t + 1);
  double top = -1e300;
  for (int i = 0; i <= t; ++i) {
    w[i] = static_cast<double>(Q.row(t).dot(K.row(i))) / std::sqrt(static_cast<double>(K.cols()));
    top = std::max(top, w[i]);
  }
  double z = 0;
  for (double& x : w) z += (x = std::exp(x - top));
  for (double& x : w) x /= z;
  return w;
}

TEST(Synth, AttentionHasASinkAndIsPeakedButNotTrivial) {
  const SynthSpec spec = small_spec(512, 1);
  SynthGenerator generator(spec);
  const LayerData layer = generator.layer(0);
  const int n = spec.num_tokens;
  double sink_mass = 0, effective_tokens = 0;
  std::vector<double> mean_weight(n, 0.0);  // over queries that can see the token
  int queries = 0;
  for (int qh = 0; qh < spec.q_heads; ++qh) {
    const MatrixF& K = layer.keys[qh / (spec.q_heads / spec.kv_heads)];
    for (int t = n / 2; t < n; t += 8) {
      std::vector<double> w = attention(layer.queries[qh], K, t);
      for (int i = 0; i < n / 2; ++i) mean_weight[i] += w[i];
      sink_mass += w[0];
      double entropy = 0, rest = 1 - w[0];
      for (int i = 1; i <= t; ++i)
        if (w[i] > 0) entropy -= (w[i] / rest) * std::log(w[i] / rest);
      effective_tokens += std::exp(entropy);
      ++queries;
    }
  }
  sink_mass /= queries;
  effective_tokens /= queries;
  // Token 0 is a sink: on average it takes a large share, far more than any other token.
  EXPECT_GT(sink_mass, 0.3);
  EXPECT_LT(sink_mass, 0.95);
  const double runner_up = *std::max_element(mean_weight.begin() + 1, mean_weight.begin() + n / 2);
  EXPECT_GT(mean_weight[0], 5 * runner_up);
  // Beyond the sink, attention concentrates on tens of tokens, not one and not all ~380.
  EXPECT_GT(effective_tokens, 8.0);
  EXPECT_LT(effective_tokens, 150.0);
}

TEST(Synth, OutlierChannelsStandOut) {
  const SynthSpec spec = small_spec(256, 2);
  SynthGenerator generator(spec);
  const LayerData layer = generator.layer(1);
  const std::vector<int> outliers = generator.outlier_channels(1);
  ASSERT_FALSE(outliers.empty());
  const MatrixF& K = layer.keys[0];
  double outlier_mag = 0, other_mag = 0;
  for (int j = 0; j < spec.head_dim; ++j) {
    const double mean_abs = K.col(j).cwiseAbs().mean();
    if (std::find(outliers.begin(), outliers.end(), j) != outliers.end())
      outlier_mag += mean_abs / outliers.size();
    else
      other_mag += mean_abs / (spec.head_dim - outliers.size());
  }
  EXPECT_GT(outlier_mag, 4 * other_mag);
}

TEST(Synth, RopeRotatesPairsWithoutChangingTheirNorms) {
  SynthSpec rotated = small_spec(128, 3), plain = small_spec(128, 3);
  plain.apply_rope = false;
  const LayerData a = SynthGenerator(rotated).layer(0), b = SynthGenerator(plain).layer(0);
  const int half = rotated.head_dim / 2;
  const MatrixF& ka = a.keys[1];
  const MatrixF& kb = b.keys[1];
  EXPECT_EQ(ka.row(0), kb.row(0));  // position 0: rotation by angle 0
  double moved = 0;
  for (int t = 1; t < 128; ++t)
    for (int i = 0; i < half; ++i) {
      const double na = std::hypot(ka(t, i), ka(t, i + half));
      const double nb = std::hypot(kb(t, i), kb(t, i + half));
      ASSERT_NEAR(na, nb, 1e-4 * (1 + nb));
      moved += std::abs(ka(t, i) - kb(t, i));
    }
  EXPECT_GT(moved, 1.0);
}

TEST(Synth, ValuesFollowTheKeyTopics) {
  const SynthSpec spec = small_spec(400, 4);
  SynthGenerator generator(spec);
  const LayerData layer = generator.layer(0);
  const std::vector<int>& topic = generator.topics();
  const MatrixF& V = layer.values[0];
  double same = 0, other = 0;
  int same_n = 0, other_n = 0;
  for (int i = 1; i < 400; i += 3)
    for (int j = i + 1; j < 400; j += 7) {
      const double dist = (V.row(i) - V.row(j)).norm();
      if (topic[i] == topic[j])
        same += dist, ++same_n;
      else
        other += dist, ++other_n;
    }
  ASSERT_GT(same_n, 10);
  ASSERT_GT(other_n, 10);
  EXPECT_LT(same / same_n, 0.6 * other / other_n);
}

TEST(CliSynth, WritesACaptureThatInfoLabelsSynthetic) {
  const fs::path out = scratch() / "cli.npz";
  int code = -1;
  std::string text = run_cli(
      "synth --shape small --tokens 48 --layers 3 --dtype f16 --seed 9 "
      "--quiet --out " +
          out.string(),
      &code);
  ASSERT_EQ(code, 0) << text;
  auto cap = CaptureFile::open(out.string());
  EXPECT_EQ(cap->info().num_layers, 3);
  EXPECT_EQ(cap->info().num_tokens, 48);
  EXPECT_EQ(cap->info().dtype, DType::F16);
  EXPECT_EQ(cap->info().metadata.at("synthetic_seed"), "9");
  text = run_cli("info " + out.string(), &code);
  EXPECT_EQ(code, 0) << text;
  EXPECT_NE(text.find("synthetic   YES"), std::string::npos) << text;
  EXPECT_NE(text.find("model       synthetic-small"), std::string::npos) << text;
  EXPECT_NE(text.find("tokens      48"), std::string::npos) << text;
  EXPECT_NE(text.find("\"<syn 0>\""), std::string::npos) << text;
  EXPECT_NE(text.find("heads       4 query, 2 kv"), std::string::npos) << text;
}

TEST(CliSynth, BadFlagsAreNamed) {
  int code = -1;
  std::string text = run_cli(
      "synth --shape small --tokens 8 --dtype f64 --out " + (scratch() / "x.safetensors").string(),
      &code);
  EXPECT_EQ(code, 1);
  EXPECT_NE(text.find("--dtype"), std::string::npos) << text;
  text = run_cli("synth --shape tiny --tokens 8 --out " + (scratch() / "x.safetensors").string(),
                 &code);
  EXPECT_EQ(code, 1);
  EXPECT_NE(text.find("--shape"), std::string::npos) << text;
  text = run_cli(
      "synth --shape small --tokens 8 --dtype bf16 --out " + (scratch() / "x.npz").string(), &code);
  EXPECT_EQ(code, 1);
  EXPECT_NE(text.find("BF16"), std::string::npos) << text;
  EXPECT_FALSE(fs::exists(scratch() / "x.npz"));
}

}  // namespace
