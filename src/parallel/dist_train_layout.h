// The dist-train rank map: sub-worlds with their own TP/PP/DP grids chained into one pipeline.
//
// A pure computation (no communication) for MindSpeed's --dist-train.
// Sub-world i (in model_index order) owns the consecutive global ranks [first_rank, first_rank +
// world_size), laid out inside as Megatron's default order: local rank = tp + TP·(cp + CP·(dp +
// DP·pp)). Every sub-world has the same CP size, and a transfer keeps its cp coordinate (the
// stages' CP chunks of the sequence are the same). The sub-worlds' pipeline stages follow each other: sub-world i's local stage p is global
// stage Σ_{j<i} PP_j + p, so the whole job is one pipeline of Σ PP_j stages per data-parallel index
// d (every sub-world has the same DP; different DP is refused upstream).
//
// Data parallelism: every DP size is a multiple k_i of the smallest (the "main" DP, MindSpeed's
// main_dp). Main replica d is one pipeline: the ranks of dp index [d·k_i, (d+1)·k_i) of each
// sub-world i; a sub-world with k_i > 1 runs micro-batches k_i times smaller, replica d·k_i + r
// holding slice r of main replica d's micro-batch (along the batch: Megatron's sampler gives it
// exactly those samples).
//
// Transfers between adjacent global stages: inside a sub-world the pipeline neighbour has the same
// tp and dp coordinates; across the boundary between sub-worlds with TP sizes t_send and t_recv,
// the receiving rank of tp coordinate j takes its tensor from the sending rank of tp coordinate
// ⌊j·t_send / t_recv⌋. When the sender has q times the receiver's replicas, the receiver gathers q
// pieces (piece r from the sender of dp index dp·q + r); when it has q times fewer, the sender
// cuts its tensor into q slices along the batch and slice r goes to the receiver of dp index
// ≡ r (mod q). With --sequence-parallel every TP rank of a TP > 1 stage holds its own sequence
// slice, so across TP sizes t_send and t_recv (one a multiple of the other) the receiver of tp j
// gathers the q = t_send/t_recv slices of tp j·q + r, or takes slice j mod q of tp ⌊j/q⌋'s when
// q = t_recv/t_send. This is MindSpeed's matching of the two TP groups
// (dist_ranks_match.py: the smaller group's ranks each face a contiguous block of the larger one's)
// with only the message its receiver keeps: MindSpeed sends to every matched rank and the receiver
// uses the first it got. Without sequence parallelism every TP rank of a stage holds the same
// boundary activation (and, backward, the same input gradient), so any one of them will do.
#pragma once

#include <string>
#include <vector>

namespace gale {

struct DistTrainSubWorld {
  std::string name;  // the config's "name" (e.g. "vit", "gpt")
  int first_rank = 0;
  int world_size = 1;
  int tp = 1, pp = 1;
  int cp = 1;           // context_parallel_size: the same in every sub-world
  int dp = 1;           // world_size / (tp·cp·pp)
  int first_stage = 0;  // global pipeline stage of its local stage 0
  int64_t num_layers = 0;  // transformer layers it holds (split evenly over its PP stages)
  // MindSpeed's forward_only: frozen, runs forward only; nothing is sent back to it (it leads the
  // chain: only a prefix of sub-worlds may be forward-only).
  bool forward_only = false;
};

// The sub-worlds in pipeline order, with the job-level lookups.
struct DistTrainLayout {
  std::vector<DistTrainSubWorld> subworlds;
  // --sequence-parallel: a stage of TP > 1 holds its TP rank's slice of the sequence, so across TP
  // sizes that differ the pieces are sequence slices (DP sizes must then be equal).
  bool sequence_parallel = false;

  // One peer of a transfer: its rank and which part of the tensor the message is. For a sender's
  // target, slice r of `slices` of its tensor; for a receiver's source, the place of the message as
  // piece r of `slices` in its tensor (slices 1: the whole tensor). The slices are along the batch
  // (rows s·B + r·B/q + [0, B/q) of every s), or with `sequence` along the sequence (the r-th of q
  // equal row blocks: sequence parallelism's slices).
  struct Peer {
    int rank = 0;
    int slice = 0, slices = 1;
    bool sequence = false;
    bool operator==(const Peer& o) const {
      return rank == o.rank && slice == o.slice && slices == o.slices && sequence == o.sequence;
    }
  };

  int world_size() const;
  int num_stages() const;  // Σ PP
  int dp() const;          // the smallest DP size (the main one)
  int dp_ratio(int s) const { return subworlds[static_cast<size_t>(s)].dp / dp(); }  // k_s
  // The main data-parallel replica (pipeline) that `rank` belongs to.
  int main_dp_of(int rank) const { return dp_of(rank) / dp_ratio(subworld_of(rank)); }
  // The sub-world holding global rank `rank`.
  int subworld_of(int rank) const;
  // Coordinates of global rank `rank` inside its sub-world, and its global pipeline stage.
  int tp_of(int rank) const;
  int cp_of(int rank) const;
  int dp_of(int rank) const;
  int stage_of(int rank) const;
  // The global rank of sub-world `s` at (tp, dp, local stage pp, cp).
  int rank_at(int s, int tp, int dp, int pp, int cp = 0) const;
  // The sub-world holding global stage `stage`.
  int subworld_of_stage(int stage) const;
  // Every rank of main replica `dp`, by global stage, then dp, cp and tp coordinate: the whole
  // pipeline of one main data-parallel replica (its "model-parallel group" across the sub-worlds).
  std::vector<int> pipeline_ranks(int dp) const;
  // The ranks `rank` receives from when stage `from_stage` (adjacent to its own) sends to it.
  std::vector<Peer> sources_of(int rank, int from_stage) const;
  // The ranks of stage `to_stage` (adjacent) that receive from `rank` (see sources_of); possibly none
  // (always none backward into a forward-only sub-world).
  std::vector<Peer> targets_of(int rank, int to_stage) const;
  // Whether `rank` is the first of the replicas of its sub-world inside its main replica (dp index
  // ≡ 0 mod k) and of its CP group (cp 0): it alone contributes to sums over the main replica's
  // groups (the others hold the same reduced gradients and loss sums).
  bool first_replica(int rank) const { return dp_of(rank) % dp_ratio(subworld_of(rank)) == 0 && cp_of(rank) == 0; }
  // Whether global stage `stage` belongs to a forward-only sub-world.
  bool forward_only_stage(int stage) const { return subworlds[static_cast<size_t>(subworld_of_stage(stage))].forward_only; }
  // The transformer layers of the leading forward-only sub-worlds (frozen, with the embedding).
  int64_t frozen_layers() const;
  // Transformer layers of every global stage (each sub-world's layers split evenly over its stages).
  std::vector<int64_t> stage_layers() const;
};

}  // namespace gale
