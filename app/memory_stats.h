// What the app's memory is made of, for state.json (F9) and the soak (tests/gui/test_gui_soak.cpp,
// docs/testing.md): resident memory as the kernel counts it, and the bytes the program holds in
// live heap allocations as its allocator counts them. Resident memory can grow where the live
// heap does not (freed memory the allocator keeps, AddressSanitizer's quarantine of freed
// blocks); a growing live heap is memory the program keeps.
#pragma once

#include <cstdint>
#include <string>

namespace kvscope::app {

struct MemoryStats {
  int64_t rss_kb = -1;       // VmRSS of /proc/self/status (-1: not known)
  int64_t heap_live = -1;    // bytes in live heap allocations (-1: not known)
  int64_t heap_mapped = -1;  // bytes the allocator has from the system (-1: not known)
  std::string allocator;     // whose figures: "asan" or "glibc"
};

MemoryStats memory_stats();

}  // namespace kvscope::app
