// MindSpeed's --swap-attention [--swap-modules ...] (SwapAttentionFeature, memory, level 2) in the registry.
//
// What: after each transformer layer's training forward, the activations its attention block kept
// for backward (--swap-modules: input_norm → the first norm's output, self_attention → the packed
// QKV after RoPE, the log-sum-exp rows and the attention output, post_attention_norm → the second
// norm's output; MindSpeed's default all three, one comma-separated string or several values) are
// written to a file and released; backward reads layer i − 1's back on a thread while layer i's
// backward runs (model/activation_swap.h). Training is bit-identical (the bytes come back as they
// were); the allocator's peak drops by about those tensors of all layers but the ones in flight.
//
// How it differs from MindSpeed: MindSpeed moves the tensors to host memory over copy streams; on a
// CPU host memory is the device's, so Gale writes them to one anonymous file per micro-batch in
// flight in --swap-attention-dir (Gale's flag; default $TMPDIR or /tmp; unlinked at once, as
// --swap-optimizer's). MindSpeed's interplay with --recompute-num-layers (swap for some layers,
// recompute for others) is Gale's too in effect: layers under full recomputation keep nothing, so
// nothing of theirs is swapped. MindSpeed needs flash attention; Gale swaps either attention path.
//
// Rules, as MindSpeed: conflicts with LoRA and with the DualPipeV schedule. An unknown module name
// and an unusable directory are one-line errors (the latter at start-up, naming the file).
//
// Tests: tests/train/swap_attention_test.cc (bit-identical training for each module set, GPT and
// LLaMA-style, reference and fused kernels (flash attention), bf16, full recomputation; allocator
// peak; unusable directory),
// tests/parallel/swap_attention_mpi_test.cc (PP2, 1F1B and interleaved: forwards in flight),
// tests/features/swap_attention_feature_test.cc (registry and rules).
#include "features/registry.h"
#include "model/activation_swap.h"

namespace gale {

namespace {

class SwapAttention : public Feature {
 public:
  std::string name() const override { return "swap-attention"; }
  std::string flag() const override { return "--swap-attention"; }
  FeatureModule module() const override { return FeatureModule::kMemory; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed SwapAttentionFeature (L2)"; }
  std::string description() const override {
    return "each layer's attention activations kept for backward (--swap-modules input_norm, self_attention, "
           "post_attention_norm) written to an unlinked temporary file (--swap-attention-dir) after its forward "
           "and read back one layer ahead on a thread in backward: lower peak memory, bit-identical training; "
           "conflicts with LoRA and DualPipeV";
  }
  bool requested(const FeatureContext& ctx) const override { return ctx.args->training.swap_attention; }
  Status validate(const FeatureContext& ctx) const override {
    const Arguments& a = *ctx.args;
    GALE_RETURN_IF_ERROR(swap_attention_config(a.training.swap_modules, a.training.swap_attention_dir).status());
    if (a.lora.enabled())
      return InvalidArgument("--swap-attention: conflicts with --lora-target-modules (as MindSpeed)");
    if (a.parallel.schedules_method == "dualpipev")
      return InvalidArgument("--swap-attention: conflicts with --schedules-method dualpipev (as MindSpeed)");
    return Status::Ok();
  }
};

}  // namespace

void register_feature_swap_attention(FeatureRegistry& registry) { registry.add(std::make_unique<SwapAttention>()); }

}  // namespace gale
