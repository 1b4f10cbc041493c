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

#include "engine/io/tensor_archive.h"

namespace kvscope {

// The header's limits, each named in the error when hit. Size: the reference implementation uses
// the same 100 MB. Depth: a capture header nests 3 deep ({name: {shape: [..]}}). Tensors: a
// 1000-layer capture with queries has 3000. Values: every tensor entry holds at most 13 JSON values
// (dtype, up to 8 dims, 2 offsets, the containers), plus the metadata strings.
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;
constexpr int kMaxSafetensorsHeaderDepth = 16;
constexpr size_t kMaxSafetensorsTensors = 65536;
constexpr uint64_t kMaxTensorElements = 1ull << 40;
constexpr uint64_t kMaxSafetensorsHeaderValues = 16 * kMaxSafetensorsTensors + 65536;

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
// offsets in range, sizes matching shape x dtype, no overlaps, no duplicate keys (tensor names or
// __metadata__ keys), the limits above. `file` names the file in errors.
// Never reads outside [bytes, bytes + size). Throws InputError.
SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, size_t size,
                                           const std::string& file);

std::unique_ptr<TensorArchive> open_safetensors(std::shared_ptr<const MappedFile> file);

// Writes `path` in one pass (see TensorFileWriter).
std::unique_ptr<TensorFileWriter> create_safetensors_writer(
    const std::string& path, const std::map<std::string, std::string>& metadata,
    const std::vector<TensorPlan>& plan);

}  // namespace kvscope
