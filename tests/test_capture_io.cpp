// Capture I/O: round trips through safetensors and npz in every dtype, the layer cache, the
// streaming writer, half-precision conversion, and the CLI info command on a valid file.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <thread>

#include "engine/core/error.h"
#include "engine/core/half.h"
#include "engine/core/random.h"
#include "engine/eval/protocol.h"
#include "engine/io/capture.h"
#include "engine/io/mapped_file.h"
#include "engine/io/safetensors.h"
#include "engine/io/tensor_archive.h"
#include "tests/cli_runner.h"

namespace fs = std::filesystem;
using namespace kvscope;

namespace {

using kvscope::testing::run_cli;

// Removes the test's scratch directory when the test program ends.
class ScratchCleanup : public ::testing::Environment {
 public:
  void TearDown() override;
};

fs::path temp_dir() {
  fs::path dir =
      fs::temp_directory_path() / ("kvscope_test_capture_io_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

void ScratchCleanup::TearDown() {
  fs::remove_all(temp_dir());
}
const auto* const kCleanup = ::testing::AddGlobalTestEnvironment(new ScratchCleanup);

float test_value(int layer, int kind, int head, int row, int col) {
  // Deterministic values in [-2, 2), in general exactly representable in neither F16 nor BF16,
  // so the half-precision round trips are really exercised.
  double u = counter_uniform(7, kRandMisc, layer * 3 + kind, head, row, col, 0);
  return static_cast<float>(4.0 * u - 2.0);
}

CaptureData make_capture(int layers, int q_heads, int kv_heads, int n, int d, int dv, bool queries,
                         int hidden = 0) {
  CaptureData c;
  c.info.model = "unit-test-model";
  c.info.prompt = "a prompt";
  c.info.source = "test_capture_io";
  c.info.q_heads = q_heads;
  for (int i = 0; i < n; ++i) c.info.tokens.push_back("tok" + std::to_string(i));
  for (int L = 0; L < layers; ++L) {
    LayerData ld;
    ld.layer = L;
    auto fill = [&](int kind, int heads, int cols, std::vector<MatrixF>& out) {
      for (int h = 0; h < heads; ++h) {
        MatrixF m(n, cols);
        for (int r = 0; r < n; ++r)
          for (int col = 0; col < cols; ++col) m(r, col) = test_value(L, kind, h, r, col);
        out.push_back(m);
      }
    };
    fill(0, kv_heads, d, ld.keys);
    fill(1, kv_heads, dv, ld.values);
    if (queries) fill(2, q_heads, d, ld.queries);
    for (int h = 0; h < q_heads && hidden > 0; ++h) {  // the output projection: dv x hidden
      MatrixF m(dv, hidden);
      for (int r = 0; r < dv; ++r)
        for (int col = 0; col < hidden; ++col) m(r, col) = test_value(L, 3, h, r, col);
      ld.output_projection.push_back(m);
    }
    c.layers.push_back(std::move(ld));
  }
  return c;
}

float round_trip(float x, DType t) {
  if (t == DType::F16) return f16_to_float(float_to_f16(x));
  if (t == DType::BF16) return bf16_to_float(float_to_bf16(x));
  return x;
}

void expect_same_layer(const LayerData& want, const LayerData& got, DType t) {
  ASSERT_EQ(want.keys.size(), got.keys.size());
  ASSERT_EQ(want.values.size(), got.values.size());
  ASSERT_EQ(want.queries.size(), got.queries.size());
  ASSERT_EQ(want.output_projection.size(), got.output_projection.size());
  auto same = [&](const std::vector<MatrixF>& a, const std::vector<MatrixF>& b) {
    for (size_t h = 0; h < a.size(); ++h) {
      ASSERT_EQ(a[h].rows(), b[h].rows());
      ASSERT_EQ(a[h].cols(), b[h].cols());
      for (Eigen::Index i = 0; i < a[h].size(); ++i)
        ASSERT_EQ(round_trip(a[h].data()[i], t), b[h].data()[i]) << "head " << h << " elem " << i;
    }
  };
  same(want.keys, got.keys);
  same(want.values, got.values);
  same(want.queries, got.queries);
  same(want.output_projection, got.output_projection);
}

struct RoundTripCase {
  const char* extension;
  DType dtype;
};

class CaptureRoundTrip : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(CaptureRoundTrip, WritesAndReadsBackEveryTensorAndField) {
  const RoundTripCase param = GetParam();
  CaptureData data = make_capture(3, 4, 2, 11, 8, 6, true, 10);
  const fs::path path =
      temp_dir() / (std::string("rt_") + dtype_name(param.dtype) + param.extension);
  write_capture(path.string(), data, param.dtype);
  EXPECT_FALSE(fs::exists(path.string() + ".partial"));

  auto cap = CaptureFile::open(path.string());
  const CaptureInfo& info = cap->info();
  EXPECT_EQ(info.path, path.string());
  EXPECT_EQ(info.format, "kvscope/1");
  EXPECT_EQ(info.model, "unit-test-model");
  EXPECT_EQ(info.prompt, "a prompt");
  EXPECT_EQ(info.source, "test_capture_io");
  EXPECT_EQ(info.num_layers, 3);
  EXPECT_EQ(info.q_heads, 4);
  EXPECT_EQ(info.kv_heads, 2);
  EXPECT_EQ(info.head_dim, 8);
  EXPECT_EQ(info.value_dim, 6);
  EXPECT_EQ(info.num_tokens, 11);
  EXPECT_EQ(info.dtype, param.dtype);
  EXPECT_TRUE(info.has_queries);
  EXPECT_TRUE(info.has_output_projection);
  EXPECT_EQ(info.hidden_dim, 10);
  EXPECT_FALSE(info.synthetic);
  EXPECT_EQ(info.tokens, data.info.tokens);
  EXPECT_EQ(info.metadata.at("rope"), "applied");
  EXPECT_EQ(info.file_bytes, static_cast<long long>(fs::file_size(path)));
  EXPECT_EQ(info.file_format, std::string(param.extension) == ".npz" ? "npz" : "safetensors");

  for (int L = 0; L < 3; ++L) {
    auto layer = cap->layer(L);
    EXPECT_EQ(layer->layer, L);
    ASSERT_EQ(layer->refused.size(), 2u);
    EXPECT_TRUE(layer->refused[0].empty());
    EXPECT_TRUE(layer->refused[1].empty());
    expect_same_layer(data.layers[L], *layer, param.dtype);
  }
}

INSTANTIATE_TEST_SUITE_P(AllFormats, CaptureRoundTrip,
                         ::testing::Values(RoundTripCase{".safetensors", DType::F32},
                                           RoundTripCase{".safetensors", DType::F16},
                                           RoundTripCase{".safetensors", DType::BF16},
                                           RoundTripCase{".npz", DType::F32},
                                           RoundTripCase{".npz", DType::F16}),
                         [](const auto& info) {
                           return std::string(info.param.extension + 1) + "_" +
                                  dtype_name(info.param.dtype);
                         });

// layers.L.wo is optional, all layers or none, [q_heads, value_dim, hidden] with one hidden:
// anything else is refused on opening, naming the tensor.
TEST(CaptureIo, TheOutputProjectionIsCheckedOnOpening) {
  const fs::path plain = temp_dir() / "no_wo.safetensors";
  write_capture(plain.string(), make_capture(2, 4, 2, 9, 8, 6, true));
  EXPECT_FALSE(CaptureFile::open(plain.string())->info().has_output_projection);
  EXPECT_TRUE(CaptureFile::open(plain.string())->layer(1)->output_projection.empty());

  // Rewrites layer `L`'s wo tensor as `shape` (or drops it), other tensors as they are.
  auto rewritten = [&](int L, std::vector<int64_t> shape, const std::string& name) {
    const fs::path good = temp_dir() / "wo_good.safetensors";
    write_capture(good.string(), make_capture(2, 4, 2, 9, 8, 6, true, 5));
    auto src = CaptureFile::open(good.string());
    std::vector<TensorPlan> plan;
    CaptureInfo info = src->info();
    for (int l = 0; l < 2; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".";
      plan.push_back({p + "key", DType::F32, {2, 9, 8}});
      plan.push_back({p + "value", DType::F32, {2, 9, 6}});
      plan.push_back({p + "query", DType::F32, {4, 9, 8}});
      if (l != L)
        plan.push_back({p + "wo", DType::F32, {4, 6, 5}});
      else if (!shape.empty())
        plan.push_back({p + "wo", DType::F32, shape});
    }
    const fs::path out = temp_dir() / (name + ".safetensors");
    auto w = create_safetensors_writer(out.string(), capture_metadata(info), plan);
    for (const TensorPlan& t : plan) {
      size_t count = 1;
      for (int64_t x : t.shape) count *= static_cast<size_t>(x);
      const std::vector<float> zeros(count, 0.25f);
      w->append(zeros.data(), count * sizeof(float));
    }
    w->finish();
    return out.string();
  };
  auto open_error = [](const std::string& path) -> std::string {
    try {
      CaptureFile::open(path);
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_TRUE(CaptureFile::open(rewritten(-1, {}, "wo_all"))->info().has_output_projection);
  EXPECT_EQ(CaptureFile::open(rewritten(-1, {}, "wo_all"))->info().hidden_dim, 5);
  EXPECT_NE(open_error(rewritten(1, {}, "wo_missing")).find("missing tensor layers.1.wo"),
            std::string::npos);
  EXPECT_NE(open_error(rewritten(1, {4, 6, 7}, "wo_hidden")).find("layers.0.wo has 5"),
            std::string::npos);
  EXPECT_NE(open_error(rewritten(0, {4, 5, 5}, "wo_dv")).find("value_dim = 6"), std::string::npos);
  EXPECT_NE(open_error(rewritten(0, {24, 5}, "wo_rank")).find("rank 2"), std::string::npos);
}

TEST(CaptureIo, CapturesWithoutQueriesOpen) {
  CaptureData data = make_capture(2, 4, 2, 5, 4, 4, false);
  const fs::path path = temp_dir() / "noq.safetensors";
  write_capture(path.string(), data);
  auto cap = CaptureFile::open(path.string());
  EXPECT_FALSE(cap->info().has_queries);
  EXPECT_EQ(cap->info().q_heads, 4);
  auto layer = cap->layer(1);
  EXPECT_TRUE(layer->queries.empty());
  EXPECT_TRUE(layer->group_queries(0).empty());
}

TEST(CaptureIo, GroupQueriesFollowGqa) {
  CaptureData data = make_capture(1, 6, 2, 4, 4, 4, true);
  const fs::path path = temp_dir() / "gqa.safetensors";
  write_capture(path.string(), data);
  auto layer = CaptureFile::open(path.string())->layer(0);
  auto group = layer->group_queries(1);
  ASSERT_EQ(group.size(), 3u);
  EXPECT_EQ(group[0], &layer->queries[3]);
  EXPECT_EQ(group[2], &layer->queries[5]);
}

TEST(CaptureIo, LayerCacheIsBoundedAndLru) {
  CaptureData data = make_capture(5, 2, 2, 16, 8, 8, true);
  const fs::path path = temp_dir() / "cache.safetensors";
  write_capture(path.string(), data);
  auto cap = CaptureFile::open(path.string());
  const long long per_layer = (2 * 16 * 8 * 3) * 4;
  EXPECT_EQ(cap->resident_bytes(), 0);
  auto first = cap->layer(0);
  EXPECT_EQ(cap->resident_bytes(), per_layer);
  EXPECT_EQ(cap->layer(0), first);  // served from the cache
  for (int L = 0; L < 5; ++L) cap->layer(L);
  EXPECT_EQ(cap->resident_bytes(), 4 * per_layer);  // default: at most 4 layers
  cap->set_max_cached_layers(2);
  EXPECT_EQ(cap->resident_bytes(), 2 * per_layer);
  // Layers 3 and 4 are the most recent; touching 3 then loading 0 must evict 4.
  auto three = cap->layer(3);
  cap->layer(0);
  EXPECT_EQ(cap->layer(3), three);
  EXPECT_EQ(cap->resident_bytes(), 2 * per_layer);
  // A layer held by the caller outlives its eviction.
  cap->set_max_cached_layers(0);
  EXPECT_EQ(cap->resident_bytes(), 0);
  EXPECT_EQ(three->keys[0].rows(), 16);
  EXPECT_THROW(cap->layer(5), InputError);
  EXPECT_THROW(cap->layer(-1), InputError);
}

// An evicted layer nobody holds lends its matrices to the next load (engine/io/capture.cpp,
// ArchiveCapture::evict): every load still holds exactly its own layer's values, and a layer the
// caller still holds is never recycled under it.
TEST(CaptureIo, RecycledLayersHoldTheirOwnValuesAndHeldLayersAreUntouched) {
  CaptureData data = make_capture(5, 4, 2, 40, 8, 8, true);
  for (DType dtype : {DType::BF16, DType::F32}) {
    const fs::path path =
        temp_dir() / (std::string("recycle_") + dtype_name(dtype) + ".safetensors");
    write_capture(path.string(), data, dtype);
    auto cap = CaptureFile::open(path.string());
    auto fresh = CaptureFile::open(path.string());
    fresh->set_max_cached_layers(0);
    cap->set_max_cached_layers(1);  // every load evicts the one before: constant recycling
    auto held = cap->layer(2);      // evicted below while held
    const LayerData held_copy = *fresh->layer(2);
    for (int pass = 0; pass < 3; ++pass)
      for (int L = 0; L < 5; ++L) {
        const std::shared_ptr<const LayerData> got = cap->layer(L), want = fresh->layer(L);
        ASSERT_EQ(got->layer, L);
        for (int h = 0; h < 2; ++h) {
          EXPECT_TRUE(got->keys[h] == want->keys[h]) << "layer " << L << " kv head " << h;
          EXPECT_TRUE(got->values[h] == want->values[h]) << "layer " << L << " kv head " << h;
        }
        for (int h = 0; h < 4; ++h)
          EXPECT_TRUE(got->queries[h] == want->queries[h]) << "layer " << L << " query " << h;
      }
    for (int h = 0; h < 2; ++h) {
      EXPECT_TRUE(held->keys[h] == held_copy.keys[h]);
      EXPECT_TRUE(held->values[h] == held_copy.values[h]);
    }
    for (int h = 0; h < 4; ++h) EXPECT_TRUE(held->queries[h] == held_copy.queries[h]);
  }
}

// Threads that ask for a layer while another loads it wait for that load (the grid's threads
// reach each layer together): one conversion per layer, the same object for every thread.
TEST(CaptureIo, ThreadsAskingForALayerBeingLoadedShareOneLoad) {
  CaptureData data = make_capture(2, 8, 4, 2048, 64, 64, true);
  const fs::path path = temp_dir() / "share_load.safetensors";
  write_capture(path.string(), data, DType::BF16);
  for (int round = 0; round < 5; ++round) {
    auto cap = CaptureFile::open(path.string());
    std::atomic<int> ready{0};
    std::vector<std::shared_ptr<const LayerData>> got(4);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        ++ready;
        while (ready.load() < 4) std::this_thread::yield();
        got[t] = cap->layer(1);
      });
    for (auto& th : threads) th.join();
    EXPECT_EQ(cap->layers_loaded(), 1);
    for (int t = 1; t < 4; ++t) EXPECT_EQ(got[t], got[0]);
  }
}

TEST(CaptureIo, ConcurrentLayerRequestsAgree) {
  CaptureData data = make_capture(6, 2, 2, 32, 8, 8, true);
  const fs::path path = temp_dir() / "threads.safetensors";
  write_capture(path.string(), data, DType::F16);
  auto cap = CaptureFile::open(path.string());
  cap->set_max_cached_layers(2);  // constant eviction while the threads run
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 30; ++i) {
        const int L = (i * 7 + t * 3) % 6;
        auto layer = cap->layer(L);
        if (layer->layer != L ||
            layer->keys[1](5, 3) != f16_to_float(float_to_f16(data.layers[L].keys[1](5, 3))))
          ++mismatches;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_LE(cap->resident_bytes(), 2LL * (2 * 32 * 8 * 3) * 4);
}

TEST(CaptureIo, StreamingWriterChecksShapesAndOrder) {
  CaptureData data = make_capture(2, 2, 2, 6, 4, 4, true);
  CaptureInfo info = data.info;
  info.num_layers = 2;
  info.kv_heads = 2;
  info.q_heads = 2;
  info.head_dim = 4;
  info.value_dim = 4;
  info.num_tokens = 6;
  info.has_queries = true;
  info.synthetic = true;
  const fs::path path = temp_dir() / "stream.safetensors";
  {
    auto writer = CaptureWriter::create(path.string(), info, DType::BF16);
    LayerData wrong = data.layers[0];
    wrong.keys[1].resize(5, 4);
    EXPECT_THROW(writer->write_layer(wrong), InputError);
    writer->write_layer(data.layers[0]);
    EXPECT_THROW(writer->finish(), InputError);  // one layer short
  }
  EXPECT_FALSE(fs::exists(path));  // an unfinished writer leaves nothing behind
  EXPECT_FALSE(fs::exists(path.string() + ".partial"));
  auto writer = CaptureWriter::create(path.string(), info, DType::BF16);
  writer->write_layer(data.layers[0]);
  writer->write_layer(data.layers[1]);
  EXPECT_THROW(writer->write_layer(data.layers[1]), InputError);
  writer->finish();
  auto cap = CaptureFile::open(path.string());
  EXPECT_TRUE(cap->info().synthetic);
  EXPECT_EQ(cap->info().dtype, DType::BF16);
  expect_same_layer(data.layers[1], *cap->layer(1), DType::BF16);
}

TEST(CaptureIo, WriterRejectsTokenCountMismatch) {
  CaptureData data = make_capture(1, 2, 2, 6, 4, 4, true);
  data.info.tokens.pop_back();
  EXPECT_THROW(write_capture((temp_dir() / "bad_tokens.safetensors").string(), data), InputError);
}

TEST(CaptureIo, TokenStringsSurviveUnicodeAndQuotes) {
  CaptureData data = make_capture(1, 2, 2, 3, 4, 4, true);
  data.info.tokens = {"\"quoted\"", "caf\xc3\xa9 \xe2\x86\x92", "\n"};
  const fs::path path = temp_dir() / "unicode.npz";
  write_capture(path.string(), data);
  EXPECT_EQ(CaptureFile::open(path.string())->info().tokens, data.info.tokens);
}

TEST(HalfConversion, F16RoundTripsAndRoundsToNearestEven) {
  EXPECT_EQ(float_to_f16(1.0f), 0x3C00);
  EXPECT_EQ(float_to_f16(-2.0f), 0xC000);
  EXPECT_EQ(float_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_f16(65520.0f), 0x7C00);  // rounds up past the largest half: Inf
  EXPECT_EQ(float_to_f16(1e-8f), 0x0000);
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -24)), 0x0001);             // smallest subnormal
  EXPECT_EQ(float_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);      // tie -> even
  EXPECT_EQ(float_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // tie -> even (up)
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(f16_to_float(0x7C00)));
  // Every finite half survives half -> float -> half.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7C00) == 0x7C00) continue;
    ASSERT_EQ(float_to_f16(f16_to_float(static_cast<uint16_t>(h))), h) << h;
  }
}

