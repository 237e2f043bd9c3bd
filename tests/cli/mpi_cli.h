// CLI tests that start `gale` under mpirun: Open MPI's environment as the tests run it
// (tests/mpi_test.cmake) and the launcher's argv prefix. Users of mpirun_argv need the
// GALE_MPIEXEC definition (tests/cli/CMakeLists.txt).
#pragma once

#include <string>
#include <vector>

namespace gale::testing {

inline const std::vector<std::string> kMpiEnv = {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                                                 "OMPI_MCA_mpi_yield_when_idle=1",
                                                 "OMPI_MCA_btl_vader_single_copy_mechanism=none", "OMP_NUM_THREADS=1"};

#ifdef GALE_MPIEXEC
// `mpirun --oversubscribe --bind-to none -np <np>` (the program and its flags follow).
inline std::vector<std::string> mpirun_argv(int np) {
  return {GALE_MPIEXEC, "--oversubscribe", "--bind-to", "none", "-np", std::to_string(np)};
}

// `program` then `extra`, under mpirun_argv(np) when np > 1.
inline std::vector<std::string> launch_argv(int np, const std::vector<std::string>& program,
                                            const std::vector<std::string>& extra) {
  std::vector<std::string> argv = np > 1 ? mpirun_argv(np) : std::vector<std::string>{};
  argv.insert(argv.end(), program.begin(), program.end());
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}
#endif

}  // namespace gale::testing
