// Invariant checks that abort the whole job (every rank) when a programming error is found.
//
//   GALE_CHECK(n % tp == 0) << "n=" << n;
//   GALE_CHECK_EQ(a.numel(), b.numel());
//
// Failure prints "CHECK failed: <expr> at <file>:<line>: <message>" to stderr, runs the abort
// hook (the MPI communicator installs MPI_Abort there so no rank is left hanging) and aborts.
// User errors are never CHECKs: they return a Status (status.h).
#pragma once

#include <sstream>

namespace gale {

// Called once before the process ends abnormally, with the exit code the job should end with;
// comm/ installs one under MPI that takes every rank down (MPI_Abort) instead of leaving the
// other ranks waiting. A failed CHECK passes kCheckFailureExitCode.
using AbortHook = void (*)(int exit_code);
constexpr int kCheckFailureExitCode = 134;  // what a shell reports for abort()
void set_abort_hook(AbortHook hook);
[[noreturn]] void fatal_abort(const char* what);

// Exit the whole job with `code` after printing `message` (used for user errors found on one
// rank only, so that every rank stops instead of hanging). Runs the abort hook when code != 0
// and other ranks may be waiting.
[[noreturn]] void fatal_exit(int code, const std::string& message);
// fatal_exit for a thread other than the main one (a watchdog): prints `message`, runs the abort
// hook with `code`, then ends the process with std::_Exit(code) (no static destructors run while
// the main thread may still be using them).
[[noreturn]] void fatal_exit_from_thread(int code, const std::string& message);

class CheckFailure {
 public:
  CheckFailure(const char* expr, const char* file, int line);
  [[noreturn]] ~CheckFailure();
  std::ostream& stream() { return os_; }

 private:
  std::ostringstream os_;
};

// Lets `GALE_CHECK(c) << x` compile to nothing extra when c is true.
struct CheckVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace gale

#define GALE_CHECK(cond) \
  (cond) ? (void)0 : ::gale::CheckVoidify() & ::gale::CheckFailure(#cond, __FILE__, __LINE__).stream()

#define GALE_CHECK_OP_(a, b, op) GALE_CHECK((a)op(b)) << "(" << (a) << " vs " << (b) << ") "
#define GALE_CHECK_EQ(a, b) GALE_CHECK_OP_(a, b, ==)
#define GALE_CHECK_NE(a, b) GALE_CHECK_OP_(a, b, !=)
#define GALE_CHECK_LT(a, b) GALE_CHECK_OP_(a, b, <)
#define GALE_CHECK_LE(a, b) GALE_CHECK_OP_(a, b, <=)
#define GALE_CHECK_GT(a, b) GALE_CHECK_OP_(a, b, >)
#define GALE_CHECK_GE(a, b) GALE_CHECK_OP_(a, b, >=)
#define GALE_CHECK_OK(expr)                                                \
  do {                                                                     \
    ::gale::Status gale_check_status_ = (expr);                            \
    GALE_CHECK(gale_check_status_.ok()) << gale_check_status_.to_string(); \
  } while (0)