TEST(HalfConversion, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(bf16_to_float(0x3F80), 1.0f);
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);      // tie -> even
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);  // tie -> even (up)
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7F80) == 0x7F80) continue;
    ASSERT_EQ(float_to_bf16(bf16_to_float(static_cast<uint16_t>(h))), h) << h;
  }
}

TEST(CliInfo, PrintsShapesProvenanceAndTokens) {
  CaptureData data = make_capture(3, 4, 2, 30, 8, 6, true);
  data.info.prompt = std::string(300, 'p');
  data.info.tokens[1] = "line\nbreak";  // printed escaped, on one line
  const fs::path path = temp_dir() / "info.safetensors";
  write_capture(path.string(), data, DType::BF16);
  int code = -1;
  std::string out = run_cli("info " + path.string(), &code);
  ASSERT_EQ(code, 0) << out;
  for (const char* expected :
       {"model       unit-test-model", "synthetic   no", "source      test_capture_io",
        "layers      3", "heads       4 query, 2 kv (GQA group of 2)", "head dim    8",
        "value dim   6", "tokens      30", "dtype       BF16", "format      safetensors, kvscope/1",
        "first 20 tokens:", "\"line\\nbreak\"", "\"tok19\"", "... 10 more"})
    EXPECT_NE(out.find(expected), std::string::npos) << "missing \"" << expected << "\" in\n"
                                                     << out;
  EXPECT_EQ(out.find("tok20"), std::string::npos) << out;
  EXPECT_NE(out.find(std::string(100, 'p') + "..."), std::string::npos) << out;  // shortened
  EXPECT_EQ(out.find(std::string(101, 'p')), std::string::npos) << out;

  out = run_cli("info --json --tokens 2 " + path.string(), &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("\"num_layers\": 3"), std::string::npos) << out;
  EXPECT_NE(out.find("\"first_tokens\": [\n    \"tok0\","), std::string::npos) << out;

  out = run_cli("info --check " + path.string(), &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("all 3 layers load; every value is finite"), std::string::npos) << out;
}

