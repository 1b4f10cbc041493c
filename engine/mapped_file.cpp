#include "engine/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "engine/error.h"

namespace kvscope {

std::shared_ptr<const MappedFile> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw InputError(path + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError(path + ": not a regular file");
  }
  std::shared_ptr<MappedFile> file(new MappedFile());
  file->path_ = path;
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ > 0) {
    void* mapping = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapping == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      throw InputError(path + ": cannot memory-map: " + std::strerror(err));
    }
    file->mapping_ = mapping;
    file->data_ = static_cast<const uint8_t*>(mapping);
  }
  ::close(fd);  // the mapping keeps the file referenced
  return file;
}

std::shared_ptr<const MappedFile> MappedFile::from_bytes(std::vector<uint8_t> bytes,
                                                         const std::string& name) {
  std::shared_ptr<MappedFile> file(new MappedFile());
  file->path_ = name;
  file->owned_ = std::move(bytes);
  file->data_ = file->owned_.data();
  file->size_ = file->owned_.size();
  return file;
}

MappedFile::~MappedFile() {
  if (mapping_) ::munmap(mapping_, size_);
}

void MappedFile::release(size_t offset, size_t length) const {
  if (!mapping_ || offset >= size_ || length == 0) return;
  if (length > size_ - offset) length = size_ - offset;
  // madvise wants a page-aligned start; widen the range down to the page boundary. Pages shared
  // with a neighbouring tensor are simply faulted in again if that tensor is read later.
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  size_t begin = offset / page * page;
  size_t end = offset + length;
  ::madvise(const_cast<uint8_t*>(data_) + begin, end - begin, MADV_DONTNEED);
}

void MappedFile::will_need(size_t offset, size_t length) const {
  if (!mapping_ || offset >= size_ || length == 0) return;
  if (length > size_ - offset) length = size_ - offset;
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  size_t begin = offset / page * page;
  ::madvise(const_cast<uint8_t*>(data_) + begin, offset + length - begin, MADV_WILLNEED);
}

}  // namespace kvscope
