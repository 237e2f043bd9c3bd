// ICU-backed normalisation and lowercasing.
#include "tokenizer/unicode_normalize.h"

#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <vector>

namespace gale {

namespace {
bool is_ascii(const std::string& s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

Status to_utf16(const std::string& in, std::vector<UChar>* out) {
  UErrorCode err = U_ZERO_ERROR;
  int32_t len = 0;
  u_strFromUTF8(nullptr, 0, &len, in.data(), static_cast<int32_t>(in.size()), &err);
  if (err != U_BUFFER_OVERFLOW_ERROR && U_FAILURE(err)) return InvalidArgument("invalid UTF-8 for normalisation");
  out->resize(static_cast<size_t>(len) + 1);
  err = U_ZERO_ERROR;
  u_strFromUTF8(out->data(), len + 1, &len, in.data(), static_cast<int32_t>(in.size()), &err);
  if (U_FAILURE(err)) return InvalidArgument("invalid UTF-8 for normalisation");
  out->resize(static_cast<size_t>(len));
  return Status::Ok();
}

Status to_utf8(const std::vector<UChar>& in, std::string* out) {
  UErrorCode err = U_ZERO_ERROR;
  int32_t len = 0;
  u_strToUTF8(nullptr, 0, &len, in.data(), static_cast<int32_t>(in.size()), &err);
  if (err != U_BUFFER_OVERFLOW_ERROR && U_FAILURE(err)) return Internal("ICU: UTF-16 to UTF-8 failed");
  out->resize(static_cast<size_t>(len));
  err = U_ZERO_ERROR;
  u_strToUTF8(out->data(), len, &len, in.data(), static_cast<int32_t>(in.size()), &err);
  if (U_FAILURE(err) && err != U_STRING_NOT_TERMINATED_WARNING) return Internal("ICU: UTF-16 to UTF-8 failed");
  return Status::Ok();
}
}  // namespace

Status unicode_normalize(NormalForm form, std::string* text) {
  if (is_ascii(*text)) return Status::Ok();
  UErrorCode err = U_ZERO_ERROR;
  const UNormalizer2* n = nullptr;
  switch (form) {
    case NormalForm::kNfc:
      n = unorm2_getNFCInstance(&err);
      break;
    case NormalForm::kNfd:
      n = unorm2_getNFDInstance(&err);
      break;
    case NormalForm::kNfkc:
      n = unorm2_getNFKCInstance(&err);
      break;
    case NormalForm::kNfkd:
      n = unorm2_getNFKDInstance(&err);
      break;
  }
  if (U_FAILURE(err)) return Internal("ICU: cannot load the normaliser (", u_errorName(err), ")");
  std::vector<UChar> src, dst;
  GALE_RETURN_IF_ERROR(to_utf16(*text, &src));
  dst.resize(src.size() * 3 + 16);
  err = U_ZERO_ERROR;
  int32_t len = unorm2_normalize(n, src.data(), static_cast<int32_t>(src.size()), dst.data(),
                                 static_cast<int32_t>(dst.size()), &err);
  if (err == U_BUFFER_OVERFLOW_ERROR) {
    dst.resize(static_cast<size_t>(len));
    err = U_ZERO_ERROR;
    len = unorm2_normalize(n, src.data(), static_cast<int32_t>(src.size()), dst.data(), len, &err);
  }
  if (U_FAILURE(err) && err != U_STRING_NOT_TERMINATED_WARNING)
    return Internal("ICU: normalisation failed (", u_errorName(err), ")");
  dst.resize(static_cast<size_t>(len));
  return to_utf8(dst, text);
}

Status unicode_lowercase(std::string* text) {
  if (is_ascii(*text)) {
    for (char& c : *text)
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
    return Status::Ok();
  }
  std::vector<UChar> src, dst;
  GALE_RETURN_IF_ERROR(to_utf16(*text, &src));
  dst.resize(src.size() * 3 + 16);
  UErrorCode err = U_ZERO_ERROR;
  int32_t len = u_strToLower(dst.data(), static_cast<int32_t>(dst.size()), src.data(), static_cast<int32_t>(src.size()),
                             "", &err);
  if (U_FAILURE(err) && err != U_STRING_NOT_TERMINATED_WARNING)
    return Internal("ICU: lowercasing failed (", u_errorName(err), ")");
  dst.resize(static_cast<size_t>(len));
  return to_utf8(dst, text);
}

}  // namespace gale
