// `gale pretrain`: Megatron's pretrain_gpt.py.
#include <cstdio>

#include "cli/subcommands.h"
#include "kernels/cpu/gemm.h"

namespace gale::cli {

int run_pretrain(int argc, char** argv) {
  std::printf("GEMM: %s\n", gemm_backend_description().c_str());
  return 0;
}

}  // namespace gale::cli