// ---- hostile files: not regular files, files changing under the reader, outputs

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(HostileFiles, FifoDirectoryAndDeviceAreRefusedWithoutBlocking) {
  const fs::path fifo = temp_dir() / "capture.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Opening a FIFO for reading without O_NONBLOCK would wait for a writer forever.
  std::string msg = error_of([&] { CaptureFile::open(fifo.string()); });
  EXPECT_NE(msg.find("a FIFO"), std::string::npos) << msg;
  msg = error_of([&] { CaptureFile::open(temp_dir().string()); });
  EXPECT_NE(msg.find("a directory"), std::string::npos) << msg;
  msg = error_of([] { CaptureFile::open("/dev/zero"); });
  EXPECT_NE(msg.find("a device"), std::string::npos) << msg;
}

TEST(HostileFiles, ACaptureTruncatedWhileMappedGivesAnErrorNotSigbus) {
  for (const char* ext : {".safetensors", ".npz"}) {
    CaptureData data = make_capture(2, 2, 2, 4096, 64, 64, true);
    const fs::path path = temp_dir() / (std::string("shrinks") + ext);
    write_capture(path.string(), data);
    auto cap = CaptureFile::open(path.string());
    cap->set_max_cached_layers(0);
    cap->layer(1);                // reads fine while the file is whole
    fs::resize_file(path, 4096);  // another program truncates it in place
    const std::string msg = error_of([&] { cap->layer(1); });
    EXPECT_NE(msg.find("shrank or was rewritten while open"), std::string::npos)
        << ext << ": " << msg;
    // Reading still works for whatever is left, and other threads' faults are not swallowed:
    // the guard is per call.
    EXPECT_NE(error_of([&] { cap->layer(1); }), "");
  }
}

