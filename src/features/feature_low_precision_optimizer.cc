// MindSpeed's low-precision optimizer (LowPrecisionOptimizerFeature, memory, level 0) in the registry.
//
// What: --quant-states fp8|mxfp8|hif8 stores AdamW's moments as 8-bit codes with block scales
// between steps (fp8 and mxfp8: exp_avg E4M3, exp_avg_sq E5M2; hif8: both Ascend's HiFloat8 with
// MindSpeed's hif8 scale, fl(fl(T / amax) / T) with T = 15 and 224; as MindSpeed's quant_adamw.py);
// each step dequantises a block to f32, updates it with the parameters, and quantises it again, in
// one vectorised pass (AVX-512/AVX2/one-lane builds, bit-identical to the reference;
// kernels/cpu/quant_states.h has the formats, the scaling rules and the rounding,
// kernels/cpu/fp8_codec.h the shared FP8 pieces). The state takes 1 + 4/B bytes per element and
// moment (fp8 and hif8, B = gcd(numel, 128): 1.03125 for B = 128) or 1 + 1/32 (mxfp8) instead of 4:
// about 3.9x less (docs/model.md has the measured figures).
//
// Level: MindSpeed registers it at optimization level 0, which only means no level gates it; it
// changes numerics, so here too it is active exactly when --quant-states or --quant-grads is given,
// at any --optimization-level (the flags are the gate).
//
// --quant-grads (optim/quant_grads.h, kernels/cpu/quant_grads.h): MindSpeed's FP16 main gradients
// with one f32 scale per parameter (65503 / amax), requantised at every accumulation (once per
// parameter group and micro-batch, from the f32 contribution the backward wrote), the scales aligned
// across data-parallel ranks by an all-reduce MIN before the sum, the sum rounded to FP16 with the
// aligned scale, and the optimizer, the gradient norm and clipping reading the dequantised values.
// Gale's backward still writes each contribution in f32 (as MindSpeed's param.grad), but only one
// drain unit's at a time: the chunk's flat f32 gradient buffer is replaced by one scratch the size
// of the largest unit (a layer, the head or the embedding), shared by all units and reused as the
// data-parallel sum's staging and the optimizer's dequantised copy, plus f32 slots for the
// parameters written outside their unit or summed in f32 afterwards (the tied word embedding, the
// embedding group's copies, sequence-parallel norms and biases). Numerics are unchanged, bit for
// bit (docs/model.md has the measured memory). Works alone or with --quant-states.
// Refused (not supported yet, naming the flag): --overlap-grad-reduce (buckets would be reduced
// during the backward, before the scales are aligned), expert parallelism (a second data-parallel
// group), several distributed-optimizer instances, --dualpipev-dw-detach (weight gradients after
// their unit's hook, into a scratch another unit then uses), ZeRO-2/3.
//
// Rules of --quant-states: AdamW only (--optimizer adam; SGD and Muon keep their f32 state); conflicts with
// --swap-optimizer (its file holds f32 state; the task's rule for this feature, MindSpeed's own
// validation does not check it); refused with ZeRO-2/3 (--use-custom-fsdp optim_grads /
// optim_grads_params, --layerzero: not supported yet). Compatible with the distributed optimizer
// (blocks cut by shard boundaries are quantised in two parts, see optim/optimizer.h) and with
// --reuse-fp32-param (as MindSpeed).
//
// Tests: tests/kernels/quant_states_test.cc (FP8 and HiF8 codes and block scaling vs the numpy
// fixtures, all 256 HiF8 codes round trip, every ISA build of the fused kernel vs the reference on
// edge cases), tests/train/quant_states_test.cc (training within tolerance of f32 states, exact
// state bytes, bitwise resume, cross loads; all three modes), tests/cli/quant_states_cli_test.cc, tests/optim/quant_states_mpi_test.cc (DP2 distributed
// optimizer), tests/features/low_precision_optimizer_feature_test.cc (registry and rules);
// --quant-grads: tests/kernels/quant_grads_test.cc (codec vs the numpy fixture, accumulation bound),
// tests/train/quant_grads_test.cc (gradients, training within tolerance of f32, bytes of the codes
// and of the f32 slots and scratch against the bound derived from the model, bitwise resume),
// tests/optim/quant_grads_mpi_test.cc (DP2 vs one process, aligned scales, distributed optimizer,
// TP2 + SP resident norms), tests/cli/quant_states_cli_test.cc.
#include "features/registry.h"

