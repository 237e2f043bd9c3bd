// MindSpeed's --compress-optimizer (CompressOptimizerFeature, memory, level 2) in the registry.
//
// What: AdamW's moments (exp_avg, exp_avg_sq; SGD's momentum buffer too) are held losslessly
// compressed in memory between steps; the step decompresses one chunk of them at a time into a
// staging buffer, updates that chunk's parameters and compresses it again, so the resident state is
// the compressed state plus one chunk.
//
// How (optim/state_swap.h, core/plane_codec.h): MindSpeed calls the Ascend lossless coder
// (npu_hans_encode/decode) on each parameter's moments of more than 32768 elements. Gale's codec
// splits the f32 words into byte planes (sign/exponent bytes apart from the mantissa bytes) and
// compresses each plane with zstd (Debian's libzstd); the chunks are the swap optimizer's plan with
// about OptimizerConfig::compress_chunk (65536) elements each, their edges on 64-element multiples
// inside a parameter, so every AdamW call sees the same vector lanes: training is bit-identical,
// with and without the distributed optimizer (each rank compresses its shard). Checkpoints hold the
// decompressed state (nothing is stored compressed on disk), so runs resume either way.
//
// Rules: conflicts with --optimizer-selection fused_ema_adamw (as MindSpeed) and with
// --swap-optimizer and --quant-states (each stores the moments its own way); --optimizer muon,
// --reuse-fp32-param, ZeRO-2/3 (train/arguments_parallel.cc) and --enable-expert-placement (its
// feature) are not supported yet.
//
// Tests: tests/core/plane_codec_test.cc (codec), tests/train/compress_optimizer_test.cc
// (bit-identical training, state, checkpoints, allocator bytes, rules),
// tests/optim/compress_optimizer_mpi_test.cc (DP2 with and without the distributed optimizer, PP2
// chunks, bit-identical), tests/features/compress_features_test.cc (rules), tests/cli/compress_cli_test.cc.
#include "features/registry.h"

namespace gale {

namespace {

class CompressOptimizer : public Feature {
 public:
  std::string name() const override { return "compress-optimizer"; }
  std::string flag() const override { return "--compress-optimizer"; }
  FeatureModule module() const override { return FeatureModule::kMemory; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed CompressOptimizerFeature (L2)"; }
  std::string description() const override {
    return "optimizer fp32 state (Adam moments, SGD momentum) held losslessly compressed in memory (byte planes + "
           "zstd) in chunks of about 65536 elements, each decompressed into one staging buffer for its update and "
           "compressed again: bit-identical training and checkpoints";
  }
  bool requested(const FeatureContext& ctx) const override { return ctx.args->training.compress_optimizer; }
  Status validate(const FeatureContext& ctx) const override {
    const Arguments& a = *ctx.args;
    if (a.training.optimizer_selection == "fused_ema_adamw")
      return InvalidArgument("--compress-optimizer: conflicts with --optimizer-selection fused_ema_adamw (as MindSpeed)");
    if (a.training.swap_optimizer)
      return InvalidArgument("--compress-optimizer: conflicts with --swap-optimizer (both store the optimizer state "
                             "their own way)");
    if (!a.training.quant_states.empty())
      return InvalidArgument("--compress-optimizer: conflicts with --quant-states ", a.training.quant_states,
                             " (both store the moments their own way)");
    if (a.training.optimizer == "muon" || a.training.optimizer == "lion")
      return Unimplemented("--compress-optimizer with --optimizer ", a.training.optimizer,
                           ": not supported yet (MindSpeed compresses AdamW's moments)");
    if (a.training.reuse_fp32_param)
      return Unimplemented("--compress-optimizer with --reuse-fp32-param: not supported yet");
    return Status::Ok();
  }
};

}  // namespace

void register_feature_compress_optimizer(FeatureRegistry& registry) {
  registry.add(std::make_unique<CompressOptimizer>());
}

}  // namespace gale
