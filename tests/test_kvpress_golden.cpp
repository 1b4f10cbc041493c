// The kvpress ports against kvpress's own presses: tests/data/kvpress_golden.json holds the kept
// sets that the presses' score() gives on the sample captures and a synthetic GQA capture (head
// dim 128), written by tools/kvpress_golden.py from NVIDIA/kvpress (its commit is in the file;
// the mapping is docs/methods.md's "kvpress presses"). The ports must keep the same tokens,
// except positions tied at the budget's boundary. snapkv and tova are KVScope's own rules, which
// differ from kvpress's on purpose (docs/methods.md): with their defaults the overlap is printed,
// not asserted; their kvpress variants (snapkv variant=kvpress, tova variant=kvpress) must match.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "engine/core/error.h"
#include "engine/eval/protocol.h"
#include "engine/io/capture.h"
#include "engine/methods/method.h"
#include "engine/model/synth.h"

namespace kvscope {
namespace {

using nlohmann::json;

json load_golden() {
  std::ifstream f(std::string(KVSCOPE_SOURCE_DIR) + "/tests/data/kvpress_golden.json");
  EXPECT_TRUE(f.good());
  return json::parse(f);
}

// The layer of a golden case's capture: a sample capture from sample_data/, or the synthetic
// capture regenerated in memory from the spec the file records.
class Layers {
 public:
  explicit Layers(const json& synthetic) {
    spec_ = synth_preset(synthetic.at("shape").get<std::string>());
    spec_.num_tokens = synthetic.at("tokens").get<int>();
    spec_.num_layers = synthetic.at("layers").get<int>();
    spec_.seed = synthetic.at("seed").get<uint64_t>();
  }
  std::shared_ptr<const LayerData> get(const std::string& capture, int layer, int* num_layers) {
    const std::string key = capture + "/" + std::to_string(layer);
    if (capture.rfind("synth", 0) == 0 || capture.find("synth") != std::string::npos) {
      if (!synth_) synth_ = std::make_unique<SynthGenerator>(spec_);
      *num_layers = spec_.num_layers;
      auto& slot = cache_[key];
      if (!slot) slot = std::make_shared<LayerData>(synth_->layer(layer));
      return slot;
    }
    auto& file = files_[capture];
    if (!file)
      file = CaptureFile::open(std::string(KVSCOPE_SOURCE_DIR) + "/sample_data/" + capture);
    *num_layers = file->info().num_layers;
    return file->layer(layer);
  }

