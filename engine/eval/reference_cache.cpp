#include "engine/eval/reference_cache.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <thread>

#include "engine/core/error.h"
#include "engine/core/simd.h"

namespace kvscope {

namespace {

constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull, kP2 = 0xC2B2AE3D27D4EB4Full,
                   kP3 = 0x165667B19E3779F9ull, kP4 = 0x85EBCA77C2B2AE63ull;

inline uint64_t rotl(uint64_t x, int r) {
  return (x << r) | (x >> (64 - r));
}
inline uint64_t round64(uint64_t acc, uint64_t w) {
  return rotl(acc + w * kP2, 31) * kP1;
}
inline uint64_t load64(const unsigned char* p) {
  uint64_t w;
  std::memcpy(&w, p, sizeof w);
  return w;
}

}  // namespace

uint64_t content_hash(const void* data, size_t bytes, uint64_t seed) {
  // The rounds of XXH64: four lanes of 8 bytes each per 32-byte stripe, merged at the end.
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t a0 = seed + kP1 + kP2, a1 = seed + kP2, a2 = seed, a3 = seed - kP1;
  size_t i = 0;
  for (; i + 32 <= bytes; i += 32) {
    a0 = round64(a0, load64(p + i));
    a1 = round64(a1, load64(p + i + 8));
    a2 = round64(a2, load64(p + i + 16));
    a3 = round64(a3, load64(p + i + 24));
  }
  uint64_t h = rotl(a0, 1) + rotl(a1, 7) + rotl(a2, 12) + rotl(a3, 18);
  for (uint64_t a : {a0, a1, a2, a3}) h = (h ^ round64(0, a)) * kP1 + kP4;
  h += bytes;
  for (; i + 8 <= bytes; i += 8) h = rotl(h ^ round64(0, load64(p + i)), 27) * kP1 + kP4;
  for (; i < bytes; ++i) h = rotl(h ^ (p[i] * kP3), 11) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

ReferenceKey reference_key(const LayerData& layer, int kv, int sink, int eval) {
  if (kv < 0 || kv >= static_cast<int>(layer.keys.size()) ||
      kv >= static_cast<int>(layer.values.size()))
    throw std::invalid_argument("reference: kv head " + std::to_string(kv) + " out of range");
  const MatrixF& K = layer.keys[kv];
  const MatrixF& V = layer.values[kv];
  const std::vector<const MatrixF*> queries = reference_queries(layer, kv);
  ReferenceKey key;
  key.layer = layer.layer;
  key.kv_head = kv;
  key.n = static_cast<int>(K.rows());
  key.d = static_cast<int>(K.cols());
  key.dv = static_cast<int>(V.cols());
  key.sink = sink;
  key.eval = eval;
  key.query_heads = static_cast<int>(queries.size());
  key.proxy_queries = layer.queries.empty();
  key.kernels = simd::kernels().name;
  if (V.rows() != K.rows())
    throw std::invalid_argument("reference: " + std::to_string(K.rows()) + " keys but " +
                                std::to_string(V.rows()) + " values");
  for (const MatrixF* q : queries)
    if (q->rows() != K.rows() || q->cols() != K.cols())
      throw std::invalid_argument("reference: queries are " + std::to_string(q->rows()) + "x" +
                                  std::to_string(q->cols()) + ", keys " + std::to_string(K.rows()) +
                                  "x" + std::to_string(K.cols()));
  uint64_t h = content_hash(K.data(), sizeof(float) * static_cast<size_t>(K.size()), 1);
  h = content_hash(V.data(), sizeof(float) * static_cast<size_t>(V.size()), h);
  // Only the evaluation rows of the queries enter the exact side.
  const long rows = std::clamp<long>(eval, 0, K.rows());
  for (const MatrixF* q : queries)
    h = content_hash(q->data() + (q->rows() - rows) * q->cols(),
                     sizeof(float) * static_cast<size_t>(rows * q->cols()), h);
  key.content = h;
  return key;
}

struct ReferenceCache::Pending {
  std::promise<std::shared_ptr<const ExactSide>> promise;
  std::shared_future<std::shared_ptr<const ExactSide>> future = promise.get_future().share();
};

ReferenceCache::ReferenceCache(size_t budget_bytes) : budget_(budget_bytes) {}

size_t ReferenceCache::default_budget() {
  if (const char* mb = std::getenv("KVSCOPE_REFERENCE_CACHE_MB")) {
    char* end = nullptr;
    const double v = std::strtod(mb, &end);
    if (end != mb && *end == '\0' && v >= 0 && v < 1e9) return static_cast<size_t>(v * (1 << 20));
  }
  return size_t{1} << 30;
}

ReferenceCache& ReferenceCache::global() {
  static ReferenceCache* cache = new ReferenceCache(default_budget());  // outlives every thread
  return *cache;
}

void ReferenceCache::set_budget(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  budget_ = bytes;
  evict_locked();
}

ReferenceCacheStats ReferenceCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ReferenceCacheStats s;
  s.bytes = bytes_;
  s.budget = budget_;
  s.entries = static_cast<int>(ready_.size());
  s.hits = hits_;
  s.misses = misses_;
  s.waits = waits_;
  s.evictions = evictions_;
  s.disk_hits = disk_hits_;
  s.disk_writes = disk_writes_;
  s.disk_rejected = disk_rejected_;
  s.last_rejected = last_rejected_;
  s.disk_dir = disk_dir_;
  return s;
}

// ---- the disk tier

namespace {

namespace fs = std::filesystem;

// The whole key as text: written at the head of its file and compared on reading, so a file
// found under a colliding name is never taken for another key's.
std::string key_text(const ReferenceKey& k) {
  std::ostringstream o;
  o << "kvscope-reference/3 content=" << k.content << " layer=" << k.layer << " kv=" << k.kv_head
    << " n=" << k.n << " d=" << k.d << " dv=" << k.dv << " sink=" << k.sink << " eval=" << k.eval
    << " qh=" << k.query_heads << " proxy=" << k.proxy_queries << " kernels=" << k.kernels;
  return o.str();
}

std::string key_file(const std::string& dir, const ReferenceKey& k) {
  const std::string text = key_text(k);
  char name[40];
  std::snprintf(name, sizeof name, "%016llx.kvref",
                static_cast<unsigned long long>(content_hash(text.data(), text.size())));
  return (fs::path(dir) / name).string();
}

// Blocks are read and written through the file's running checksum (content_hash chained from
// one block to the next, seeded with the shapes' hash).
template <class M>
bool read_block(std::istream& in, M& m, long rows, long cols, uint64_t& sum) {
  m.resize(rows, cols);
  const size_t bytes = sizeof(double) * static_cast<size_t>(rows) * static_cast<size_t>(cols);
  in.read(reinterpret_cast<char*>(m.data()), static_cast<std::streamsize>(bytes));
  sum = content_hash(m.data(), bytes, sum);
  return static_cast<bool>(in);
}

template <class M>
void write_block(std::ostream& out, const M& m, uint64_t& sum) {
  const size_t bytes = sizeof(double) * static_cast<size_t>(m.size());
  out.write(reinterpret_cast<const char*>(m.data()), static_cast<std::streamsize>(bytes));
  sum = content_hash(m.data(), bytes, sum);
}

// Every table of one query head, in file order.
template <class Head, class Fn>
void each_table(Head& h, Fn&& fn) {
  fn(h.exact, true);
  fn(h.shift, false);
  fn(h.norm, false);
  fn(h.softmax_norm, false);
  fn(h.v_frob, false);
  fn(h.fixed_num, true);
  fn(h.fixed_max, false);
  fn(h.fixed_sum, false);
}

// Oldest files out until the folder's .kvref files fit `budget`.
void trim_folder(const std::string& dir, size_t budget) {
  std::error_code ec;
  std::vector<std::pair<fs::file_time_type, fs::path>> files;
  uintmax_t total = 0;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() != ".kvref") continue;
    const uintmax_t size = e.file_size(ec);
    if (ec) continue;
    total += size;
    files.emplace_back(e.last_write_time(ec), e.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& [when, path] : files) {
    if (total <= budget) break;
    const uintmax_t size = fs::file_size(path, ec);
    if (fs::remove(path, ec)) total -= size;
  }
}

}  // namespace

