// Layers resident on the device (docs/design.md, "Backend ops", and
// docs/performance.md, "Layers resident on the device"). Everywhere: every load of a layer gets a
// fresh LayerData id, copies name nothing, and the protocol puts the id in every attention_errors
// batch. With a CUDA device, or under the CPU emulation of CUDA (kernels/emu/, which builds this
// file with tests/test_cuda_parity.cpp), the backend's resident copies: a layer's keys, values and
// evaluation query rows cross to the device once over many calls (counted by the cache and, under
// the emulation, by the runtime's own count of host-to-device bytes), the figures are bit for bit
// those of the same batch uploaded at every call and within 1e-9 of the CPU reference, a new id
// (a reloaded layer in recycled memory) is copied again and never served stale, the LRU stays
// within its budget, and running out of device memory evicts and retries or falls back to the CPU.
// The device tests skip without a device (and in a build without the kernels).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/eval/protocol.h"
#include "engine/io/capture.h"
#include "engine/methods/method.h"
#include "engine/ops/attention_scores.h"
#include "engine/ops/backend.h"
#include "tests/counting_backend.h"
#include "tests/forwarding_backend.h"
#include "tests/memory_capture.h"
#include "tests/sample_captures.h"

#ifdef KVSCOPE_HAVE_CUDA
#include "kernels/cuda_backend.h"
#endif

using namespace kvscope;