 private:
  SynthSpec spec_;
  std::unique_ptr<SynthGenerator> synth_;
  std::map<std::string, std::unique_ptr<CaptureFile>> files_;
  std::map<std::string, std::shared_ptr<const LayerData>> cache_;
};

// tools/kvpress_golden.py's bitmask(): character k holds middle positions 6k..6k+5 (bit j:
// 6k+j), as its index in kMaskDigits. Returns token indices (position + sink).
std::set<int> decode_mask(const std::string& mask, int sink) {
  static const std::string kMaskDigits =
      "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz-_";
  std::set<int> out;
  for (size_t k = 0; k < mask.size(); ++k) {
    const size_t v = kMaskDigits.find(mask[k]);
    EXPECT_NE(v, std::string::npos) << mask;
    for (int j = 0; j < 6; ++j)
      if (v & (1u << j)) out.insert(sink + static_cast<int>(6 * k) + j);
  }
  return out;
}

struct Tally {
  int cases = 0, identical = 0;
  long long kept = 0, differing = 0;
};

TEST(KvpressGolden, PortsKeepWhatThePressesKeep) {
  const json golden = load_golden();
  ASSERT_FALSE(golden.at("kvpress_commit").get<std::string>().empty());
  Layers layers(golden.at("synthetic"));
  const std::set<std::string> compared_only = {"snapkv", "tova"};
  std::map<std::string, Tally> tally;
  std::vector<json> checks;  // every case, and its variant (same kept sets, other parameters)
  for (const json& c : golden.at("cases")) {
    checks.push_back(c);
    if (c.contains("variant")) {
      json v = c;
      v["press"] = c.at("variant").at("press");
      v["params"] = c.at("variant").at("params");
      checks.push_back(v);
    }
  }
  for (const json& c : checks) {
    const std::string press = c.at("press"), method_name = c.at("method");
    const Method* method = find_method(method_name);
    ASSERT_NE(method, nullptr) << method_name;
    int num_layers = 0;
    auto layer = layers.get(c.at("capture"), c.at("layer"), &num_layers);
    ParamValues params;
    for (auto& [k, v] : c.at("params").items()) params[k] = v.get<double>();
    const int n = c.at("n"), sink = c.at("sink"), eval = c.at("eval");
    std::optional<Ranking> ranking;
    for (const json& r : c.at("ratios")) {
      EvalWindow w = EvalWindow::make(n, r.at("ratio").get<double>(), sink, eval);
      // chunkkv: the press's own kept count (whole chunks) is the budget.
      if (c.value("budget_given", false))
        w.budget = r.at("budget").get<int>();
      else
        ASSERT_EQ(w.budget, r.at("budget").get<int>());
      MethodInput in = make_method_input(*layer, num_layers, c.at("kv_head"), w, params, 0);
      Selection sel;
      if (method->ranks_by_score()) {
        if (!ranking) ranking = method->rank(in);
        sel = method->ranked_selection(in, *ranking);
      } else {
        sel = method->select(in);  // compactor: its scores follow the budget
      }
      const std::set<int> ours(sel.indices.begin(), sel.indices.end());
      const std::set<int> theirs = decode_mask(r.at("kept"), sink);
      const std::set<int> ambiguous = decode_mask(r.at("ambiguous"), sink);
      int differing = 0;
      for (int t : ours)
        if (!theirs.count(t) && !ambiguous.count(t)) ++differing;
      Tally& t = tally[press];
      ++t.cases;
      t.kept += static_cast<long long>(theirs.size());
      t.differing += differing;
      if (differing == 0) ++t.identical;
      if (!compared_only.count(press)) {
        EXPECT_EQ(ours.size(), theirs.size());
        EXPECT_EQ(differing, 0) << press << " on " << c.at("capture").get<std::string>()
                                << " layer " << c.at("layer") << " kv head " << c.at("kv_head")
                                << " ratio " << r.at("ratio");
      }
    }
  }
  for (const auto& [press, t] : tally)
    std::printf("%-20s %4d cases, %4d identical kept sets; %lld of %lld kept tokens differ%s\n",
                press.c_str(), t.cases, t.identical, t.differing, t.kept,
                compared_only.count(press) ? " (KVScope's rule differs on purpose)" : "");
}

// Rotating back the keys of a synthetic capture gives the keys it rotated (engine/core/rope.h).
TEST(KvpressRope, UnrotateUndoesTheCapturesRope) {
  SynthSpec spec = synth_preset("small");
  spec.num_tokens = 300;
  SynthSpec plain = spec;
  plain.apply_rope = false;
  const LayerData rotated = SynthGenerator(spec).layer(0), flat = SynthGenerator(plain).layer(0);
  ASSERT_TRUE(rotated.rope.known());
  EXPECT_EQ(rotated.rope.layout, RopeInfo::Layout::Half);
  const MatrixD back = unrotate_rows(rotated.keys[0], 0, 300, rotated.rope);
  EXPECT_LT((back - flat.keys[0].cast<double>()).cwiseAbs().maxCoeff(),
            1e-5 * flat.keys[0].cwiseAbs().maxCoeff());
}

TEST(KvpressRope, SampleCapturesAreLlama2cRope) {
  auto file = CaptureFile::open(std::string(KVSCOPE_SOURCE_DIR) +
                                "/sample_data/stories260K_lily.safetensors");
  EXPECT_EQ(file->info().rope.layout, RopeInfo::Layout::Interleaved);
  EXPECT_EQ(file->info().rope.theta, 10000);
  EXPECT_EQ(file->layer(0)->rope.theta, 10000);
}

// rope_theta / rope_layout are read from the metadata; a malformed one fails the open, naming it.
TEST(KvpressRope, MetadataIsReadAndChecked) {
  SynthSpec spec = synth_preset("small");
  spec.num_tokens = 64;
  spec.num_layers = 1;
  const SynthGenerator gen(spec);
  CaptureData data;
  data.info = gen.info();
  data.layers.push_back(gen.layer(0));
  const std::string path = ::testing::TempDir() + "kvpress_rope.safetensors";
  auto open_with = [&](const std::string& theta, const std::string& layout) {
    CaptureData d = data;
    d.info.metadata["rope_theta"] = theta;
    d.info.metadata["rope_layout"] = layout;
    write_capture(path, d);
    return CaptureFile::open(path);
  };
  const auto ok = open_with("1000000", "interleaved");
  EXPECT_EQ(ok->info().rope.theta, 1e6);
  EXPECT_EQ(ok->info().rope.layout, RopeInfo::Layout::Interleaved);
  for (const auto& [theta, layout, key] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"ten", "half", "rope_theta"},
           {"0.5", "half", "rope_theta"},
           {"10000", "sideways", "rope_layout"}}) {
    try {
      open_with(theta, layout);
      FAIL() << theta << " " << layout;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
}

// Rows at explicit positions (generate's compressed caches) rotate by those positions: the
// identity list gives the same ranking, a shifted one a different one.
TEST(KvpressRope, ExpectedAttentionUsesRowPositions) {
  auto file = CaptureFile::open(std::string(KVSCOPE_SOURCE_DIR) +
                                "/sample_data/kjv3M_beginning.safetensors");
  const auto layer = file->layer(1);
  const EvalWindow w = EvalWindow::make(512, 0.25);
  MethodInput in = make_method_input(*layer, 4, 0, w, ParamValues{}, 0);
  const Method* ea = find_method("expected-attention");
  const Ranking plain = ea->rank(in);
  std::vector<int> positions(512);
  for (int t = 0; t < 512; ++t) positions[t] = t;
  in.positions = &positions;
  EXPECT_EQ(ea->rank(in).order, plain.order);
  for (int& p : positions) p += 1000;
  EXPECT_NE(ea->rank(in).scores, plain.scores);
}

// A capture whose RoPE is unknown is refused by the method that needs it, naming what is missing.
TEST(KvpressRope, ExpectedAttentionRefusesWithoutRope) {
  auto file = CaptureFile::open(std::string(KVSCOPE_SOURCE_DIR) +
                                "/sample_data/stories260K_lily.safetensors");
  LayerData layer = *file->layer(0);
  layer.rope = RopeInfo();
  layer.rope.missing = "the capture metadata has no \"rope_theta\" and \"rope_layout\"";
  const EvalWindow w = EvalWindow::make(480, 0.25);
  const MethodInput in = make_method_input(layer, 5, 0, w, ParamValues{}, 0);
  const Method* ea = find_method("expected-attention");
  ASSERT_NE(ea, nullptr);
  try {
    ea->rank(in);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("rope_theta"), std::string::npos) << e.what();
  }
  // The methods that need no RoPE still run.
  EXPECT_NO_THROW(find_method("keydiff")->rank(in));
}

}  // namespace
}  // namespace kvscope
