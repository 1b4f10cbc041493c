#include "engine/io/tensor_archive.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "engine/core/error.h"

namespace kvscope {

size_t dtype_size(DType t) {
  return t == DType::F32 ? 4 : 2;
}

void check_output_path(const std::string& path, const std::vector<std::string>& inputs,
                       const std::string& what) {
  if (path.empty()) throw InputError(what + ": empty output path");
  struct stat target {};
  if (::lstat(path.c_str(), &target) != 0) {
    if (errno == ENOENT) return;  // a new file; its folder is checked when it is created
    throw InputError(what + ": cannot check the output path: " + std::strerror(errno));
  }
  if (S_ISLNK(target.st_mode))
    throw InputError(what +
                     ": is a symbolic link; refusing to replace it (write to the link's "
                     "target path directly, or choose another name)");
  if (!S_ISREG(target.st_mode))
    throw InputError(what + ": is " +
                     (S_ISDIR(target.st_mode)    ? std::string("a directory")
                      : S_ISFIFO(target.st_mode) ? std::string("a FIFO")
                      : S_ISCHR(target.st_mode) || S_ISBLK(target.st_mode)
                          ? std::string("a device")
                          : std::string("not a regular file")) +
                     "; outputs are only written to regular files (or '-' for standard output)");
  for (const std::string& input : inputs) {
    struct stat in {};
    if (::stat(input.c_str(), &in) == 0 && in.st_dev == target.st_dev && in.st_ino == target.st_ino)
      throw InputError(what + ": is the input file " + input + "; refusing to overwrite it");
  }
}

OutputFile::OutputFile(const std::string& path, const std::string& what)
    : path_(path), what_(what.empty() ? path : what) {
  check_output_path(path, {}, what_);
  // The temporary file lives in the output's folder, so the final rename stays on one file
  // system; O_EXCL never opens an existing file or follows a planted link.
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  static std::atomic<unsigned> counter{0};
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    char suffix[64];
    std::snprintf(suffix, sizeof suffix, ".%d.%u.partial", static_cast<int>(::getpid()),
                  counter.fetch_add(1) * 7919u + static_cast<unsigned>(attempt));
    partial_path_ = dir + "." + base + suffix;
    fd = ::open(partial_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0)
    throw InputError(what_ + ": cannot create " + partial_path_ + ": " + std::strerror(errno));
  file_ = ::fdopen(fd, "wb");
  if (!file_) {
    const int err = errno;
    ::close(fd);
    ::unlink(partial_path_.c_str());
    throw InputError(what_ + ": cannot create: " + std::strerror(err));
  }
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
    throw InputError(what_ + ": write failed: " + std::strerror(errno));
  position_ += n;
}

void OutputFile::write_at(uint64_t offset, const void* bytes, size_t n) {
  if (std::fseek(file_, static_cast<long>(offset), SEEK_SET) != 0 ||
      std::fwrite(bytes, 1, n, file_) != n ||
      std::fseek(file_, static_cast<long>(position_), SEEK_SET) != 0)
    throw InputError(what_ + ": write failed: " + std::strerror(errno));
}

void OutputFile::commit() {
  std::FILE* f = file_;
  file_ = nullptr;
  bool ok = std::fflush(f) == 0 && !std::ferror(f);
  int err = ok ? 0 : errno;
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    std::remove(partial_path_.c_str());
    throw InputError(what_ + ": write failed: " + std::strerror(err));
  }
  // The target may have changed since the constructor looked (e.g. a link planted meanwhile).
  try {
    check_output_path(path_, {}, what_);
  } catch (...) {
    std::remove(partial_path_.c_str());
    throw;
  }
  if (std::rename(partial_path_.c_str(), path_.c_str()) != 0) {
    err = errno;
    std::remove(partial_path_.c_str());
    throw InputError(what_ + ": cannot move " + partial_path_ +
                     " into place: " + std::strerror(err));
  }
}

}  // namespace kvscope
