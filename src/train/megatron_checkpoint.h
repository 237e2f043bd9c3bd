// Megatron-LM's own checkpoints of GPT models (docs/formats/megatron-checkpoint.md): detecting, reading and writing them.
//
//   GALE_ASSIGN_OR_RETURN(CheckpointFormat f, detect_checkpoint_format(dir));   // gale, torch, torch_dist, ...
//   GALE_ASSIGN_OR_RETURN(MegatronCheckpoint m, read_megatron_checkpoint(dir)); // the legacy `torch` format
//   // m.tensors: Gale's names and whole (global) shapes, the TP/PP/virtual-pipeline pieces merged
//   GALE_RETURN_IF_ERROR(save_megatron_as_gale(m, "gale-ckpt"));                // an ordinary Gale checkpoint
//   GALE_RETURN_IF_ERROR(write_megatron_checkpoint(opts, model, tensors));       // Megatron's `torch` format
//
// Megatron's legacy format (--ckpt-format torch): <dir>/latest_checkpointed_iteration.txt (an
// iteration or "release"), <dir>/iter_NNNNNNN/mp_rank_TT[_PPP]/model_optim_rng.pt, each a torch.save
// of {'args': argparse.Namespace, 'checkpoint_version': 3.0, 'iteration': N, 'model' (or 'model0',
// 'model1', ... per virtual pipeline chunk): the rank's state dict, optimizer, rng_state, ...}.
// Megatron-Core's GPT state dict names are Gale's (embedding.word_embeddings.weight,
// decoder.layers.i.self_attention.linear_qkv.weight, ...), but each pipeline stage (and chunk) numbers
// its layers from 0, and tensor parallelism splits: rows of linear_qkv (whole query groups: [q heads;
// k; v] per group), linear_fc1 (with SwiGLU each rank holds [its gate rows; its up rows]),
// word_embeddings and output_layer (vocabulary rows), and columns of linear_proj and linear_fc2.
// Transformer Engine's fused names (linear_qkv.layer_norm_weight, linear_fc1.layer_norm_weight and
// their biases) read as input_layernorm / pre_mlp_layernorm; `_extra_state` entries are skipped.
// Megatron's `torch_dist` (and TP1 x PP1 `torch_dcp`) directories read the same way, from their global
// tensors (train/megatron_dist_checkpoint.h). MoE layers (SequentialMLP, TEGroupedMLP and GroupedMLP
// experts, the router and its expert bias, shared experts) read as Gale's per-expert tensors with
// global expert numbers, expert-parallel rank files mp_rank_TT[_PPP]_EEE merged
// (train/megatron_moe_names.h). Multi-latent attention layers read and write with
// train/megatron_mla_names.h's names and TP layouts. Gated DeltaNet (-2) GPT models read and write
// in the torch format with train/megatron_gdn_names.h's per-section TP layout, and read from torch_dist
// (train/megatron_gdn_dist.h joins its per-section keys) and TP 1 torch_dcp.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "train/arguments.h"
#include "train/hf_weights.h"
#include "train/megatron_dist_optimizer.h"

