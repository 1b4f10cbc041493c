// The exact reference cache (engine/eval/reference_cache.h) and the compact form of ExactReference
// (engine/attention/exact_attention.h): scoring from the cached side gives the fresh reference's
// figures bit for bit, hits and evictions change nothing, two threads never build one key twice,
// cancellation stops waits, and every field the exact side depends on is in the key.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <thread>

#include "engine/attention/exact_attention.h"
#include "engine/core/error.h"
#include "engine/core/scratch.h"
#include "engine/core/simd.h"
#include "engine/eval/protocol.h"
#include "engine/eval/reference_cache.h"
#include "engine/methods/method.h"
#include "tests/memory_capture.h"

namespace kvscope {
namespace {

MatrixF random_matrix(int rows, int cols, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  MatrixF m(rows, cols);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) m(i, j) = dist(rng);
  return m;
}

// One layer: kv heads with a GQA group of `group` query heads each (none: proxy queries).
LayerData make_layer(int layer, int n, int d, int dv, int kv_heads, int group, uint32_t seed) {
  std::mt19937 rng(seed);
  LayerData L;
  L.layer = layer;
  for (int h = 0; h < kv_heads; ++h) {
    L.keys.push_back(random_matrix(n, d, rng));
    L.values.push_back(random_matrix(n, dv, rng));
  }
  for (int h = 0; h < kv_heads * group; ++h) L.queries.push_back(random_matrix(n, d, rng));
  L.refused.assign(kv_heads, "");
  return L;
}

// A selection of about `keep` middle tokens of [s, n - E) with random weights; `separate` adds a
// different denominator set.
Selection random_selection(int n, int s, int E, int keep, bool separate, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int> mid;
  for (int i = s; i < n - E; ++i) mid.push_back(i);
  std::shuffle(mid.begin(), mid.end(), rng);
  std::uniform_real_distribution<double> w(0.2, 3.0);
  Selection sel;
  sel.indices.assign(mid.begin(), mid.begin() + keep);
  std::sort(sel.indices.begin(), sel.indices.end());
  for (size_t i = 0; i < sel.indices.size(); ++i) sel.weights.push_back(w(rng));
  if (separate) {
    sel.separate = true;
    sel.den_indices.assign(mid.begin() + keep / 2, mid.begin() + keep / 2 + keep);
    std::sort(sel.den_indices.begin(), sel.den_indices.end());
    for (size_t i = 0; i < sel.den_indices.size(); ++i) sel.den_weights.push_back(w(rng));
  }
  return sel;
}

using Errors = std::vector<std::vector<QueryError>>;

// Bit-for-bit equality of every figure.
void expect_identical(const Errors& a, const Errors& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t h = 0; h < a.size(); ++h) {
    ASSERT_EQ(a[h].size(), b[h].size());
    for (size_t e = 0; e < a[h].size(); ++e) {
      EXPECT_EQ(a[h][e].position, b[h][e].position);
      EXPECT_EQ(a[h][e].relative, b[h][e].relative) << "head " << h << " query " << e;
      EXPECT_EQ(a[h][e].normalized, b[h][e].normalized) << "head " << h << " query " << e;
      EXPECT_EQ(a[h][e].mass, b[h][e].mass) << "head " << h << " query " << e;
    }
  }
}

std::vector<const float*> pointers(const std::vector<const MatrixF*>& m) {
  std::vector<const float*> p;
  for (const MatrixF* x : m) p.push_back(x->data());
  return p;
}

// The reference the protocol built before the cache: fresh, holding every logit.
Errors fresh_errors(const LayerData& L, int kv, int s, int E, const Selection& sel) {
  return ExactReference(reference_queries(L, kv), L.keys[kv], L.values[kv], s, E).evaluate(sel);
}

// ---------------------------------------------------------------------------------------------
// The compact form

