// Seeds are unsigned 64-bit: CLI11 reads "-1" into an unsigned option as 2^64 - 1, so the text is
// checked before it is converted, with the limits in the message.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace kvscope::cli {

inline CLI::Validator seed_validator() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const bool digits =
            !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
        if (digits && (text.size() < 20 || (text.size() == 20 && text <= "18446744073709551615")))
          return "";
        return "'" + text + "' must be an integer between 0 and 18446744073709551615";
      },
      "SEED");
}

}  // namespace kvscope::cli
