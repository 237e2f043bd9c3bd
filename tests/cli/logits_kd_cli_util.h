// The offline-distillation CLI tests' tiny model and launcher: `layers` layers (no dropout: exact
// comparisons), mock data over 4095 ids, 4 samples per iteration in micro-batches of 1, 2 iterations.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "cli/mpi_cli.h"
#include "subprocess.h"

namespace gale::testing {

inline std::vector<std::string> kd_tiny_model(int layers, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {
      "pretrain", "--num-layers", std::to_string(layers), "--hidden-size", "64", "--num-attention-heads", "4",
      "--ffn-hidden-size", "128", "--seq-length", "32", "--max-position-embeddings", "32", "--micro-batch-size", "1",
      "--global-batch-size", "4", "--train-iters", "2", "--lr", "3e-3", "--mock-data", "--vocab-size", "4095",
      "--log-interval", "1", "--eval-iters", "0", "--num-threads", "1", "--attention-dropout", "0",
      "--hidden-dropout", "0"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// `gale` with kd_tiny_model(layers, flags) on `np` ranks (under mpirun when np > 1).
inline test::RunResult run_kd_tiny_model(int np, int layers, const std::vector<std::string>& flags) {
  return test::run_with_timeout(launch_argv(np, {GALE_BINARY}, kd_tiny_model(layers, flags)),
                                np > 1 ? kMpiEnv : std::vector<std::string>{}, 300);
}

}  // namespace gale::testing