TEST(ExactReferenceForms, CompactScoringIsBitIdenticalToHeldLogits) {
  // Head dims off the SIMD width and above the kernels' depth block (128 or 256), E over two
  // panels, empty / small / full / separate selections.
  struct Shape {
    int n, d, dv, s, E;
  };
  for (const Shape sh : {Shape{300, 20, 13, 8, 70}, Shape{400, 260, 7, 0, 130},
                         Shape{64, 3, 5, 4, 8}, Shape{200, 64, 64, 16, 64}}) {
    SCOPED_TRACE("n=" + std::to_string(sh.n) + " d=" + std::to_string(sh.d));
    const LayerData L = make_layer(0, sh.n, sh.d, sh.dv, 1, 3, 11);
    const auto q = reference_queries(L, 0);
    const ExactReference full(q, L.keys[0], L.values[0], sh.s, sh.E);
    ASSERT_TRUE(full.has_logits());
    const ExactReference built = ExactReference::build(
        pointers(q), L.keys[0].data(), L.values[0].data(), sh.n, sh.d, sh.dv, sh.s, sh.E, false);
    ASSERT_FALSE(built.has_logits());
    const ExactReference compact(full.side(), pointers(q), L.keys[0].data(), L.values[0].data(),
                                 false);
    const ExactReference relogit(built.side(), pointers(q), L.keys[0].data(), L.values[0].data(),
                                 true);
    ASSERT_TRUE(relogit.has_logits());
    const int mid = sh.n - sh.s - sh.E;
    for (const Selection& sel : {random_selection(sh.n, sh.s, sh.E, 0, false, 1),
                                 random_selection(sh.n, sh.s, sh.E, mid / 4, false, 2),
                                 random_selection(sh.n, sh.s, sh.E, mid, false, 3),
                                 random_selection(sh.n, sh.s, sh.E, mid / 3, true, 4)}) {
      const Errors want = full.evaluate(sel);
      expect_identical(built.evaluate(sel), want);
      expect_identical(compact.evaluate(sel), want);
      expect_identical(relogit.evaluate(sel), want);
    }
    // The exact sides agree too, and the approximation of one query.
    for (int h = 0; h < 3; ++h)
      for (int e = 0; e < sh.E; ++e) EXPECT_EQ(full.exact_output(h, e), built.exact_output(h, e));
    const Selection sel = random_selection(sh.n, sh.s, sh.E, mid / 2, false, 5);
    const int j = sh.n - 1;
    EXPECT_EQ(full.approximation(sel, q[1]->row(j).data(), j),
              compact.approximation(sel, q[1]->row(j).data(), j));
  }
}

TEST(ExactReferenceForms, CompactSideIsSmall) {
  // 4 query heads, E = 256, d_v = 128: about 2 MiB however long the capture (Attn_j and the
  // fixed columns' sums, E x d_v each, and six numbers per row).
  const LayerData L = make_layer(0, 2048, 16, 128, 1, 4, 3);
  const ExactReference r =
      ExactReference::build(pointers(reference_queries(L, 0)), L.keys[0].data(), L.values[0].data(),
                            2048, 16, 128, 64, 256, false);
  EXPECT_GT(r.side()->bytes(), size_t{4 * 256 * 256 * 8});
  EXPECT_LT(r.side()->bytes(), size_t{4 * 256 * 264 * 8});
}

TEST(ExactReferenceForms, SideOfOtherHeadCountIsRefused) {
  const LayerData L = make_layer(0, 100, 8, 8, 1, 2, 3);
  const ExactReference r(reference_queries(L, 0), L.keys[0], L.values[0], 4, 10);
  EXPECT_THROW(
      ExactReference(r.side(), {L.queries[0].data()}, L.keys[0].data(), L.values[0].data(), false),
      std::invalid_argument);
}

TEST(ScratchPool, ReturnedBuffersAreReused) {
  double* first = nullptr;
  {
    scratch::Buffer a(size_t{1} << 20);
    first = a.data();
    a.data()[0] = 1;
  }
  scratch::Buffer b((size_t{1} << 20) - 100);  // fits the returned one
  EXPECT_EQ(b.data(), first);
  scratch::Buffer c(size_t{4} << 20);  // does not: a new one
  EXPECT_NE(c.data(), first);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(c.data()) % 64, 0u);
}

// ---------------------------------------------------------------------------------------------
// The cache

