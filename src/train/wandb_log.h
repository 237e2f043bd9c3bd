// What gale pretrain writes to its Weights & Biases run: the config (Megatron's vars(args)) and
// the TensorBoard scalars Megatron also logs to W&B.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/wandb_writer.h"

namespace gale {

// Megatron's vars(args) as W&B config items, one per Megatron core_v0.12.1 destination
// (train/yaml_cfg.h megatron_dests(), in its order): the value given on `argv` (the command line
// gale pretrain parsed, "--flag value" or "--flag=value"; a switch: true, its --no- form: false; a
// list: a JSON array) or else Megatron's default; then Gale's own flags given on `argv` (dest: the
// flag without "--", '-' as '_'). Ints and floats as JSON numbers (a value that does not read as
// one stays a string), None as null. Values are the parsed ones, before Megatron's derivations.
WandbItems wandb_config_items(const std::vector<std::string>& argv);

// Megatron's W&B key of a TensorBoard tag, or "" when Megatron writes that tag to TensorBoard only:
// "X vs samples", decoupled-learning-rate, mem-*, the timers ("<name>-time" but iteration-time)
// and "X validation ppl".
std::string wandb_key_of_tensorboard_tag(std::string_view tag);

// The TensorBoard writer's scalar observer feeding a W&B run: every scalar with a W&B key is
// logged at its step, and "lm loss vs samples" (step = consumed samples) becomes 'samples vs
// steps' at the iteration of the 'lm loss' before it, as Megatron's training_log logs it.
class WandbScalarMirror {
 public:
  explicit WandbScalarMirror(WandbWriter* writer) : writer_(writer) {}
  void operator()(std::string_view tag, double value, int64_t step);

 private:
  WandbWriter* writer_;
  int64_t lm_loss_iteration_ = -1;
};

}  // namespace gale
