// The one text escaper (issue 25 item 4): token text and text read from files made safe to show,
// in a terminal (kvscope-cli) or a view (the app's token labels and generated text).
#pragma once

#include <string>

namespace kvscope {

// Control characters (C0, DEL, C1) and bytes that are not UTF-8 are escaped (\n, \t, \x1b,
// \u0085, ...); valid UTF-8 is kept. `keep_newlines` leaves '\n' as is (multi-line error
// messages).
std::string printable(const std::string& s, bool keep_newlines = false);

}  // namespace kvscope
