// bytes_to_unicode and lossy UTF-8 decoding.
#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/unicode.h"

namespace gale {

namespace {
struct ByteMap {
  std::array<uint32_t, 256> to_char{};
  std::array<int16_t, 512> to_byte{};  // characters used are all below U+0200
  ByteMap() {
    to_byte.fill(-1);
    bool printable[256] = {};
    for (int b = '!'; b <= '~'; ++b) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      to_char[static_cast<size_t>(b)] = printable[b] ? static_cast<uint32_t>(b) : next++;
      to_byte[to_char[static_cast<size_t>(b)]] = static_cast<int16_t>(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}
}  // namespace

uint32_t byte_to_char(uint8_t b) { return byte_map().to_char[b]; }

int char_to_byte(uint32_t cp) { return cp < 512 ? byte_map().to_byte[cp] : -1; }

bool byte_level_decode(std::string_view text, std::string* out) {
  out->clear();
  const unsigned char* p = reinterpret_cast<const unsigned char*>(text.data());
  size_t i = 0;
  while (i < text.size()) {
    int len;
    uint32_t cp = decode_utf8(p + i, &len);
    int b = char_to_byte(cp);
    if (b < 0) return false;
    out->push_back(static_cast<char>(b));
    i += static_cast<size_t>(len);
  }
  return true;
}

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  for (unsigned char c : bytes) append_utf8(byte_to_char(c), &out);
  return out;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  const unsigned char* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t n = bytes.size(), i = 0;
  while (i < n) {
    unsigned char c = p[i];
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    // Expected length and the allowed range of the second byte (Unicode Table 3-7).
    int len = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    }
    if (len == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
      continue;
    }
    size_t k = 1;
    bool ok = true;
    for (; k < static_cast<size_t>(len); ++k) {
      if (i + k >= n) {
        ok = false;
        break;
      }
      unsigned char x = p[i + k];
      unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
      if (x < l || x > h) {
        ok = false;
        break;
      }
    }
    if (ok) {
      out.append(reinterpret_cast<const char*>(p + i), static_cast<size_t>(len));
      i += static_cast<size_t>(len);
    } else {
      out += "\xEF\xBF\xBD";  // the maximal valid prefix (k bytes) is one replacement
      i += k;
    }
  }
  return out;
}

}  // namespace gale
