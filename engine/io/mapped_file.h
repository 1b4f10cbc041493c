// A read-only view of a whole file's bytes: memory-mapped for real files (so a 2 GiB capture
// costs nothing until a layer is read), or an owned buffer for bytes already in memory (tests,
// the fuzz target). Readers index into data() only after checking ranges against size().
// A mapped file that shrinks while mapped (truncated or rewritten in place by another program)
// would raise SIGBUS on access; readers therefore take bytes out with copy(), which catches that
// fault and throws InputError instead. data() stays for code that reads plain in-memory bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvscope {

class MappedFile {
 public:
  // Throws InputError naming the file when it cannot be opened or mapped, or is not a regular
  // file (a FIFO, device or directory is refused without blocking on it).
  static std::shared_ptr<const MappedFile> open(const std::string& path);
  // Wraps bytes in memory; `name` stands for the file in error messages.
  static std::shared_ptr<const MappedFile> from_bytes(std::vector<uint8_t> bytes,
                                                      const std::string& name);

  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  bool is_mapped() const { return mapping_ != nullptr; }

  // Copies [offset, offset + n) to `dst`. Throws InputError naming the file when the range is
  // outside the file or the file shrank under the mapping (the SIGBUS is caught). Large reads
  // of a real file go through pread() on the file itself rather than the mapping: the same
  // bytes from the page cache without faulting the pages into this process and releasing them
  // again (a layer load spent a third of its time on that; docs/performance.md).
  void copy(size_t offset, size_t n, void* dst) const;
  std::vector<uint8_t> bytes(size_t offset, size_t n) const;

  // Tells the kernel the process is done with [offset, offset + length) for now: the pages
  // leave this process's resident set (the page cache may keep them). Keeps RSS bounded by the
  // layers converted to float, not by the layers ever read. No-op for in-memory bytes.
  void release(size_t offset, size_t length) const;
  // Hints that [offset, offset + length) is about to be read front to back (read-ahead for a
  // file not yet in the page cache). No-op for in-memory bytes.
  void will_need(size_t offset, size_t length) const;

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  void* mapping_ = nullptr;
  int fd_ = -1;  // the file, open for pread() while mapped
  std::vector<uint8_t> owned_;
};

}  // namespace kvscope
