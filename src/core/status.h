// Recoverable errors: Status and StatusOr<T>, returned (never thrown) across layer boundaries.
//
// Use Status for anything a user can cause (bad flag, bad file, truncated checkpoint): the message
// names the flag or file, what was expected and what was found. Use GALE_CHECK (check.h) only for
// invariants of the program itself.
#pragma once

#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <variant>

namespace gale {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // a flag or value is wrong
  kNotFound,          // a file or key does not exist
  kDataLoss,          // a file exists but is truncated or corrupt
  kFailedPrecondition,
  kUnimplemented,     // "not supported yet"
  kIOError,
  kOutOfRange,
  kInternal,
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "InvalidArgument: --lr: expected a number, found 'abc'"
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Concatenate anything streamable: str_cat("expected ", 3, " found ", x).
template <class... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

template <class... Args> Status InvalidArgument(const Args&... a) { return Status(StatusCode::kInvalidArgument, str_cat(a...)); }
template <class... Args> Status NotFound(const Args&... a) { return Status(StatusCode::kNotFound, str_cat(a...)); }
template <class... Args> Status DataLoss(const Args&... a) { return Status(StatusCode::kDataLoss, str_cat(a...)); }
template <class... Args> Status FailedPrecondition(const Args&... a) { return Status(StatusCode::kFailedPrecondition, str_cat(a...)); }
template <class... Args> Status Unimplemented(const Args&... a) { return Status(StatusCode::kUnimplemented, str_cat(a...)); }
template <class... Args> Status IOError(const Args&... a) { return Status(StatusCode::kIOError, str_cat(a...)); }
template <class... Args> Status OutOfRange(const Args&... a) { return Status(StatusCode::kOutOfRange, str_cat(a...)); }
template <class... Args> Status Internal(const Args&... a) { return Status(StatusCode::kInternal, str_cat(a...)); }

// A value or the Status saying why there is none.
template <class T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : status_(std::move(status)) {}  // NOLINT: implicit by design
  StatusOr(T value) : value_(std::move(value)) {}           // NOLINT
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace gale

#define GALE_CONCAT_INNER_(a, b) a##b
#define GALE_CONCAT_(a, b) GALE_CONCAT_INNER_(a, b)

// Return early from a function returning Status or StatusOr when `expr` is not OK.
#define GALE_RETURN_IF_ERROR(expr)                 \
  do {                                             \
    ::gale::Status gale_status_ = (expr);          \
    if (!gale_status_.ok()) return gale_status_;   \
  } while (0)

// `GALE_ASSIGN_OR_RETURN(auto x, make_x());`
#define GALE_ASSIGN_OR_RETURN(lhs, expr) GALE_ASSIGN_OR_RETURN_IMPL_(GALE_CONCAT_(gale_or_, __LINE__), lhs, expr)
#define GALE_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()
