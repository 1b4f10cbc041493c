// The exact reference cache (docs/performance.md, "Exact reference cache"): the exact side of the
// errors of one (layer, kv head, window) does not depend on the method, keep ratio, seed or any
// parameter, so it is computed once per capture and kept, in compact form
// (engine/attention/exact_attention.h, ExactSide: about 1 MiB per kv head of Llama-3-8B's shapes),
// for every later run: run_eval (eval, sweep, the app's grid and sweep jobs) and run_head (the
// app's focused runs) score against it. Process-wide, least recently used first out under a byte
// budget, thread-safe; two threads asking for the same key build it once (the second waits, and its
// own cancel flag still stops the wait). Figures are identical bit for bit to a fresh reference's.
#pragma once

#include <atomic>
#include <compare>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "engine/attention/exact_attention.h"
#include "engine/io/capture.h"

namespace kvscope {

// Everything the exact side depends on. `content` hashes the bytes of the keys, the values and
// the evaluation rows of the queries (the keys' when the capture has none), so that a different
// capture, layer, head or edited tensor never matches; the rest names the shapes, the window,
// which queries are used and the SIMD table (whose rounding the figures carry).
struct ReferenceKey {
  uint64_t content = 0;
  int layer = 0, kv_head = 0;
  int n = 0, d = 0, dv = 0, sink = 0, eval = 0;
  int query_heads = 0;
  bool proxy_queries = false;  // the keys stand in for queries
  std::string kernels;         // simd::kernels().name
  auto operator<=>(const ReferenceKey&) const = default;
};

// 64-bit hash of `bytes` bytes (four independent multiply-rotate lanes, about 10 GB/s).
uint64_t content_hash(const void* data, size_t bytes, uint64_t seed = 0);

// The key of kv head `kv` of `layer` with sink s and eval E. Throws std::invalid_argument on a
// head out of range or inconsistent shapes.
ReferenceKey reference_key(const LayerData& layer, int kv, int sink, int eval);

struct ReferenceCacheStats {
  size_t bytes = 0, budget = 0;  // held, allowed
  int entries = 0;
  long long hits = 0;       // found ready
  long long misses = 0;     // built
  long long waits = 0;      // found being built by another thread, waited for it
  long long evictions = 0;  // dropped for the budget
  // The disk tier (set_disk): entries read back from disk instead of built, written, and the
  // folder in use ("" when off).
  long long disk_hits = 0, disk_writes = 0;
  // Files found under a key's name and thrown away: another key's, truncated, of another shape,
  // or failing their checksum (a flipped bit on disk); each is then built again.
  long long disk_rejected = 0;
  std::string last_rejected;  // the last such file and why
  std::string disk_dir;
};

class ReferenceCache {
 public:
  explicit ReferenceCache(size_t budget_bytes);
  // The one every run uses. Budget: default_budget() at first use.
  static ReferenceCache& global();
  // 1 GiB, or KVSCOPE_REFERENCE_CACHE_MB (MiB) from the environment.
  static size_t default_budget();

  // Drops least recently used entries until the rest fit. 0: nothing is kept (builds in flight
  // are still shared).
  void set_budget(size_t bytes);
  ReferenceCacheStats stats() const;
  void clear();  // drops every entry (not the counters)

  // The disk tier: a miss first looks in `dir` for the entry (one file per key, named by a hash
  // of the whole key and holding the key itself, so reopening a capture finds its references
  // instead of computing them again) and a build is written there (atomically: a temporary
  // file renamed). The folder is kept under `budget_bytes`, oldest files out. Every file ends
  // with a checksum of everything after its key (content_hash, XXH64, over the shapes and the
  // tables), checked on every read: a file that does not hold the key or its shapes, or does not
  // verify, is removed and counted (stats().disk_rejected) and the reference built again. A
  // folder that cannot be written only stops the writes. "" turns the tier off (the default).
  void set_disk(const std::string& dir, size_t budget_bytes);
  // The folder the app and the CLI use: $KVSCOPE_CACHE_DIR, else $XDG_CACHE_HOME/kvscope, else
  // ~/.cache/kvscope, with /reference appended; "" when KVSCOPE_CACHE_DIR is "off" or no home is
  // known. 2 GiB.
  static std::string default_disk_dir();
  static constexpr size_t kDefaultDiskBudget = size_t{2} << 30;

  using BuildFn = std::function<std::shared_ptr<const ExactSide>()>;
  // The entry of `key`: found (a hit), or made by `build` (a miss) and kept when it fits the
  // budget. While one thread builds a key, others asking for it wait for that build; if it
  // throws (or is cancelled) they try again themselves. A set `cancel` stops a wait with
  // Cancelled; `build` is expected to watch the same flag.
  std::shared_ptr<const ExactSide> get(const ReferenceKey& key, const BuildFn& build,
                                       const std::atomic<bool>* cancel = nullptr);

 private:
  struct Entry {
    std::shared_ptr<const ExactSide> side;
    size_t bytes = 0;
    std::list<ReferenceKey>::iterator lru;
  };
  struct Pending;
  void insert_locked(const ReferenceKey& key, std::shared_ptr<const ExactSide> side);
  void evict_locked();
  std::shared_ptr<const ExactSide> read_disk(const ReferenceKey& key);
  void write_disk(const ReferenceKey& key, const ExactSide& side);

  mutable std::mutex mu_;
  size_t budget_ = 0, bytes_ = 0;
  std::list<ReferenceKey> lru_;  // most recently used first
  std::map<ReferenceKey, Entry> ready_;
  std::map<ReferenceKey, std::shared_ptr<Pending>> pending_;
  long long hits_ = 0, misses_ = 0, waits_ = 0, evictions_ = 0;
  std::string disk_dir_;
  size_t disk_budget_ = 0;
  long long disk_hits_ = 0, disk_writes_ = 0, disk_rejected_ = 0;
  std::string last_rejected_;
};

// The exact reference of kv head `kv` of `layer` over sink s and eval E, through `cache` (the
// global one when null), borrowing the layer's tensors (the layer must outlive it). On a miss it
// is built here and keeps the logits of every key it computed; on a hit it scores from the cached
// side, computing the logits of every key only when `want_logits` (many selections to score;
// otherwise each selection computes its kept tokens' logits). A set cancel flag throws Cancelled.
// `built_seconds`, when given, receives the seconds this call spent building the exact side
// (0 when it was found in memory or on disk, or built by another thread): what a cost model
// counts as cold work, apart from scoring against a side in hand.
std::unique_ptr<ExactReference> cached_reference(const LayerData& layer, int kv, int sink, int eval,
                                                 bool want_logits,
                                                 const std::atomic<bool>* cancel = nullptr,
                                                 ReferenceCache* cache = nullptr,
                                                 double* built_seconds = nullptr);

}  // namespace kvscope
