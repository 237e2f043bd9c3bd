// The MPI world and the engine of the MPI schedule benchmarks, built from Megatron flags.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "comm/mpi_communicator.h"
#include "train/engine.h"

namespace gale::bench {

// The MPI world; when MPI cannot start, prints why (named by `program`) and exits with status 1.
inline Comm init_world_or_exit(const char* program) {
  StatusOr<Comm> w = init_mpi_world();
  if (!w.ok()) {
    std::fprintf(stderr, "%s: %s\n", program, w.status().to_string().c_str());
    std::exit(1);
  }
  return w.value();
}

// `gale pretrain` flags (without the program name) parsed and validated into *args for `world`,
// the vocabulary padded to 1024 (the synthetic batches' token ids), then the engine with `ops`.
// A flag error aborts: the benchmarks' flags are fixed in their code.
inline std::unique_ptr<Engine> build_bench_engine(const std::vector<std::string>& flags, const Comm& world,
                                                  Arguments* args, const OpTable& ops) {
  ArgParser parser("gale pretrain", "bench");
  add_all_pretrain_args(parser, *args);
  std::vector<std::string> argv = {"gale"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  std::vector<char*> ptrs;
  for (auto& a : argv) ptrs.push_back(a.data());
  GALE_CHECK_OK(parser.parse(static_cast<int>(ptrs.size()), ptrs.data()));
  GALE_CHECK_OK(validate_all_pretrain_args(*args, parser, world->size()));
  args->model.padded_vocab_size = 1024;
  auto e = build_engine(*args, world, ops);
  GALE_CHECK_OK(e.status());
  return std::move(e).value();
}

}  // namespace gale::bench
