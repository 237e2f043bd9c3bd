// Megatron's FP8 training flags (--fp8-format, --fp8-recipe, --fp8-margin, --fp8-amax-history-len,
// --fp8-amax-compute-algo, --no-fp8-wgrad, --first-last-layers-bf16 and its counts), emulated on the CPU.
//
// What: Transformer Engine's FP8 linear layers as Megatron drives them — every GEMM operand of the
// transformer layers' linear layers (QKV, attention projection, fc1, fc2; experts and shared
// experts; MLA's projections) quantised to FP8 with its scale and dequantised to f32 before Gale's
// f32 GEMM (model/fp8.h): E4M3 everywhere (e4m3) or E5M2 gradients (hybrid); recipes delayed (amax
// history, TE's DelayedScaling; the state in checkpoints), tensorwise (Float8CurrentScaling) and
// mxfp8 (MXFP8BlockScaling, E8M0 per 32). The numerics of FP8 training, not its speed or memory.
//
// How it differs from Megatron: no FP8 GEMM hardware, so no speed-up and no memory saving (the
// quantised operands are f32 temporaries); the delayed recipe updates its scales once per training
// iteration (TE: after each micro-batch's forward and backward; the same with one micro-batch per
// iteration); mxfp8's shared exponent follows the OCP floor rule of kernels/cpu/mx_quant.h;
// --fp8-interval is accepted and ignored (deprecated in Megatron). --fp8-param-gather is not
// supported yet: Megatron keeps the linear weights as FP8 tensors and all-gathers those bytes,
// where Gale's emulation quantises each GEMM's operands from the f32 / bf16 weights.
//
// Rules: Megatron's (arguments.py, TransformerConfig) with its messages; not with --fp16, --qat-scheme,
// LoRA, --tp-2d; the delayed recipe not with expert parallelism or ZeRO-3 sharding (its state buffers).
//
// Tests: tests/kernels/fp8_scaling_test.cc (codec and delayed update vs the numpy fixture),
// tests/model/fp8_test.cc (the GEMMs' operands, training per recipe, --no-fp8-wgrad, bf16 layers),
// tests/parallel/fp8_mpi_test.cc (TP2 = TP1), tests/features/fp8_feature_test.cc (rules),
// tests/cli/fp8_resume_test.cc (checkpoint resume bit for bit).
#include <algorithm>

#include "features/registry.h"
#include "model/fp8.h"

