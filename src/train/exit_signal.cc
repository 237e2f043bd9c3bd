// SIGTERM flag for --exit-signal-handler.
#include "train/exit_signal.h"

#include <csignal>

namespace gale {

namespace {
volatile std::sig_atomic_t g_sigterm_received = 0;
extern "C" void note_sigterm(int) { g_sigterm_received = 1; }
}  // namespace

void install_exit_signal_handler() {
  struct sigaction action = {};
  action.sa_handler = note_sigterm;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // blocking calls (MPI, file I/O) resume instead of failing with EINTR
  sigaction(SIGTERM, &action, nullptr);
}

bool exit_signal_received() { return g_sigterm_received != 0; }

}  // namespace gale
