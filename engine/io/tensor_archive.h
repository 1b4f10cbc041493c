// What capture.cpp needs from a container format (safetensors, npz): the metadata strings, every
// tensor's name, dtype and shape, and each tensor's raw little-endian C-order bytes on demand.
// The container readers validate their own structure (offsets, sizes, headers); capture.cpp
// validates the capture layout (layers, heads, shapes, tokens) on top.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/io/capture.h"
#include "engine/io/mapped_file.h"

namespace kvscope {

size_t dtype_size(DType t);

struct TensorDesc {
  std::string name;  // e.g. "layers.3.key" (npz member names lose their ".npy")
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t num_elements = 0;
};

class TensorArchive {
 public:
  virtual ~TensorArchive() = default;
  virtual const std::string& path() const = 0;
  virtual const char* format_name() const = 0;  // "safetensors" or "npz"
  virtual uint64_t file_bytes() const = 0;
  // Metadata strings (safetensors __metadata__, npz metadata.json). has_metadata() is false when
  // the file carries none at all.
  virtual bool has_metadata() const = 0;
  virtual const std::map<std::string, std::string>& metadata() const = 0;
  virtual const std::vector<TensorDesc>& tensors() const = 0;
  // The bytes of tensors()[i]: a pointer into the mapping when stored plainly, else decoded into
  // `scratch`. Exactly num_elements * dtype_size bytes. Throws InputError on corrupt data.
  virtual const uint8_t* tensor_bytes(size_t i, std::vector<uint8_t>& scratch) const = 0;
  // Where tensors()[i]'s bytes lie when they can be copied straight out of the file (plain
  // safetensors data): the file, with *offset set to the first byte. nullptr when the bytes must
  // go through tensor_bytes() (deflated or CRC-checked members).
  virtual const MappedFile* plain_location(size_t i, uint64_t* offset) const {
    (void)i, (void)offset;
    return nullptr;
  }
  // Done with tensor i for now (drops its mapped pages from the resident set).
  virtual void release(size_t i) const = 0;
};

// A tensor file written in one pass: the plan (names, dtypes, shapes) is fixed up front and the
// data is appended in plan order, so a writer never holds more than the caller's current chunk.
struct TensorPlan {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
};

class TensorFileWriter {
 public:
  virtual ~TensorFileWriter() = default;
  // Appends raw little-endian bytes; may span tensor boundaries.
  virtual void append(const void* bytes, size_t n) = 0;
  // Checks every planned byte was written, closes and moves the file into place.
  virtual void finish() = 0;
};

// An output file written to a new temporary file in the same folder (".NAME.XXXXXX.partial",
// created exclusively, so no existing file or link is followed) and renamed into place by
// commit() after it is flushed and closed without error, so a failed or interrupted write never
// leaves a half-written file under the real name. Destroyed without commit(), it removes the
// temporary file. `path` must be absent or a regular file: a symbolic link, FIFO, device or
// directory there is refused (the rename would replace it), see check_output_path.
class OutputFile {
 public:
  // `what` names the output in messages (e.g. "--out x.safetensors"); empty: the path alone.
  explicit OutputFile(const std::string& path, const std::string& what = "");  // throws InputError
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const void* bytes, size_t n);                      // throws InputError on I/O failure
  void write_at(uint64_t offset, const void* bytes, size_t n);  // patch earlier bytes
  uint64_t position() const { return position_; }
  void commit();

 private:
  std::string path_, partial_path_, what_;
  std::FILE* file_ = nullptr;
  uint64_t position_ = 0;
};

// Refuses an output path that is a symbolic link, FIFO, device, directory or other non-regular
// file, or the same file as one of `inputs` (compared by device and inode, so other spellings and
// hard links count). Throws InputError starting with `what` (e.g. "--json report.json").
void check_output_path(const std::string& path, const std::vector<std::string>& inputs,
                       const std::string& what);

// Validates the capture layout of an opened archive and wraps it as a CaptureFile. Used by
// CaptureFile::open and by the fuzz target (which opens bytes held in memory).
std::unique_ptr<CaptureFile> open_capture_archive(std::unique_ptr<TensorArchive> archive);

}  // namespace kvscope
