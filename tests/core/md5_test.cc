// MD5 digests (core/md5.h) against RFC 1321's test suite and hashlib.md5 of a longer string.
#include "core/md5.h"

#include <gtest/gtest.h>

#include <string>

namespace gale {
namespace {

TEST(Md5, Rfc1321TestSuite) {
  EXPECT_EQ(md5_hex(""), "d41d8cd98f00b204e9800998ecf8427e");
  EXPECT_EQ(md5_hex("a"), "0cc175b9c0f1b6a831c399e269772661");
  EXPECT_EQ(md5_hex("abc"), "900150983cd24fb0d6963f7d28e17f72");
  EXPECT_EQ(md5_hex("message digest"), "f96b697d7cb7938d525a2f31aaf161d0");
  EXPECT_EQ(md5_hex("abcdefghijklmnopqrstuvwxyz"), "c3fcd3d76192e4007dfb496cca67e13b");
  EXPECT_EQ(md5_hex("12345678901234567890123456789012345678901234567890123456789012345678901234567890"),
            "57edf4a22be3c955ac49da2e2107b67a");
}

// A 56-byte message (padding spills into a second block): python3 -c "import hashlib;
// print(hashlib.md5(b'x'*56).hexdigest())".
TEST(Md5, PaddingIntoASecondBlock) { EXPECT_EQ(md5_hex(std::string(56, 'x')), "668a72d5ba17f08e62dabcafad6db14b"); }

}  // namespace
}  // namespace gale
