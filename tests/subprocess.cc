// Child processes with a time limit for tests (fork/exec, output through a temporary file).
#include "subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

namespace gale::test {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

RunResult run_with_timeout(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env,
                           double timeout_seconds) {
  RunResult result;
  char path[] = "/tmp/gale_subprocess_XXXXXX";
  int out_fd = mkstemp(path);
  if (out_fd < 0) {
    result.output = "mkstemp failed";
    return result;
  }
  auto t0 = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    dup2(out_fd, 1);
    dup2(out_fd, 2);
    for (const std::string& kv : extra_env) putenv(strdup(kv.c_str()));
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid);  // also from the parent, so kill(-pid) works however the race goes
  int status = 0;
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (seconds_since(t0) > timeout_seconds) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      result.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  result.seconds = seconds_since(t0);
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  close(out_fd);
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  result.output = ss.str();
  std::remove(path);
  return result;
}

bool process_alive(int pid) {
  if (kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  size_t close_paren = line.rfind(')');
  return !(close_paren != std::string::npos && close_paren + 2 < line.size() && line[close_paren + 2] == 'Z');
}

}  // namespace gale::test
