// Megatron's theoretical memory footprint (report_theoretical_memory): the lines rank 0 prints
// after the first training log line.
//
// Megatron's estimate, not Gale's measurement: weights and optimizer state assume bf16 training
// (18 bytes per parameter, or 6 + 12/DP with the distributed optimizer) on the most loaded model
// shard (the first pipeline stage with the embedding), and the activations come from the
// paper's per-layer formula (Korthikanti et al. 2022, Table 2) with sequence parallelism and
// selective recomputation, else Megatron's "precise, without SP" formula. Gale prints it
// because Megatron users read it in their logs; the measured bytes follow it in the memory
// report line (train/memory_report.h).
//
// The formulas are Megatron main's (megatron/training/theoretical_memory_usage.py), verbose:
//   Number of parameters in transformer block in billions:  X.XX
//   Number of active parameters in transformer block in billions:  X.XX
//   [Number of parameters in mtp block in billions:  X.XX]            (--mtp-num-layers)
//   Number of parameters in embedding layers in billions: X.XX
//   Total number of parameters in billions: X.XX
//   Total number of active parameters in billions: X.XX
//   Number of parameters in most loaded shard in billions: X.XXXX
//   [Number of parameters in other shards in billions: X.XXXX]        (PP > 1)
//   compute_activation_memory_without_sp                               (or "... with SP")
//   Activation memory footprint per transformer layer (precise, without SP): X.X MB
//   [Memory penalty from interleaved schedule: X.XX]                   (virtual pipeline)
//   [Number of in-flight microbatches: N]                              (PP > 1)
//   Theoretical memory footprints: weight and optimizer=X.XX MB, activation=X.XX MB, total=X.XX MB
//   (an empty line)
// A hybrid Mamba model gets Megatron's one line "Theoretical memory footprints not yet supported
// for hybrid Mamba-Transformer models." instead.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "train/arguments.h"

namespace gale {

struct TheoreticalMemory {
  double weight_and_optimizer_mb = 0.0, activation_mb = 0.0, total_mb = 0.0;
  std::vector<std::string> lines;  // what Megatron prints, in its order
};

// `a` validated (its derived sizes filled, padded_vocab_size set); `num_microbatches` the current
// number of micro-batches per iteration (Megatron's get_num_microbatches()). Fails only on a
// malformed --moe-layer-freq (validation has checked it).
StatusOr<TheoreticalMemory> theoretical_memory(const Arguments& a, int64_t num_microbatches);

}  // namespace gale
