// MindSpeed's --smart-swap (SmartSwapFeature, memory, level 2) in the registry.
//
// What: an activation-swap policy searched from a sampled iteration (model/smart_swap.h). The first
// --smart-swap-warmup-iters iterations (default 2, MindSpeed's warm-up steps) train without
// swapping; the last of them is sampled with the allocator's exact accounting (the peak of every
// stretch between two layers' forward ends / backward starts, and what each layer's activations
// kept for backward hold). A greedy search then picks the fewest layers whose activations (the
// attention block's, the layer input and the dense MLP's, each only where it is the sole holder of
// its storage) must go to a file after their forward — read back one layer ahead in backward, as
// --swap-attention — for the predicted peak to fall by --smart-swap-reduction-mb (default 3072,
// MindSpeed's reduction_memory) or to --smart-swap-target-mb (MindSpeed's target mode), or as far
// as swapping can take it. The policy is printed, then applied unchanged (MindSpeed's stable
// phase). Training is bit-identical (the bytes come back as they were); the peak is the predicted
// one to the byte when the iterations repeat their allocations.
//
// How it differs from MindSpeed: MindSpeed hooks every tensor of the NPU caching allocator and
// swaps to host memory over copy streams, and can also take over on an out-of-memory error; Gale's
// candidates are the layers' saved activations, its lower tier is one unlinked file per micro-batch
// in --swap-attention-dir (a CPU's host memory is the device's), and it has no out-of-memory
// fallback (the allocator stops the job). MindSpeed's --swap-delay (seconds before the policy
// applies) is Gale's --smart-swap-warmup-iters in iterations.
//
// Rules: as MindSpeed, it conflicts with adaptive selective recompute (whose flags Gale refuses
// anyway). Not supported yet (errors naming the flag): with --swap-attention or --swap-layer-input
// (smart-swap chooses the swapped layers itself), full recomputation, pipeline parallelism,
// --compress-activation / --compress-dense, LoRA, --variable-seq-lengths and --rampup-batch-size
// (the sampled iteration must stand for the later ones).
//
// Tests: tests/train/smart_swap_test.cc (bit-identical training, GPT and LLaMA-style, bf16,
// several micro-batches; the measured peak equals the predicted one and drops by at least the
// requested reduction; target mode; the policy search on a hand-made profile; unusable directory),
// tests/features/smart_swap_feature_test.cc (registry and refusals).
#include "features/registry.h"
#include "model/activation_swap.h"

namespace gale {

namespace {

class SmartSwapFeature : public Feature {
 public:
  std::string name() const override { return "smart-swap"; }
  std::string flag() const override { return "--smart-swap"; }
  FeatureModule module() const override { return FeatureModule::kMemory; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed SmartSwapFeature (L2)"; }
  std::string description() const override {
    return "a swap policy searched from a sampled warm-up iteration (--smart-swap-warmup-iters): the fewest layers "
           "whose saved activations go to an unlinked temporary file (--swap-attention-dir) for the peak to drop by "
           "--smart-swap-reduction-mb (default 3072) or to --smart-swap-target-mb, then applied for the rest of "
           "training: predicted peak, bit-identical training";
  }
  bool requested(const FeatureContext& ctx) const override { return ctx.args->training.smart_swap; }
  Status validate(const FeatureContext& ctx) const override {
    const Arguments& a = *ctx.args;
    const TrainingArgs& t = a.training;
    auto refuse = [](const std::string& expected, const std::string& found) {
      return InvalidArgument("--smart-swap: expected ", expected, ", found ", found, " (not supported yet)");
    };
    if (t.smart_swap_warmup_iters < 1)
      return InvalidArgument("--smart-swap-warmup-iters: expected at least 1 (the last warm-up iteration is sampled), "
                             "found ", t.smart_swap_warmup_iters);
    if (!(t.smart_swap_reduction_mb >= 0.0))
      return InvalidArgument("--smart-swap-reduction-mb: expected a size in MiB >= 0, found ", t.smart_swap_reduction_mb);
    if (!(t.smart_swap_target_mb >= 0.0))
      return InvalidArgument("--smart-swap-target-mb: expected a size in MiB >= 0 (0: off), found ",
                             t.smart_swap_target_mb);
    if (ctx.parser->was_set("--smart-swap-reduction-mb") && t.smart_swap_target_mb > 0.0)
      return InvalidArgument("--smart-swap: expected one of --smart-swap-reduction-mb and --smart-swap-target-mb, "
                             "found both");
    if (t.swap_attention)
      return refuse("no --swap-attention (smart-swap chooses the swapped layers itself)", "it set");
    if (t.swap_layer_input)
      return refuse("no --swap-layer-input (smart-swap chooses the swapped layers itself)", "it set");
    if (a.model.recompute_granularity == "full")
      return refuse("no full recomputation (its layers keep nothing to swap)", "--recompute-granularity full");
    if (a.parallel.pipeline_model_parallel_size > 1)
      return refuse("--pipeline-model-parallel-size 1 (one micro-batch in flight)",
                    str_cat("--pipeline-model-parallel-size ", a.parallel.pipeline_model_parallel_size));
    if (!t.compress_activation.empty())
      return refuse("no --compress-activation (it holds the same activations)",
                    "--compress-activation " + t.compress_activation);
    if (t.compress_dense != "disable")
      return refuse("no --compress-dense (it holds the same activations)", "--compress-dense " + t.compress_dense);
    if (a.lora.enabled()) return refuse("no LoRA adapters", "--lora-target-modules");
    if (a.data.variable_seq_lengths)
      return refuse("fixed-length micro-batches (the sampled iteration stands for the later ones)",
                    "--variable-seq-lengths");
    if (!t.rampup_batch_size.empty())
      return refuse("a constant global batch size (the sampled iteration stands for the later ones)",
                    "--rampup-batch-size");
    return Status::Ok();
  }
};

}  // namespace

void register_feature_smart_swap(FeatureRegistry& registry) { registry.add(std::make_unique<SmartSwapFeature>()); }

}  // namespace gale
