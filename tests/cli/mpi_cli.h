// CLI tests that start `gale` under mpirun: Open MPI's environment as the tests run it
// (tests/mpi_test.cmake) and the launcher's argv prefix. Users of mpirun_argv need the
// GALE_MPIEXEC definition (tests/cli/CMakeLists.txt).
#pragma once

#include <string>
#include <vector>

namespace gale::testing {

// The one copy of that environment for tests that start mpirun themselves.
inline const std::vector<std::string> kMpiEnv = {"OMPI_ALLOW_RUN_AS_ROOT=1",
                                                 "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                                                 "OMPI_MCA_rmaps_base_oversubscribe=1",
                                                 "OMPI_MCA_mpi_yield_when_idle=1",
                                                 "OMPI_MCA_btl_vader_single_copy_mechanism=none",
                                                 "OMP_NUM_THREADS=1"};

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

#ifdef GALE_BINARY
// `gale pretrain` on a tiny GPT (2 layers, hidden 64, sequence 32, mock data over 4096 tokens):
// `train_iters` iterations of 4 samples in micro-batches of 1 (2 per rank at DP 2), no evaluation,
// one thread per rank, then `flags` and `extra`; under mpirun when np > 1.
inline std::vector<std::string> tiny_gpt_pretrain(int np, int train_iters, std::vector<std::string> flags,
                                                  const std::vector<std::string>& extra) {
  std::vector<std::string> pretrain = {
      GALE_BINARY, "pretrain", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
      "--seq-length", "32", "--max-position-embeddings", "32", "--micro-batch-size", "1", "--global-batch-size", "4",
      "--train-iters", std::to_string(train_iters), "--lr", "3e-3", "--mock-data", "--vocab-size", "4096",
      "--eval-iters", "0", "--num-threads", "1"};
  pretrain.insert(pretrain.end(), flags.begin(), flags.end());
  return launch_argv(np, pretrain, extra);
}

// `gale pretrain` on a tiny GPT over the dataset `data` of NullTokenizer ids below 99 (EOD 99;
// testing::write_short_documents): 2 layers, hidden 64, sequence 32, 4 iterations of 4 samples in
// micro-batches of 2, no evaluation, one thread per rank, then `extra`; under mpirun when np > 1.
inline std::vector<std::string> short_documents_pretrain(int np, const std::string& data,
                                                         const std::vector<std::string>& extra) {
  const std::vector<std::string> pretrain = {
      GALE_BINARY, "pretrain", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
      "--seq-length", "32", "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "4",
      "--train-iters", "4", "--lr", "3e-3", "--tokenizer-type", "NullTokenizer", "--vocab-size", "99",
      "--data-path", data, "--split", "100,0,0", "--eval-iters", "0", "--log-interval", "1", "--num-threads", "1"};
  return launch_argv(np, pretrain, extra);
}
#endif
#endif

}  // namespace gale::testing
