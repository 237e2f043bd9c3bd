// ZeRO-3 for one model chunk (Megatron-FSDP's --data-parallel-sharding-strategy
// optim_grads_params): parameters, gradients and optimizer state sharded over the data-parallel
// group, each unit's whole parameters gathered only while it is used. Two variants:
//   - ZeRO-2 (optim_grads; Zero3Options::shard_params false): only the gradients and the
//     optimizer state are sharded; the values stay whole, nothing is gathered before a use, and
//     after the optimizer step each unit's updated shards are all-gathered into the whole values.
//   - MindSpeed's LayerZeRO (Zero3Options::replicas): the shard group is a sub-group of zero3_size
//     consecutive DP ranks (ZeRO-3 inside it), and the optimizer state is sharded over the whole DP
//     group (ZeRO-1): each shard is cut again into one piece per replica (the ranks holding the
//     same shard in the other sub-groups), finish_grad_sync all-reduces the shards' gradients over
//     the replicas, each rank updates its piece, and after_optimizer_step all-gathers the pieces
//     over the replicas back into the shard.
//
//   - PyTorch FSDP2 (--use-torch-fsdp2, train/fsdp2_config.h): ZeRO-3 with FSDP2's schedule
//     options: Zero3Options::root_params (the units not wrapped on their own: FSDP2's root, all
//     gathered before the first unit's forward and kept until the end of the backward, where their
//     gradients are reduce-scattered after the lowest unit's), reshard_after_forward false (a unit
//     stays gathered from its forward to its backward: no second all-gather), forward_prefetch n
//     (a wrapped unit's forward starts the asynchronous all-gathers of the next n wrapped units,
//     awaited at their own forward: the same bytes, so training is bitwise that of n = 0), and HSDP
//     (replicas with shard_optimizer_over_replicas false: the shard gradients are all-reduced over
//     the replicas like LayerZeRO's, but each rank keeps and updates its whole shard).
//     Mixed precision (PyTorch's MixedPrecisionPolicy as FSDP2 applies it; docs/parallelism.md §16):
//     param_dtype bf16 is a buffer that gathers_bf16 (ParamBuffer, model/params.h: --bf16): the
//     shards stay the f32 masters, and each rank sends its shard's GEMM weights rounded to bf16
//     (nearest even) and its other elements in f32 in one all-gather of equal payloads (the
//     largest rank's, padded), unpacked into the unit's bf16 and f32 storage: the model reads the
//     bf16 values Gale's --bf16 reads, for 2 bytes per GEMM-weight element instead of 4.
//     gather_all (checkpoints) gathers f32. Zero3Options::reduce_bf16 (reduce_dtype bf16): the
//     scaled unit gradient is rounded to bf16 and reduce-scattered as bf16 (the communicator's
//     bf16 sum: the addends summed in f32 and rounded to bf16 once), then added to the f32 shard
//     gradient (HSDP: the all-reduce over the replicas runs in bf16 too).
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
// start_iteration releases what is still gathered (an evaluation's forward) and zeroes the
// gradient shards; after the optimizer step nothing is gathered: the next forward gathers the
// updated shards (after_optimizer_step completes them first for ZeRO-2 and LayerZeRO, above). gather_all / release_all bracket code that reads or
// writes every parameter (checkpoints, weight hashes). All collectives are blocking, on the
// calling thread, in the same order on every data-parallel rank.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "model/params.h"
#include "optim/grad_buckets.h"

namespace gale {

struct Zero3Options {
  bool shard_params = true;  // false: ZeRO-2
  // LayerZeRO and HSDP: the group across the shard groups (the ranks holding the same shard); null: none.
  Comm replicas;
  // With replicas: LayerZeRO (true) cuts each shard's optimizer state again over the replicas;
  // FSDP2's HSDP (false) keeps the whole shard's state on every replica (copies).
  bool shard_optimizer_over_replicas = true;
  // FSDP2 (see above): the root's parameters (any of a unit names it), whether a unit is released
  // once the next one's forward begins, and how many wrapped units a forward prefetches.
  std::vector<int> root_params;
  bool reshard_after_forward = true;
  int forward_prefetch = 0;
  // FSDP2's reduce_dtype bf16 (see above); false: f32.
  bool reduce_bf16 = false;
};

class Zero3Sync {
 public:
  // `shard`: the group the units are sharded over (the data-parallel group; LayerZeRO: a sub-group
  // of it). `groups`: the chunk's parameter groups (any order; each contiguous in the flat layout,
  // together tiling it). `pinned`: a parameter whose unit stays gathered from its first use in a
  // forward to its own gradient report (-1: none). Shards the buffer's storage
  // (ParamBuffer::shard_storage).
  Zero3Sync(ParamBuffer* params, Comm shard, const std::vector<std::vector<int>>& groups, int pinned = -1,
            Zero3Options options = {});
  Zero3Sync(const Zero3Sync&) = delete;
  Zero3Sync& operator=(const Zero3Sync&) = delete;

