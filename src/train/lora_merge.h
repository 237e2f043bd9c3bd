// Merging a LoRA checkpoint into base weights: W += (alpha / r)·B·A (MindSpeed-LLM's convert with
// --lora-load; also `gale generate` / `gale evaluate --lora-load`, which merge at load).
//
//   GALE_ASSIGN_OR_RETURN(LoraMerge merge, LoraMerge::open(args.lora));
//   if (merge.adapts(name)) GALE_RETURN_IF_ERROR(merge.merge_into(name, weight));
//
// The adapter checkpoint is what `gale pretrain --lora-target-modules ... --save DIR` writes: the
// tensors "<linear>.lora_A.default.weight" [r, in] and "<linear>.lora_B.default.weight" [out, r]
// (docs/formats/checkpoint.md), and the whole tensors of its --lora-modules-to-save modules
// (recorded as lora_modules_to_save), which replace the base's. The flags must agree with the lora_r / lora_alpha /
// lora_target_modules its args section records.
#pragma once

#include <functional>
#include <set>
#include <string>

#include "ckpt/checkpoint_reader.h"
#include "model/config.h"
#include "train/arguments.h"

namespace gale {

class LoraMerge {
 public:
  // Opens a.lora_load (latest iteration) and checks the flags against its recorded args.
  static StatusOr<LoraMerge> open(const LoraArgs& a);

  // Whether the weight named `weight_name` (e.g. "decoder.layers.0.mlp.linear_fc1.weight") is adapted,
  // or is a parameter of a module trained whole (--lora-modules-to-save) that the checkpoint holds.
  bool adapts(const std::string& weight_name) const;
  // w [out, in], the whole f32 tensor, += (alpha / r)·B·A read from the adapter checkpoint; a saved
  // module's parameter (any shape) is replaced by the checkpoint's.
  Status merge_into(const std::string& weight_name, Tensor& w) const;
  // The base tensors the checkpoint replaces whole (its modules to save).
  const std::set<std::string>& saved_modules() const { return saved_; }
  const LoraConfig& config() const { return config_; }
  const std::string& directory() const { return reader_.directory(); }

 private:
  LoraMerge(CheckpointReader reader, LoraConfig config, std::set<std::string> saved)
      : reader_(std::move(reader)), config_(std::move(config)), saved_(std::move(saved)) {}
  CheckpointReader reader_;
  LoraConfig config_;
  std::set<std::string> saved_;
};

// gale convert --load-model-type gale --save-model-type gale --lora-load ...: writes the Gale
// checkpoint in `load_dir` (latest iteration) to `save_dir` as iteration 0 with every adapted
// weight merged, as a base to load with --load (no optimizer state; its model/args sections kept).
Status merge_lora_checkpoint(const std::string& load_dir, const std::string& save_dir, const LoraArgs& a,
                             const std::function<void(const std::string&)>& log);

// The LoRA flags of a command that merges (convert, generate, evaluate): --lora-load and
// --lora-target-modules go together; the values are checked as for training.
Status validate_lora_merge_args(const LoraArgs& a, const ArgParser& p);

}  // namespace gale
