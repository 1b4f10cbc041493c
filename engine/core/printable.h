// Text for people. The one text escaper: token text and text read from files made safe to show,
// in a terminal (kvscope-cli) or a view (the app's token labels and generated text).
#pragma once

#include <sstream>
#include <string>
#include <vector>

namespace kvscope {

// Control characters (C0, DEL, C1) and bytes that are not UTF-8 are escaped (\n, \t, \x1b,
// \u0085, ...); valid UTF-8 is kept. `keep_newlines` leaves '\n' as is (multi-line error
// messages).
std::string printable(const std::string& s, bool keep_newlines = false);

// A number in a message as the stream writes it by default (6 significant digits): for settings
// named in errors and notes, never for figures (those are written in full, docs/evaluation.md).
inline std::string fmt_double(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// "a, b, c": the items with `sep` between them (lists of notes, names and reasons in messages).
inline std::string join(const std::vector<std::string>& items, const char* sep = ", ") {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : sep) + s;
  return out;
}

}  // namespace kvscope
