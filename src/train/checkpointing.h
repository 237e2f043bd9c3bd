// Saving and loading training checkpoints: model parameters, optimizer state, scheduler and
// trainer state, in Megatron's directory layout (iter_XXXXXXX/, latest_checkpointed_iteration.txt)
// with Gale's sharded safetensors format (docs/formats/checkpoint.md).
//
// Every tensor is stored by its global (unsharded) name and shape, each rank writing the pieces it
// owns, so a checkpoint loads at any tensor/pipeline/data-parallel layout. Optimizer state too:
// "optimizer.<state>.<param name>" with the parameter's global shape; with the distributed
// optimizer every data-parallel rank writes the boxes its shards cover (optim/shard_boxes.h), and
// a rank of any layout, sharded or not, reads back the boxes it owns.
#pragma once

#include <memory>
#include <string>

#include "ckpt/checkpoint_writer.h"
#include "train/arguments.h"
#include "train/engine.h"
#include "train/trainer.h"

namespace gale {

// --async-save: the checkpoint being written in the background, finalised on the main thread
// (Megatron's schedule_async_save / maybe_finalize_async_save). At most one save is in flight:
// save_checkpoint() finalises the previous one (blocking) before it starts the next.
class AsyncCheckpointSaves {
 public:
  explicit AsyncCheckpointSaves(Communicator& world) : world_(world) {}
  // Waits for a writer still running (without finalising it: its checkpoint stays untracked).
  ~AsyncCheckpointSaves() = default;

  bool empty() const { return writer_ == nullptr; }
  // Takes a writer whose start_commit() succeeded; `saved_line` is printed on rank 0 once the
  // checkpoint is finalised.
  void schedule(std::unique_ptr<CheckpointWriter> writer, std::string saved_line);
  // Megatron's maybe_finalize_async_save. Collective over the world: every rank calls it at the same
  // points (nothing happens, and nothing is communicated, when no save is in flight). Not blocking:
  // one all-reduce tells whether every rank's writer has finished, and only then the commit is
  // finished (metadata, rename, tracker). Blocking: prints Megatron's "Unfinalized async checkpoint
  // saves. Finalizing them synchronously now." and waits for this rank's writer first.
  Status maybe_finalize(bool blocking);

