// MD5 (RFC 1321) of a byte string as 32 lowercase hex digits: the digest Python's hashlib.md5
// gives, for formats that key data by it (Megatron's cached-logits dataset hash,
// train/cached_logits.h). Not for security.
#pragma once

#include <string>
#include <string_view>

namespace gale {

std::string md5_hex(std::string_view bytes);

}  // namespace gale
