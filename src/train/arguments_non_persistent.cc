// Validation of Megatron's non-persistent checkpoint flags (--non-persistent-*, --replication*).
#include "core/log.h"
#include "train/arguments.h"

namespace gale {

Status validate_non_persistent_args(Arguments& a, const ArgParser& p, int64_t world_size) {
  CheckpointArgs& c = a.checkpoint;
  const std::string& type = c.non_persistent_ckpt_type;
  // Megatron core_v0.12.1 lists in_memory among the choices but its validate_args refuses it.
  if (type == "in_memory")
    return InvalidArgument("--non-persistent-ckpt-type in_memory: Currently only global and local checkpoints are "
                           "supported (expected global or local)");
  if (type == "local" && c.non_persistent_local_ckpt_dir.empty())
    return InvalidArgument("--non-persistent-ckpt-type local: Tried to use local checkpointing without specifying "
                           "--non-persistent-local-ckpt-dir (the node-local directory each rank writes its part to)");
  if (c.replication) {
    if (c.replication_jump == kUnset)
      return InvalidArgument("--replication requires the value of --replication-jump (the spacing J between the "
                             "ranks that hold copies of a rank's part)");
    if (type != "local")
      return InvalidArgument("--replication requires --non-persistent-ckpt-type local, but got: ",
                             type.empty() ? std::string("None") : type);
    if (c.replication_jump <= 0)
      return InvalidArgument("--replication-jump: expected a positive integer, found ", c.replication_jump);
    if (c.replication_factor <= 0)
      return InvalidArgument("--replication-factor: expected a positive integer, found ", c.replication_factor);
    if (world_size % (c.replication_jump * c.replication_factor) != 0)
      return InvalidArgument("--replication: the world size (", world_size, ") must be divisible by --replication-jump "
                             "x --replication-factor (", c.replication_jump, " x ", c.replication_factor, " = ",
                             c.replication_jump * c.replication_factor, ")");
  } else if (c.replication_jump != kUnset) {
    warn_rank0("--replication-jump was specified despite not using replication. Ignoring.");  // Megatron's warning
    c.replication_jump = kUnset;
  }
  if (c.non_persistent_save_interval != kUnset) {
    if (c.non_persistent_save_interval <= 0)
      return InvalidArgument("--non-persistent-save-interval: expected a positive integer, found ",
                             c.non_persistent_save_interval);
    if (type.empty())
      return InvalidArgument("--non-persistent-save-interval needs --non-persistent-ckpt-type: Please use local or "
                             "global non-persistent checkpoints (got: None)");
    if (c.save.empty())
      return InvalidArgument("--non-persistent-save-interval needs --save (Megatron saves no checkpoint without it)");
  }
  // Not composed yet: LoRA saves only the adapters and loads from two directories.
  if (!type.empty() && a.lora.enabled())
    return Unimplemented("--non-persistent-ckpt-type ", type, " with LoRA (--lora-target-modules): not supported yet");
  if (!type.empty() && a.moe.moe_use_upcycling)
    return Unimplemented("--non-persistent-ckpt-type ", type, " with --moe-use-upcycling: not supported yet");
  (void)p;
  return Status::Ok();
}

}  // namespace gale
