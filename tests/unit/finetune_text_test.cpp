// finetune/text: UTF-8 and Python's str as XTREME's scripts see text, against values Python 3.11
// gives (noted beside each case).
#include "xlme/finetune/text.h"

#include "xlme/data/text.h"

#include <gtest/gtest.h>

namespace xlme::finetune::text {
namespace {

TEST(FinetuneText, DecodesUtf8AndReplacesEachBadByte) {
  EXPECT_EQ(decode_utf8("a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80"), U"a\u00e9\u20ac\U0001F600");
  // A lead byte whose sequence breaks off is one U+FFFD, and the next byte is read again: the
  // old features.cpp decoder swallowed "ab" into the U+FFFD.
  EXPECT_EQ(decode_utf8("\xE2"
                        "ab"),
            U"\ufffd"
            U"ab");
  EXPECT_EQ(decode_utf8("\xFF\x80x"), U"\ufffd\ufffdx");
  // Overlong forms and surrogates are not UTF-8 (as data::valid_utf8 says).
  EXPECT_EQ(decode_utf8("\xC0\xAF"), U"\ufffd\ufffd");
  EXPECT_EQ(decode_utf8("\xED\xA0\x80"), U"\ufffd\ufffd\ufffd");
  EXPECT_FALSE(data::valid_utf8("\xED\xA0\x80"));
  EXPECT_TRUE(data::valid_utf8("a\xC3\xA9\xF0\x9F\x98\x80"));
  const std::u32string all = U"x\u00e9\u0800\uffff\U00010000\U0010ffff";
  EXPECT_EQ(decode_utf8(encode_utf8(all)), all);
  EXPECT_EQ(encode_utf8(U"\u00e9\u20ac"), "\xC3\xA9\xE2\x82\xAC");
}

TEST(FinetuneText, CodePointOffsetsAreByteOffsets) {
  const std::string s = "Zu\xCC\x88rich \xE2\x82\xAC";  // "Zu" + U+0308 + "rich €"
  EXPECT_EQ(byte_offset_of_code_point(s, 0), 0);
  EXPECT_EQ(byte_offset_of_code_point(s, 3), 4);
  EXPECT_EQ(byte_offset_of_code_point(s, 8), 9);
  EXPECT_EQ(byte_offset_of_code_point(s, 9), 12);  // just past the end
  EXPECT_EQ(byte_offset_of_code_point(s, 10), -1);
  EXPECT_EQ(byte_offset_of_code_point(s, -1), -1);
}

TEST(FinetuneText, PythonSplitStripAndLower) {
  // "a\xa0b\u3000c\u200bd \u2028e".split() == ['a', 'b', 'c\u200bd', 'e']: NBSP and the
  // ideographic space separate, the zero-width space does not.
  EXPECT_EQ(split(U"a\u00a0b\u3000c\u200bd \u2028e"),
            (std::vector<std::u32string>{U"a", U"b", U"c\u200bd", U"e"}));
  EXPECT_TRUE(split(U" \t\u0085 ").empty());
  EXPECT_EQ(collapse(U"  x \n\n y\u00a0 "), U"x y");
  EXPECT_EQ(strip(U"\u2003 x y \u00a0"), U"x y");
  EXPECT_TRUE(is_space(0x1c) && is_space(0x202f) && !is_space(0x200b));
  // "ΟΔΟΣ ΣΑ İ".lower() == 'οδος σα i̇': final sigma at a word end only; İ lowers to two.
  EXPECT_EQ(lower(U"\u039f\u0394\u039f\u03a3 \u03a3\u0391 \u0130"),
            U"\u03bf\u03b4\u03bf\u03c2 \u03c3\u03b1 i\u0307");
}

TEST(FinetuneText, UnicodeClassesAsPython) {
  EXPECT_TRUE(is_punctuation(U'\u00bf') && is_punctuation(U'\u3001') && is_punctuation(U'_'));
  EXPECT_FALSE(is_punctuation(U'$') || is_punctuation(U'+'));  // Sc, Sm
  EXPECT_TRUE(is_ascii_punctuation(U'$') && is_ascii_punctuation(U'~'));
  EXPECT_FALSE(is_ascii_punctuation(U'\u00bf') || is_ascii_punctuation(U'a'));
  EXPECT_TRUE(is_word(U'\u00e9') && is_word(U'_') && is_word(U'\u0663'));
  EXPECT_FALSE(is_word(U'-'));
  EXPECT_TRUE(is_other(U'\u200b') && is_other(0x7f) && !is_other(U'a'));
  EXPECT_TRUE(is_space_separator(U'\u00a0') && !is_space_separator(U'\t'));
}

TEST(FinetuneText, AsciiHelpersOnBytes) {
  EXPECT_EQ(strip_ascii(" \t x y\r\n"), "x y");
  EXPECT_EQ(strip_ascii("\xC2\xA0x"), "\xC2\xA0x");  // NBSP is not ASCII whitespace
  EXPECT_EQ(strip_ascii(" \t"), "");
  EXPECT_EQ(split_tabs("a\t\tb\t"), (std::vector<std::string>{"a", "", "b", ""}));
  EXPECT_EQ(split_tabs("ab"), (std::vector<std::string>{"ab"}));
  EXPECT_EQ(split_ascii("  a\tb \v c\n"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_TRUE(split_ascii(" \t ").empty());
}

}  // namespace
}  // namespace xlme::finetune::text
