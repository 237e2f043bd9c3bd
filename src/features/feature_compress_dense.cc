// MindSpeed's --compress-dense level0|level1 (AnsCompressTensorFeature, memory, level 2) in the
// registry.
//
// What: the output of each dense MLP's linear_fc1 (the activation function's input, kept for its
// backward) is held compressed from the end of the layer's forward to the start of its backward.
// level0 entropy-codes the sign/exponent byte plane and keeps the mantissa bytes raw in memory
// (MindSpeed: exponent coded by the NPU's lossless coder, mantissa kept in device memory); level1
// also moves the raw mantissa bytes to the lower memory tier (MindSpeed: host memory; Gale, as its
// swap features: an unlinked temporary file in $TMPDIR or /tmp) and reads them back in backward.
// MoE layers' experts and shared experts are left alone (MindSpeed patches the dense MLP).
//
// How: model/activation_compress.h, core/plane_codec.h; the tensor comes back bit for bit, so
// training is bit-identical.
//
// Rules, as MindSpeed: conflicts with --recompute-activation-function and with --compress-activation
// (checked by compress-activation's feature).
//
// Tests: tests/train/compress_activation_test.cc (level0 and level1 bit-identical, allocator
// peak), tests/parallel/compress_activation_mpi_test.cc, tests/features/compress_features_test.cc
// (rules), tests/cli/compress_cli_test.cc.
#include "features/registry.h"
#include "model/activation_compress.h"

namespace gale {

namespace {

class CompressDense : public Feature {
 public:
  std::string name() const override { return "compress-dense"; }
  std::string flag() const override { return "--compress-dense"; }
  FeatureModule module() const override { return FeatureModule::kMemory; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed AnsCompressTensorFeature (L2)"; }
  std::string description() const override {
    return "each dense MLP's fc1 output held compressed until its backward: level0 zstd-codes the sign/exponent "
           "byte plane and keeps the mantissa bytes in memory, level1 also moves the mantissa bytes to a temporary "
           "file; bit-identical training; conflicts with --recompute-activation-function and --compress-activation";
  }
  bool requested(const FeatureContext& ctx) const override {
    return ctx.args->training.compress_dense != "disable";
  }
  Status validate(const FeatureContext& ctx) const override {
    const Arguments& a = *ctx.args;
    GALE_RETURN_IF_ERROR(parse_compress_dense(a.training.compress_dense).status());
    if (ctx.parser->was_set("--recompute-activation-function"))
      return InvalidArgument("--compress-dense ", a.training.compress_dense,
                             ": conflicts with --recompute-activation-function (as MindSpeed)");
    return Status::Ok();
  }
};

}  // namespace

void register_feature_compress_dense(FeatureRegistry& registry) { registry.add(std::make_unique<CompressDense>()); }

}  // namespace gale