// MappedFile::copy reads small ranges through the mapping (a SIGBUS caught) and large ones with
// pread (a short read): a file truncated under it gives the same error either way, and the
// bytes before the cut still read.
TEST(HostileFiles, AMappedFileTruncatedUnderItFailsCleanlyForSmallAndLargeReads) {
  const fs::path path = temp_dir() / "mapped_shrinks.bin";
  {
    std::vector<uint8_t> bytes(65536);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7);
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
  }
  auto file = MappedFile::open(path.string());
  std::vector<uint8_t> out(32768);
  file->copy(8192, 20000, out.data());  // large: pread
  EXPECT_EQ(out[100], static_cast<uint8_t>((8192 + 100) * 7));
  fs::resize_file(path, 4096);
  for (const size_t n : {size_t{100}, size_t{20000}}) {
    const std::string msg = error_of([&] { file->copy(8192, n, out.data()); });
    EXPECT_NE(msg.find("shrank or was rewritten while open"), std::string::npos)
        << n << " bytes: " << msg;
  }
  file->copy(0, 4096, out.data());  // what is left reads, through pread
  EXPECT_EQ(out[4095], static_cast<uint8_t>(4095 * 7));
  file->copy(10, 100, out.data());  // and through the mapping
  EXPECT_EQ(out[0], static_cast<uint8_t>(10 * 7));
}

