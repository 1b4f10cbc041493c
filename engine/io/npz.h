// NumPy .npz (a zip of .npy members, stored or deflated) and .npy headers (v1, v2, v3; '<f4' and
// '<f2', C order). A KVScope capture in .npz has members "layers.{L}.key.npy" etc. and its
// metadata in a "metadata.json" member with the same keys as the safetensors __metadata__.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/io/tensor_archive.h"

namespace kvscope {

// Limits on what an .npz may make the reader allocate, each named in the error when hit: the
// inflated size of one member (absolute), the inflate ratio of a member larger than the floor
// (real captures compress ~1.1:1; 100:1 leaves room for padding and zeros, a bomb needs ~1000:1),
// and metadata.json's size and values (tokens may be a real JSON array).
constexpr uint64_t kMaxNpzMemberBytes = 4ull << 30;
constexpr uint64_t kMaxNpzDeflateRatio = 100;
constexpr uint64_t kNpzRatioFloorBytes = 1ull << 20;
constexpr uint64_t kMaxNpzMetadataBytes = 100ull << 20;
constexpr uint64_t kMaxNpzMetadataValues = (1ull << 22) + 65536;

struct NpyHeader {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t num_elements = 0;
  size_t data_offset = 0;  // bytes from the start of the .npy to its data
};

// Parses the .npy header in [bytes, bytes + size); `what` names the member in errors
// ("file.npz: member layers.0.key.npy"). Throws InputError.
NpyHeader parse_npy_header(const uint8_t* bytes, size_t size, const std::string& what);

std::unique_ptr<TensorArchive> open_npz(std::shared_ptr<const MappedFile> file);

// Writes an .npz with stored (uncompressed) members; the metadata goes into metadata.json.
// Members and the archive must each stay under 4 GiB (no zip64 on writing; use .safetensors
// for larger captures). Throws InputError.
std::unique_ptr<TensorFileWriter> create_npz_writer(
    const std::string& path, const std::map<std::string, std::string>& metadata,
    const std::vector<TensorPlan>& plan);

}  // namespace kvscope