void ReferenceCache::set_disk(const std::string& dir, size_t budget_bytes) {
  std::error_code ec;
  if (!dir.empty()) fs::create_directories(dir, ec);
  std::lock_guard<std::mutex> lock(mu_);
  disk_dir_ = ec ? std::string() : dir;
  disk_budget_ = budget_bytes;
}

std::string ReferenceCache::default_disk_dir() {
  std::string base;
  if (const char* d = std::getenv("KVSCOPE_CACHE_DIR")) {
    if (std::string(d) == "off") return "";
    base = d;
  } else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) {
    base = (fs::path(x) / "kvscope").string();
  } else if (const char* h = std::getenv("HOME"); h && *h) {
    base = (fs::path(h) / ".cache" / "kvscope").string();
  } else {
    return "";
  }
  return (fs::path(base) / "reference").string();
}

std::shared_ptr<const ExactSide> ReferenceCache::read_disk(const ReferenceKey& key) {
  std::string dir;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dir = disk_dir_;
  }
  if (dir.empty()) return nullptr;
  const std::string path = key_file(dir, key);
  std::ifstream in(path, std::ios::binary);
  if (!in) return nullptr;
  const std::string want = key_text(key);
  std::string got(want.size(), '\0');
  in.read(got.data(), static_cast<std::streamsize>(got.size()));
  auto side = std::make_shared<ExactSide>();
  int32_t dims[6] = {};
  const char* why = nullptr;
  if (!in || got != want || !in.read(reinterpret_cast<char*>(dims), sizeof dims))
    why = "it holds another key";
  else if (dims[0] != key.n || dims[1] != key.d || dims[2] != key.dv || dims[3] != key.sink ||
           dims[4] != key.eval || dims[5] != key.query_heads)
    why = "its shapes are not the key's";
  if (!why) {
    side->n = key.n, side->d = key.d, side->dv = key.dv, side->sink = key.sink;
    side->eval = key.eval;
    side->heads.resize(static_cast<size_t>(key.query_heads));
    uint64_t sum = content_hash(dims, sizeof dims);
    bool ok = true;
    for (ExactSide::Head& h : side->heads)
      each_table(h, [&](auto& m, bool wide) {
        ok = ok && read_block(in, m, key.eval, wide ? key.dv : 1, sum);
      });
    uint64_t stored = 0;
    ok = ok && in.read(reinterpret_cast<char*>(&stored), sizeof stored);
    if (!ok || in.peek() != std::char_traits<char>::eof())
      why = "it is truncated or longer than its shapes";
    else if (stored != sum)
      why = "its checksum does not match (the file changed on disk)";
  }
  if (why) {  // not ours to keep: removed, and the reference is built again
    in.close();
    std::error_code ec;
    fs::remove(path, ec);
    std::lock_guard<std::mutex> lock(mu_);
    ++disk_rejected_;
    last_rejected_ = path + ": " + why;
    return nullptr;
  }
  std::error_code ec;
  fs::last_write_time(path, fs::file_time_type::clock::now(), ec);  // recently used: kept longer
  std::lock_guard<std::mutex> lock(mu_);
  ++disk_hits_;
  return side;
}