TEST(HostileFiles, MappedFileCopyChecksItsRange) {
  auto file = MappedFile::from_bytes({1, 2, 3}, "mem");
  uint8_t out[4] = {};
  EXPECT_NO_THROW(file->copy(1, 2, out));
  EXPECT_EQ(out[0], 2);
  EXPECT_NE(error_of([&] { file->copy(2, 2, out); }).find("lies outside the file"),
            std::string::npos);
}

TEST(HostileFiles, OutputsNeverReplaceLinksDevicesOrInputs) {
  const fs::path target = temp_dir() / "target.bin";
  { std::ofstream(target) << "keep"; }
  const fs::path link = temp_dir() / "link.bin";
  fs::create_symlink(target, link);
  std::string msg = error_of([&] { OutputFile out(link.string()); });
  EXPECT_NE(msg.find("symbolic link"), std::string::npos) << msg;
  msg = error_of([] { OutputFile out("/dev/null"); });
  EXPECT_NE(msg.find("a device"), std::string::npos) << msg;
  msg = error_of([&] { check_output_path(target.string(), {link.string()}, "--json x"); });
  EXPECT_NE(msg.find("is the input file"), std::string::npos) << msg;  // through the link
  EXPECT_TRUE(fs::is_symlink(link));
  std::ifstream in(target);
  std::string kept;
  in >> kept;
  EXPECT_EQ(kept, "keep");

  // A write that fails leaves no temporary file and no output behind.
  const fs::path out_path = temp_dir() / "never.bin";
  {
    OutputFile out(out_path.string());
    out.write("abc", 3);
  }  // destroyed without commit
  EXPECT_FALSE(fs::exists(out_path));
  for (const auto& entry : fs::directory_iterator(temp_dir()))
    EXPECT_EQ(entry.path().string().find("never.bin"), std::string::npos) << entry.path();
}

