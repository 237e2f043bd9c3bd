// ZeRO-3 for one model chunk (Megatron-FSDP's --data-parallel-sharding-strategy
// optim_grads_params): parameters, gradients and optimizer state sharded over the data-parallel
// group, each unit's whole parameters gathered only while it is used.
//
// Units are the groups GPTModel reports to its hooks (the embedding, each transformer layer, the
// head), each a contiguous run of whole parameters of the chunk's flat layout. A unit of n
// elements is padded to P = ⌈n/dp⌉·dp and cut into dp shards of P/dp elements, like a bucket of
// the distributed optimizer (optim/grad_buckets.h): rank r keeps elements [r·s, min((r+1)·s, n)).
// ParamBuffer::shard_storage keeps only those shards (values and gradients); the optimizer updates
// them through the flat offsets of owned_ranges() (ParamBuffer::master_data / master_grad).
//
// Per micro-batch (no pipelining: forward, then backward):
//   on_params_needed(ids)  forward pre-hook: all-gather the unit of `ids`; release every other
//                          gathered unit except the pinned one (a tied embedding, which the head
//                          reads too and whose gradient completes only after the embedding's
//                          backward). The head is gathered last and so stays for the backward.
//   on_grads_ready(ids)    after the unit's backward: scale its gradient by 1/dp, reduce-scatter
//                          it, add this rank's part to the gradient shard (so micro-batches
//                          accumulate), release the unit, and all-gather the unit below it (the
//                          next one backward needs).
// start_iteration releases what is still gathered (an evaluation's forward) and zeroes the gradient shards; after the optimizer step nothing is gathered: the
// next forward gathers the updated shards. gather_all / release_all bracket code that reads or
// writes every parameter (checkpoints, weight hashes). All collectives are blocking, on the
// calling thread, in the same order on every data-parallel rank.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "model/params.h"
#include "optim/grad_buckets.h"

namespace gale {

class Zero3Sync {
 public:
  // `groups`: the chunk's parameter groups (any order; each contiguous in the flat layout, together
  // tiling it). `pinned`: a parameter whose unit stays gathered from its first use in a forward to
  // its own gradient report (-1: none). Shards the buffer's storage (ParamBuffer::shard_storage).
  Zero3Sync(ParamBuffer* params, Comm dp, const std::vector<std::vector<int>>& groups, int pinned = -1);
  Zero3Sync(const Zero3Sync&) = delete;
  Zero3Sync& operator=(const Zero3Sync&) = delete;

  int64_t dp_size() const { return dp_size_; }
  // This rank's shard of every unit, in flat offsets (empty shards left out).
  std::vector<FlatRange> owned_ranges() const;

  void start_iteration();
  void on_params_needed(const std::vector<int>& param_ids);
  void on_grads_ready(const std::vector<int>& param_ids);
  // Every unit gathered (values; zero gradients) / every unit released, its shard first taken back
  // from the gathered values when `write_back` (after a checkpoint load).
  void gather_all();
  void release_all(bool write_back);
  // Units gathered now, and the most gathered at once since construction.
  int gathered_units() const;
  int max_gathered_units() const { return max_gathered_; }

 private:
  void gather(int u);
  void reduce_scatter_grads(int u);

  ParamBuffer* params_;
  Comm dp_;
  int64_t dp_size_ = 1, dp_rank_ = 0;
  int pinned_unit_ = -1;
  int max_gathered_ = 0;
};

}  // namespace gale
