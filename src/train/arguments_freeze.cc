// --freeze-all-layers (Megatron main): its warnings and what Gale does not support with it yet.
#include "core/log.h"
#include "train/arguments.h"

namespace gale {

Status validate_freeze_all_layers(Arguments& a) {
  if (!a.training.freeze_all_layers) return Status::Ok();
  ParallelArgs& par = a.parallel;
  CheckpointArgs& c = a.checkpoint;
  if ((par.use_custom_fsdp && par.data_parallel_sharding_strategy != "no_shard") || par.zero3())
    return Unimplemented("--freeze-all-layers with a sharded optimizer, gradients or parameters (--use-custom-fsdp "
                         "optim, optim_grads or optim_grads_params, --use-torch-fsdp2, --layerzero): not supported yet");
  if (a.dpo.enabled()) return Unimplemented("--freeze-all-layers with --stage dpo: not supported yet");
  if (a.qad.qad_enable) return Unimplemented("--freeze-all-layers with --qad-enable: not supported yet");
  if (a.model.qk_clip)
    return Unimplemented("--freeze-all-layers with --qk-clip: not supported yet (the clip rescales the weights after "
                         "the optimizer step)");
  // Megatron's warnings, in its order.
  if (par.use_distributed_optimizer) {
    warn_rank0("--freeze-all-layers incompatible with use_distributed_optimizer. Disabling use_distributed_optimizer.");
    par.use_distributed_optimizer = false;
  }
  if (par.overlap_param_gather) {
    warn_rank0("--freeze-all-layers incompatible with overlap_param_gather. Disabling overlap_param_gather.");
    par.overlap_param_gather = false;
  }
  // Megatron's load_checkpoint: nothing trains, so --load gives the weights only (finetune-style:
  // iteration 0, no optimizer, scheduler or RNG state, no check of the saved arguments), and the run
  // starts at --override-ckpt-iteration or at the iteration of --save's tracker (load_checkpoint).
  // --save writes nothing (save_checkpoint: Megatron's skip_weight_ckpt).
  c.finetune = true;
  return Status::Ok();
}

}  // namespace gale