namespace gale {

namespace {

class Fp8Feature : public Feature {
 public:
  std::string name() const override { return "fp8"; }
  std::string flag() const override { return "--fp8-format"; }
  FeatureModule module() const override { return FeatureModule::kMegatron; }
  int level() const override { return 0; }
  std::string counterpart() const override { return "Megatron --fp8-format / --fp8-recipe (Transformer Engine FP8)"; }
  std::string description() const override {
    return "FP8 training emulated: the linear layers' GEMM operands quantised to E4M3 (hybrid: E5M2 gradients) and "
           "dequantised before f32 GEMMs, with delayed (amax history, in checkpoints), tensorwise or mxfp8 scaling; "
           "--no-fp8-wgrad, --first-last-layers-bf16 (numerics only: no speed or memory gain)";
  }
  std::vector<std::string> sub_flags() const override {
    return {"--fp8-recipe", "--fp8-margin", "--fp8-interval", "--fp8-amax-history-len", "--fp8-amax-compute-algo",
            "--no-fp8-wgrad", "--first-last-layers-bf16", "--num-layers-at-start-in-bf16",
            "--num-layers-at-end-in-bf16"};
  }
  bool requested(const FeatureContext& ctx) const override {
    return !ctx.args->model.fp8_format.empty() || ctx.args->model.fp8_param_gather;
  }
  Status validate(const FeatureContext& ctx) const override {
    const Arguments& a = *ctx.args;
    const ModelArgs& m = a.model;
    const ParallelArgs& p = a.parallel;
    // megatron/training/arguments.py validate_args
    if (m.fp8_param_gather && !(p.use_distributed_optimizer || p.use_torch_fsdp2))
      return InvalidArgument("--fp8-param-gather only supported with distributed optimizer or torch fsdp2");
    // TransformerConfig.__post_init__
    if (m.fp8_param_gather && m.fp8_format.empty())
      return InvalidArgument("fp8_param must be used together with fp8 mode. (--fp8-param-gather needs --fp8-format)");
    StatusOr<Fp8Config> parsed = parse_fp8_config(m.fp8_format, m.fp8_recipe, m.fp8_margin, m.fp8_amax_history_len,
                                                  m.fp8_amax_compute_algo, m.fp8_wgrad);
    GALE_RETURN_IF_ERROR(parsed.status());
    const Fp8Config& c = parsed.value();
    if (m.first_last_layers_bf16 && c.recipe == Fp8Recipe::kDelayed)
      return InvalidArgument("Delayed scaling does not support first / last layer in BF16. "
                             "(--first-last-layers-bf16 needs --fp8-recipe tensorwise or mxfp8)");
    const int64_t pp = std::max<int64_t>(1, p.pipeline_model_parallel_size);
    const int64_t per_stage = m.num_layers / pp;
    if (m.first_last_layers_bf16 && m.num_layers > 0) {
      if (m.num_layers_at_start_in_bf16 < 0 || m.num_layers_at_start_in_bf16 > per_stage)
        return InvalidArgument("num_layers_at_start_in_bf16 (", m.num_layers_at_start_in_bf16,
                               ") must be between 0 and number of layers per pipeline stage (", per_stage, ").");
      if (m.num_layers_at_end_in_bf16 < 0 || m.num_layers_at_end_in_bf16 > per_stage)
        return InvalidArgument("num_layers_at_end_in_bf16 (", m.num_layers_at_end_in_bf16,
                               ") must be between 0 and number of layers per pipeline stage (", per_stage, ").");
    }
    if (m.fp8_param_gather && c.recipe == Fp8Recipe::kMxfp8)
      return InvalidArgument("MXFP8 currently does not support fp8_param.");
    if (m.fp8_param_gather)
      return Unimplemented("--fp8-param-gather: not supported yet (Megatron keeps the linear weights as FP8 tensors "
                           "and all-gathers their FP8 bytes; Gale's emulated FP8 quantises each GEMM's operands from "
                           "the f32 / bf16 weights, whose all-gather stays f32 / bf16)");
    const std::string fp8 = "--fp8-format " + m.fp8_format;
    if (a.training.fp16) return Unimplemented(fp8, " with --fp16: not supported yet (use --bf16 or f32)");
    if (!m.qat_scheme.empty())
      return InvalidArgument(fp8, " conflicts with --qat-scheme ", m.qat_scheme,
                             " (both quantise the linear layers' GEMMs); use one of them");
    if (a.lora.enabled()) return Unimplemented(fp8, " with LoRA (--lora-target-modules): not supported yet");
    if (p.tp_2d) return Unimplemented(fp8, " with --tp-2d: not supported yet");
    if (c.recipe == Fp8Recipe::kDelayed) {
      if (p.expert_model_parallel_size > 1)
        return Unimplemented(fp8, " --fp8-recipe delayed with --expert-model-parallel-size ",
                             p.expert_model_parallel_size,
                             ": not supported yet (the experts' amax reduction); use tensorwise or mxfp8");
      if (p.zero2() || p.zero3())
        return Unimplemented(fp8, " --fp8-recipe delayed with ZeRO-2/3 sharding: not supported yet (the "
                             "delayed-scaling state buffers); use --use-distributed-optimizer");
    }
    return Status::Ok();
  }
};

}  // namespace

void register_feature_fp8(FeatureRegistry& registry) { registry.add(std::make_unique<Fp8Feature>()); }

}  // namespace gale