TEST(ReferenceCache, HitScoresIdenticallyToAFreshReference) {
  ReferenceCache cache(size_t{1} << 30);
  const LayerData L = make_layer(2, 256, 16, 12, 2, 2, 7);
  const Selection sel = random_selection(256, 8, 32, 60, false, 9);
  const Errors want = fresh_errors(L, 1, 8, 32, sel);
  for (bool logits : {false, true}) {
    const auto ref = cached_reference(L, 1, 8, 32, logits, nullptr, &cache);
    expect_identical(ref->evaluate(sel), want);
  }
  const ReferenceCacheStats s = cache.stats();
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.entries, 1);
  EXPECT_GT(s.bytes, 0u);
  // The hit held no logits unless asked: a compact reference.
  EXPECT_FALSE(cached_reference(L, 1, 8, 32, false, nullptr, &cache)->has_logits());
  EXPECT_TRUE(cached_reference(L, 1, 8, 32, true, nullptr, &cache)->has_logits());
}

// The disk tier: a second process (a fresh cache on the same folder) reads the reference back
// instead of building it, with identical figures; a damaged file is ignored and replaced, and
// the folder is kept under its budget.
TEST(ReferenceCache, DiskTierReadsBackIdenticallyAndSurvivesDamage) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() /
      ("kvscope_refdisk_" + std::to_string(::getpid()) + "_" +
       std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  const LayerData L = make_layer(2, 256, 16, 12, 2, 2, 7);
  const Selection sel = random_selection(256, 8, 32, 60, false, 9);
  const Errors want = fresh_errors(L, 1, 8, 32, sel);
  {
    ReferenceCache first(size_t{1} << 30);
    first.set_disk(dir.string(), size_t{1} << 30);
    expect_identical(cached_reference(L, 1, 8, 32, false, nullptr, &first)->evaluate(sel), want);
    EXPECT_EQ(first.stats().disk_writes, 1);
    EXPECT_EQ(first.stats().disk_hits, 0);
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].extension(), ".kvref");
  {
    ReferenceCache second(size_t{1} << 30);
    second.set_disk(dir.string(), size_t{1} << 30);
    for (bool logits : {false, true})
      expect_identical(cached_reference(L, 1, 8, 32, logits, nullptr, &second)->evaluate(sel),
                       want);
    EXPECT_EQ(second.stats().disk_hits, 1);
    EXPECT_EQ(second.stats().disk_writes, 0);  // read back, not built
    // Another head is another key: built and written beside it.
    cached_reference(L, 0, 8, 32, false, nullptr, &second);
    EXPECT_EQ(second.stats().disk_writes, 1);
  }
  // A truncated file is not taken: the reference is built again, with the same figures.
  fs::resize_file(files[0], fs::file_size(files[0]) / 2);
  {
    ReferenceCache third(size_t{1} << 30);
    third.set_disk(dir.string(), size_t{1} << 30);
    expect_identical(cached_reference(L, 1, 8, 32, false, nullptr, &third)->evaluate(sel), want);
    EXPECT_EQ(third.stats().disk_hits, 0);
    EXPECT_EQ(third.stats().disk_writes, 1);
  }
  // A budget below one file keeps none.
  {
    ReferenceCache tiny(size_t{1} << 30);
    tiny.set_disk(dir.string(), 1);
    cached_reference(L, 1, 4, 32, false, nullptr, &tiny);
    size_t left = 0;
    for (const auto& e : fs::directory_iterator(dir)) left += e.path().extension() == ".kvref";
    EXPECT_EQ(left, 0u);
  }
  fs::remove_all(dir);
}

