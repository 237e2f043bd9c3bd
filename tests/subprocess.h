// Test helper: run a command in a child process with a time limit, capturing its output.
#pragma once

#include <string>
#include <vector>

namespace gale::test {

struct RunResult {
  int exit_code = -1;      // exit status when the child exited
  int signal = 0;          // terminating signal, when killed
  bool timed_out = false;  // the limit passed; the child's whole process group was killed
  double seconds = 0.0;    // wall time until exit (or until the limit)
  std::string output;      // stdout and stderr together
};

// Runs argv[0] (searched in PATH) with `extra_env` ("NAME=value") added to the environment, in
// its own process group. After `timeout_seconds` the group gets SIGKILL and timed_out is set.
RunResult run_with_timeout(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env,
                           double timeout_seconds);

// True while a process with this pid exists (and is not a zombie).
bool process_alive(int pid);

}  // namespace gale::test
