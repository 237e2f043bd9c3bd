// NullTokenizer.
#include "tokenizer/null_tokenizer.h"

#include <limits>

namespace gale {

StatusOr<std::unique_ptr<NullTokenizer>> NullTokenizer::create(int64_t vocab_size) {
  if (vocab_size <= 0) return InvalidArgument("--vocab-size is required for NullTokenizer (a positive integer)");
  if (vocab_size >= std::numeric_limits<int32_t>::max())
    return InvalidArgument("--vocab-size ", vocab_size, " is too large (ids are 32-bit)");
  auto t = std::make_unique<NullTokenizer>();
  t->vocab_size_ = vocab_size;
  return t;
}

Status NullTokenizer::encode(std::string_view text, std::vector<int32_t>* ids) const {
  // Python: [int(x) for x in text.split(' ')]. int() allows surrounding whitespace and a sign.
  size_t pos = 0;
  while (true) {
    size_t sp = text.find(' ', pos);
    std::string_view part = text.substr(pos, sp == std::string_view::npos ? std::string_view::npos : sp - pos);
    size_t b = part.find_first_not_of("\t\n\v\f\r"), e = part.find_last_not_of("\t\n\v\f\r");
    std::string_view t = b == std::string_view::npos ? std::string_view() : part.substr(b, e - b + 1);
    bool negative = false;
    size_t k = 0;
    if (!t.empty() && (t[0] == '+' || t[0] == '-')) negative = t[k++] == '-';
    if (k >= t.size())
      return InvalidArgument("NullTokenizer: expected space-separated integers, found '",
                             std::string(part.substr(0, 40)), "'");
    int64_t v = 0;
    for (; k < t.size(); ++k) {
      if (t[k] < '0' || t[k] > '9' || v > (int64_t{1} << 40))
        return InvalidArgument("NullTokenizer: expected space-separated integers, found '",
                               std::string(part.substr(0, 40)), "'");
      v = v * 10 + (t[k] - '0');
    }
    if (negative) v = -v;
    if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
      return InvalidArgument("NullTokenizer: id ", v, " does not fit 32 bits");
    ids->push_back(static_cast<int32_t>(v));
    if (sp == std::string_view::npos) break;
    pos = sp + 1;
  }
  return Status::Ok();
}

StatusOr<std::string> NullTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ' ';
    out += std::to_string(ids[i]);
  }
  return out;
}

}  // namespace gale
