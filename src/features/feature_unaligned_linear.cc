// MindSpeed's --unaligned-linear (UnalignedLinearFeature) in the registry: TP with heads / FFN not divisible by TP.
//
// Megatron needs --num-attention-heads, --num-query-groups and --ffn-hidden-size divisible by the
// TP size. With --unaligned-linear they are dealt out unevenly by MindSpeed's rule (rank r < n mod
// TP gets n/TP + 1, the others n/TP): attention in whole query groups with their heads (linear_qkv's
// rows and linear_proj's columns follow; a head never straddles ranks), the FFN in columns
// (linear_fc1's rows, each SwiGLU half alike, and linear_fc2's columns). Everything reads the
// per-rank counts from model/layer_shares.h; checkpoints store global tensors, so a TP3 checkpoint
// resumes at TP1 and back. Differences from MindSpeed: the sequence under --sequence-parallel
// stays evenly split (MindSpeed splits it unevenly too); SwiGLU splits each half by the FFN rule
// (MindSpeed splits 2·F and halves locally, which only agrees when that is even). Refused with
// it (train/arguments_parallel.cc): MoE (as MindSpeed), MLA, LoRA, fewer query groups than TP
// ranks, MTP with --hidden-size not divisible by TP; Ulysses / hybrid context parallelism keep
// their TP x CP divisibility of the heads. Level 0, like the unaligned pipeline split: which
// layouts run must not depend on --optimization-level. Tests: tests/parallel/
// unaligned_linear_mpi_test.cc, tests/model/layer_shares_test.cc, tests/features/
// unaligned_linear_feature_test.cc, tests/cli/unaligned_linear_cli_test.cc,
// tests/train/arguments_parallel_test.cc.
#include "features/registry.h"

namespace gale {

namespace {

class UnalignedLinearFeature : public Feature {
 public:
  std::string name() const override { return "unaligned-linear"; }
  std::string flag() const override { return "--unaligned-linear"; }
  FeatureModule module() const override { return FeatureModule::kParallel; }
  int level() const override { return 0; }
  std::string counterpart() const override { return "MindSpeed UnalignedLinearFeature (L2)"; }
  std::string description() const override {
    return "tensor parallelism with heads, query groups or FFN not divisible by TP: whole query groups (with "
           "their heads) and FFN columns dealt out unevenly, one more to each of the first ranks";
  }
  bool requested(const FeatureContext& ctx) const override { return ctx.args->parallel.unaligned_linear; }
};

}  // namespace

void register_feature_unaligned_linear(FeatureRegistry& registry) {
  registry.add(std::make_unique<UnalignedLinearFeature>());
}

}  // namespace gale
