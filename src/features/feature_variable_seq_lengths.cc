// Megatron's --variable-seq-lengths (MindSpeed VariableSequenceLengthFeature) in the registry.
//
// Instruction samples are right-padded to --seq-length. With this feature each micro-batch is cut
// to its longest sample instead (rounded up to a multiple of TP with --sequence-parallel), as
// MindSpeed-LLM's collator pads with PaddingStrategy.LONGEST under --variable-seq-lengths. The
// padding carries loss mask 0 and comes after every real token, so causal attention never lets a
// real position see it: the losses and gradients are those of the full-length micro-batch (up to
// the order of floating-point sums), and a micro-batch of short samples costs its own length.
// Pipeline stages each load the same micro-batches, so every stage knows each transfer's shape
// without Megatron's extra shape exchange (schedule/pipeline_schedules.cc). Level 2, as MindSpeed's.
// The flag is a data flag (train/arguments.cc); the trainer reads args.data.variable_seq_lengths,
// which `gale pretrain` sets from this feature's status.
#include "features/registry.h"

namespace gale {

namespace {

class VariableSeqLengthsFeature : public Feature {
 public:
  std::string name() const override { return "variable-seq-lengths"; }
  std::string flag() const override { return "--variable-seq-lengths"; }
  FeatureModule module() const override { return FeatureModule::kMultimodal; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed VariableSequenceLengthFeature (L2)"; }
  std::string description() const override {
    return "micro-batches of different lengths: an instruction (or pairwise) dataset's micro-batch is padded to its "
           "longest sample, not to --seq-length; pipeline transfers take each micro-batch's shape";
  }
  bool requested(const FeatureContext& ctx) const override { return ctx.args->data.variable_seq_lengths; }
  Status validate(const FeatureContext& ctx) const override {
    if (ctx.args->parallel.context_parallel_size > 1)
      return InvalidArgument("--variable-seq-lengths with --context-parallel-size ",
                             ctx.args->parallel.context_parallel_size,
                             ": not supported (context parallelism splits whole --seq-length sequences; "
                             "MindSpeed-LLM forbids the combination too)");
    return Status::Ok();
  }
  bool applicable(const FeatureContext& ctx, std::string* why) const override {
    if (ctx.args->data.is_instruction_dataset || ctx.args->dpo.is_pairwise_dataset) return true;
    *why = "pretraining samples are always --seq-length tokens (only --is-instruction-dataset and "
           "--is-pairwise-dataset samples are padded)";
    return false;
  }
};

}  // namespace

void register_feature_variable_seq_lengths(FeatureRegistry& registry) {
  registry.add(std::make_unique<VariableSeqLengthsFeature>());
}

}  // namespace gale
