#include "cli/output_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "cli/validate.h"
#include "engine/core/error.h"
#include "engine/io/tensor_archive.h"

namespace kvscope::cli {

void check_output(const std::string& path, const std::vector<std::string>& inputs,
                  const std::string& flag) {
  if (path == "-") return;
  check_output_path(path, inputs, flag + " " + printable(path));
}

void write_output(const std::string& path, const std::string& text, const std::string& flag,
                  const std::vector<std::string>& inputs) {
  if (path == "-") {
    if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0)
      throw InputError(flag + " -: writing to standard output failed: " + std::strerror(errno));
    return;
  }
  const std::string what = flag + " " + printable(path);
  check_output_path(path, inputs, what);
  OutputFile out(path, what);
  out.write(text.data(), text.size());
  out.commit();
}

void check_stdout() {
  errno = 0;
  if (std::fflush(stdout) != 0 || std::ferror(stdout))
    throw InputError(std::string("writing to standard output failed: ") +
                     (errno ? std::strerror(errno) : "I/O error"));
}

}  // namespace kvscope::cli
