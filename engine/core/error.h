// One exception type for bad input: its message names the file, tensor or flag and the problem,
// so the CLI can print it and exit non-zero and the app can show it and keep running.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace kvscope {

class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad input in one setting. The message names the setting in words, as the app shows it
// ("compress at: 3 is inside the prompt ..."); the CLI prints the setting's flag in its place
// (cli/main.cpp: "--compress-at: 3 is inside the prompt ..."), so what the engine says never
// reads like a command line in the app.
class SettingError : public InputError {
 public:
  SettingError(const std::string& setting, std::string flag, std::string detail)
      : InputError(setting + ": " + detail), flag_(std::move(flag)), detail_(std::move(detail)) {}
  const std::string& flag() const { return flag_; }  // "--compress-at"
  const std::string& detail() const { return detail_; }
  std::string cli_message() const { return flag_ + ": " + detail_; }

 private:
  std::string flag_, detail_;
};

// Thrown when a long computation sees its cancel flag set.
class Cancelled : public std::runtime_error {
 public:
  Cancelled() : std::runtime_error("cancelled") {}
};

}  // namespace kvscope
