// MindSpeed's --swap-layer-input (SwapLayerInputFeature, memory, level 2) in the registry.
//
// What: after each transformer layer's training forward, the layer's input kept for its backward
// (LayerSaved::x_in [Tl, H], f32: the previous layer's output, or the embedding's) is written to a
// file and released; backward reads layer i − 1's back on a thread while layer i's backward runs.
// It shares --swap-attention's machinery (model/activation_swap.h): one anonymous file per
// micro-batch in flight in --swap-attention-dir (Gale's flag; default $TMPDIR or /tmp; unlinked at
// once), the one-layer-ahead prefetch, byte-exact round trips, so training is bit-identical. With
// --swap-attention too, both sets go to the same file. The allocator's peak drops by about the
// inputs of all layers but the ones in flight (docs/model.md, measured).
//
// How it differs from MindSpeed: MindSpeed moves the input to host memory on a copy stream (and
// patches its --moe-fb-overlap layer functions, which Gale's fb-overlap does not need); on a CPU host memory is
// the device's, so Gale's lower tier is the file. Layers under full recomputation keep only the
// group's input for the rerun (model/gpt_model.cc); that one stays in memory. MindSpeed's feature
// has no requirements or conflicts, and neither has Gale's.
//
// Tests: tests/train/swap_layer_input_test.cc (bit-identical training, GPT and LLaMA-style, bf16,
// with --swap-attention, full recomputation, several micro-batches; the allocator's exact peak
// drop; an unusable directory at start-up), tests/parallel/swap_attention_mpi_test.cc (PP2, 1F1B
// and interleaved, alone and with --swap-attention), tests/features/swap_layer_input_feature_test.cc.
#include "features/registry.h"

namespace gale {

namespace {

class SwapLayerInput : public Feature {
 public:
  std::string name() const override { return "swap-layer-input"; }
  std::string flag() const override { return "--swap-layer-input"; }
  FeatureModule module() const override { return FeatureModule::kMemory; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed SwapLayerInputFeature (L2)"; }
  std::string description() const override {
    return "each transformer layer's input kept for backward written to an unlinked temporary file "
           "(--swap-attention-dir) after its forward and read back one layer ahead on a thread in backward: lower "
           "peak memory, bit-identical training";
  }
  bool requested(const FeatureContext& ctx) const override { return ctx.args->training.swap_layer_input; }
};

}  // namespace

void register_feature_swap_layer_input(FeatureRegistry& registry) {
  registry.add(std::make_unique<SwapLayerInput>());
}

}  // namespace gale