// A stored file whose bytes changed on disk (a failing disk, a torn write) is never served: one
// bit flipped anywhere after the key (shapes, any table, the checksum itself) makes the next read
// discard the file, say so in the stats, and build the reference again with the cold figures.
TEST(ReferenceCache, AFlippedBitInAStoredFileIsDiscardedAndTheFiguresComputedCold) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() /
      ("kvscope_refbits_" + std::to_string(::getpid()) + "_" +
       std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  const LayerData L = make_layer(3, 200, 8, 8, 1, 2, 21);
  const Selection sel = random_selection(200, 4, 24, 50, true, 5);
  const Errors cold = fresh_errors(L, 0, 4, 24, sel);
  {
    ReferenceCache writer(size_t{1} << 30);
    writer.set_disk(dir.string(), size_t{1} << 30);
    cached_reference(L, 0, 4, 24, false, nullptr, &writer);
    ASSERT_EQ(writer.stats().disk_writes, 1);
  }
  fs::path file;
  for (const auto& e : fs::directory_iterator(dir)) file = e.path();
  const uintmax_t size = fs::file_size(file);
  std::string pristine(size, '\0');
  {
    std::ifstream in(file, std::ios::binary);
    in.read(pristine.data(), static_cast<std::streamsize>(size));
  }
  // The key text is followed by the shapes (n, d, dv, sink, eval, query heads as int32): the
  // offsets below are past the key: the shapes, a first and a middle table byte, the last table
  // byte, the checksum's first byte.
  const int32_t dims[6] = {200, 8, 8, 4, 24, 2};
  const size_t after_key =
      pristine.find(std::string(reinterpret_cast<const char*>(dims), sizeof dims));
  ASSERT_NE(after_key, std::string::npos);
  for (size_t at :
       {after_key, after_key + 24, (after_key + size) / 2, size_t(size - 9), size_t(size - 8)}) {
    for (int bit : {0, 6}) {
      std::string damaged = pristine;
      damaged[at] = static_cast<char>(damaged[at] ^ (1 << bit));
      {
        std::ofstream out(file, std::ios::binary | std::ios::trunc);
        out.write(damaged.data(), static_cast<std::streamsize>(damaged.size()));
      }
      ReferenceCache reader(size_t{1} << 30);
      reader.set_disk(dir.string(), size_t{1} << 30);
      const std::string what = "byte " + std::to_string(at) + " bit " + std::to_string(bit);
      expect_identical(cached_reference(L, 0, 4, 24, false, nullptr, &reader)->evaluate(sel), cold);
      const ReferenceCacheStats st = reader.stats();
      EXPECT_EQ(st.disk_hits, 0) << what;
      EXPECT_EQ(st.disk_rejected, 1) << what;
      EXPECT_NE(st.last_rejected.find(file.filename().string()), std::string::npos) << what;
      EXPECT_EQ(st.disk_writes, 1) << what << ": built again and written back";
    }
  }
  // The file written back verifies: the next reader takes it.
  ReferenceCache again(size_t{1} << 30);
  again.set_disk(dir.string(), size_t{1} << 30);
  expect_identical(cached_reference(L, 0, 4, 24, false, nullptr, &again)->evaluate(sel), cold);
  EXPECT_EQ(again.stats().disk_hits, 1);
  EXPECT_EQ(again.stats().disk_rejected, 0);
  fs::remove_all(dir);
}

TEST(ReferenceCache, EvictionUnderATinyBudgetKeepsTheFigures) {
  const LayerData L = make_layer(0, 200, 8, 8, 3, 2, 5);
  const Selection sel = random_selection(200, 4, 24, 40, true, 2);
  std::vector<Errors> want;
  for (int kv = 0; kv < 3; ++kv) want.push_back(fresh_errors(L, kv, 4, 24, sel));
  // Room for one entry only: every change of head evicts.
  ReferenceCache probe(size_t{1} << 30);
  const size_t one = cached_reference(L, 0, 4, 24, false, nullptr, &probe)->side()->bytes();
  ReferenceCache cache(one + one / 2);
  for (int round = 0; round < 3; ++round)
    for (int kv = 0; kv < 3; ++kv) {
      expect_identical(cached_reference(L, kv, 4, 24, false, nullptr, &cache)->evaluate(sel),
                       want[kv]);
      const ReferenceCacheStats s = cache.stats();
      EXPECT_LE(s.bytes, s.budget);
      EXPECT_LE(s.entries, 1);
    }
  EXPECT_EQ(cache.stats().misses, 9);
  EXPECT_EQ(cache.stats().evictions, 8);
  // Budget 0 keeps nothing and still scores correctly.
  ReferenceCache none(0);
  expect_identical(cached_reference(L, 2, 4, 24, false, nullptr, &none)->evaluate(sel), want[2]);
  EXPECT_EQ(none.stats().entries, 0);
  // Shrinking the budget evicts down to it.
  ReferenceCache big(size_t{1} << 30);
  for (int kv = 0; kv < 3; ++kv) cached_reference(L, kv, 4, 24, false, nullptr, &big);
  EXPECT_EQ(big.stats().entries, 3);
  big.set_budget(one * 2);
  EXPECT_EQ(big.stats().entries, 2);
  // The least recently used went first: head 0.
  cached_reference(L, 2, 4, 24, false, nullptr, &big);
  cached_reference(L, 1, 4, 24, false, nullptr, &big);
  EXPECT_EQ(big.stats().misses, 3);
  cached_reference(L, 0, 4, 24, false, nullptr, &big);
  EXPECT_EQ(big.stats().misses, 4);
}

