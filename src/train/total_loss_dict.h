// Megatron's total_loss_dict: the training log line's loss entries, accumulated over a log interval.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/training_log.h"

namespace gale {

// The losses Megatron's training_log sums between two log lines, in its order. Keys keep the
// position of their first insertion for the whole run (Megatron zeroes them at each line but never
// removes them), so the line's order is the order in which they first appeared:
//  - add_loss_dict: the loss function's dict of an iteration (lm loss, ...); summed only when the
//    iteration advanced (a skipped iteration adds nothing, and inserts no new key);
//  - add_tracked: the trackers' per-iteration values (MoE auxiliary losses, mtp_k loss, indexer
//    loss), summed every iteration, skipped or not (Megatron's trackers add to the dict
//    unconditionally).
// averages(advanced) divides every sum by max(1, advanced); the line prints those >= 0.
class TotalLossDict {
 public:
  void add_loss_dict(const LossDict& losses, bool advanced);
  void add_tracked(const LossDict& values);
  LossDict averages(int64_t advanced) const;
  // Zeroes every sum, keeping the keys and their order (Megatron's reset after a line).
  void reset();

 private:
  void add(const std::string& key, double value);
  LossDict sums_;
};

// Megatron's training_log `track_names` for the MoE tracker, as indices into kMoeAuxTypes /
// kMoeAuxLossNames (model/config.h), in its order: each of aux_loss, seq_aux_loss, global_aux_loss
// for which `"<type>" in args.moe_router_load_balancing_type` holds. Megatron turns a one-element
// list into its string, so for the scalar form (`list_types` empty) that is a substring test:
// "seq_aux_loss" and "global_aux_loss" contain "aux_loss", and load_balancing_loss is tracked too
// (its never-recorded entry is zero and prints as 0.000000E+00). For the list form it is membership.
std::vector<int> moe_tracked_aux_kinds(const std::string& scalar_type, const std::vector<std::string>& list_types);

}  // namespace gale
