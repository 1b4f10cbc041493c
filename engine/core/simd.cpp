// Run-time choice of the SIMD kernel table (engine/core/simd.h).
#include "engine/core/simd.h"

#include <atomic>
#include <cstdlib>
#include <stdexcept>

namespace kvscope::simd {
namespace {

bool cpu_runs(const std::string& name) {
  if (name == "scalar" || name == "sse2") return true;
#if defined(KVSCOPE_SIMD_X86) && (defined(__x86_64__) || defined(__i386__))
  __builtin_cpu_init();
  if (name == "avx2") return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (name == "avx512") return __builtin_cpu_supports("avx512f");
#endif
  return false;
}

const Kernels* find(const std::string& name) {
  if (name == "scalar") return &detail::scalar_table;
  if (name == "sse2") return &detail::sse2_table;
#if defined(KVSCOPE_SIMD_X86)
  if (name == "avx2") return &detail::avx2_table;
  if (name == "avx512") return &detail::avx512_table;
#endif
  return nullptr;
}

const Kernels* best() {
  if (const char* forced = std::getenv("KVSCOPE_SIMD"); forced && *forced) return &table(forced);
  const std::vector<std::string> names = available();
  return find(names.back());
}

std::atomic<const Kernels*> current{nullptr};

}  // namespace

bool cpu_supports(const std::string& name) {
  return cpu_runs(name);
}

std::vector<std::string> available() {
  std::vector<std::string> out;
  for (const char* name : {"scalar", "sse2", "avx2", "avx512"})
    if (find(name) && cpu_runs(name)) out.push_back(name);
  return out;
}

const Kernels& table(const std::string& name) {
  const Kernels* k = find(name);
  if (!k) throw std::invalid_argument("KVSCOPE_SIMD: '" + name + "' is not built into this binary");
  if (!cpu_runs(name))
    throw std::invalid_argument("KVSCOPE_SIMD: this CPU cannot run the '" + name + "' kernels");
  return *k;
}

const Kernels& kernels() {
  const Kernels* k = current.load(std::memory_order_acquire);
  if (!k) {
    k = best();
    current.store(k, std::memory_order_release);
  }
  return *k;
}

void use(const std::string& name) {
  current.store(&table(name), std::memory_order_release);
}

}  // namespace kvscope::simd
