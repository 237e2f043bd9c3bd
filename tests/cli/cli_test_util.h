// Running the `gale` binary from tests: exit code, stdout and stderr of one command.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace gale::testing {

struct CommandResult {
  int exit_code = -1;
  std::string out, err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs `GALE_BINARY <args>` through the shell (args must be shell-quoted by the caller).
inline CommandResult run_gale(const std::string& args, const std::string& scratch_dir) {
  std::string out = scratch_dir + "/.stdout", err = scratch_dir + "/.stderr";
  std::string cmd = std::string(GALE_BINARY) + " " + args + " >" + out + " 2>" + err;
  int status = std::system(cmd.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  std::filesystem::remove(out);
  std::filesystem::remove(err);
  return r;
}

}  // namespace gale::testing
