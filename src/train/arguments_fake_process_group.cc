// --fake-process-group (Megatron main): the flag, Megatron's checks and forced settings, and what a
// fake run (one process playing one rank, comm/fake_communicator.h) refuses in Gale.
#include "train/arguments_fake_process_group.h"

#include "core/log.h"

namespace gale {

void add_fake_process_group_args(ArgParser& p, FakeProcessGroupArgs& a) {
  p.add_flag("--fake-process-group", &a.fake_process_group,
             "one process plays rank $RANK of $WORLD_SIZE with a fake process group: every communication is "
             "skipped (comm/fake_communicator.h), to profile the memory of one rank of a distributed layout");
}

Status validate_fake_process_group(const FakeProcessGroupArgs& f, Arguments& a, const ArgParser& p) {
  if (!f.fake_process_group) return Status::Ok();
  const std::string flag = "--fake-process-group";
  // Megatron's checks (validate_args).
  if (a.moe.moe_token_dispatcher_type == "flex")
    return InvalidArgument(flag, " with --moe-token-dispatcher-type flex: expected allgather or alltoall (Fake "
                           "process group is not supported with flex token dispatcher.)");
  // Megatron turns the NaN check off (a fake rank's values are not what a real run computes) and
  // warns so; its second forced setting, use_gloo_process_groups = False, is Gale's only way (Gale
  // creates no Gloo groups), so it has no warning here.
  a.training.check_for_nan_in_loss_and_grad = false;
  warn_rank0("check_for_nan_in_loss_and_grad is set to False for fake process group.");
  // Gale's refusals: what one process playing one rank cannot do meaningfully, or is untested.
  // Megatron does not refuse --save, but cannot save either: its distributed checkpoint's metadata
  // is written by the coordinator rank from a gather of every rank's save plan and write results
  // (dist_checkpointing state_dict_saver), which the fake backend skips; Gale's commit likewise
  // all-gathers every shard's size and checksum before rank 0 writes metadata.json
  // (ckpt/checkpoint_writer.h). So fake ranks, run one after another, cannot together write the
  // checkpoint of a real run.
  if (!a.checkpoint.save.empty())
    return InvalidArgument(flag, " with --save: expected no checkpoint saving (one process playing one rank of "
                           "$WORLD_SIZE would write one rank's part of a checkpoint, which no run can load: the "
                           "checkpoint's metadata is written by rank 0 from a gather of every rank's shards, as "
                           "Megatron's distributed checkpoint does, and a fake process group's gather returns this rank's own values only)");
  if (!a.checkpoint.load.empty() || !a.checkpoint.pretrained_checkpoint.empty())
    return Unimplemented(flag, " with ", a.checkpoint.load.empty() ? "--pretrained-checkpoint" : "--load",
                         ": not supported yet (a fake run starts from its initialisation)");
  if (a.auto_settings.auto_settings || a.auto_settings.auto_parallel)
    return Unimplemented(flag, " with ", a.auto_settings.auto_settings ? "--auto-settings" : "--auto-parallel",
                         ": not supported yet (their profiling runs need real ranks)");
  if (a.parallel.dist_train) return Unimplemented(flag, " with --dist-train: not supported yet");
  if (p.was_set("--automated-pipeline"))
    return Unimplemented(flag, " with --automated-pipeline: not supported yet (its profiling runs need real ranks)");
  if (p.was_set("--use-multiparameter-pipeline-model-parallel"))
    return Unimplemented(flag, " with --use-multiparameter-pipeline-model-parallel: not supported yet (its start-up "
                         "check exchanges the stages' transfer lists)");
  return Status::Ok();
}

}  // namespace gale