void ReferenceCache::write_disk(const ReferenceKey& key, const ExactSide& side) {
  std::string dir;
  size_t budget = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dir = disk_dir_;
    budget = disk_budget_;
  }
  if (dir.empty()) return;
  const std::string path = key_file(dir, key);
  const std::string tmp = path + ".tmp" + std::to_string(::getpid()) + "." +
                          std::to_string(std::hash<std::thread::id>()(std::this_thread::get_id()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    const std::string text = key_text(key);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    const int32_t dims[6] = {side.n,    side.d,    side.dv,
                             side.sink, side.eval, static_cast<int32_t>(side.heads.size())};
    out.write(reinterpret_cast<const char*>(dims), sizeof dims);
    uint64_t sum = content_hash(dims, sizeof dims);
    for (const ExactSide::Head& h : side.heads)
      each_table(h, [&](const auto& m, bool) { write_block(out, m, sum); });
    out.write(reinterpret_cast<const char*>(&sum), sizeof sum);
    if (!out) {
      out.close();
      std::error_code ec;
      fs::remove(tmp, ec);
      return;  // a full or read-only folder stops the writes, never the run
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return;
  }
  trim_folder(dir, budget);
  std::lock_guard<std::mutex> lock(mu_);
  ++disk_writes_;
}

void ReferenceCache::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  ready_.clear();
  lru_.clear();
  bytes_ = 0;
}