namespace {

std::string lily() {
  return kvscope::testing::sample_capture_paths()[0];
}

EvalSpec small_spec(std::vector<int> layers) {
  EvalSpec spec;
  for (const char* name : {"uniform", "streaming"}) spec.methods.push_back(find_method(name));
  spec.ratios = {0.5};
  spec.seeds = 2;
  spec.threads = 1;
  spec.layers = std::move(layers);
  return spec;
}

TEST(LayerIds, EveryLoadIsFreshAndCopiesNameNothing) {
  auto cap = CaptureFile::open(lily());
  cap->set_max_cached_layers(1);
  std::shared_ptr<const LayerData> first = cap->layer(0);
  const uint64_t id0 = first->id.value();
  EXPECT_NE(id0, 0u);
  EXPECT_EQ(cap->layer(0)->id.value(), id0) << "a cached layer is the same load";
  first.reset();
  // Layer 1 evicts layer 0, whose matrices the reader keeps for its next load (the reload of
  // layer 0 below, or any other layer's): recycled memory is named by the new load's id.
  const std::shared_ptr<const LayerData> one = cap->layer(1);
  EXPECT_NE(one->id.value(), 0u);
  EXPECT_NE(one->id.value(), id0);
  const std::shared_ptr<const LayerData> again = cap->layer(0);  // reloaded
  EXPECT_NE(again->id.value(), 0u);
  EXPECT_NE(again->id.value(), id0) << "a reload is a new load";
  EXPECT_NE(again->id.value(), one->id.value());

  LayerData copy = *again;
  EXPECT_EQ(copy.id.value(), 0u) << "a copy may be changed: it names nothing";
  LayerData named;
  named.id = LayerId::fresh();
  const uint64_t v = named.id.value();
  LayerData moved = std::move(named);
  EXPECT_EQ(moved.id.value(), v) << "a move takes the data and its id";
  EXPECT_EQ(named.id.value(), 0u);  // NOLINT(bugprone-use-after-move): what the move left
  copy = moved;
  EXPECT_EQ(copy.id.value(), 0u);
  EXPECT_NE(LayerId::fresh().value(), LayerId::fresh().value());
}

TEST(LayerIds, TheProtocolNamesTheLoadedLayerInEveryErrorBatch) {
  ASSERT_TRUE(kvscope::testing::kCountingRegistered);
  Backend& backend = select_backend("test-batch");
  auto& counting = kvscope::testing::counting();
  counting.take_calls();
  auto cap = CaptureFile::open(lily());
  const EvalSpec spec = small_spec({});
  run_eval(*cap, spec, {}, nullptr, &backend);
  std::set<uint64_t> ids;
  const std::vector<kvscope::testing::ErrorCall> calls = counting.take_calls();
  ASSERT_FALSE(calls.empty());
  for (const auto& c : calls) {
    EXPECT_NE(c.layer_id, 0u);
    ids.insert(c.layer_id);
  }
  EXPECT_EQ(ids.size(), static_cast<size_t>(cap->info().num_layers)) << "one id per layer load";

  // The same data held in memory (copies: no id) is uploaded at every call.
  CaptureData data;
  data.info = cap->info();
  for (int L = 0; L < cap->info().num_layers; ++L) data.layers.push_back(*cap->layer(L));
  kvscope::testing::MemoryCapture memory(std::move(data));
  run_eval(memory, spec, {}, nullptr, &backend);
  const std::vector<kvscope::testing::ErrorCall> unnamed = counting.take_calls();
  ASSERT_EQ(unnamed.size(), calls.size());
  for (const auto& c : unnamed) EXPECT_EQ(c.layer_id, 0u);
}

// Records the layer id of every batch the methods send to the ops that carry one, running the
// CPU's.
class BatchIds final : public kvscope::testing::ForwardingBackend {
 public:
  std::vector<uint64_t> scores, clusters, cache;
  void attention_scores(const ScoreBatch& b) override {
    scores.push_back(b.layer_id);
    ForwardingBackend::attention_scores(b);
  }
  void key_clusters(const ClusterBatch& b) override {
    clusters.push_back(b.layer_id);
    ForwardingBackend::key_clusters(b);
  }
  void cache_scores(const CacheScoreBatch& b) override {
    cache.push_back(b.layer_id);
    ForwardingBackend::cache_scores(b);
  }
  void clear() {
    scores.clear();
    clusters.clear();
    cache.clear();
  }
};

// `method` on kv head 1 of a loaded layer of lily, through `backend`: every batch of the op whose
// ids `op` records names the layer; on a copy of the keys (not the layer's matrices), none does.
void expect_method_names_its_layer(const char* method, const ParamValues& params,
                                   std::vector<uint64_t> BatchIds::*op) {
  SCOPED_TRACE(method);
  auto cap = CaptureFile::open(lily());
  const std::shared_ptr<const LayerData> layer = cap->layer(1);
  const EvalWindow w = EvalWindow::make(cap->info().num_tokens, 0.25, -1, -1);
  const Method* m = find_method(method);
  ASSERT_NE(m, nullptr);
  BatchIds backend;
  MethodInput in = make_method_input(*layer, cap->info().num_layers, 1, w, params, 0);
  in.backend = &backend;
  m->select(in);
  ASSERT_FALSE((backend.*op).empty());
  for (uint64_t id : backend.*op) EXPECT_EQ(id, layer->id.value());
  const MatrixF keys = *in.keys;
  in.keys = &keys;
  backend.clear();
  m->select(in);
  ASSERT_FALSE((backend.*op).empty());
  for (uint64_t id : backend.*op) EXPECT_EQ(id, 0u);
}

TEST(LayerIds, ScoreRankingMethodsNameTheLayerWhenTheyScoreItsOwnMatrices) {
  for (const char* name : {"h2o", "snapkv", "tova"})
    expect_method_names_its_layer(name, {}, &BatchIds::scores);
  // TOVA's kvpress variant scores every kv head of the layer in one batch.
  auto cap = CaptureFile::open(lily());
  const std::shared_ptr<const LayerData> layer = cap->layer(1);
  const EvalWindow w = EvalWindow::make(cap->info().num_tokens, 0.25, -1, -1);
  BatchIds backend;
  MethodInput in =
      make_method_input(*layer, cap->info().num_layers, 0, w, ParamValues{{"variant", 1}}, 0);
  in.backend = &backend;
  find_method("tova")->select(in);
  ASSERT_EQ(backend.scores.size(), 1u);
  EXPECT_EQ(backend.scores[0], layer->id.value());
}

TEST(LayerIds, SubGenNamesTheLayerWhenItClustersItsOwnKeys) {
  // t = 5: a search no other test runs (SubGen remembers its searches per thread).
  expect_method_names_its_layer("subgen", {{"t", 5}}, &BatchIds::clusters);
}

TEST(LayerIds, BuzzNamesTheLayerWhenItScoresItsOwnMatrices) {
  expect_method_names_its_layer("buzz", {}, &BatchIds::cache);
}

#ifdef KVSCOPE_HAVE_CUDA

Backend* gpu_or_null(std::string* why) {
  if (!cuda_available(why)) return nullptr;
  return &select_backend("cuda");
}

#define REQUIRE_GPU(var)                  \
  std::string why_##var;                  \
  Backend* var = gpu_or_null(&why_##var); \
  if (!var) GTEST_SKIP() << "no CUDA device: " << why_##var;

// A layer in memory, named by a fresh id as CaptureFile::layer names its loads.
struct Shape {
  int kv = 2, q = 4, n = 128, d = 16, dv = 16, sink = 4, eval = 16;
  size_t layer_bytes() const {  // keys, values, the evaluation rows of the queries
    return sizeof(float) *
           (static_cast<size_t>(kv) * n * (d + dv) + static_cast<size_t>(q) * eval * d);
  }
  size_t arrays() const { return static_cast<size_t>(2 * kv + q); }
  // The exact side of the errors kept per query head: [eval][dv + 3] doubles.
  size_t exact_bytes() const { return sizeof(double) * static_cast<size_t>(q) * eval * (dv + 3); }
  // The approximate side's candidates per kv head (error_batch selects 30% of the middle).
  size_t candidates() const {
    return static_cast<size_t>(sink + (n - eval - sink) * 3 / 10 + eval);
  }
  // What a call copies besides the layer: its pointer tables (the arrays' and the exact
  // sides'), the candidates with their count, and their two log weights.
  size_t call_bytes() const {
    return (arrays() + q) * sizeof(void*) + kv * (candidates() + 1) * sizeof(int) +
           2 * kv * candidates() * sizeof(float);
  }
};

void fill(MatrixF& m, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = dist(rng);
}

LayerData make_layer(const Shape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  LayerData L;
  L.id = LayerId::fresh();
  for (int h = 0; h < s.kv; ++h) {
    L.keys.emplace_back(s.n, s.d);
    L.values.emplace_back(s.n, s.dv);
    fill(L.keys.back(), rng);
    fill(L.values.back(), rng);
  }
  for (int h = 0; h < s.q; ++h) {
    L.queries.emplace_back(s.n, s.d);
    fill(L.queries.back(), rng);
  }
  return L;
}

// Every kv head of `L` with a random selection of 30% of the middle (seed `sel`).
ErrorBatch error_batch(const Shape& s, const LayerData& L, uint32_t sel) {
  ErrorBatch b;
  b.n = s.n;
  b.d = s.d;
  b.dv = s.dv;
  b.q_heads = s.q;
  b.kv_heads = s.kv;
  b.sink = s.sink;
  b.eval = s.eval;
  b.layer_id = L.id.value();
  std::mt19937 rng(sel);
  std::uniform_real_distribution<float> lw(0.2f, 1.2f);
  for (int h = 0; h < s.kv; ++h) {
    b.keys.push_back(L.keys[h].data());
    b.values.push_back(L.values[h].data());
    std::vector<int> middle;
    for (int t = s.sink; t < s.n - s.eval; ++t) middle.push_back(t);
    std::shuffle(middle.begin(), middle.end(), rng);
    middle.resize(middle.size() * 3 / 10);
    std::vector<double> w(middle.size());
    for (double& x : w) x = lw(rng);
    b.num_idx.push_back(middle);
    b.num_logw.push_back(w);
    b.den_idx.push_back(middle);
    b.den_logw.push_back(w);
  }
  for (int h = 0; h < s.q; ++h) b.queries.push_back(L.queries[h].data());
  return b;
}

struct Figures {
  std::vector<double> rel, nrm, mass;
};

Figures run(Backend& backend, ErrorBatch b) {
  Figures f;
  const size_t count = static_cast<size_t>(b.q_heads) * b.eval;
  f.rel.assign(count, -1);
  f.nrm.assign(count, -1);
  f.mass.assign(count, -1);
  b.relative = f.rel.data();
  b.normalized = f.nrm.data();
  b.mass = f.mass.data();
  backend.attention_errors(b);
  return f;
}

void expect_same(const Figures& got, const Figures& want, const std::string& what) {
  EXPECT_EQ(got.rel, want.rel) << what;
  EXPECT_EQ(got.nrm, want.nrm) << what;
  EXPECT_EQ(got.mass, want.mass) << what;
}

void expect_near_cpu(const Figures& got, const Figures& cpu, const std::string& what) {
  ASSERT_EQ(got.rel.size(), cpu.rel.size());
  for (size_t i = 0; i < cpu.rel.size(); ++i) {
    EXPECT_NEAR(got.rel[i], cpu.rel[i], 1e-9 * std::max(1e-12, std::abs(cpu.rel[i])))
        << what << " relative " << i;
    EXPECT_NEAR(got.nrm[i], cpu.nrm[i], 1e-9 * std::max(1e-12, std::abs(cpu.nrm[i])))
        << what << " normalized " << i;
    EXPECT_NEAR(got.mass[i], cpu.mass[i], 1e-9 * std::max(1e-12, std::abs(cpu.mass[i])))
        << what << " mass " << i;
  }
}

// The device figures of a batch, resident (its id) and uploaded (id 0): bit for bit the same,
// and within 1e-9 of the CPU reference. Returns the resident ones.
Figures checked(Backend& gpu, const ErrorBatch& b, const std::string& what) {
  const Figures resident = run(gpu, b);
  EXPECT_EQ(last_fallback(), "") << what << ": ran on the CPU";
  ErrorBatch unnamed = b;
  unnamed.layer_id = 0;
  expect_same(resident, run(gpu, unnamed), what + ": resident against uploaded");
  expect_near_cpu(resident, run(cpu_backend(), b), what + ": against the CPU");
  return resident;
}

uint64_t h2d_bytes() {
  uint64_t bytes = 0;
  return cuda_host_to_device_bytes_for_testing(&bytes) ? bytes : 0;
}
bool emulated() {
  uint64_t bytes = 0;
  return cuda_host_to_device_bytes_for_testing(&bytes);
}

// Each test starts from an empty cache with the default budget and staging, and leaves it so.
class ResidentLayers : public ::testing::Test {
 protected:
  void SetUp() override { restore(); }
  void TearDown() override { restore(); }
  static void restore() {
    cuda_set_emulated_device_memory_for_testing(0);
    cuda_set_resident_budget(0);
    cuda_set_resident_staging_chunk_for_testing(size_t(8) << 20);
    cuda_reset_resident_for_testing();
  }
};

// (a) and (b): many calls over one layer (other selections, as other methods, ratios and seeds
// make) copy its arrays once. Staging chunks of 1000 bytes make every array cross several chunks
// and both pinned buffers; 0 copies from pageable memory.
class ResidentStaging : public ResidentLayers, public ::testing::WithParamInterface<size_t> {};

TEST_P(ResidentStaging, ALayerIsCopiedOnceAcrossCallsWithTheSameFigures) {
  REQUIRE_GPU(gpu);
  cuda_set_resident_staging_chunk_for_testing(GetParam());
  const Shape s;
  const LayerData L = make_layer(s, 7);
  const int calls = 6;
  for (int k = 0; k < calls; ++k) {
    const ErrorBatch b = error_batch(s, L, 100 + k);
    const uint64_t before = h2d_bytes();
    const Figures f = run(*gpu, b);
    const uint64_t copied = h2d_bytes() - before;
    EXPECT_EQ(last_fallback(), "");
    const ResidentLayerStats st = cuda_resident_stats();
    EXPECT_EQ(st.uploaded_bytes, s.layer_bytes()) << "call " << k;
    EXPECT_EQ(st.uploads, s.arrays()) << "call " << k;
    EXPECT_EQ(st.hits, static_cast<uint64_t>(k) * s.arrays()) << "call " << k;
    EXPECT_EQ(st.resident_bytes, s.layer_bytes() + s.exact_bytes());
    EXPECT_EQ(st.exact_built, static_cast<uint64_t>(s.q)) << "call " << k << ": computed once";
    EXPECT_EQ(st.exact_reused, static_cast<uint64_t>(k * s.q)) << "call " << k;
    if (emulated()) {  // the runtime's own count: a later call copies only its selections
      EXPECT_EQ(copied, (k == 0 ? s.layer_bytes() : 0) + s.call_bytes()) << "call " << k;
    }
    ErrorBatch unnamed = b;
    unnamed.layer_id = 0;
    const uint64_t before_unnamed = h2d_bytes();
    expect_same(f, run(*gpu, unnamed), "call " + std::to_string(k) + ": resident against uploaded");
    if (emulated()) {
      EXPECT_EQ(h2d_bytes() - before_unnamed, s.layer_bytes() + s.call_bytes())
          << "a batch without an id is uploaded whole";
    }
    expect_near_cpu(f, run(cpu_backend(), b), "call " + std::to_string(k));
  }
  EXPECT_EQ(cuda_resident_stats().uploaded_bytes, s.layer_bytes()) << "unnamed calls stay out";
  EXPECT_EQ(cuda_resident_stats().mismatches, 0u);
}

INSTANTIATE_TEST_SUITE_P(Chunks, ResidentStaging, ::testing::Values(size_t(1000), size_t(0)));

// (c): a reload in recycled memory (the same host addresses, other contents, a new id) is copied
// again and gives the new contents' figures; the old id's copies are never served for it.
TEST_F(ResidentLayers, ANewLayerIdIsCopiedAgainAndNeverServedStale) {
  REQUIRE_GPU(gpu);
  const Shape s;
  LayerData old_layer = make_layer(s, 11);
  const Figures old_figures = checked(*gpu, error_batch(s, old_layer, 5), "first load");
  const float* address = old_layer.keys[0].data();
  // The reader's recycling: the matrices move to the next load, which converts other contents
  // into them and is named by a new id.
  LayerData reload;
  reload.keys = std::move(old_layer.keys);
  reload.values = std::move(old_layer.values);
  reload.queries = std::move(old_layer.queries);
  reload.id = LayerId::fresh();
  ASSERT_EQ(reload.keys[0].data(), address);
  const LayerData fresh = make_layer(s, 12);
  for (int h = 0; h < s.kv; ++h) {
    reload.keys[h] = fresh.keys[h];  // same size: assigned in place
    reload.values[h] = fresh.values[h];
  }
  for (int h = 0; h < s.q; ++h) reload.queries[h] = fresh.queries[h];
  ASSERT_EQ(reload.keys[0].data(), address);
  const ResidentLayerStats before = cuda_resident_stats();
  const Figures new_figures = checked(*gpu, error_batch(s, reload, 5), "reload");
  const ResidentLayerStats after = cuda_resident_stats();
  EXPECT_EQ(after.uploaded_bytes - before.uploaded_bytes, s.layer_bytes());
  EXPECT_EQ(after.hits, before.hits) << "nothing of the old id may serve the new one";
  EXPECT_NE(new_figures.rel, old_figures.rel);

  // A caller that breaks the promise (changes a named layer): the guard sees a change in an
  // array's first or last bytes and copies it again rather than serve the old copy.
  reload.keys[1](0, 0) += 1.0f;
  reload.values[0](s.n - 1, s.dv - 1) *= -2.0f;
  const Figures changed = checked(*gpu, error_batch(s, reload, 5), "changed under its id");
  EXPECT_EQ(cuda_resident_stats().mismatches - after.mismatches, 2u);
  EXPECT_NE(changed.rel, new_figures.rel);
  // Both kv heads' copies changed, so every query head's exact side was computed again.
  EXPECT_EQ(cuda_resident_stats().exact_built - after.exact_built, static_cast<uint64_t>(s.q));
}

// The guard samples each array through its middle as well as at its ends: a caller that rewrites
// a run of rows in the middle of a named layer's arrays under the same id (first and last bytes
// untouched) gets them copied again, never the stale copy. The run here is 1/16 of each array; a
// run longer than 1/33 of an array always meets one of the guard's windows
// (kernels/resident_layers.cuh).
TEST_F(ResidentLayers, TheGuardSeesAChangeInTheMiddleOfAnArray) {
  REQUIRE_GPU(gpu);
  const Shape s;
  LayerData L = make_layer(s, 71);
  const Figures loaded = checked(*gpu, error_batch(s, L, 3), "as loaded");
  const ResidentLayerStats before = cuda_resident_stats();
  const int run = s.n / 16;
  for (int r = s.n / 2 - run / 2; r < s.n / 2 + run / 2; ++r) {
    L.keys[1].row(r) *= -1.5f;
    L.values[0].row(r).array() += 0.25f;
  }
  const Figures changed = checked(*gpu, error_batch(s, L, 3), "changed in the middle");
  const ResidentLayerStats after = cuda_resident_stats();
  EXPECT_EQ(after.mismatches - before.mismatches, 2u);
  EXPECT_EQ(after.uploaded_bytes - before.uploaded_bytes,
            sizeof(float) * static_cast<size_t>(s.n) * (s.d + s.dv))
      << "the two changed arrays, copied again";
  EXPECT_NE(changed.rel, loaded.rel);
  // Unchanged since: served from the new copies.
  checked(*gpu, error_batch(s, L, 4), "again");
  EXPECT_EQ(cuda_resident_stats().mismatches, after.mismatches);
  EXPECT_EQ(cuda_resident_stats().uploaded_bytes, after.uploaded_bytes);
}

// The exact side of the errors is kept per (layer, query head, window): later calls over other
// selections compute only the approximate side, and their figures are bit for bit those of a
// call that computed the exact side afresh (after the cache was emptied) and within 1e-9 of the
// CPU's. Another window (E) is another exact side.
TEST_F(ResidentLayers, TheExactSideIsComputedOncePerLayerAndWindow) {
  REQUIRE_GPU(gpu);
  const Shape s;
  const LayerData L = make_layer(s, 51);
  std::vector<Figures> kept;
  for (uint32_t k = 0; k < 3; ++k) kept.push_back(checked(*gpu, error_batch(s, L, 60 + k), "kept"));
  ResidentLayerStats st = cuda_resident_stats();
  EXPECT_EQ(st.exact_built, static_cast<uint64_t>(s.q));
  EXPECT_EQ(st.exact_reused, static_cast<uint64_t>(2 * s.q));
  for (uint32_t k = 0; k < 3; ++k) {
    cuda_reset_resident_for_testing();
    expect_same(run(*gpu, error_batch(s, L, 60 + k)), kept[k], "computed afresh");
    EXPECT_EQ(cuda_resident_stats().exact_built, static_cast<uint64_t>(s.q));
  }
  Shape wider = s;
  wider.eval = 24;
  st = cuda_resident_stats();
  checked(*gpu, error_batch(wider, L, 61), "another window");
  EXPECT_EQ(cuda_resident_stats().exact_built - st.exact_built, static_cast<uint64_t>(s.q));
  // Float scores keep no exact side (theirs is computed in each call).
  ErrorBatch f = error_batch(s, L, 62);
  f.float_scores = true;
  st = cuda_resident_stats();
  run(*gpu, f);
  EXPECT_EQ(cuda_resident_stats().exact_built, st.exact_built);
  EXPECT_EQ(cuda_resident_stats().exact_reused, st.exact_reused);
}

// (d): layers in turn within a budget of 2.5 layers: the least recently used arrays go, the
// resident bytes never exceed the budget, a layer used again while resident is not copied, an
// evicted one is; a call larger than the budget is uploaded as before and caches nothing.
TEST_F(ResidentLayers, TheLeastRecentlyUsedLayersAreEvictedWithinTheBudget) {
  REQUIRE_GPU(gpu);
  const Shape s;
  std::vector<LayerData> layers;
  for (uint32_t k = 0; k < 4; ++k) layers.push_back(make_layer(s, 20 + k));
  // What a layer keeps: its copies and the exact sides of its query heads.
  const size_t budget = (s.layer_bytes() + s.exact_bytes()) * 5 / 2;
  cuda_set_resident_budget(budget);
  for (size_t k = 0; k < layers.size(); ++k) {
    checked(*gpu, error_batch(s, layers[k], 1), "layer " + std::to_string(k));
    const ResidentLayerStats st = cuda_resident_stats();
    EXPECT_LE(st.resident_bytes, budget) << "layer " << k;
    EXPECT_EQ(st.uploaded_bytes, (k + 1) * s.layer_bytes()) << "layer " << k;
    EXPECT_EQ(st.budget_bytes, budget);
    if (k < 2) {
      EXPECT_EQ(st.evictions, 0u) << "layer " << k;
    }
  }
  EXPECT_GT(cuda_resident_stats().evictions, 0u);
  ResidentLayerStats st = cuda_resident_stats();
  checked(*gpu, error_batch(s, layers[3], 2), "the last layer again");
  EXPECT_EQ(cuda_resident_stats().uploaded_bytes, st.uploaded_bytes) << "still resident";
  EXPECT_EQ(cuda_resident_stats().hits - st.hits, s.arrays());
  st = cuda_resident_stats();
  checked(*gpu, error_batch(s, layers[0], 2), "the first layer again");
  EXPECT_EQ(cuda_resident_stats().uploaded_bytes - st.uploaded_bytes, s.layer_bytes())
      << "evicted: copied again";
  EXPECT_LE(cuda_resident_stats().resident_bytes, budget);

  // A budget below one call: nothing of it is kept, the figures stand (the exact side computed
  // in the call's workspace).
  cuda_set_resident_budget(s.layer_bytes() / 2);
  EXPECT_LE(cuda_resident_stats().resident_bytes, s.layer_bytes() / 2) << "evicted at once";
  st = cuda_resident_stats();
  checked(*gpu, error_batch(s, layers[1], 3), "a call over the budget");
  EXPECT_EQ(cuda_resident_stats().uncached_calls - st.uncached_calls, 1u);
  EXPECT_EQ(cuda_resident_stats().uploaded_bytes, st.uploaded_bytes);
}

// The attention-score op on a named layer: a head's keys are the same resident copy as the
// error op's (the whole n rows), each reduced range of query rows is copied once, and the
// figures are bit for bit those of the same batch uploaded and within 1e-9 of the CPU's.
ScoreBatch score_batch(const Shape& s, const LayerData& L, int row_begin, int row_end,
                       std::vector<std::vector<double>>& out) {
  ScoreBatch b;
  b.n = s.n;
  b.d = s.d;
  b.row_begin = row_begin;
  b.row_end = row_end;
  b.reduce = ScoreReduce::mean_seen;
  b.layer_id = L.id.value();
  const int group = s.q / s.kv;
  out.assign(static_cast<size_t>(s.kv), std::vector<double>(static_cast<size_t>(row_end), -1));
  for (int h = 0; h < s.kv; ++h) {
    ScoreHead head;
    head.keys = L.keys[h].data();
    for (int g = 0; g < group; ++g) head.queries.push_back(L.queries[h * group + g].data());
    head.scores = out[h].data();
    b.heads.push_back(std::move(head));
  }
  return b;
}

TEST_F(ResidentLayers, AttentionScoresShareTheResidentKeysAndCopyTheirRowsOnce) {
  REQUIRE_GPU(gpu);
  const Shape s;
  const LayerData L = make_layer(s, 41);
  checked(*gpu, error_batch(s, L, 1), "errors first");
  const ResidentLayerStats after_errors = cuda_resident_stats();
  const size_t rows_bytes = sizeof(float) * static_cast<size_t>(s.q) * (s.n - 20 - 10) * s.d;
  for (int k = 0; k < 3; ++k) {
    std::vector<std::vector<double>> resident, uploaded, cpu;
    ScoreBatch b = score_batch(s, L, 10, s.n - 20, resident);
    const uint64_t before = h2d_bytes();
    gpu->attention_scores(b);
    EXPECT_EQ(last_fallback(), "");
    const ResidentLayerStats st = cuda_resident_stats();
    EXPECT_EQ(st.uploaded_bytes - after_errors.uploaded_bytes, rows_bytes)
        << "call " << k << ": the keys were resident, the rows copied once";
    EXPECT_EQ(st.hits - after_errors.hits, static_cast<uint64_t>(s.kv + k * (s.kv + s.q)));
    if (emulated() && k > 0) {
      EXPECT_LT(h2d_bytes() - before, 1024u) << "a later call copies its pointer table only";
    }
    ScoreBatch unnamed = score_batch(s, L, 10, s.n - 20, uploaded);
    unnamed.layer_id = 0;
    gpu->attention_scores(unnamed);
    ScoreBatch reference = score_batch(s, L, 10, s.n - 20, cpu);
    cpu_backend().attention_scores(reference);
    for (int h = 0; h < s.kv; ++h) {
      EXPECT_EQ(resident[h], uploaded[h]) << "head " << h;
      for (size_t i = 0; i < cpu[h].size(); ++i)
        EXPECT_NEAR(resident[h][i], cpu[h][i], 1e-9 * std::max(1e-12, std::abs(cpu[h][i])))
            << "head " << h << " key " << i;
    }
  }
}

// SubGen's key clustering on a named layer: the middle's keys cross to the device once over
// several batches of radii (as its bisection sends them), a later batch copies only its radii,
// and the clusterings are exactly those of the same batch uploaded (id 0) and of the CPU
// reference. Another head's keys are another copy.
ClusterBatch cluster_batch(const Shape& s, const LayerData& L, int head, std::vector<double> deltas,
                           std::vector<KeyClusters>& out) {
  ClusterBatch b;
  b.keys = L.keys[head].data() + static_cast<size_t>(s.sink) * s.d;  // the middle's rows
  b.n = s.n - s.sink - s.eval;
  b.d = s.d;
  b.t = 2;
  b.limit = b.n / 2;  // the smallest radii stop early
  b.deltas = std::move(deltas);
  out.assign(b.deltas.size(), KeyClusters{});
  b.out = out.data();
  b.layer_id = L.id.value();
  return b;
}

void expect_same_clusters(const std::vector<KeyClusters>& got, const std::vector<KeyClusters>& want,
                          const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t r = 0; r < want.size(); ++r) {
    EXPECT_EQ(got[r].owner, want[r].owner) << what << ", radius " << r;
    EXPECT_EQ(got[r].size, want[r].size) << what << ", radius " << r;
    EXPECT_EQ(got[r].capacity, want[r].capacity) << what << ", radius " << r;
    EXPECT_EQ(got[r].over, want[r].over) << what << ", radius " << r;
  }
}

TEST_F(ResidentLayers, KeyClustersCopyTheMiddlesKeysOnceAcrossBatches) {
  REQUIRE_GPU(gpu);
  const Shape s;
  const LayerData L = make_layer(s, 81);
  const size_t key_bytes = sizeof(float) * static_cast<size_t>(s.n - s.sink - s.eval) * s.d;
  bool some_over = false, some_whole = false;
  for (int k = 0; k < 4; ++k) {
    const std::string what = "batch " + std::to_string(k);
    const std::vector<double> deltas = {1.5 + k, 3.0 + k, 4.5 + k};  // keys ~ N(0, 1), d = 16
    const size_t radii_bytes = deltas.size() * sizeof(double);
    std::vector<KeyClusters> resident, uploaded, cpu;
    const ResidentLayerStats before = cuda_resident_stats();
    const uint64_t h2d_before = h2d_bytes();
    gpu->key_clusters(cluster_batch(s, L, 1, deltas, resident));
    EXPECT_EQ(last_fallback(), "") << what;
    const ResidentLayerStats after = cuda_resident_stats();
    EXPECT_EQ(after.uploaded_bytes - before.uploaded_bytes, k == 0 ? key_bytes : 0) << what;
    EXPECT_EQ(after.hits - before.hits, k == 0 ? 0u : 1u) << what;
    if (emulated()) {  // the runtime's own count: a later batch copies its radii only
      EXPECT_EQ(h2d_bytes() - h2d_before, (k == 0 ? key_bytes : 0) + radii_bytes) << what;
    }
    ClusterBatch unnamed = cluster_batch(s, L, 1, deltas, uploaded);
    unnamed.layer_id = 0;
    const uint64_t h2d_unnamed = h2d_bytes();
    gpu->key_clusters(unnamed);
    if (emulated()) {
      EXPECT_EQ(h2d_bytes() - h2d_unnamed, key_bytes + radii_bytes) << what << ": uploaded whole";
    }
    cpu_backend().key_clusters(cluster_batch(s, L, 1, deltas, cpu));
    expect_same_clusters(resident, uploaded, what + ": resident against uploaded");
    expect_same_clusters(resident, cpu, what + ": against the CPU");
    for (const KeyClusters& c : cpu) (c.over ? some_over : some_whole) = true;
  }
  EXPECT_TRUE(some_over && some_whole) << "the radii should both stop early and run whole";
  const ResidentLayerStats before = cuda_resident_stats();
  std::vector<KeyClusters> other, cpu;
  gpu->key_clusters(cluster_batch(s, L, 0, {3.0}, other));
  cpu_backend().key_clusters(cluster_batch(s, L, 0, {3.0}, cpu));
  expect_same_clusters(other, cpu, "head 0");
  EXPECT_EQ(cuda_resident_stats().uploaded_bytes - before.uploaded_bytes, key_bytes);
  EXPECT_EQ(cuda_resident_stats().mismatches, 0u);
}

// BUZZ's cache scores on a named layer: the keys' and the group's queries' first n rows cross to
// the device once for every segment of a stream; a segment then copies only its key positions,
// its rows' counts and scales, the cache's scores and the group's pointer table. The accumulated
// scores are bit for bit those of the same segments uploaded (id 0: the cache's keys gathered,
// the segment's query rows copied) and within 1e-9 of the CPU reference.
TEST_F(ResidentLayers, CacheScoresReadTheResidentKeysAndQueriesAcrossSegments) {
  REQUIRE_GPU(gpu);
  const Shape s;
  const LayerData L = make_layer(s, 91);
  const int group = s.q / s.kv, head = 1, n = s.n - s.eval;
  auto batch = [&](std::vector<double>& acc, const std::vector<int>& ids, int begin, int end) {
    CacheScoreBatch b;
    b.keys = L.keys[head].data();
    for (int g = 0; g < group; ++g) b.queries.push_back(L.queries[head * group + g].data());
    b.n = n;
    b.d = s.d;
    b.key_ids = ids.data();
    b.num_keys = static_cast<int>(ids.size());
    b.row_begin = begin;
    b.row_end = end;
    b.log_n = true;
    b.acc = acc.data();
    b.layer_id = L.id.value();
    return b;
  };
  const size_t layer_bytes = sizeof(float) * static_cast<size_t>(n) * s.d * (1 + group);
  std::vector<double> resident(n, 0.0), uploaded(n, 0.0), cpu(n, 0.0);
  int segments = 0;
  for (int begin = 16; begin < n; begin += 16, ++segments) {
    // The cache: every third position before the segment, then the segment's own rows.
    const int end = std::min(n, begin + 16);
    std::vector<int> ids;
    for (int i = 0; i < begin; i += 3) ids.push_back(i);
    for (int i = begin; i < end; ++i) ids.push_back(i);
    const std::string what = "segment " + std::to_string(segments);
    const ResidentLayerStats before = cuda_resident_stats();
    const uint64_t h2d_before = h2d_bytes();
    gpu->cache_scores(batch(resident, ids, begin, end));
    EXPECT_EQ(last_fallback(), "") << what;
    EXPECT_EQ(cuda_resident_stats().uploaded_bytes - before.uploaded_bytes,
              segments == 0 ? layer_bytes : 0)
        << what;
    const size_t rows = static_cast<size_t>(end - begin);
    const size_t per_call = ids.size() * (sizeof(int) + sizeof(double)) +
                            rows * (sizeof(int) + sizeof(double)) + group * sizeof(void*);
    if (emulated()) {
      EXPECT_EQ(h2d_bytes() - h2d_before, (segments == 0 ? layer_bytes : 0) + per_call) << what;
    }
    CacheScoreBatch unnamed = batch(uploaded, ids, begin, end);
    unnamed.layer_id = 0;
    gpu->cache_scores(unnamed);
    cpu_backend().cache_scores(batch(cpu, ids, begin, end));
  }
  EXPECT_GE(segments, 5);
  EXPECT_EQ(resident, uploaded);
  for (int i = 0; i < n; ++i)
    EXPECT_NEAR(resident[i], cpu[i], 1e-9 * std::max(1e-12, std::abs(cpu[i]))) << "key " << i;
  EXPECT_EQ(cuda_resident_stats().mismatches, 0u);
}

// The two methods end to end on a loaded layer of stories260K_lily (so their batches name it):
// on the device, with the layer's keys and queries resident, SubGen and BUZZ keep the CPU's
// selections exactly (indices, weights, denominator samples, clusters); BUZZ with another seed
// streams again over the copies already there.
TEST_F(ResidentLayers, SubGenAndBuzzOnALoadedLayerKeepTheCpuSetsAndReuseTheCopies) {
  REQUIRE_GPU(gpu);
  auto cap = CaptureFile::open(lily());
  const std::shared_ptr<const LayerData> layer = cap->layer(1);
  const EvalWindow w = EvalWindow::make(cap->info().num_tokens, 0.25, -1, -1);
  for (const char* name : {"subgen", "buzz"}) {
    SCOPED_TRACE(name);
    const Method* m = find_method(name);
    ASSERT_NE(m, nullptr);
    MethodInput in = make_method_input(*layer, cap->info().num_layers, 1, w, ParamValues{}, 0);
    const ResidentLayerStats before = cuda_resident_stats();
    in.backend = gpu;
    const Selection device = m->select(in);
    EXPECT_EQ(last_fallback(), "");
    EXPECT_GT(cuda_resident_stats().uploaded_bytes, before.uploaded_bytes) << "resident copies";
    in.backend = &cpu_backend();
    const Selection cpu = m->select(in);
    EXPECT_EQ(device.indices, cpu.indices);
    EXPECT_EQ(device.weights, cpu.weights);
    EXPECT_EQ(device.den_indices, cpu.den_indices);
    EXPECT_EQ(device.den_weights, cpu.den_weights);
    EXPECT_EQ(device.cluster, cpu.cluster);
  }
  const ResidentLayerStats before = cuda_resident_stats();
  MethodInput in = make_method_input(*layer, cap->info().num_layers, 1, w, ParamValues{}, 1);
  in.backend = gpu;
  const Selection again = find_method("buzz")->select(in);
  in.backend = &cpu_backend();
  EXPECT_EQ(again.indices, find_method("buzz")->select(in).indices);
  EXPECT_EQ(cuda_resident_stats().uploaded_bytes, before.uploaded_bytes) << "nothing copied again";
  EXPECT_GT(cuda_resident_stats().hits, before.hits);
}

// Out of device memory (the emulation's capacity; skipped on a real device, where it cannot be
// set): cudaMalloc failing evicts other layers and retries on the device; with nothing left to
// evict the call becomes a DeviceFailure and the CPU's figures, and the device recovers.
TEST_F(ResidentLayers, OutOfDeviceMemoryEvictsAndRetriesOrRunsOnTheCpu) {
  REQUIRE_GPU(gpu);
  if (!cuda_set_emulated_device_memory_for_testing(0))
    GTEST_SKIP() << "the device memory can be limited only under the CPU emulation";
  const Shape s;
  const LayerData a = make_layer(s, 31), b = make_layer(s, 32), c = make_layer(s, 33);
  cuda_set_resident_budget(size_t(1) << 40);  // the budget never evicts here: memory does
  checked(*gpu, error_batch(s, a, 1), "layer a");
  // Room for about half of another layer beyond what is allocated now (a's copies, workspaces).
  cuda_set_emulated_device_memory_for_testing(cuda_emulated_device_memory_used_for_testing() +
                                              s.layer_bytes() * 3 / 5);
  ResidentLayerStats st = cuda_resident_stats();
  const Figures fb = run(*gpu, error_batch(s, b, 1));
  EXPECT_EQ(last_fallback(), "") << "evicting layer a must make room on the device";
  expect_near_cpu(fb, run(cpu_backend(), error_batch(s, b, 1)), "layer b after evictions");
  EXPECT_GT(cuda_resident_stats().evictions, st.evictions);
  EXPECT_EQ(cuda_resident_stats().uploaded_bytes - st.uploaded_bytes, s.layer_bytes());

  // No room for one layer even with everything evicted and every buffer released (the backend
  // retries once without them): the CPU runs the call, and says why.
  cuda_reset_resident_for_testing();
  cuda_set_resident_budget(size_t(1) << 40);
  cuda_set_emulated_device_memory_for_testing(s.layer_bytes() / 2);
  const Figures fc = run(*gpu, error_batch(s, c, 1));
  EXPECT_NE(last_fallback().find("out of device memory"), std::string::npos) << last_fallback();
  expect_same(fc, run(cpu_backend(), error_batch(s, c, 1)), "the CPU's figures, exactly");
  cuda_set_emulated_device_memory_for_testing(0);
  checked(*gpu, error_batch(s, c, 1), "layer c once memory is back");
}

// Another op out of memory while layers are resident (the emulation's capacity): the backend
// drops the resident copies and runs the op again on the device, once.
TEST_F(ResidentLayers, AnOpOutOfMemoryDropsTheResidentLayersAndRunsOnTheDevice) {
  REQUIRE_GPU(gpu);
  if (!cuda_set_emulated_device_memory_for_testing(0))
    GTEST_SKIP() << "the device memory can be limited only under the CPU emulation";
  Shape large;
  large.n = 512;
  const LayerData resident = make_layer(large, 61);
  cuda_set_resident_budget(size_t(1) << 40);
  run(*gpu, error_batch(large, resident, 1));
  ASSERT_GT(cuda_resident_stats().entries, 0);
  // An unnamed batch needs larger workspaces than any call so far; the memory in use (mostly the
  // resident layer) is all there is.
  Shape other;
  other.n = 400;
  const LayerData unnamed_layer = make_layer(other, 62);
  ErrorBatch unnamed = error_batch(other, unnamed_layer, 2);
  unnamed.layer_id = 0;
  cuda_set_emulated_device_memory_for_testing(cuda_emulated_device_memory_used_for_testing());
  const Figures f = run(*gpu, unnamed);
  EXPECT_EQ(last_fallback(), "") << "dropping the resident layer must make room";
  EXPECT_EQ(cuda_resident_stats().out_of_memory_retries, 1u);
  EXPECT_EQ(cuda_resident_stats().entries, 0);
  expect_near_cpu(f, run(cpu_backend(), unnamed), "after the retry");
}

// The protocol end to end on a real capture: run_eval on the device copies each layer once for
// all its (method, ratio, seed) calls, gives bit for bit the figures of the same data held in
// memory without an id (uploaded at every call), and within 1e-6 of the CPU path; a second run
// over the still-cached layers copies nothing; layers reloaded (new ids) are copied again.
TEST_F(ResidentLayers, RunEvalCopiesEachLayerOnceAndGivesTheUploadedFigures) {
  REQUIRE_GPU(gpu);
  auto cap = CaptureFile::open(lily());
  const CaptureInfo& info = cap->info();
  cap->set_max_cached_layers(info.num_layers);  // every layer stays the same load until below
  EvalSpec spec = small_spec({0, 1});
  spec.eval = 16;  // one tile of evaluation queries per query head: the emulation is slow
  const int E = EvalWindow::make(info.num_tokens, 0.5, spec.sink, spec.eval).eval;
  const size_t layer_bytes =
      sizeof(float) *
      (static_cast<size_t>(info.kv_heads) * info.num_tokens * (info.head_dim + info.value_dim) +
       static_cast<size_t>(info.q_heads) * E * info.head_dim);
  const EvalReport got = run_eval(*cap, spec, {}, nullptr, gpu);
  EXPECT_EQ(last_fallback(), "");
  ResidentLayerStats st = cuda_resident_stats();
  EXPECT_EQ(st.uploaded_bytes, 2 * layer_bytes) << "two layers, each copied once";
  EXPECT_EQ(st.uploads, 2u * (2 * info.kv_heads + info.q_heads));
  // Three calls a layer (uniform's two seeds, streaming's one run): the later two find all.
  EXPECT_EQ(st.hits, 2 * st.uploads) << "later calls found them resident";

  CaptureData data;
  data.info = info;
  for (int L = 0; L < info.num_layers; ++L) data.layers.push_back(*cap->layer(L));  // copies: no id
  kvscope::testing::MemoryCapture memory(std::move(data));
  const EvalReport uploaded = run_eval(memory, spec, {}, nullptr, gpu);
  const EvalReport cpu = run_eval(*cap, spec);
  ASSERT_EQ(got.results.size(), uploaded.results.size());
  ASSERT_EQ(got.results.size(), cpu.results.size());
  for (size_t i = 0; i < got.results.size(); ++i) {
    const HeadEval& g = got.results[i];
    EXPECT_EQ(g.error, "");
    EXPECT_EQ(g.per_seed, uploaded.results[i].per_seed) << i;
    EXPECT_EQ(g.per_query, uploaded.results[i].per_query) << i;
    EXPECT_EQ(g.mass_mean, uploaded.results[i].mass_mean) << i;
    EXPECT_NEAR(g.mean, cpu.results[i].mean, 1e-6 * std::abs(cpu.results[i].mean)) << i;
    EXPECT_NEAR(g.mass_mean, cpu.results[i].mass_mean, 1e-6) << i;
  }
  EXPECT_EQ(cuda_resident_stats().uploaded_bytes, st.uploaded_bytes) << "copies made no entries";

  const uint64_t h2d_before = h2d_bytes();
  const EvalReport second = run_eval(*cap, spec, {}, nullptr, gpu);
  EXPECT_EQ(cuda_resident_stats().uploaded_bytes, st.uploaded_bytes) << "the same loads";
  if (emulated()) {
    EXPECT_LT(h2d_bytes() - h2d_before, layer_bytes) << "only selections and tables crossed";
  }
  for (size_t i = 0; i < got.results.size(); ++i)
    EXPECT_EQ(second.results[i].per_seed, got.results[i].per_seed) << i;

  cap->set_max_cached_layers(0);  // every layer() call loads anew: new ids
  st = cuda_resident_stats();
  const EvalReport reloaded = run_eval(*cap, spec, {}, nullptr, gpu);
  EXPECT_EQ(cuda_resident_stats().uploaded_bytes - st.uploaded_bytes, 2 * layer_bytes);
  for (size_t i = 0; i < got.results.size(); ++i)
    EXPECT_EQ(reloaded.results[i].per_seed, got.results[i].per_seed) << i;
}

#else

TEST(ResidentLayers, NeedTheCudaKernels) {
  GTEST_SKIP() << "this build has no CUDA kernels (KVSCOPE_ENABLE_CUDA is off)";
}

#endif  // KVSCOPE_HAVE_CUDA

}  // namespace