namespace gale {

namespace {

class LowPrecisionOptimizer : public Feature {
 public:
  std::string name() const override { return "low-precision-optimizer"; }
  std::string flag() const override { return "--quant-states"; }
  FeatureModule module() const override { return FeatureModule::kMemory; }
  int level() const override { return 0; }
  std::string counterpart() const override { return "MindSpeed LowPrecisionOptimizerFeature (L0)"; }
  std::string description() const override {
    return "AdamW moments stored as 8-bit codes between steps (--quant-states fp8: exp_avg E4M3, exp_avg_sq E5M2, "
           "an f32 scale per block of up to 128 elements; mxfp8: the same k-scaled with an E8M0 scale per 32; hif8: "
           "both HiFloat8 with fp8's blocks and MindSpeed's hif8 scale) and dequantised to f32 for the update in one "
           "fused pass: about 3.9x less optimizer-state memory; --quant-grads: FP16 main gradients with a "
           "per-parameter scale (65503 / amax), requantised at every micro-batch accumulation, scales aligned by a "
           "data-parallel MIN before the sum; f32 gradients only for the largest layer (a scratch every layer "
           "shares) and the tied embedding";
  }
  bool requested(const FeatureContext& ctx) const override {
    return !ctx.args->training.quant_states.empty() || ctx.args->training.quant_grads;
  }
  Status validate(const FeatureContext& ctx) const override {
    const Arguments& a = *ctx.args;
    const TrainingArgs& t = a.training;
    if (!t.quant_states.empty()) GALE_RETURN_IF_ERROR(validate_quant_states(a));
    if (t.quant_grads) GALE_RETURN_IF_ERROR(validate_quant_grads(a));
    return Status::Ok();
  }

 private:
  static Status validate_quant_states(const Arguments& a) {
    const TrainingArgs& t = a.training;
    if (t.quant_states != "fp8" && t.quant_states != "mxfp8" && t.quant_states != "hif8")
      return InvalidArgument("--quant-states: expected fp8, hif8 or mxfp8, found '", t.quant_states, "'");
    if (t.optimizer != "adam")
      return InvalidArgument("--quant-states ", t.quant_states,
                             ": quantises AdamW's moments, needs --optimizer adam, found --optimizer ", t.optimizer);
    if (t.swap_optimizer)
      return InvalidArgument("--quant-states ", t.quant_states,
                             ": conflicts with --swap-optimizer (the swapped state is f32); use one of them");
    if (t.optimizer_selection == "fused_ema_adamw")
      return Unimplemented("--quant-states ", t.quant_states,
                           " with --optimizer-selection fused_ema_adamw: not supported yet (the fused EMA kernel "
                           "reads f32 moments)");
    if (a.parallel.zero3() || a.parallel.zero2())
      return Unimplemented("--quant-states with ZeRO-2/3 (", zero_flag(a), "): not supported yet (use "
                           "--use-distributed-optimizer)");
    return Status::Ok();
  }

  static std::string zero_flag(const Arguments& a) {
    if (a.parallel.layerzero) return "--layerzero";
    return "--data-parallel-sharding-strategy " + a.parallel.data_parallel_sharding_strategy;
  }

  static Status validate_quant_grads(const Arguments& a) {
    const TrainingArgs& t = a.training;
    const ParallelArgs& p = a.parallel;
    // MindSpeed builds its quantised AdamW whenever --quant-grads is on (it reads the FP16 gradients).
    if (t.optimizer != "adam")
      return InvalidArgument("--quant-grads: MindSpeed's FP16 main gradients feed its AdamW, needs --optimizer adam, "
                             "found --optimizer ", t.optimizer);
    if (t.swap_optimizer)
      return InvalidArgument("--quant-grads: conflicts with --swap-optimizer (MindSpeed's rule); use one of them");
    if (p.zero3() || p.zero2())
      return Unimplemented("--quant-grads with ZeRO-2/3 (", zero_flag(a), "): not supported yet (use "
                           "--use-distributed-optimizer)");
    if (p.overlap_grad_reduce)
      return Unimplemented("--quant-grads with --overlap-grad-reduce: not supported yet (the FP16 gradients are "
                           "aligned and reduced after the backward); drop --overlap-grad-reduce");
    if (p.expert_model_parallel_size > 1)
      return Unimplemented("--quant-grads with --expert-model-parallel-size ", p.expert_model_parallel_size,
                           ": not supported yet (expert gradients are reduced over a second data-parallel group); "
                           "expected --expert-model-parallel-size 1");
    if (p.num_distributed_optimizer_instances > 1)
      return Unimplemented("--quant-grads with --num-distributed-optimizer-instances ",
                           p.num_distributed_optimizer_instances, ": not supported yet; expected 1");
    if (p.dualpipev_dw_detach)
      return Unimplemented("--quant-grads with --dualpipev-dw-detach: not supported yet (the detached weight "
                           "gradients arrive after the FP16 accumulation hooks)");
    return Status::Ok();
  }
};

}  // namespace

void register_feature_low_precision_optimizer(FeatureRegistry& registry) {
  registry.add(std::make_unique<LowPrecisionOptimizer>());
}

}  // namespace gale
