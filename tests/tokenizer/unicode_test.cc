// Character classes, UTF-8 validation, byte-level mapping and lossy decoding.
#include "tokenizer/unicode.h"

#include <gtest/gtest.h>

#include "tokenizer/byte_level.h"

namespace gale {
namespace {

TEST(Unicode, Classes) {
  EXPECT_EQ(char_class('a'), CharClass::kLetter);
  EXPECT_EQ(char_class('7'), CharClass::kNumber);
  EXPECT_EQ(char_class(' '), CharClass::kSpace);
  EXPECT_EQ(char_class(0x1C), CharClass::kOther);  // Python's str.isspace says yes; White_Space says no
  EXPECT_EQ(char_class(0x85), CharClass::kSpace);
  EXPECT_EQ(char_class(0x3000), CharClass::kSpace);
  EXPECT_EQ(char_class(0x4E2D), CharClass::kLetter);   // CJK ideograph (range entry)
  EXPECT_EQ(char_class(0x2164), CharClass::kNumber);   // ROMAN NUMERAL FIVE (Nl)
  EXPECT_EQ(char_class(0x00B2), CharClass::kNumber);   // SUPERSCRIPT TWO (No)
  EXPECT_EQ(char_class(0x0301), CharClass::kOther);    // combining acute (Mn)
  EXPECT_EQ(char_class(0x1F980), CharClass::kOther);   // emoji
  EXPECT_EQ(char_class(0x31350), CharClass::kLetter);  // CJK Extension H (Unicode 15.0)
  EXPECT_EQ(char_class(0x10FFFF), CharClass::kOther);
}

TEST(Unicode, CategoriesSplitLettersByCaseAndKeepMarks) {
  EXPECT_EQ(char_category('A'), CharCategory::kUpper);
  EXPECT_EQ(char_category('z'), CharCategory::kLower);
  EXPECT_EQ(char_category(0x01C5), CharCategory::kUpper);        // Dz with caron, titlecase (Lt)
  EXPECT_EQ(char_category(0x02B0), CharCategory::kOtherLetter);  // modifier letter small h (Lm)
  EXPECT_EQ(char_category(0x4E2D), CharCategory::kOtherLetter);  // CJK ideograph (Lo, range entry)
  EXPECT_EQ(char_category(0x0301), CharCategory::kMark);         // combining acute (Mn)
  EXPECT_EQ(char_category(0x0903), CharCategory::kMark);         // Devanagari visarga (Mc)
  EXPECT_EQ(char_category(0x20DD), CharCategory::kMark);         // combining enclosing circle (Me)
  EXPECT_EQ(char_category(0x2164), CharCategory::kNumber);
  EXPECT_EQ(char_category(0x3000), CharCategory::kSpace);
  EXPECT_EQ(char_category(0x1F980), CharCategory::kOther);
  // The coarse classes follow from the categories.
  EXPECT_EQ(char_class(0x01C5), CharClass::kLetter);
  EXPECT_EQ(char_class(0x0903), CharClass::kOther);
}

TEST(Unicode, Utf8Validation) {
  EXPECT_EQ(find_invalid_utf8("plain ascii"), std::string_view::npos);
  EXPECT_EQ(find_invalid_utf8("caf\xC3\xA9 \xF0\x9F\xA6\x80"), std::string_view::npos);
  EXPECT_EQ(find_invalid_utf8("ab\xC3"), 2u);            // truncated
  EXPECT_EQ(find_invalid_utf8("a\xC0\xAF"), 1u);         // overlong
  EXPECT_EQ(find_invalid_utf8("a\xED\xA0\x80"), 1u);     // surrogate
  EXPECT_EQ(find_invalid_utf8("\xF4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(find_invalid_utf8("x\x80"), 1u);             // stray continuation byte
}

TEST(ByteLevel, MapIsGpt2s) {
  EXPECT_EQ(byte_to_char('A'), static_cast<uint32_t>('A'));
  EXPECT_EQ(byte_to_char(' '), 0x120u);   // 'Ġ'
  EXPECT_EQ(byte_to_char('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(byte_to_char(0xAD), 0x143u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(char_to_byte(byte_to_char(static_cast<uint8_t>(b))), b);
  std::string raw;
  ASSERT_TRUE(byte_level_decode("\xC4\xA0hello", &raw));
  EXPECT_EQ(raw, " hello");
  EXPECT_EQ(byte_level_encode(" hello"), "\xC4\xA0hello");
  EXPECT_FALSE(byte_level_decode("\xE2\x96\x81", &raw));  // '▁' is not in the map
}

TEST(ByteLevel, LossyDecodingReplacesMaximalSubparts) {
  // Python: b"a\xf0\x9f\xa6b\xff\xe2\x82".decode("utf-8", "replace") == "a\ufffdb\ufffd\ufffd"
  EXPECT_EQ(utf8_lossy("a\xF0\x9F\xA6"
                       "b\xFF\xE2\x82"),
            "a\xEF\xBF\xBD"
            "b\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate: 3 replacements
  EXPECT_EQ(utf8_lossy("ok \xC3\xA9"), "ok \xC3\xA9");
}

}  // namespace
}  // namespace gale