TEST(HostileFiles, ValuesTooLargeForFloatScoresRefuseTheHead) {
  CaptureData data = make_capture(1, 2, 2, 8, 4, 4, true);
  data.layers[0].keys[1](3, 2) = 1e20f;
  data.layers[0].values[0](1, 1) = std::numeric_limits<float>::max();
  const fs::path path = temp_dir() / "huge.safetensors";
  write_capture(path.string(), data);
  auto cap = CaptureFile::open(path.string());
  auto layer = cap->layer(0);
  EXPECT_NE(layer->refused[1].find("magnitude 1e+20 at token 3, channel 2"), std::string::npos)
      << layer->refused[1];
  EXPECT_NE(layer->refused[0].find("layers.0.value: kv head 0 has magnitude"), std::string::npos)
      << layer->refused[0];
}

TEST(EvalWindowFit, EveryCaptureLengthAndOverrideGivesAValidWindow) {
  for (int n : {1, 2, 3, 7, 8, 31, 64, 5000})
    for (int sink : {-1, 0, 5, 200, 100000})
      for (int eval : {-1, 0, 1, 9, 100000}) {
        const EvalWindow::Fitted f = EvalWindow::fit(n, 0.5, sink, eval);
        const EvalWindow& w = f.window;
        EXPECT_EQ(w.n, n);
        EXPECT_GE(w.eval, 1);
        EXPECT_GE(w.sink, 0);
        EXPECT_LE(w.sink + w.eval, n);
        EXPECT_EQ(w.n_mid, n - w.sink - w.eval);
        // Whatever fits as asked is left alone, and the same window make() gives.
        bool fits = true;
        try {
          const EvalWindow made = EvalWindow::make(n, 0.5, sink, eval);
          EXPECT_EQ(made.sink, w.sink);
          EXPECT_EQ(made.eval, w.eval);
        } catch (const InputError&) {
          fits = false;
        }
        if (!fits) {
          EXPECT_FALSE(f.note.empty()) << n << " " << sink << " " << eval;
        }
      }
  const EvalWindow::Fitted f = EvalWindow::fit(64, 0.5, 200, -1);
  EXPECT_EQ(f.window.sink, 56);
  EXPECT_NE(f.note.find("sink 200 does not fit a 64-token capture"), std::string::npos) << f.note;
  EXPECT_EQ(EvalWindow::fit(4, 0.5).window.eval, 1);
}

}  // namespace

