// The backend registry, the CPU backend and the CPU fallback around device backends
// (engine/ops/backend.h). No kernels/ header here: device backends register themselves.
#include "engine/ops/backend.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <type_traits>
#include <utility>

#include "engine/core/error.h"

namespace kvscope {
namespace {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  void walk_blocks(const WalkBatch& b) override { cpu_walk_blocks(b); }
  void attention_errors(const ErrorBatch& b) override { cpu_attention_errors(b); }
  double tsne_gradient(const TsneGradInput& in, float* grad) override {
    return cpu_tsne_gradient(in, grad);
  }
  std::vector<int> kcenter(const float* x, int n, int d, int k, int first) override {
    return cpu_kcenter(x, n, d, k, first);
  }
  void attention_scores(const ScoreBatch& b) override { cpu_attention_scores(b); }
  void key_clusters(const ClusterBatch& b) override { cpu_key_clusters(b); }
  void cache_scores(const CacheScoreBatch& b) override { cpu_cache_scores(b); }
  void expected_scores(const ExpectedScoreBatch& b) override { cpu_expected_scores(b); }
  void chunk_scores(const ChunkScoreBatch& b) override { cpu_chunk_scores(b); }
};

// One registered device backend: probed once, wrapped once.
struct Entry {
  std::string id;
  BackendProbe probe = nullptr;
  std::once_flag probed;
  Backend* device = nullptr;
  std::string why;
  std::unique_ptr<FallbackBackend> wrapped;
};

struct Registry {
  std::mutex mutex;
  std::vector<std::unique_ptr<Entry>> entries;  // in registration order
};

// Built on first use: registrars run during static initialisation, in any order.
Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: backends live for the program
  return *r;
}

Entry* find_entry(const std::string& id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (auto& e : r.entries)
    if (e->id == id) return e.get();
  return nullptr;
}

// The entry's wrapped device backend, or nullptr with `why`.
Backend* probe_entry(Entry& e, std::string* why) {
  std::call_once(e.probed, [&e] {
    e.device = e.probe(&e.why);
    if (e.device) e.wrapped = std::make_unique<FallbackBackend>(e.id, *e.device);
  });
  if (why) *why = e.why;
  return e.wrapped.get();
}

std::mutex g_last_mutex;
std::string g_last_fallback;
std::set<std::string> g_reported;

}  // namespace

const char* op_name(Op op) {
  switch (op) {
    case Op::walk_blocks:
      return "walk_blocks";
    case Op::attention_errors:
      return "attention_errors";
    case Op::tsne_gradient:
      return "tsne_gradient";
    case Op::kcenter:
      return "kcenter";
    case Op::attention_scores:
      return "attention_scores";
    case Op::key_clusters:
      return "key_clusters";
    case Op::cache_scores:
      return "cache_scores";
    case Op::expected_scores:
      return "expected_scores";
    case Op::chunk_scores:
      return "chunk_scores";
  }
  return "?";
}

// {op, rows, d, dv, count, float_scores}: the fields of OpShape in order (engine/ops/backend.h).
OpShape op_shape(const WalkBatch& b) {
  const int64_t rows = b.num_blocks > 0 && b.block_offset ? b.block_offset[b.num_blocks] : 0;
  return {Op::walk_blocks, rows, b.d, b.dv, b.num_blocks, false};
}

OpShape op_shape(const ErrorBatch& b) {
  return {Op::attention_errors, b.n, b.d, b.dv, b.q_heads, b.float_scores};
}

OpShape op_shape(const TsneGradInput& in) {
  return {Op::tsne_gradient, in.n, 2, 0, 0, false};
}

OpShape op_shape(const ScoreBatch& b) {
  return {Op::attention_scores, b.n, b.d, static_cast<int>(b.heads.size()), b.group(), false};
}

OpShape op_shape(const ClusterBatch& b) {
  return {Op::key_clusters, b.n, b.d, 0, static_cast<int>(b.deltas.size()), false};
}

OpShape op_shape(const CacheScoreBatch& b) {
  return {Op::cache_scores, b.n, b.d, b.num_keys, b.group(), false};
}

// rows: tokens scored; dv: the value width; count: the group.
OpShape op_shape(const ExpectedScoreBatch& b) {
  return {Op::expected_scores, b.count, b.d, b.dv, b.group(), false};
}

// rows: tokens of the region; count: the group; dv: the chunk size.
OpShape op_shape(const ChunkScoreBatch& b) {
  return {Op::chunk_scores, b.len, b.d, b.chunk, b.group(), false};
}

OpShape kcenter_shape(int n, int d, int k) {
  return {Op::kcenter, n, d, 0, k, false};
}

// ---- the fallback ---------------------------------------------------------------------------

FallbackBackend::FallbackBackend(std::string label, Backend& device)
    : label_(std::move(label)), device_(device) {}

void FallbackBackend::record(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    last_ = why;
  }
  std::lock_guard<std::mutex> lock(g_last_mutex);
  g_last_fallback = why;
  if (!why.empty() && g_reported.insert(why).second)
    std::fprintf(stderr, "kvscope: %s\n", why.c_str());
}

std::string FallbackBackend::last_fallback() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_;
}

