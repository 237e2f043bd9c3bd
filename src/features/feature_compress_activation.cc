// MindSpeed's --compress-activation (CompressActivationFeature, memory, level 2) in the registry.
//
// What: the activations the listed transformer layers keep for backward are held losslessly
// compressed from the end of each layer's forward to the start of its backward. The value is
// MindSpeed's: 1-based layer numbers and ranges ("1-3,5") or "0" for every layer.
//
// How (model/activation_compress.h, core/plane_codec.h): MindSpeed compresses the tensors autograd
// saves inside the layer with the Ascend lossless coder on a side stream; Gale compresses every
// tensor of the layer's LayerSaved of at least 4 KiB (f32 and bf16; byte planes + zstd) on the
// calling thread after the layer's forward and decompresses them before its backward. Tensors come
// back bit for bit: training is bit-identical. Layers that --recompute-granularity full reruns
// keep nothing in forward, so nothing of theirs is compressed.
//
// Rules, as MindSpeed: conflicts with --recompute-activation-function and with --compress-dense
// (MindSpeed: compress-activation is compress-dense's successor, not both). A layer number outside
// 1..--num-layers or a malformed value is an error naming the item.
//
// Tests: tests/train/compress_activation_test.cc (bit-identical training, allocator peak),
// tests/parallel/compress_activation_mpi_test.cc (PP2, 1F1B and interleaved),
// tests/features/compress_features_test.cc (parsing and rules), tests/cli/compress_cli_test.cc.
#include "features/registry.h"
#include "model/activation_compress.h"

namespace gale {

namespace {

class CompressActivation : public Feature {
 public:
  std::string name() const override { return "compress-activation"; }
  std::string flag() const override { return "--compress-activation"; }
  FeatureModule module() const override { return FeatureModule::kMemory; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed CompressActivationFeature (L2)"; }
  std::string description() const override {
    return "the activations the listed layers ('1-3,5'; 0: all) keep for backward held losslessly compressed "
           "(byte planes + zstd) from the end of their forward to their backward: lower peak memory, bit-identical "
           "training; conflicts with --recompute-activation-function and --compress-dense";
  }
  bool requested(const FeatureContext& ctx) const override {
    return ctx.parser->was_set("--compress-activation") || !ctx.args->training.compress_activation.empty();
  }
  Status validate(const FeatureContext& ctx) const override {
    const Arguments& a = *ctx.args;
    GALE_RETURN_IF_ERROR(parse_compress_activation(a.training.compress_activation, a.model.num_layers).status());
    if (ctx.parser->was_set("--recompute-activation-function"))
      return InvalidArgument("--compress-activation: conflicts with --recompute-activation-function (as MindSpeed)");
    if (a.training.compress_dense != "disable")
      return InvalidArgument("--compress-activation: conflicts with --compress-dense ", a.training.compress_dense,
                             " (as MindSpeed: use one of them)");
    return Status::Ok();
  }
};

}  // namespace

void register_feature_compress_activation(FeatureRegistry& registry) {
  registry.add(std::make_unique<CompressActivation>());
}

}  // namespace gale