// Large layers are cached fewer at a time, so a 32k-token capture's grid stays within its memory
// target (docs/performance.md, "Large captures").
TEST(CaptureIo, LargeLayersAreCachedFewerAtATime) {
  CaptureInfo llama;
  llama.num_layers = 32;
  llama.q_heads = 32;
  llama.kv_heads = 8;
  llama.head_dim = 128;
  llama.has_queries = true;
  llama.num_tokens = 8192;  // 192 MiB a layer
  EXPECT_EQ(default_cached_layers(llama), 4);
  llama.num_tokens = 32768;  // 805 MiB a layer
  EXPECT_EQ(default_cached_layers(llama), 2);
  llama.num_tokens = 131072;  // 3.2 GiB a layer: still the one read and the one loading ahead
  EXPECT_EQ(default_cached_layers(llama), 2);
  llama.has_queries = false;  // keys and values only: 4 x 32768 x 128 x 16 = 256 MiB
  llama.num_tokens = 32768;
  EXPECT_EQ(default_cached_layers(llama), 4);
  CaptureInfo tiny;  // the sample captures
  tiny.num_tokens = 512;
  tiny.head_dim = 8;
  tiny.q_heads = tiny.kv_heads = 8;
  tiny.has_queries = true;
  EXPECT_EQ(default_cached_layers(tiny), 4);
}
