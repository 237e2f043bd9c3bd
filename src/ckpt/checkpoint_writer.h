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
//
// Asynchronous commit (--async-save): the same protocol in two collective calls with the shard
// write in between on a background thread, so that training continues while the files are written:
//
//   GALE_RETURN_IF_ERROR(w.start_commit(sections));  // copies the pieces, step 1, starts the writer
//   ... training iterations; every rank may poll w.shard_written() ...
//   GALE_RETURN_IF_ERROR(w.finish_commit());          // waits for the writer, steps 2-3
//
// The background thread only writes this rank's shard file: every communicator call (broadcast,
// all-gather) stays on the calling thread. Nothing names the new checkpoint (no iter_XXXXXXX/, no
// tracker update) before finish_commit(), so a crash while the writer runs leaves the previously
// tracked checkpoint the latest. The copy costs host memory of the pieces this rank writes.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/safetensors.h"
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
  // Test hook, run on every rank by the thread that writes the shard, just before it writes (the
  // background thread after start_commit()); a test can hold the writer back with it.
  std::function<void()> before_shard_write;
};

class CheckpointWriter {
 public:
  // Nothing touches the disk before commit(). `comm` is the group of all ranks that write this
  // checkpoint (usually the world); make_self_communicator() for a single process.
  CheckpointWriter(std::string save_dir, int64_t iteration, Communicator& comm, CheckpointWriterOptions options = {});
  // Waits for a background shard write still running; the checkpoint then stays uncommitted (its
  // temporary directory is removed by the next save of the same iteration).
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

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

  // commit() in two parts for an asynchronous save. start_commit() is collective over `comm`: it
  // checks `sections`, copies every added piece into memory this writer owns (the caller may change
  // its tensors as soon as it returns), has rank 0 create the temporary directory, and starts a
  // background thread that writes this rank's shard (file I/O only). An error (the same on every
  // rank) leaves nothing running.
  Status start_commit(const nlohmann::json& sections);
  // Whether this rank's background shard write has finished (this rank only: no communication).
  bool shard_written() const { return shard_written_.load(std::memory_order_acquire); }
  // Collective over `comm`, after start_commit() succeeded: waits for this rank's shard write, then
  // finishes as commit() does (barrier, metadata.json, rename, tracker). The same result on every rank.
  Status finish_commit();

  // Not collective: writes this rank's pieces to `path` (atomically) as a shard file, with
  // `metadata` added to its __metadata__ (the local non-persistent checkpoints, ckpt/local_checkpoint.h).
  // A rank without pieces writes a file without tensors.
  StatusOr<SafetensorsWriteResult> write_part(const std::string& path,
                                              const std::map<std::string, std::string>& metadata) const;

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
  Status check_sections(const nlohmann::json& sections) const;
  // Step 1: rank 0 creates the temporary directory; sets tmp_dir_ on every rank.
  Status prepare();
  // Steps 2-3 once this rank's shard is written (shard_status_, bytes_, crc_).
  Status finish(const nlohmann::json& sections);
  // The shard write with the test hook; records shard_status_, bytes_, crc_.
  void write_own_shard();
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
  std::string token_, tmp_dir_;
  // The shard write's outcome (written by the writer thread before shard_written_ is set).
  Status shard_status_;
  uint64_t bytes_ = 0;
  uint32_t crc_ = 0;
  std::atomic<bool> shard_written_{false};
  std::thread writer_;
  std::unique_ptr<nlohmann::json> pending_sections_;  // between start_commit() and finish_commit()
};

}  // namespace gale
