// libFuzzer target: arbitrary bytes as a llama2.c tokenizer (and checkpoint) file plus a prompt.
// Input layout: 2 bytes vocab_size - 1 (little endian, mod 2048), 2 bytes prompt length (mod
// 128: the reference is quadratic), the prompt, then the file. Loading must succeed or throw
// InputError; a loaded tokenizer must encode the prompt to exactly run.c's tokens (the O(n^2)
// rescanning reference in tests/llama2c_reference.h) or throw InputError where run.c would have no
// token to use.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "engine/core/error.h"
#include "engine/model/llama2c.h"
#include "tests/llama2c_reference.h"

namespace {

// The readers take paths: each input is written to one file per fuzzing process.
const std::string& scratch_path() {
  static const std::string path = "/tmp/kvscope_fuzz_llama2c_" + std::to_string(getpid()) + ".bin";
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvscope;
  if (size < 4) return 0;
  const int vocab_size = 1 + (data[0] | data[1] << 8) % 2048;
  const size_t prompt_len = std::min<size_t>((data[2] | data[3] << 8) % 128, size - 4);
  const std::string prompt(reinterpret_cast<const char*>(data + 4), prompt_len);
  const uint8_t* file = data + 4 + prompt_len;
  const size_t file_size = size - 4 - prompt_len;
  {
    FILE* f = std::fopen(scratch_path().c_str(), "wb");
    if (!f || std::fwrite(file, 1, file_size, f) != file_size || std::fclose(f) != 0) std::abort();
  }
  try {
    llama2c::Transformer model(scratch_path());
  } catch (const InputError&) {
  }
  try {
    const llama2c::Tokenizer tokenizer(scratch_path(), vocab_size);
    for (const bool prompt_mode : {true, false}) {
      const auto expected =
          llama2c::reference::run_c_encode(tokenizer, prompt, prompt_mode, prompt_mode);
      try {
        const std::vector<int> got = prompt_mode ? tokenizer.encode(prompt, true, false)
                                                 : tokenizer.encode_continuation(prompt);
        if (!expected || got != *expected) std::abort();  // differs from run.c
      } catch (const InputError&) {
        if (expected) std::abort();  // run.c would have encoded it
      }
    }
  } catch (const InputError&) {
  }
  return 0;
}
