#include "engine/io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csetjmp>
#include <csignal>
#include <cstring>
#include <mutex>

#include "engine/core/error.h"

namespace kvscope {
namespace {

// SIGBUS guard: copy() arms a per-thread jump buffer around one memcpy from the mapping; the
// handler jumps back out of the memcpy when the fault happens on that thread while armed, and
// otherwise hands the signal to whatever handled it before (or the default action). Only a
// memcpy lies between sigsetjmp and the fault, so no C++ destructor is skipped.
// volatile: the stores around the memcpy must happen (memcpy is a builtin the compiler knows does
// not read this variable, so without it the arming store is dead-store-eliminated).
thread_local sigjmp_buf* volatile t_bus_guard = nullptr;
struct sigaction g_previous_bus_action {};

void on_sigbus(int sig, siginfo_t* info, void* context) {
  if (sigjmp_buf* guard = t_bus_guard) {
    t_bus_guard = nullptr;
    siglongjmp(*guard, 1);
  }
  // Not ours: restore the previous handler and return, so the faulting access repeats under it.
  ::sigaction(SIGBUS, &g_previous_bus_action, nullptr);
  (void)sig, (void)info, (void)context;
}

void install_sigbus_guard() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGBUS, &action, &g_previous_bus_action);
  });
}

// Returns false when the copy faulted (the file shrank under the mapping).
bool guarded_memcpy(void* dst, const void* src, size_t n) {
  sigjmp_buf env;
  if (sigsetjmp(env, 1) != 0) return false;  // t_bus_guard was cleared by the handler
  t_bus_guard = &env;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(dst, src, n);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_bus_guard = nullptr;
  return true;
}

}  // namespace

std::shared_ptr<const MappedFile> MappedFile::open(const std::string& path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below).
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw InputError(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw InputError(path + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    const char* kind = S_ISDIR(st.st_mode)                          ? "a directory"
                       : S_ISFIFO(st.st_mode)                       ? "a FIFO (named pipe)"
                       : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                       : S_ISSOCK(st.st_mode)                       ? "a socket"
                                                                    : "not a regular file";
    throw InputError(path + ": is " + std::string(kind) +
                     ", not a regular file; a capture must be a regular file");
  }
  install_sigbus_guard();
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
  file->fd_ = fd;  // kept for pread() (copy)
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

void MappedFile::copy(size_t offset, size_t n, void* dst) const {
  if (offset > size_ || n > size_ - offset)
    throw InputError(path_ + ": read of [" + std::to_string(offset) + ", +" + std::to_string(n) +
                     ") lies outside the file (" + std::to_string(size_) + " bytes)");
  if (n == 0) return;
  if (!mapping_) {
    std::memcpy(dst, data_ + offset, n);
    return;
  }
  // Reads of at least a page: pread (a file that shrank returns fewer bytes: the same error).
  if (fd_ >= 0 && n >= 4096) {
    auto* out = static_cast<uint8_t*>(dst);
    size_t done = 0;
    while (done < n) {
      const ssize_t got = ::pread(fd_, out + done, n - done, static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0)
        throw InputError(path_ + ": the file shrank or was rewritten while open (read at byte " +
                         std::to_string(offset + done) + " failed: " +
                         (got < 0 ? std::strerror(errno) : "end of file") + "); reopen it");
      done += static_cast<size_t>(got);
    }
    return;
  }
  if (!guarded_memcpy(dst, data_ + offset, n))
    throw InputError(path_ + ": the file shrank or was rewritten while open (read at byte " +
                     std::to_string(offset) + " failed: SIGBUS); reopen it");
}

std::vector<uint8_t> MappedFile::bytes(size_t offset, size_t n) const {
  if (offset > size_ || n > size_ - offset)
    throw InputError(path_ + ": read of [" + std::to_string(offset) + ", +" + std::to_string(n) +
                     ") lies outside the file (" + std::to_string(size_) + " bytes)");
  std::vector<uint8_t> out(n);
  copy(offset, n, out.data());
  return out;
}

MappedFile::~MappedFile() {
  if (mapping_) ::munmap(mapping_, size_);
  if (fd_ >= 0) ::close(fd_);
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
