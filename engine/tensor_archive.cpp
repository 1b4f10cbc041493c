#include "engine/tensor_archive.h"

#include <cerrno>
#include <cstring>

#include "engine/error.h"

namespace kvscope {

size_t dtype_size(DType t) {
  return t == DType::F32 ? 4 : 2;
}

OutputFile::OutputFile(const std::string& path) : path_(path), partial_path_(path + ".partial") {
  file_ = std::fopen(partial_path_.c_str(), "wb");
  if (!file_) throw InputError(path + ": cannot create: " + std::strerror(errno));
  // Large writes go straight through; a big stdio buffer keeps small header writes cheap.
  std::setvbuf(file_, nullptr, _IOFBF, 1 << 20);
}

OutputFile::~OutputFile() {
  if (file_) {
    std::fclose(file_);
    std::remove(partial_path_.c_str());
  }
}

void OutputFile::write(const void* bytes, size_t n) {
  if (n == 0) return;
  if (std::fwrite(bytes, 1, n, file_) != n)
    throw InputError(path_ + ": write failed: " + std::strerror(errno));
  position_ += n;
}

void OutputFile::write_at(uint64_t offset, const void* bytes, size_t n) {
  if (std::fseek(file_, static_cast<long>(offset), SEEK_SET) != 0 ||
      std::fwrite(bytes, 1, n, file_) != n ||
      std::fseek(file_, static_cast<long>(position_), SEEK_SET) != 0)
    throw InputError(path_ + ": write failed: " + std::strerror(errno));
}

void OutputFile::commit() {
  std::FILE* f = file_;
  file_ = nullptr;
  bool ok = std::fflush(f) == 0;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    int err = errno;
    std::remove(partial_path_.c_str());
    throw InputError(path_ + ": write failed: " + std::strerror(err));
  }
  if (std::rename(partial_path_.c_str(), path_.c_str()) != 0) {
    int err = errno;
    std::remove(partial_path_.c_str());
    throw InputError(path_ + ": cannot move " + partial_path_ +
                     " into place: " + std::strerror(err));
  }
}

}  // namespace kvscope
