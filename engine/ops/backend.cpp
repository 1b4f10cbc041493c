// The backend registry, the CPU backend and the CPU fallback around device backends
// (engine/ops/backend.h). No kernels/ header here: device backends register themselves.
#include "engine/ops/backend.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <utility>

#include "engine/core/error.h"

namespace kvscope {
namespace {

// The CPU backend: every op is Backend's default, the CPU reference.
class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
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
