// libFuzzer target: arbitrary bytes as a safetensors capture. Parsing the header, validating the
// capture layout and loading every layer must either succeed or throw InputError: no crash, no
// out-of-bounds read (AddressSanitizer), no other exception type.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/core/error.h"
#include "engine/io/capture.h"
#include "engine/io/mapped_file.h"
#include "engine/io/safetensors.h"
#include "engine/io/tensor_archive.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvscope;
  auto file = MappedFile::from_bytes(std::vector<uint8_t>(data, data + size), "fuzz.safetensors");
  try {
    auto capture = open_capture_archive(open_safetensors(file));
    capture->set_max_cached_layers(1);
    for (int L = 0; L < capture->info().num_layers; ++L) capture->layer(L);
  } catch (const InputError&) {
    // Rejected with a message: the expected outcome for almost every input.
  }
  return 0;
}
