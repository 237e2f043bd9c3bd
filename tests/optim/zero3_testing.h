// The shared part of the ZeRO-3 MPI tests (custom FSDP, LayerZeRO, FSDP2): the 3-layer model run
// and the comparison of a rank's parameter shards with a replicated run.
#pragma once

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/temp_dir.h"
#include "testing_checkpoint_run.h"

namespace gale::testing {

// 3 layers, 8 micro-batches of one sample, AdamW with clipping; `model` the shape (kTinyGpt,
// kTinyLlama, ...), `flags` the sharding under test.
struct Zero3Run : CheckpointRun {
  Zero3Run(const Comm& world, const std::vector<std::string>& model, const std::vector<std::string>& flags)
      : CheckpointRun(join({{"--num-layers", "3", "--hidden-size", "64", "--seq-length", "16",
                              "--max-position-embeddings", "16", "--micro-batch-size", "1", "--global-batch-size", "8",
                              "--train-iters", "6", "--lr", "5e-3", "--lr-warmup-iters", "1", "--mock-data",
                              "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1", "--attention-dropout",
                              "0.1", "--eval-iters", "0", "--log-interval", "1000", "--clip-grad", "0.5",
                              "--weight-decay", "0.1"},
                             model, flags}),
                      world, kTinyVocab) {}
};

// --use-torch-fsdp2 with MindSpeed's configuration file (--fsdp2-config-path) holding `yaml` (empty: no
// file, Megatron's defaults), then `extra`. The file lies in this process's temporary directory, removed
// at exit (one per rank: every rank is a process).
inline std::vector<std::string> fsdp2_flags(const std::string& yaml, const std::vector<std::string>& extra = {}) {
  static const testing_util::TempDir dir;
  std::vector<std::string> flags = {"--use-torch-fsdp2"};
  if (!yaml.empty()) {
    const std::string path = dir.file(std::to_string(std::hash<std::string>{}(yaml)) + ".yaml");
    std::ofstream(path) << yaml;
    flags.insert(flags.end(), {"--fsdp2-config-path", path});
  }
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

// Largest relative difference (per unit) between this rank's ZeRO-3 shards (ZeRO-2: the whole
// values) and the same elements of a replicated run's parameters.
inline double shard_vs_replicated(const ParamBuffer& zero3, const ParamBuffer& plain) {
  double worst = 0.0;
  const float* p = plain.flat_params().data<float>();
  for (int u = 0; u < zero3.num_units(); ++u) {
    const ParamUnit& x = zero3.unit(u);
    double diff = 0.0, norm = 0.0;
    const bool whole = !zero3.values_sharded();
    for (int64_t i = whole ? x.begin : x.own_begin; i < (whole ? x.end : x.own_end); ++i) {
      const double a = whole ? zero3.flat_params().data<float>()[i] : zero3.shard_values(u)[i - x.own_begin], b = p[i];
      diff += (a - b) * (a - b);
      norm += b * b;
    }
    if (norm > 0.0) worst = std::max(worst, std::sqrt(diff / norm));
  }
  return worst;
}

}  // namespace gale::testing