namespace gale {

enum class CheckpointFormat {
  kNone,           // no latest_checkpointed_iteration.txt
  kGale,           // iter_NNNNNNN/metadata.json with Gale's format
  kMegatronTorch,  // iter_NNNNNNN/mp_rank_*/model_optim_rng.pt
  kMegatronTorchDist,  // iter_NNNNNNN/.metadata + metadata.json (Megatron's dist_checkpointing)
  kMegatronTorchDcp,   // iter_NNNNNNN/.metadata only (torch.distributed.checkpoint)
};
const char* checkpoint_format_name(CheckpointFormat f);  // "gale", "torch", "torch_dist", ...

// The format of the checkpoint <load_dir> holds at the tracker's iteration (or `step`'s): kNone
// without a tracker (or without that iteration's directory). An iteration directory none of the
// formats describes is FailedPrecondition naming it and what it holds.
StatusOr<CheckpointFormat> detect_checkpoint_format(const std::string& load_dir, int64_t step = kUnset);

struct MegatronCheckpoint {
  std::string directory;  // the iteration directory read
  CheckpointFormat format = CheckpointFormat::kMegatronTorch;  // torch, torch_dist or torch_dcp
  int64_t iteration = 0;  // 0 for "release"
  bool release = false;
  double checkpoint_version = 0;
  int64_t tensor_parallel = 1, pipeline_parallel = 1, virtual_chunks = 1;
  nlohmann::json args;  // the scalar attributes of Megatron's args Namespace (None left out)
  ModelArgs model;      // from args, padded_vocab_size = the embedding's rows
  MoeArgs moe;          // from args (train/megatron_moe_names.h); disabled for a dense model
  int64_t vocab_size = 0;  // args.vocab_size when recorded, else padded_vocab_size
  int64_t consumed_train_samples = 0, consumed_valid_samples = 0, skipped_train_samples = 0;
  double floating_point_operations_so_far = 0;
  std::map<std::string, Tensor> tensors;  // Gale names, whole tensors, in the files' dtype
  // read with `with_optimizer`: Megatron's optimizer state, its tensors by Gale name (the fp32 master
  // copies are not among them: they replace the model weights in `tensors`)
  std::optional<MegatronOptimizerState> optimizer;
};

// Reads Megatron's checkpoint in <load_dir> (the tracker's iteration, or `step`): the legacy `torch`
// format, `torch_dist` or `torch_dcp` (whose tensors are global: tensor_parallel / pipeline_parallel
// are then the layout that saved it, from args). The model is read, and with `with_optimizer` the
// optimizer state of a torch_dist checkpoint (train/megatron_dist_optimizer.h) or a torch one
// (train/megatron_torch_optimizer.h): Adam's moments or SGD's momentum, step, scheduler; the fp32 master
// copies of a --bf16/--fp16 run become the weights; never the RNG state. Errors name the file and what was expected and found: a Gale checkpoint, a missing
// rank file (expert-parallel ones too), a pickle without 'model', shards whose shapes disagree, keys
// with no place in Gale's model; with `with_optimizer`, a torch_dcp checkpoint (Unimplemented) and the
// optimizer layouts the two readers refuse, each naming --no-load-optim.
StatusOr<MegatronCheckpoint> read_megatron_checkpoint(const std::string& load_dir, int64_t step = kUnset,
                                                      bool with_optimizer = false);

// The scalar attributes of the args Namespace of Megatron's checkpoint in <load_dir> (rank 0's file,
// or torch_dist's common.pt; `where` is set to it), for --use-checkpoint-args.
StatusOr<nlohmann::json> read_megatron_args(const std::string& load_dir, int64_t step, std::string* where);

// `m` as a Gale checkpoint in <save_dir>/iter_<m.iteration> (+ tracker): the tensors, "model",
// "args" (Megatron's model flags), "trainer" (iteration and consumed samples) and "megatron_source";
// with m.optimizer also its state as Gale's (optimizer.<state>.<name> f32 tensors, "optimizer" with
// Megatron's args.optimizer as type and its step, "opt_param_scheduler" as Megatron saved it).
Status save_megatron_as_gale(const MegatronCheckpoint& m, const std::string& save_dir, const std::string& source_dir);

// A Megatron checkpoint as a Gale checkpoint in a private temporary directory of this process
// ($TMPDIR/gale_megatron_<pid>_<n>), removed when the object goes: how `gale pretrain` and `gale
// generate` load a Megatron --load directory through Gale's own reader.
class TemporaryGaleCheckpoint {
 public:
  static StatusOr<TemporaryGaleCheckpoint> write(const MegatronCheckpoint& m, const std::string& source_dir);
  TemporaryGaleCheckpoint(TemporaryGaleCheckpoint&& other) noexcept : dir_(std::move(other.dir_)) { other.dir_.clear(); }
  TemporaryGaleCheckpoint& operator=(TemporaryGaleCheckpoint&&) = delete;
  TemporaryGaleCheckpoint(const TemporaryGaleCheckpoint&) = delete;
  ~TemporaryGaleCheckpoint();
  const std::string& dir() const { return dir_; }

 private:
  TemporaryGaleCheckpoint() = default;
  std::string dir_;
};

// A TensorSource over m.tensors (f32 copies; a wrong shape is an error naming the tensor).
TensorSource megatron_tensor_source(const MegatronCheckpoint& m);

struct MegatronSaveOptions {
  std::string save_dir;
  int64_t tensor_parallel = 1;
  int64_t pipeline_parallel = 1;
  int64_t iteration = 0;                    // written as iter_NNNNNNN, the tracker and 'iteration'
  bool release = false;                     // written as release/ with the tracker "release" instead
  int64_t vocab_size = 0;                   // real vocabulary rows (0: the model's padded size)
  std::string tokenizer_type;               // recorded in args (Megatron compares it when it has a vocab file)
  int64_t consumed_train_samples = 0;
  int64_t expert_parallel = 1;              // expert-parallel ranks: files mp_rank_TT[_PPP]_EEE when > 1
  MoeArgs moe;                              // the model's experts (disabled: a dense model)
};

// Writes Megatron's legacy `torch` checkpoint of `model` from Gale's whole tensors `tensors` at
// o.tensor_parallel x o.pipeline_parallel (layers split evenly) x o.expert_parallel (each rank's
// experts numbered from 0, SequentialMLP's names; expert TP = TP), with Megatron-Core's local layer
// names (--transformer-impl local), the vocabulary padded for that TP size as Megatron pads it,
// checkpoint_version 3.0, the iteration and an args Namespace with the model flags Megatron's
// check_checkpoint_args compares; no optimizer or RNG state (load it in Megatron with --finetune or
// --no-load-optim --no-load-rng).
Status write_megatron_checkpoint(const MegatronSaveOptions& o, const ModelArgs& model,
                                 const std::vector<NamedTensor>& tensors);

}  // namespace gale