// Runs `device` when the device supports `shape`; otherwise, or when it throws DeviceFailure,
// records why and returns `cpu()`. Other exceptions (input errors) propagate.
template <typename Device, typename Cpu>
auto FallbackBackend::run(const OpShape& shape, Device&& device, Cpu&& cpu) -> decltype(cpu()) {
  std::string why;
  if (!device_.supports(shape, &why)) {
    if (why.empty()) why = "shape not supported";
  } else {
    try {
      if constexpr (std::is_void_v<decltype(cpu())>) {
        device();
        record("");
        return;
      } else {
        auto result = device();
        record("");
        return result;
      }
    } catch (const DeviceFailure& e) {
      why = e.what();
    }
  }
  record(label_ + " " + op_name(shape.op) + ": " + why + "; ran on the CPU");
  return cpu();
}

void FallbackBackend::walk_blocks(const WalkBatch& b) {
  run(
      op_shape(b), [&] { device_.walk_blocks(b); }, [&] { cpu_walk_blocks(b); });
}

void FallbackBackend::attention_errors(const ErrorBatch& b) {
  run(
      op_shape(b), [&] { device_.attention_errors(b); }, [&] { cpu_attention_errors(b); });
}

double FallbackBackend::tsne_gradient(const TsneGradInput& in, float* grad) {
  return run(
      op_shape(in), [&] { return device_.tsne_gradient(in, grad); },
      [&] { return cpu_tsne_gradient(in, grad); });
}

std::vector<int> FallbackBackend::kcenter(const float* x, int n, int d, int k, int first) {
  return run(
      kcenter_shape(n, d, k), [&] { return device_.kcenter(x, n, d, k, first); },
      [&] { return cpu_kcenter(x, n, d, k, first); });
}

void FallbackBackend::attention_scores(const ScoreBatch& b) {
  run(
      op_shape(b), [&] { device_.attention_scores(b); }, [&] { cpu_attention_scores(b); });
}

void FallbackBackend::key_clusters(const ClusterBatch& b) {
  run(
      op_shape(b), [&] { device_.key_clusters(b); }, [&] { cpu_key_clusters(b); });
}

void FallbackBackend::cache_scores(const CacheScoreBatch& b) {
  run(
      op_shape(b), [&] { device_.cache_scores(b); }, [&] { cpu_cache_scores(b); });
}

void FallbackBackend::expected_scores(const ExpectedScoreBatch& b) {
  run(
      op_shape(b), [&] { device_.expected_scores(b); }, [&] { cpu_expected_scores(b); });
}

void FallbackBackend::chunk_scores(const ChunkScoreBatch& b) {
  run(
      op_shape(b), [&] { device_.chunk_scores(b); }, [&] { cpu_chunk_scores(b); });
}

std::string last_fallback() {
  std::lock_guard<std::mutex> lock(g_last_mutex);
  return g_last_fallback;
}

// ---- the registry ---------------------------------------------------------------------------

bool register_backend(const std::string& id, BackendProbe probe) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto& e : r.entries)
    if (e->id == id) throw std::logic_error("backend '" + id + "' registered twice");
  if (id == "cpu" || id == "auto" || !probe)
    throw std::logic_error("backend '" + id + "' cannot be registered");
  auto e = std::make_unique<Entry>();
  e->id = id;
  e->probe = probe;
  r.entries.push_back(std::move(e));
  return true;
}

std::vector<std::string> registered_backends() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> ids;
  for (const auto& e : r.entries) ids.push_back(e->id);
  return ids;
}

Backend& cpu_backend() {
  static CpuBackend cpu;
  return cpu;
}

bool backend_available(const std::string& id, std::string* why) {
  Entry* e = find_entry(id);
  if (!e) {
    if (why)
      *why = id == "cuda" ? "built without CUDA (nvcc was not found at configure time)"
                          : "no backend '" + id + "' in this program";
    return false;
  }
  return probe_entry(*e, why) != nullptr;
}

bool cuda_available(std::string* why) {
  return backend_available("cuda", why);
}

namespace {
// The device backends KVScope has (kernels/), listed even in builds without them.
const char* const kDeviceBackends[] = {"cuda"};
}  // namespace

std::vector<std::string> backend_choices() {
  std::vector<std::string> names{"cpu"};
  for (const char* d : kDeviceBackends) names.push_back(d);
  for (const std::string& id : registered_backends())
    if (std::find(names.begin(), names.end(), id) == names.end()) names.push_back(id);
  names.push_back("auto");
  return names;
}

std::string backend_choices_text() {
  const std::vector<std::string> names = backend_choices();
  std::string text;
  for (size_t i = 0; i < names.size(); ++i)
    text += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return text;
}

Backend& select_backend(const std::string& which) {
  if (which == "cpu") return cpu_backend();
  if (which == "auto") {
    for (const std::string& id : registered_backends())
      if (Backend* b = probe_entry(*find_entry(id), nullptr)) return *b;
    return cpu_backend();
  }
  Entry* e = find_entry(which);
  if (!e) {
    if (which == "cuda")
      throw SettingError(
          "backend", "--backend",
          "cuda: no CUDA kernels in this build (nvcc was not found at configure time)");
    throw SettingError("backend", "--backend", "'" + which + "' is not " + backend_choices_text());
  }
  std::string why;
  if (Backend* b = probe_entry(*e, &why)) return *b;
  if (which == "cuda") throw SettingError("backend", "--backend", "cuda: no CUDA device: " + why);
  throw SettingError("backend", "--backend", which + ": no device: " + why);
}

}  // namespace kvscope
