// GPT-2's reversible byte <-> printable-character map (bytes_to_unicode), used by byte-level BPE
// vocabularies (GPT-2, Llama-3, Qwen): byte b is written as the character byte_to_char(b).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace gale {

uint32_t byte_to_char(uint8_t b);
// The byte a character stands for, or -1 when the character is not in the map.
int char_to_byte(uint32_t cp);

// "Ġhello" -> " hello". Returns false (and leaves *out unspecified) if a character is not in the map.
bool byte_level_decode(std::string_view text, std::string* out);
// " hello" -> "Ġhello".
std::string byte_level_encode(std::string_view bytes);

// Python's bytes.decode('utf-8', errors='replace') / Rust's String::from_utf8_lossy: every
// maximal invalid subsequence becomes U+FFFD.
std::string utf8_lossy(std::string_view bytes);

}  // namespace gale
