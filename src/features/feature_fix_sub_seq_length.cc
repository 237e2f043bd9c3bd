// MindSpeed's --fix-sub-seq-length (part of ResetAttentionMaskFeature) in the registry: --reset-attention-mask's attention blocks of one fixed length.
//
// What MindSpeed does (mindspeed/core/transformer/flash_attention/reset_attention_mask/utils.py,
// collate_wrapper): under --reset-attention-mask the variable-length flash attention reads each
// sample's block ends from actual_seq_len, normally the end of every document (after each EOD) and
// the sample's end. With --fix-sub-seq-length L and 0 < L <= --seq-length S the collate replaces
// them by L, 2L, ..., S (ceil(S / L) blocks, the last one taking the rest), whatever the EODs;
// the position ids (restarted after each EOD with --reset-position-ids) and the loss mask stay as
// they were. L <= 0 (the default -1) or L > S keeps the documents. It is read only where
// --reset-attention-mask installed MindSpeed's patches, on pretraining (GPTDataset) samples.
//
// What it does in Gale: the same blocks, as the per-token document ids that express the mask
// (data/sample.h: token i gets id i / L), so every attention path that honours documents — the
// reference and flash kernels, ring, all-gather, Ulysses and hybrid context parallelism, which see
// the ids at global positions — attends inside the fixed blocks.
//
// Rules: level 2 (key-scenarios module), as MindSpeed's ResetAttentionMaskFeature. Refused without
// --reset-attention-mask (MindSpeed would silently ignore it) and with --is-instruction-dataset
// (MindSpeed applies it to pretraining samples only); L > S is inactive with a notice (the
// documents stay the blocks, as in MindSpeed). Tests: tests/data/sample_test.cc (hand-computed
// ids and mask), tests/features/fix_sub_seq_length_feature_test.cc (rules),
// tests/cli/fix_sub_seq_length_cli_test.cc (runs: L = S is plain causal attention, L > S the
// documents, smaller L neither; CP2 reproduces one process).
#include "features/registry.h"

namespace gale {

namespace {

class FixSubSeqLengthFeature : public Feature {
 public:
  std::string name() const override { return "fix-sub-seq-length"; }
  std::string flag() const override { return "--fix-sub-seq-length"; }
  FeatureModule module() const override { return FeatureModule::kKeyScenarios; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed ResetAttentionMaskFeature (L2)"; }
  std::string description() const override {
    return "--fix-sub-seq-length L with --reset-attention-mask: attention blocks of L consecutive positions (the "
           "last one takes the rest) instead of the packed documents; positions and loss mask unchanged";
  }
  bool requested(const FeatureContext& ctx) const override { return ctx.args->data.fix_sub_seq_length > 0; }
  std::string not_requested_reason(const FeatureContext&) const override {
    return "not requested (--fix-sub-seq-length L > 0)";
  }
  Status validate(const FeatureContext& ctx) const override {
    const DataArgs& d = ctx.args->data;
    if (!d.reset_attention_mask)
      return InvalidArgument("--fix-sub-seq-length ", d.fix_sub_seq_length,
                             " sets the blocks of --reset-attention-mask's attention: expected --reset-attention-mask "
                             "(MindSpeed reads it only there)");
    if (d.is_instruction_dataset)
      return Unimplemented("--fix-sub-seq-length with --is-instruction-dataset: not supported (MindSpeed applies it to "
                           "pretraining samples only)");
    return Status::Ok();
  }
  bool applicable(const FeatureContext& ctx, std::string* why) const override {
    const int64_t L = ctx.args->data.fix_sub_seq_length, S = ctx.args->model.seq_length;
    if (S <= 0 || L <= S) return true;
    *why = str_cat("--fix-sub-seq-length ", L, " is longer than --seq-length ", S,
                   ": the attention blocks stay the documents (as MindSpeed)");
    return false;
  }
};

}  // namespace

void register_feature_fix_sub_seq_length(FeatureRegistry& registry) {
  registry.add(std::make_unique<FixSubSeqLengthFeature>());
}

}  // namespace gale
