// Writing one checkpoint from every rank of a job, with a crash-safe commit (docs/formats/checkpoint.md).
//
// Every rank adds the pieces of tensors it owns, then all ranks call commit() together:
//
//   CheckpointWriter w(args.save, iteration, *world);
//   w.add("embedding.word_embeddings.weight", {V, H}, {tp_rank * V / tp, 0}, my_rows);  // a TP shard
//   w.add_flat("optimizer.exp_avg.embedding.word_embeddings.weight", V * H, start, my_slice);  // ZeRO shard
//   GALE_RETURN_IF_ERROR(w.commit({{"args", args_json}, {"consumed_samples", n}}));
//
// Protocol (a crash at any point leaves the previously tracked checkpoint loadable):
//   1. rank 0 creates <save>/iter_XXXXXXX.tmp-<token>/ (removing stale .tmp-* of this iteration) and
//      broadcasts the token; every rank writes shard_<rank>.safetensors there (fsynced);
//   2. an all-gather of (ok, bytes, crc32) is the barrier; then rank 0 writes metadata.json (fsynced,
//      with the directory), renames the directory to iter_XXXXXXX/ — swapping atomically with an
//      existing one (renameat2 RENAME_EXCHANGE), or moving the old one aside to iter_XXXXXXX.old-<token>
//      first where the filesystem cannot swap — fsyncs <save>, then rewrites the tracker file
//      atomically, and finally removes the replaced copy;
//   3. rank 0 broadcasts the outcome, so every rank returns the same success or failure.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"
#include "core/tensor.h"

namespace gale {

// The steps of commit() on rank 0, in order (kPreviousMovedAside only in the fallback path).
enum class CheckpointCommitStep {
  kShardsWritten,       // every rank's shard is durable in the temporary directory
  kMetadataWritten,     // metadata.json is durable in the temporary directory
  kPreviousMovedAside,  // an existing iter_XXXXXXX/ was renamed to iter_XXXXXXX.old-<token>
  kRenamedIntoPlace,    // the temporary directory is now iter_XXXXXXX/
  kTrackerTempWritten,  // the new tracker content is in latest_checkpointed_iteration.txt.tmp
  kTrackerUpdated,      // latest_checkpointed_iteration.txt names this iteration
  kPreviousRemoved,     // the replaced copy (if any) is deleted: done
};
const char* checkpoint_commit_step_name(CheckpointCommitStep step);

struct CheckpointWriterOptions {
  // Test hook, run on rank 0 after each step; returning false stops commit() right there, leaving
  // the files as a crash at that point would (commit then returns an error on every rank).
  std::function<bool(CheckpointCommitStep)> after_step;
  // Replace an existing iteration directory by one atomic swap where the filesystem supports it;
  // false forces the move-aside path (for tests).
  bool use_rename_exchange = true;
  // Update latest_checkpointed_iteration.txt (false for a save that must not become the latest).
  bool update_tracker = true;
};

class CheckpointWriter {
 public:
  // Nothing touches the disk before commit(). `comm` is the group of all ranks that write this
  // checkpoint (usually the world); make_self_communicator() for a single process.
  CheckpointWriter(std::string save_dir, int64_t iteration, Communicator& comm, CheckpointWriterOptions options = {});

  // A whole tensor (the piece is the full tensor; stored under its plain name).
  Status add(const std::string& name, const Tensor& tensor);
  // A piece of a tensor of `global_shape`: the box starting at `offsets` with the piece's shape.
  // The data is referenced, not copied, and written at commit(): it must not change before then.
  // InvalidArgument when the box leaves the global shape, ranks differ, or it overlaps a piece
  // this rank already added for the same tensor.
  Status add(const std::string& name, const Shape& global_shape, const std::vector<int64_t>& offsets,
             const Tensor& piece);
  // A piece of a flattened 1-D tensor of `global_numel` elements starting at `start` (distributed
  // optimizer state). The piece may have any shape; its elements are taken in row-major order.
  Status add_flat(const std::string& name, int64_t global_numel, int64_t start, const Tensor& piece);

  // Collective over `comm`: writes this rank's shard, then rank 0 writes metadata.json holding
  // `sections` (a JSON object of trainer state: args, scheduler, RNG, consumed samples, ...; null for
  // none; its keys may not be the reserved format, version, iteration, world_size or shards), moves
  // the directory into place and updates the tracker. Returns the same success or failure on every rank.
  Status commit(const nlohmann::json& sections);

  const std::string& save_dir() const { return save_dir_; }
  int64_t iteration() const { return iteration_; }
  // <save>/iter_XXXXXXX
  std::string final_dir() const;

 private:
  struct Piece {
    std::string key;  // safetensors key in the shard: the name, or "name@o0,o1,..." for a partial piece
    std::string name;
    Shape global_shape;
    std::vector<int64_t> offsets;
    Tensor data;
  };
  Status write_shard(const std::string& dir, uint64_t* bytes, uint32_t* crc) const;
  Status finish_on_rank0(const std::string& tmp_dir, const std::string& token, const std::vector<int64_t>& gathered,
                         const nlohmann::json& sections) const;
  bool step_done(CheckpointCommitStep step) const;

  std::string save_dir_;
  int64_t iteration_;
  Communicator& comm_;
  CheckpointWriterOptions options_;
  std::vector<Piece> pieces_;
  bool committed_ = false;
};

}  // namespace gale
