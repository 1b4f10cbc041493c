// The backend registry and the engine's CPU fallback (engine/ops/backend.h, docs/design.md "Backend
// ops"): a fake device backend registered here, as kernels/cuda_backend.cu registers CUDA, that
// supports only some shapes and fails on others. select_backend() must hand it out wrapped in the
// FallbackBackend, which runs the device where it can, runs the CPU reference (the same figures
// bit for bit) where it cannot, and says why.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/ops/backend.h"
#include "tests/op_cases.h"

using namespace kvscope;

namespace {

std::atomic<int> g_device_calls{0};
constexpr double kMarker = -7.0;  // what the fake device writes: tells its results from the CPU's

// Supports attention errors and scores up to d = 32, k-center up to 8 centres, every walk and t-SNE
// shape; its t-SNE gradient fails like a device out of memory above 100 points.
class FakeDevice final : public Backend {
 public:
  std::string name() const override { return "fake device"; }
  bool parallel_in_one_call() const override { return true; }
  bool supports(const OpShape& s, std::string* why) const override {
    if ((s.op == Op::attention_errors || s.op == Op::attention_scores) && s.d > 32) {
      if (why) *why = "d=" + std::to_string(s.d) + " is wider than the fake tiles";
      return false;
    }
    if (s.op == Op::kcenter && s.count > 8) {
      if (why) *why = "more than 8 centres";
      return false;
    }
    return true;
  }
  void walk_blocks(const WalkBatch& b) override {
    ++g_device_calls;
    cpu_walk_blocks(b);
  }
  void attention_errors(const ErrorBatch& b) override {
    ++g_device_calls;
    std::fill_n(b.relative, static_cast<size_t>(b.q_heads) * b.eval, kMarker);
  }
  double tsne_gradient(const TsneGradInput& in, float* grad) override {
    ++g_device_calls;
    if (in.n > 100) throw DeviceFailure("out of fake device memory");
    std::fill_n(grad, 2 * static_cast<size_t>(in.n), static_cast<float>(kMarker));
    return kMarker;
  }
  std::vector<int> kcenter(const float* x, int n, int d, int k, int first) override {
    ++g_device_calls;
    std::vector<int> picks = cpu_kcenter(x, n, d, k, first);  // input errors as the CPU's
    std::reverse(picks.begin(), picks.end());                 // device-made: a different order
    return picks;
  }
  void attention_scores(const ScoreBatch& b) override {
    ++g_device_calls;
    for (const ScoreHead& h : b.heads) std::fill_n(h.scores, b.row_end, kMarker);
  }
};

Backend* probe_fake(std::string* why) {
  static FakeDevice device;
  if (why) *why = "fake device 0";
  return &device;
}

Backend* probe_absent(std::string* why) {
  if (why) *why = "no fake device on this machine";
  return nullptr;
}

// The registrars, as a device backend's translation unit has them.
const bool kFakeRegistered = register_backend("fake", probe_fake);
const bool kAbsentRegistered = register_backend("fake-absent", probe_absent);

FallbackBackend& fake() {
  auto* b = dynamic_cast<FallbackBackend*>(&select_backend("fake"));
  if (!b) throw std::logic_error("select_backend(\"fake\") is not wrapped in a FallbackBackend");
  return *b;
}

TEST(BackendRegistry, RegistrarsAddBackendsAndSelectWrapsThem) {
  ASSERT_TRUE(kFakeRegistered && kAbsentRegistered);
  const std::vector<std::string> ids = registered_backends();
  EXPECT_NE(std::find(ids.begin(), ids.end(), "fake"), ids.end());
  EXPECT_NE(std::find(ids.begin(), ids.end(), "fake-absent"), ids.end());
#ifdef KVSCOPE_HAVE_CUDA
  EXPECT_NE(std::find(ids.begin(), ids.end(), "cuda"), ids.end())
      << "the kernels are linked: their registrar must have run";
#else
  EXPECT_EQ(std::find(ids.begin(), ids.end(), "cuda"), ids.end());
#endif
  EXPECT_THROW(register_backend("fake", probe_fake), std::logic_error);
  EXPECT_THROW(register_backend("cpu", probe_fake), std::logic_error);

  FallbackBackend& b = fake();
  EXPECT_EQ(&select_backend("fake"), &b) << "one wrapped backend per program";
  EXPECT_EQ(b.name(), "fake device");
  EXPECT_NE(&b, &cpu_backend());
  EXPECT_TRUE(b.parallel_in_one_call());
  std::string why;
  EXPECT_TRUE(backend_available("fake", &why));
  EXPECT_EQ(why, "fake device 0");
  EXPECT_NE(&select_backend("auto"), &cpu_backend())
      << "auto takes a registered device that answers";

  EXPECT_FALSE(backend_available("fake-absent", &why));
  EXPECT_EQ(why, "no fake device on this machine");
  try {
    select_backend("fake-absent");
    ADD_FAILURE() << "a device that does not answer must throw";
  } catch (const SettingError& e) {
    EXPECT_NE(std::string(e.what()).find("no fake device on this machine"), std::string::npos)
        << e.what();
  }
  try {
    select_backend("tpu");
    ADD_FAILURE() << "an unknown backend must throw";
  } catch (const SettingError& e) {
    EXPECT_NE(std::string(e.what()).find("fake"), std::string::npos)
        << "the message lists the registered backends: " << e.what();
  }
  EXPECT_EQ(&select_backend("cpu"), &cpu_backend());

  // Every list of backends (the app's combo, sessions, each --backend help) is this one: cpu,
  // the device backends KVScope has (built or not), the registered ones, auto.
  const std::vector<std::string> choices = backend_choices();
  ASSERT_GE(choices.size(), 5u);
  EXPECT_EQ(choices.front(), "cpu");
  EXPECT_EQ(choices[1], "cuda");
  EXPECT_EQ(choices.back(), "auto");
  EXPECT_EQ(std::count(choices.begin(), choices.end(), "cuda"), 1);
  EXPECT_NE(std::find(choices.begin(), choices.end(), "fake"), choices.end());
  EXPECT_NE(std::find(choices.begin(), choices.end(), "fake-absent"), choices.end());
  const std::string text = backend_choices_text();
  EXPECT_EQ(text.rfind("cpu, cuda, ", 0), 0u) << text;
  EXPECT_NE(text.find(", fake"), std::string::npos) << text;
  EXPECT_EQ(text.substr(text.size() - 8), " or auto") << text;
}

// A supported shape runs on the device (its marker comes back); an unsupported one never reaches
// it and gives the CPU reference's figures bit for bit, with the reason recorded.
TEST(BackendRegistry, UnsupportedShapeRunsTheCpuReferenceAndSaysWhy) {
  FallbackBackend& b = fake();
  ErrorCaseData narrow(find_error_case("gqa_separate"));  // d = 32
  ASSERT_LE(narrow.batch.d, 32);
  int calls = g_device_calls;
  narrow.run(b);
  EXPECT_EQ(g_device_calls, calls + 1);
  EXPECT_EQ(narrow.relative.front(), kMarker) << "a supported shape must run on the device";
  EXPECT_EQ(b.last_fallback(), "");
  EXPECT_EQ(last_fallback(), "");

  ErrorCaseData wide(find_error_case("llama_dims"));  // d = 128
  ASSERT_GT(wide.batch.d, 32);
  calls = g_device_calls;
  wide.run(b);
  EXPECT_EQ(g_device_calls, calls) << "an unsupported shape must not reach the device";
  const std::vector<double> rel = wide.relative, nrm = wide.normalized, mass = wide.mass;
  wide.run(cpu_backend());
  EXPECT_EQ(rel, wide.relative);
  EXPECT_EQ(nrm, wide.normalized);
  EXPECT_EQ(mass, wide.mass);
  EXPECT_EQ(b.last_fallback(),
            "fake attention_errors: d=128 is wider than the fake tiles; ran on the CPU");
  EXPECT_EQ(last_fallback(), b.last_fallback());

  // k-center: up to 8 centres on the device (its own order), more on the CPU.
  const KcenterCaseData kc(find_kcenter_case("separated"));
  std::vector<int> dev = b.kcenter(kc.x.data(), kc.n, kc.d, 8, 5);
  std::vector<int> cpu = cpu_kcenter(kc.x.data(), kc.n, kc.d, 8, 5);
  std::reverse(cpu.begin(), cpu.end());
  EXPECT_EQ(dev, cpu);
  EXPECT_EQ(b.last_fallback(), "");
  EXPECT_EQ(b.kcenter(kc.x.data(), kc.n, kc.d, 24, 5), cpu_kcenter(kc.x.data(), kc.n, kc.d, 24, 5));
  EXPECT_EQ(b.last_fallback(), "fake kcenter: more than 8 centres; ran on the CPU");

  // Attention scores: d = 32 on the device, d = 128 on the CPU reference, bit for bit.
  ScoreCaseData narrow_scores(find_score_case("h2o_gqa"));  // d = 32
  ASSERT_LE(narrow_scores.batch.d, 32);
  calls = g_device_calls;
  narrow_scores.run(b);
  EXPECT_EQ(g_device_calls, calls + 1);
  EXPECT_EQ(narrow_scores.scores.front().front(), kMarker);
  EXPECT_EQ(b.last_fallback(), "");
  ScoreCaseData wide_scores(find_score_case("window_llama"));  // d = 128
  calls = g_device_calls;
  wide_scores.run(b);
  EXPECT_EQ(g_device_calls, calls) << "an unsupported shape must not reach the device";
  const std::vector<std::vector<double>> fell_back = wide_scores.scores;
  wide_scores.run(cpu_backend());
  EXPECT_EQ(fell_back, wide_scores.scores);
  EXPECT_EQ(b.last_fallback(),
            "fake attention_scores: d=128 is wider than the fake tiles; ran on the CPU");
}

// A DeviceFailure thrown by the device (out of memory, a launch failure) gives the CPU
// reference's result, and the next call that fits goes back to the device.
TEST(BackendRegistry, DeviceFailureRunsTheCpuReferenceAndSaysWhy) {
  FallbackBackend& b = fake();
  TsneCaseData big(find_tsne_case("ring"));
  ASSERT_GT(big.in.n, 100);
  std::vector<float> g_fallback(2 * static_cast<size_t>(big.in.n)), g_cpu(g_fallback.size());
  const int calls = g_device_calls;
  const double kl_fallback = b.tsne_gradient(big.in, g_fallback.data());
  EXPECT_EQ(g_device_calls, calls + 1) << "the device is tried first";
  const double kl_cpu = cpu_tsne_gradient(big.in, g_cpu.data());
  EXPECT_EQ(std::memcmp(g_fallback.data(), g_cpu.data(), g_cpu.size() * sizeof(float)), 0);
  EXPECT_EQ(kl_fallback, kl_cpu);
  EXPECT_EQ(b.last_fallback(), "fake tsne_gradient: out of fake device memory; ran on the CPU");

  TsneGradInput small = big.in;
  small.n = 50;  // fits the fake device (which does not read P)
  std::vector<float> g_small(100);
  EXPECT_EQ(b.tsne_gradient(small, g_small.data()), kMarker);
  EXPECT_EQ(g_small.front(), static_cast<float>(kMarker));
  EXPECT_EQ(b.last_fallback(), "");
}

// Input errors are not device failures: they reach the caller as the CPU reference throws them.
TEST(BackendRegistry, InputErrorsPropagate) {
  FallbackBackend& b = fake();
  const KcenterCaseData kc(find_kcenter_case("separated"));
  EXPECT_THROW(b.kcenter(kc.x.data(), kc.n, kc.d, -1, 0), InputError);
  EXPECT_THROW(b.kcenter(kc.x.data(), kc.n, kc.d, 3, kc.n), InputError);
  WalkCaseData w(find_walk_case("standard"));
  std::vector<int8_t> sigma;
  std::vector<float> p, partial;
  WalkBatch bad = w.batch(sigma, p, partial, 1);
  bad.dv = 0;
  EXPECT_THROW(b.walk_blocks(bad), std::invalid_argument);
  // A good walk runs on the (fake) device and gives the CPU op's signs.
  std::vector<int8_t> s_cpu;
  b.walk_blocks(w.batch(sigma, p, partial, 1));
  cpu_walk_blocks(w.batch(s_cpu, p, partial, 1));
  EXPECT_EQ(sigma, s_cpu);
}

}  // namespace