void ReferenceCache::evict_locked() {
  while (bytes_ > budget_ && !lru_.empty()) {
    auto it = ready_.find(lru_.back());
    bytes_ -= it->second.bytes;
    ready_.erase(it);
    lru_.pop_back();
    ++evictions_;
  }
}

void ReferenceCache::insert_locked(const ReferenceKey& key, std::shared_ptr<const ExactSide> side) {
  const size_t bytes = side->bytes();
  if (bytes > budget_ || ready_.count(key)) return;
  lru_.push_front(key);
  ready_[key] = Entry{std::move(side), bytes, lru_.begin()};
  bytes_ += bytes;
  evict_locked();
}

std::shared_ptr<const ExactSide> ReferenceCache::get(const ReferenceKey& key, const BuildFn& build,
                                                     const std::atomic<bool>* cancel) {
  for (;;) {
    std::shared_ptr<Pending> pending;
    bool builder = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = ready_.find(key); it != ready_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second.lru);
        ++hits_;
        return it->second.side;
      }
      if (auto it = pending_.find(key); it != pending_.end()) {
        pending = it->second;
        ++waits_;
      } else {
        pending = std::make_shared<Pending>();
        pending_[key] = pending;
        builder = true;
        ++misses_;
      }
    }
    if (builder) {
      std::shared_ptr<const ExactSide> side;
      try {
        side = read_disk(key);
        if (!side) {
          side = build();
          if (!side) throw std::logic_error("reference cache: the build returned nothing");
          write_disk(key, *side);
        }
      } catch (...) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          pending_.erase(key);
        }
        pending->promise.set_exception(std::current_exception());
        throw;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        pending_.erase(key);
        insert_locked(key, side);
      }
      pending->promise.set_value(side);
      return side;
    }
    // Another thread builds it: wait, watching our own cancel flag.
    while (pending->future.wait_for(std::chrono::milliseconds(20)) != std::future_status::ready)
      if (cancel && cancel->load()) throw Cancelled();
    try {
      return pending->future.get();
    } catch (...) {
      // That build failed or was cancelled: ask again (and build it here if nobody else does).
      if (cancel && cancel->load()) throw Cancelled();
    }
  }
}

std::unique_ptr<ExactReference> cached_reference(const LayerData& layer, int kv, int sink, int eval,
                                                 bool want_logits, const std::atomic<bool>* cancel,
                                                 ReferenceCache* cache, double* built_seconds) {
  ReferenceCache& c = cache ? *cache : ReferenceCache::global();
  if (built_seconds) *built_seconds = 0;
  const ReferenceKey key = reference_key(layer, kv, sink, eval);
  const MatrixF& K = layer.keys[kv];
  const MatrixF& V = layer.values[kv];
  std::vector<const float*> queries;
  for (const MatrixF* q : reference_queries(layer, kv)) queries.push_back(q->data());
  std::unique_ptr<ExactReference> built;
  std::shared_ptr<const ExactSide> side = c.get(
      key,
      [&] {
        const auto t0 = std::chrono::steady_clock::now();
        built = std::make_unique<ExactReference>(ExactReference::build(
            queries, K.data(), V.data(), key.n, key.d, key.dv, sink, eval, true, cancel));
        if (built_seconds)
          *built_seconds =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        return built->side();
      },
      cancel);
  if (built) return built;
  return std::make_unique<ExactReference>(std::move(side), queries, K.data(), V.data(),
                                          want_logits);
}

}  // namespace kvscope
