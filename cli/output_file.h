// Every file kvscope-cli writes (--json, --csv, --out) goes through here: '-' is standard output;
// anything else is checked first (never an input file, a symbolic link, a FIFO, a device or a
// directory) and written to a temporary file in the same folder that is flushed, checked and
// renamed into place, so a failure never leaves a truncated file and a full disk is an error.
#pragma once

#include <string>
#include <vector>

namespace kvscope::cli {

// Checks `path` can be written without harming `inputs` (see check_output_path); call before
// long work so a bad output path fails early. '-' always passes.
void check_output(const std::string& path, const std::vector<std::string>& inputs,
                  const std::string& flag);

// Writes `text` to `path` ('-': standard output, flushed and checked). Throws InputError naming
// `flag` and the path on any failure.
void write_output(const std::string& path, const std::string& text, const std::string& flag,
                  const std::vector<std::string>& inputs = {});

// Flushes standard output and throws InputError when anything written to it failed (a closed
// pipe, a full disk): called once by main after a command, so exit 0 means the output arrived.
void check_stdout();

}  // namespace kvscope::cli