TEST(ReferenceCache, ConcurrentRequestsBuildOnce) {
  ReferenceCache cache(size_t{1} << 30);
  const LayerData L = make_layer(0, 128, 8, 8, 1, 1, 5);
  const ReferenceKey key = reference_key(L, 0, 4, 16);
  std::atomic<int> builds{0};
  const auto side = std::make_shared<const ExactSide>(
      *ExactReference(reference_queries(L, 0), L.keys[0], L.values[0], 4, 16).side());
  std::vector<std::thread> threads;
  std::vector<const ExactSide*> got(8, nullptr);
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      got[t] = cache
                   .get(key,
                        [&] {
                          ++builds;
                          std::this_thread::sleep_for(std::chrono::milliseconds(200));
                          return side;
                        })
                   .get();
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(builds.load(), 1);
  for (const ExactSide* g : got) EXPECT_EQ(g, side.get());
  const ReferenceCacheStats s = cache.stats();
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.waits + s.hits, 7);
  EXPECT_GT(s.waits, 0);  // the others came during the 200 ms build

  // Through cached_reference on real threads: one build, identical figures everywhere.
  ReferenceCache c2(size_t{1} << 30);
  const LayerData big = make_layer(0, 1500, 32, 32, 1, 4, 8);
  const Selection sel = random_selection(1500, 16, 128, 300, false, 3);
  const Errors want = fresh_errors(big, 0, 16, 128, sel);
  std::vector<Errors> res(4);
  threads.clear();
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      res[t] = cached_reference(big, 0, 16, 128, t % 2 == 1, nullptr, &c2)->evaluate(sel);
    });
  for (auto& th : threads) th.join();
  for (const Errors& r : res) expect_identical(r, want);
  EXPECT_EQ(c2.stats().misses, 1);
}

