// One exception type for bad input: its message names the file, tensor or flag and the problem,
// so the CLI can print it and exit non-zero and the app can show it and keep running.
#pragma once

#include <stdexcept>
#include <string>

namespace kvscope {

class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Thrown when a long computation sees its cancel flag set.
class Cancelled : public std::runtime_error {
 public:
  Cancelled() : std::runtime_error("cancelled") {}
};

}  // namespace kvscope
