// engine/core/printable.h, the one text escaper (the CLI's messages, the app's token labels and
// generated text): control characters and bytes that are not UTF-8 are escaped, UTF-8 is kept.
#include <gtest/gtest.h>

#include <string>

#include "engine/core/printable.h"

namespace kvscope {
namespace {

TEST(Printable, EscapesControlsAndBrokenUtf8AndKeepsUtf8) {
  EXPECT_EQ(printable("plain text"), "plain text");
  EXPECT_EQ(printable("a\nb\tc\rd"), "a\\nb\\tc\\rd");
  EXPECT_EQ(printable("a\nb", true), "a\nb");
  EXPECT_EQ(printable(std::string("\x1b[31m\x7f", 6)), "\\x1b[31m\\x7f");
  EXPECT_EQ(printable(std::string("nul\0end", 7)), "nul\\x00end");
  EXPECT_EQ(printable("caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x98\x80"),
            "caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x98\x80");
  EXPECT_EQ(printable("\xe6\x97"), "\\xe6\\x97");           // a cut sequence
  EXPECT_EQ(printable("\xc0\xaf"), "\\xc0\\xaf");           // overlong
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate
  EXPECT_EQ(printable("\xc2\x85"), "\\u0085");              // C1 control
}

}  // namespace
}  // namespace kvscope