  int64_t dp_size() const { return dp_size_ * replica_count_; }
  int64_t shard_group_size() const { return dp_size_; }
  // What this rank's optimizer updates, in flat offsets (empty ones left out): its shard of every
  // unit (LayerZeRO: its piece of the shard).
  std::vector<FlatRange> owned_ranges() const;
  // LayerZeRO: the gradient all-reduce over the replicas; ZeRO-2 and LayerZeRO: the all-gather of
  // the updated shards (pieces). No-ops where they do not apply.
  void finish_grad_sync();
  void after_optimizer_step();

  void start_iteration();
  void on_params_needed(const std::vector<int>& param_ids);
  void on_grads_ready(const std::vector<int>& param_ids);
  // Every unit gathered (values; zero gradients) / every unit released, its shard first taken back
  // from the gathered values when `write_back` (after a checkpoint load).
  void gather_all();
  void release_all(bool write_back);
  // Units gathered now, and the most gathered at once since construction; the most bytes of
  // gathered values and gradients at once (ParamBuffer::gathered_bytes, plus the values of
  // all-gathers in flight) since construction or the last reset_peak.
  int gathered_units() const;
  int max_gathered_units() const { return max_gathered_; }
  int64_t max_gathered_bytes() const { return max_gathered_bytes_; }
  void reset_peak() { max_gathered_bytes_ = 0; }
  // HSDP: this rank's optimizer state is a copy of the first replica's (a checkpoint writes it once).
  bool optimizer_state_copy() const {
    return options_.replicas && !options_.shard_optimizer_over_replicas && replica_rank_ > 0;
  }
  // All-gathers started ahead (forward_prefetch) since construction.
  int64_t prefetched() const { return prefetched_; }

 private:
  // An all-gather in flight (forward_prefetch): its staging shard and the whole values it fills.
  struct Pending {
    int unit = -1;
    WorkPtr work;
    Tensor mine, values;  // gathers_bf16: the packed payloads (bf16 words)
  };
  // gathers_bf16: what rank r of the shard group sends of unit u — its shard's non-GEMM elements
  // (f32) then its GEMM-weight elements (bf16), each a run starting at `f32_at` / `bf16_at` of the
  // unit's compact storage of that kind.
  struct Piece {
    int64_t f32_at = 0, f32_count = 0, bf16_at = 0, bf16_count = 0;
  };

  // `full`: f32 values whatever gathers_bf16 says (gather_all: checkpoints).
  void gather(int u, bool full = false);
  // gathers_bf16: this rank's payload of unit u, and the unit's storage from every rank's payload.
  Tensor pack_bf16_payload(int u) const;
  void unpack_bf16_payloads(int u, const Tensor& all);
  int64_t payload_words(int u) const { return payload_words_.at(static_cast<size_t>(u)); }
  // Whether unit u's forward gathers it in bf16: param_dtype bf16 and it holds a GEMM weight (a unit
  // without one, the embedding or the head, is all f32 in Gale's --bf16 arithmetic: an f32 gather).
  bool bf16_gather(int u) const {
    return !pieces_.empty() && options_.shard_params && unit_bf16_numel_.at(static_cast<size_t>(u)) > 0;
  }
  void start_gather(int u);
  void note_peak();
  bool pending(int u) const;
  void reduce_scatter_grads(int u);

  // LayerZeRO: this rank's piece of unit u's shard, in offsets from the shard's start.
  std::pair<int64_t, int64_t> piece(int u) const;

  ParamBuffer* params_;
  Comm dp_;  // the shard group
  Zero3Options options_;
  int64_t dp_size_ = 1, dp_rank_ = 0;  // in the shard group
  int64_t replica_count_ = 1, replica_rank_ = 0;
  int pinned_unit_ = -1;
  int max_gathered_ = 0;
  int64_t max_gathered_bytes_ = 0, prefetched_ = 0;
  std::vector<char> root_, root_grads_pending_;  // per unit
  std::vector<Pending> pending_;
  // gathers_bf16: per unit, each shard-group rank's piece and the payload's length in bf16 words.
  std::vector<std::vector<Piece>> pieces_;
  std::vector<int64_t> payload_words_;
  // gathers_bf16: the compact counts of each unit's non-GEMM and GEMM-weight elements.
  std::vector<int64_t> unit_f32_numel_, unit_bf16_numel_;
  std::vector<std::vector<int>> unit_members_;  // gathers_bf16: each unit's parameters in flat order
};

}  // namespace gale
