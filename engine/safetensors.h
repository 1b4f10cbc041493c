// safetensors (https://github.com/huggingface/safetensors): 8-byte little-endian header length,
// a JSON header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}},
// then the data section; offsets are relative to the data section's start.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/tensor_archive.h"

namespace kvscope {

// The header's hard limit (the reference implementation uses the same 100 MB).
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

struct SafetensorsEntry {
  TensorDesc desc;
  uint64_t data_begin = 0;  // absolute file offsets of the tensor's bytes
  uint64_t data_end = 0;
};

struct SafetensorsHeader {
  bool has_metadata = false;
  std::map<std::string, std::string> metadata;
  std::vector<SafetensorsEntry> tensors;  // in file (offset) order
  uint64_t data_section_begin = 0;
};

// Parses and validates the header of `size` bytes at `bytes`: lengths, JSON, dtypes, shapes,
// offsets in range, sizes matching shape x dtype, no overlaps. `file` names the file in errors.
// Never reads outside [bytes, bytes + size). Throws InputError.
SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, size_t size,
                                           const std::string& file);

std::unique_ptr<TensorArchive> open_safetensors(std::shared_ptr<const MappedFile> file);

// Writes `path` in one pass (see TensorFileWriter).
std::unique_ptr<TensorFileWriter> create_safetensors_writer(
    const std::string& path, const std::map<std::string, std::string>& metadata,
    const std::vector<TensorPlan>& plan);

}  // namespace kvscope
