// libFuzzer target: arbitrary bytes as an .npz capture (zip directory, zip64 records, deflate
// streams, .npy headers, metadata.json). Must succeed or throw InputError, never crash.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/core/error.h"
#include "engine/io/capture.h"
#include "engine/io/mapped_file.h"
#include "engine/io/npz.h"
#include "engine/io/tensor_archive.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvscope;
  auto file = MappedFile::from_bytes(std::vector<uint8_t>(data, data + size), "fuzz.npz");
  try {
    auto capture = open_capture_archive(open_npz(file));
    capture->set_max_cached_layers(1);
    for (int L = 0; L < capture->info().num_layers; ++L) capture->layer(L);
  } catch (const InputError&) {
  }
  return 0;
}
