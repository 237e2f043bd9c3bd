// SIGTERM flag for --exit-signal-handler, set by a thread that waits for the signal.
#include "train/exit_signal.h"

#include <pthread.h>

#include <csignal>
#include <mutex>
#include <thread>

namespace gale {

namespace {
volatile std::sig_atomic_t g_sigterm_received = 0;
extern "C" void note_sigterm(int) { g_sigterm_received = 1; }
}  // namespace

void install_exit_signal_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    // A thread that existed before this call and does not block SIGTERM may still take it: the
    // handler only sets the flag there.
    struct sigaction action = {};
    action.sa_handler = note_sigterm;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;  // blocking calls (MPI, file I/O) resume instead of failing with EINTR
    sigaction(SIGTERM, &action, nullptr);
    // Every thread started from here on (MPI's, OpenMP's) inherits the block, so the signal never
    // interrupts compute code; the watcher takes it with sigwait.
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    std::thread([set] {
      int sig = 0;
      while (sigwait(&set, &sig) == 0)
        if (sig == SIGTERM) g_sigterm_received = 1;
    }).detach();
  });
}

bool exit_signal_received() { return g_sigterm_received != 0; }

}  // namespace gale
