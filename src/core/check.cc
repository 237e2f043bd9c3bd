// Job-wide abort on failed invariants.
#include "core/check.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace gale {

namespace {
std::atomic<AbortHook> g_abort_hook{nullptr};
}

void set_abort_hook(AbortHook hook) { g_abort_hook.store(hook); }

void fatal_abort(const char* what) {
  std::fprintf(stderr, "%s\n", what);
  std::fflush(stderr);
  std::fflush(stdout);
  if (AbortHook hook = g_abort_hook.exchange(nullptr)) hook(kCheckFailureExitCode);
  std::abort();
}

void fatal_exit(int code, const std::string& message) {
  if (!message.empty()) std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  if (code != 0) {
    if (AbortHook hook = g_abort_hook.exchange(nullptr)) hook(code);
  }
  std::exit(code);
}

void fatal_exit_from_thread(int code, const std::string& message) {
  if (!message.empty()) std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  if (AbortHook hook = g_abort_hook.exchange(nullptr)) hook(code);
  std::_Exit(code);
}

CheckFailure::CheckFailure(const char* expr, const char* file, int line) {
  os_ << "CHECK failed: " << expr << " at " << file << ":" << line << ": ";
}

CheckFailure::~CheckFailure() {
  std::string what = os_.str();
  fatal_abort(what.c_str());
}

}  // namespace gale
