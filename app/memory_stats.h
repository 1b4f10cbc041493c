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

// Gives the system back the free memory the allocator keeps (glibc: malloc_trim, which also
// releases whole free pages inside its arenas; the worker threads' arenas included). Without it
// a large transient allocation (a capture's first open, a generation, a t-SNE) stays resident
// after it is freed: in a 3-minute soak resident memory grew 24 % while the live heap stayed at
// 38 MiB (docs/testing.md). Called by the main loop when the app goes idle; takes a few
// milliseconds. A no-op under AddressSanitizer, whose allocator returns memory on its own and
// whose quarantine of freed blocks is what finds a use after free.
void return_free_memory();

}  // namespace kvscope::app
