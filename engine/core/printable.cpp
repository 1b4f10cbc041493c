#include "engine/core/printable.h"

#include <cstdint>
#include <cstdio>

namespace kvscope {

std::string printable(const std::string& s, bool keep_newlines) {
  std::string out;
  out.reserve(s.size());
  auto hex = [&](unsigned char c) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\x%02x", c);
    out += buf;
  };
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if (c == '\n')
        out += keep_newlines ? "\n" : "\\n";
      else if (c == '\t')
        out += "\\t";
      else if (c == '\r')
        out += "\\r";
      else if (c < 0x20 || c == 0x7F)
        hex(c);
      else
        out += static_cast<char>(c);
      ++i;
      continue;
    }
    // A UTF-8 sequence: its length from the lead byte, continuation bytes checked, overlong
    // and surrogate forms refused; C1 controls (U+0080..U+009F) escaped like C0 ones.
    size_t len = 0;
    uint32_t cp = 0;
    if (c >= 0xC2 && c <= 0xDF)
      len = 2, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF)
      len = 3, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4)
      len = 4, cp = c & 0x07;
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) ok = false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (ok && ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
               (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))))
      ok = false;
    if (!ok) {
      hex(c);
      ++i;
      continue;
    }
    if (cp >= 0x80 && cp <= 0x9F) {
      char buf[12];
      std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      out += buf;
    } else {
      out.append(s, i, len);
    }
    i += len;
  }
  return out;
}

}  // namespace kvscope