 private:
  Communicator& world_;
  std::unique_ptr<CheckpointWriter> writer_;
  std::string saved_line_;
};

// Writes <args.checkpoint.save>/iter_<iteration>/ and updates the tracker (collective over the
// world: every rank writes the pieces it owns; data-parallel replicas write nothing twice).
// With `async` (--async-save) each rank copies what it writes into host memory and a background
// thread writes it; `async` finalises the save later (the tracker is written then). A save still in
// flight is finalised first (blocking), with Megatron's warning.
Status save_checkpoint(const Arguments& args, const Engine& engine, const TrainerState& state,
                       AsyncCheckpointSaves* async = nullptr);

// Megatron's _NON_PERSISTENT_CKPT_SUBDIR: global non-persistent checkpoints default to <save>/non_persistent.
inline constexpr const char* kNonPersistentSubdir = "non_persistent";
// The global non-persistent directory: --non-persistent-global-ckpt-dir, else <base>/non_persistent
// (base: --save when saving, --load when loading; "" when both are empty).
std::string non_persistent_global_dir(const CheckpointArgs& ca, const std::string& base);

// Megatron's save_checkpoint(non_persistent_ckpt=True), at every --non-persistent-save-interval
// (collective over the world):
//  - global: Megatron's cleanup_old_non_persistent_checkpoint first (every iter_<N>/ of the global
//    non-persistent directory but the newest is removed, so a loadable one always remains), then an
//    ordinary checkpoint there (its own tracker; asynchronous with --async-save);
//  - local: each rank writes its part to <--non-persistent-local-ckpt-dir>/<rank>/ (with
//    --replication also its clique's parts), then removes its older parts (ckpt/local_checkpoint.h).
//    With --non-persistent-local-ckpt-algo atomic a part holds everything the rank holds; with
//    fully_parallel the pieces Gale's format assigns to the rank (one copy over the job).
//    Synchronous: a save in flight is finalised first.
// Prints Megatron's lines ("saving checkpoint at iteration ...", "  successfully saved local
// checkpoint from iteration ...", "Non-persistent checkpoints scheduled for removal: [...]").
Status save_non_persistent_checkpoint(const Arguments& args, const Engine& engine, const TrainerState& state,
                                      AsyncCheckpointSaves* async = nullptr);

// Loads <args.checkpoint.load> into the engine's model chunks (and, unless --finetune /
// --no-load-optim, the optimizer, scheduler and trainer state), at whatever layout it was saved.
// With LoRA (--lora-target-modules) --load gives only the frozen base weights, and --lora-load (if
// set) the adapters with, unless --no-load-optim, their optimizer and scheduler state, and the
// trainer state (iteration, consumed samples): an exact resume. save_checkpoint then writes only
// the adapters (and their optimizer state).
// `*loaded` is false when there is no checkpoint to load (a warning is printed, as Megatron does)
// unless --exit-on-missing-checkpoint makes that an error.
// With --non-persistent-ckpt-type (Megatron's _load_base_checkpoint) the non-persistent checkpoint
// is loaded instead when its iteration is at least the persistent one's (the tracker of --load, or
// --ckpt-step): global from non_persistent_global_dir(--load), local from the newest iteration
// whose parts the ranks hold together (from replicas when a rank lost its directory). A local
// checkpoint newer than the one loaded that lacks a part no rank holds is an error naming the file.
// --override-ckpt-iteration N: after any load, the iteration becomes N, the consumed training
// samples N x --global-batch-size and the skipped ones 0 (Megatron main), so that the data loader
// replays from iteration N; the optimizer, scheduler and RNG state are those loaded.
// --freeze-all-layers without --override-ckpt-iteration (Megatron main's load_checkpoint): N is
// frozen_resume_iteration(--save) when that is above 0, so a frozen run resumes where the progress
// tracker of its own --save says; --load gives the weights only (--freeze-all-layers sets --finetune).
// save_checkpoint and save_non_persistent_checkpoint of a frozen run print Megatron's "saving
// checkpoint" line and write nothing (Megatron's skip_weight_ckpt: no weights, no tracker).
Status load_checkpoint(const Arguments& args, Engine& engine, TrainerState& state, bool* loaded);

// Megatron's read_frozen_resume_iteration: the iteration of <save_dir>'s tracker
// (latest_checkpointed_iteration.txt); 0 when `save_dir` is empty, has no tracker or it says
// "release"; DataLoss naming --save and the file when the tracker is malformed.
StatusOr<int64_t> frozen_resume_iteration(const std::string& save_dir);

// --stage dpo (MindSpeed-LLM's DPOTrainer._init_reference_model): the weights of the checkpoint
// in `dir` (named by `flag` in errors: --ref-model or --load) at `iteration` (kUnset: the latest)
// into `models`, standalone model chunks built like the engine's (this rank's virtual stages);
// nothing else is read. The checkpoint must hold this model. Also QAD's teacher
// (--qad-teacher-load); `what` names the model in the start-up line (one line for all the chunks).
Status load_model_weights(const std::string& flag, const std::string& dir, const std::vector<GPTModel*>& models,
                          const std::string& what = "reference model", int64_t iteration = kUnset);

// The iteration the DPO reference loads from `dir` (MindSpeed-LLM's checkpoint_step =
// --refer-model-iter for the reference model): --refer-model-iter when `dir` holds that iteration;
// when it does not, NotFound naming --refer-model-iter and the iterations found if the flag was
// given, else kUnset (the latest checkpoint, where MindSpeed-LLM would fail to load its default
// iteration 1) and *note says so.
StatusOr<int64_t> dpo_reference_iteration(const DpoArgs& dpo, const std::string& dir, std::string* note);

// Megatron's --moe-use-upcycling (instead of load_checkpoint): reads the dense checkpoint in
// --load into the MoE model, each dense MLP's weights and biases into every expert of its layer,
// the routers keeping their initial values (with softmax-after-top-k routing the upcycled layer
// then computes exactly the dense MLP); takes the dense run's consumed samples and FLOPs, no
// optimizer state; saves the result to --save as iteration 1 without optimizer state, prints
// "Upcycled checkpoint saved to <save>", and leaves `state` at iteration 0 for training. Errors: a
// checkpoint already in --save (Megatron's message), none in --load, a MoE checkpoint in --load.
Status upcycle_checkpoint(const Arguments& args, Engine& engine, TrainerState& state);

}  // namespace gale
