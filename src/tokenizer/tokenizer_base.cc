// The Tokenizer base class's shared pieces (kept apart from the factory, which links every tokenizer).
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace gale {

std::string Tokenizer::describe() const { return str_cat(type(), ": vocabulary ", vocab_size(), ", eod ", eod()); }

Status check_utf8(std::string_view text) {
  size_t bad = find_invalid_utf8(text);
  if (bad != std::string_view::npos) return InvalidArgument("invalid UTF-8 at byte ", bad);
  return Status::Ok();
}

}  // namespace gale
