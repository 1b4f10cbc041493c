#include "app/memory_stats.h"

#include <fstream>

#if defined(__SANITIZE_ADDRESS__)
#define KVSCOPE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVSCOPE_ASAN 1
#endif
#endif

#if defined(KVSCOPE_ASAN)
#include <cstddef>
// From the runtime's sanitizer/allocator_interface.h, which GCC does not install.
extern "C" size_t __sanitizer_get_current_allocated_bytes();
extern "C" size_t __sanitizer_get_heap_size();
#elif defined(__GLIBC__)
#include <malloc.h>  // mallinfo2, malloc_trim
#endif

namespace kvscope::app {

MemoryStats memory_stats() {
  MemoryStats m;
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) m.rss_kb = std::stoll(line.substr(6));
#if defined(KVSCOPE_ASAN)
  // Live blocks only: the quarantine of freed blocks is counted in heap_mapped.
  m.heap_live = static_cast<int64_t>(__sanitizer_get_current_allocated_bytes());
  m.heap_mapped = static_cast<int64_t>(__sanitizer_get_heap_size());
  m.allocator = "asan";
#elif defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  const struct mallinfo2 mi = mallinfo2();
  m.heap_live = static_cast<int64_t>(mi.uordblks + mi.hblkhd);
  m.heap_mapped = static_cast<int64_t>(mi.arena + mi.hblkhd);
  m.allocator = "glibc";
#endif
  return m;
}

void return_free_memory() {
#if !defined(KVSCOPE_ASAN) && defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace kvscope::app
