// MindSpeed's --reuse-fp32-param (ReuseFP32Param, memory, level 2) in the registry.
//
// With --bf16 each transformer layer's linear weights (linear_qkv, linear_proj, linear_fc1,
// linear_fc2) keep their f32 master as the bf16 GEMM copy plus a 16-bit residual in the 4 bytes the
// master alone took, and the other parameters (embeddings, norms, biases, output layer, which the
// model reads in f32) keep only the f32 value without a bf16 copy: 2 bytes per parameter less
// (ParamBuffer::enable_gemm_copy, model/params.h, has the bit layout). The optimizer step
// reconstructs the masters bit for bit, updates them and splits them again, so training, the
// checkpoints (f32 masters written as f32) and a resume with or without the flag are those of a
// plain --bf16 run, bit for bit. With the distributed optimizer each rank holds every parameter
// (Gale all-gathers f32 values), so the saving is 2 bytes per parameter of the rank's model chunk,
// not divided by the data-parallel size. The flag is a training flag (train/arguments.cc); `gale
// pretrain` keeps it only while this feature is active.
#include "features/registry.h"

namespace gale {

namespace {

class ReuseFp32Param : public Feature {
 public:
  std::string name() const override { return "reuse-fp32-param"; }
  std::string flag() const override { return "--reuse-fp32-param"; }
  FeatureModule module() const override { return FeatureModule::kMemory; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed ReuseFP32Param (L2)"; }
  std::string description() const override {
    return "keep fp32 master weights as bf16 parameter + 16-bit residual (exact round trip, ties included): 2 bytes "
           "per parameter less, bit-identical training and checkpoints";
  }
  bool requested(const FeatureContext& ctx) const override { return ctx.args->training.reuse_fp32_param; }
  Status validate(const FeatureContext& ctx) const override {
    const Arguments& a = *ctx.args;
    if (a.training.fp16)
      return InvalidArgument("--reuse-fp32-param with --fp16: expected --bf16 (the residual completes a bf16 value, "
                             "not an f16 one)");
    if (!a.training.bf16)
      return InvalidArgument("--reuse-fp32-param: expected --bf16 (it keeps the f32 masters as bf16 parameters + "
                             "residuals), found no --bf16");
    if (a.lora.enabled())
      return Unimplemented("--reuse-fp32-param with --lora-target-modules: not supported yet (LoRA's frozen base "
                           "weights have no f32 master to fold)");
    if (a.moe.enabled())
      return Unimplemented("--reuse-fp32-param with --num-experts: not supported yet (only the dense layers' linear "
                           "weights are stored split)");
    if (a.model.multi_latent_attention)
      return Unimplemented("--reuse-fp32-param with --multi-latent-attention: not supported yet (only the dense "
                           "layers' linear weights are stored split)");
    if (a.model.mtp_num_layers > 0)
      return Unimplemented("--reuse-fp32-param with --mtp-num-layers: not supported yet (only the dense layers' "
                           "linear weights are stored split)");
    return Status::Ok();
  }
};

}  // namespace

void register_feature_reuse_fp32_param(FeatureRegistry& registry) { registry.add(std::make_unique<ReuseFp32Param>()); }

}  // namespace gale
