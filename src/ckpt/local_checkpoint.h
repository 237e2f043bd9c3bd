// Local non-persistent checkpoints (Megatron's --non-persistent-ckpt-type local, after
// nvidia-resiliency-ext's LocalCheckpointManager): each rank writes its part to node-local storage,
// optionally replicated on the other ranks of its clique (docs/formats/checkpoint.md, "Local
// non-persistent checkpoints").
//
//   <root>/<rank>/iter_0000006_<owner>_local.safetensors   the part of rank <owner> at iteration 6
//                                                          (owner == rank: its own; else a replica)
//
// A part is a checkpoint shard (the pieces the rank added to its CheckpointWriter) whose
// __metadata__ also carries the local-checkpoint keys (format "gale-local-checkpoint-part",
// version 1, iteration, owner, world size, algorithm, and the metadata.json sections). An iteration
// is complete when the ranks together hold every owner's part; a load rebuilds an ordinary Gale
// checkpoint from the parts in a rank-private directory and reads it with CheckpointReader.
//
// Replication (CliqueReplicationStrategy): the world splits into cliques of F ranks
// n, n+J, ..., n+(F-1)J with n = a·J·F + b (b < J); every member stores every member's part.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "ckpt/checkpoint_writer.h"
#include "comm/communicator.h"
#include "core/status.h"

namespace gale {

inline constexpr const char* kLocalPartFormat = "gale-local-checkpoint-part";  // "gale.local.format"
inline constexpr int kLocalPartVersion = 1;                                    // "gale.local.version"

// "iter_0000006_1_local.safetensors" (Megatron's name with Gale's file type).
std::string local_part_file_name(int64_t iteration, int owner);
// "<root>/<rank>".
std::string local_rank_dir(const std::string& root, int rank);
// The ranks of `rank`'s replication clique, ascending (`rank` included). world % (jump·factor) == 0.
std::vector<int> replication_clique(int rank, int world, int jump, int factor);

struct LocalCheckpointConfig {
  std::string root;          // --non-persistent-local-ckpt-dir
  std::string algo;          // --non-persistent-local-ckpt-algo (recorded in every part)
  bool replication = false;  // --replication
  int jump = 1;              // --replication-jump
  int factor = 2;            // --replication-factor
};

// What the ranks hold together (find_latest).
struct LocalCheckpointSearch {
  int64_t latest = -1;       // the newest complete iteration, -1 for none
  int64_t newest_seen = -1;  // the newest iteration any rank holds a part of
  std::string missing_part;  // when newest_seen > latest: the path of a part of newest_seen no rank holds
};

class LocalCheckpointManager {
 public:
  LocalCheckpointManager(LocalCheckpointConfig config, Communicator& world);

  // Collective over the world: writes this rank's part of `iteration` (`writer`'s pieces, with
  // `sections` as its metadata), with --replication exchanges the parts within the clique and
  // writes the replicas, then, once every rank succeeded, removes every older part in this rank's
  // directory. The same result on every rank; a failed save removes this iteration's files.
  Status save(const CheckpointWriter& writer, int64_t iteration, const nlohmann::json& sections);

  // Collective: Megatron's find_latest over every rank's directory.
  StatusOr<LocalCheckpointSearch> find_latest();

  // Collective, after find_latest(): writes into `into` (a rank-private directory, emptied first)
  // a Gale checkpoint directory iter_XXXXXXX/ plus tracker holding the parts of `iteration` this
  // rank needs: its own (`all_parts` false, --non-persistent-local-ckpt-algo atomic) or every
  // rank's (fully_parallel). A part this rank lacks is broadcast by its owner, or by a rank holding
  // a replica. Errors (the same on every rank): a needed part no rank holds (naming its file), a
  // checkpoint saved by another number of ranks.
  Status assemble(int64_t iteration, bool all_parts, const std::string& into);

  const LocalCheckpointConfig& config() const { return config_; }
  std::string own_dir() const;

 private:
  // (iteration, owner) of every part file in this rank's directory.
  std::vector<std::pair<int64_t, int>> own_parts() const;
  // Removes this rank's files of `iteration` (keep false) or of every older iteration.
  void remove_parts(int64_t iteration, bool older) const;
  // Every rank's own_parts(): holders_[(iteration, owner)] = ranks holding that part.
  void gather_availability();

  LocalCheckpointConfig config_;
  Communicator& world_;
  std::map<std::pair<int64_t, int>, std::set<int>> holders_;
};

}  // namespace gale