TEST(ReferenceCache, CancelStopsAWaitAndAFailedBuildIsRetried) {
  ReferenceCache cache(size_t{1} << 30);
  const LayerData L = make_layer(0, 128, 8, 8, 1, 1, 5);
  const ReferenceKey key = reference_key(L, 0, 4, 16);
  const auto side = std::make_shared<const ExactSide>(
      *ExactReference(reference_queries(L, 0), L.keys[0], L.values[0], 4, 16).side());
  std::atomic<bool> release{false}, builder_cancel{false};
  std::thread builder([&] {
    EXPECT_THROW(cache.get(
                     key,
                     [&]() -> std::shared_ptr<const ExactSide> {
                       while (!release.load())
                         std::this_thread::sleep_for(std::chrono::milliseconds(5));
                       throw Cancelled();  // as a build that saw its cancel flag
                     },
                     &builder_cancel),
                 Cancelled);
  });
  while (cache.stats().misses == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // A waiter whose own flag is set stops waiting at once.
  std::atomic<bool> cancel{false};
  std::thread waiter([&] {
    EXPECT_THROW(cache.get(
                     key, [&] { return side; }, &cancel),
                 Cancelled);
  });
  // A second waiter, not cancelled, builds it itself once the first build gives up.
  std::atomic<int> second_builds{0};
  std::shared_ptr<const ExactSide> got;
  std::thread patient([&] {
    got = cache.get(key, [&] {
      ++second_builds;
      return side;
    });
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  cancel = true;
  waiter.join();
  release = true;
  builder.join();
  patient.join();
  EXPECT_EQ(got.get(), side.get());
  EXPECT_EQ(second_builds.load(), 1);
  EXPECT_EQ(cache.stats().entries, 1);
}

TEST(ReferenceCache, ACancelledBuildLeavesNothingBehind) {
  ReferenceCache cache(size_t{1} << 30);
  const LayerData L = make_layer(0, 300, 8, 8, 1, 2, 5);
  std::atomic<bool> cancel{true};
  EXPECT_THROW(ExactReference::build(pointers(reference_queries(L, 0)), L.keys[0].data(),
                                     L.values[0].data(), 300, 8, 8, 4, 32, true, &cancel),
               Cancelled);
  EXPECT_THROW(cached_reference(L, 0, 4, 32, false, &cancel, &cache), Cancelled);
  EXPECT_EQ(cache.stats().entries, 0);
  // Asked again without the flag: built, and as a fresh reference scores.
  const Selection sel = random_selection(300, 4, 32, 50, false, 6);
  expect_identical(cached_reference(L, 0, 4, 32, false, nullptr, &cache)->evaluate(sel),
                   fresh_errors(L, 0, 4, 32, sel));
  EXPECT_EQ(cache.stats().entries, 1);
}

TEST(ReferenceCache, KeyHoldsEverythingTheExactSideDependsOn) {
  const LayerData L = make_layer(3, 160, 8, 6, 2, 2, 21);
  const ReferenceKey base = reference_key(L, 0, 8, 32);
  EXPECT_EQ(base, reference_key(L, 0, 8, 32));  // deterministic
  EXPECT_NE(base, reference_key(L, 1, 8, 32));  // kv head
  EXPECT_NE(base, reference_key(L, 0, 9, 32));  // sink
  EXPECT_NE(base, reference_key(L, 0, 8, 31));  // eval
  LayerData other_layer = L;
  other_layer.layer = 4;
  EXPECT_NE(base, reference_key(other_layer, 0, 8, 32));  // layer
  LayerData key_edit = L, value_edit = L, query_edit = L, early_query_edit = L;
  key_edit.keys[0](5, 2) += 1e-3f;
  value_edit.values[0](150, 1) += 1e-3f;
  query_edit.queries[1](159, 0) += 1e-3f;       // an evaluation row of kv head 0's group
  early_query_edit.queries[1](10, 0) += 1e-3f;  // a row the exact side never reads
  EXPECT_NE(base.content, reference_key(key_edit, 0, 8, 32).content);
  EXPECT_NE(base.content, reference_key(value_edit, 0, 8, 32).content);
  EXPECT_NE(base.content, reference_key(query_edit, 0, 8, 32).content);
  EXPECT_EQ(base, reference_key(early_query_edit, 0, 8, 32));
  LayerData proxy = L;  // no queries: the keys stand in
  proxy.queries.clear();
  const ReferenceKey pk = reference_key(proxy, 0, 8, 32);
  EXPECT_NE(base, pk);
  EXPECT_TRUE(pk.proxy_queries);
  EXPECT_EQ(pk.query_heads, 1);
  EXPECT_EQ(base.kernels, simd::kernels().name);
}

// Behaviour, not just keys: each variant asked of one cache after the base gives the figures of
// a fresh reference of that variant (a key field left out would return the base's side).
TEST(ReferenceCache, EveryVariantMissesAndScoresAsFresh) {
  ReferenceCache cache(size_t{1} << 30);
  const LayerData L = make_layer(3, 160, 8, 6, 2, 2, 21);
  const Selection sel = random_selection(160, 9, 32, 40, false, 4);
  auto check = [&](const LayerData& layer, int kv, int s, int E, const char* what) {
    SCOPED_TRACE(what);
    const long long misses = cache.stats().misses;
    expect_identical(cached_reference(layer, kv, s, E, false, nullptr, &cache)->evaluate(sel),
                     fresh_errors(layer, kv, s, E, sel));
    EXPECT_EQ(cache.stats().misses, misses + 1);
  };
  check(L, 0, 8, 32, "base");
  check(L, 1, 8, 32, "kv head");
  check(L, 0, 9, 32, "sink");
  check(L, 0, 8, 31, "eval");
  LayerData v = L;
  v.values[0](100, 2) *= 3;
  check(v, 0, 8, 32, "values");
  LayerData q = L;
  q.queries[0].row(150) *= 2;
  check(q, 0, 8, 32, "queries");
  LayerData proxy = L;
  proxy.queries.clear();
  check(proxy, 0, 8, 32, "proxy queries");
  // The same again: all hits now.
  const long long misses = cache.stats().misses;
  expect_identical(cached_reference(v, 0, 8, 32, false, nullptr, &cache)->evaluate(sel),
                   fresh_errors(v, 0, 8, 32, sel));
  EXPECT_EQ(cache.stats().misses, misses);
}

TEST(ReferenceCache, ContentHashSeesEveryByte) {
  std::vector<unsigned char> a(1000, 7);
  const uint64_t h = content_hash(a.data(), a.size());
  for (size_t i : {size_t{0}, size_t{31}, size_t{32}, size_t{990}, size_t{999}}) {
    std::vector<unsigned char> b = a;
    b[i] ^= 1;
    EXPECT_NE(content_hash(b.data(), b.size()), h) << "byte " << i;
  }
  EXPECT_NE(content_hash(a.data(), 999), h);
  EXPECT_NE(content_hash(a.data(), a.size(), 1), h);
}

// ---------------------------------------------------------------------------------------------
// Through the protocol

using ::kvscope::testing::MemoryCapture;

MemoryCapture make_capture(int n, int layers, int kv_heads, int group, uint32_t seed) {
  CaptureData data;
  data.info.path = "memory";
  data.info.num_layers = layers;
  data.info.q_heads = kv_heads * group;
  data.info.kv_heads = kv_heads;
  data.info.head_dim = 16;
  data.info.value_dim = 16;
  data.info.num_tokens = n;
  data.info.has_queries = true;
  for (int l = 0; l < layers; ++l)
    data.layers.push_back(make_layer(l, n, 16, 16, kv_heads, group, seed + l));
  return MemoryCapture(std::move(data));
}

TEST(ReferenceCache, RunEvalAndRunHeadReuseItWithIdenticalFigures) {
  MemoryCapture cap = make_capture(600, 2, 2, 2, 31);
  EvalSpec spec;
  spec.methods = {find_method("uniform"), find_method("balancekv")};
  spec.ratios = {0.25, 0.5};
  spec.seeds = 2;
  spec.threads = 2;
  ReferenceCache::global().clear();
  const ReferenceCacheStats before = ReferenceCache::global().stats();
  const EvalReport cold_report = run_eval(cap, spec);
  const std::string cold = cold_report.to_json().dump();
  const ReferenceCacheStats mid = ReferenceCache::global().stats();
  EXPECT_EQ(mid.misses - before.misses, 4);  // 2 layers x 2 kv heads
  // The cold work is reported apart (the app's cost model keeps it out of the methods' costs).
  EXPECT_EQ(cold_report.exact_builds, 4);
  EXPECT_GT(cold_report.exact_build_seconds, 0.0);
  const EvalReport warm_report = run_eval(cap, spec);
  EXPECT_EQ(warm_report.exact_builds, 0);
  EXPECT_EQ(warm_report.exact_build_seconds, 0.0);
  const std::string warm = warm_report.to_json().dump();
  const ReferenceCacheStats after = ReferenceCache::global().stats();
  EXPECT_EQ(after.misses, mid.misses);
  EXPECT_EQ(after.hits - mid.hits, 4);
  EXPECT_EQ(cold, warm);
  // A different parameter: the cache still serves, figures as a cold run's.
  spec.params["balancekv"] = {{"gamma", 3.0}};
  const std::string warm_gamma = run_eval(cap, spec).to_json().dump();
  ReferenceCache::global().clear();
  EXPECT_EQ(run_eval(cap, spec).to_json().dump(), warm_gamma);
  // run_head: hit or miss, the figures of a fresh reference.
  MethodSettings s;
  s.method = find_method("balancekv");
  s.keep_ratio = 0.25;
  const auto layer = cap.layer(1);
  const HeadRun first = run_head(*layer, 2, 1, s, 4);
  const HeadRun again = run_head(*layer, 2, 1, s, 4);
  const EvalWindow w = EvalWindow::make(600, 0.25);
  const Errors fresh = fresh_errors(*layer, 1, w.sink, w.eval, first.selection);
  expect_identical(first.per_query_head, fresh);
  expect_identical(again.per_query_head, fresh);
}

}  // namespace
}  // namespace kvscope
