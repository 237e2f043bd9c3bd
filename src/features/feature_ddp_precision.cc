// Megatron's DDP precision flags and --create-all-gather-group (Megatron, level 0) in the registry.
//
// --ddp-reduce-scatter-with-fp32-accumulation: with the distributed optimizer, every bucket's
// reduce-scatter is an all-to-all of the gradient buffer's values (bf16 with --grad-reduce-in-bf16 /
// --main-grads-dtype bf16 under --bf16) followed by a local f32 sum in rank order, rounded once
// (comm/reduce_scatter_fp32_accumulation.h). Megatron's rules (megatron/training/arguments.py,
// megatron/core/distributed/param_and_grad_buffer.py): turned off with a warning when the gradients
// already accumulate and reduce in fp32 (--accumulate-allreduce-grads-in-fp32, Megatron's default
// under --bf16 without bf16 reduction); not with --num-distributed-optimizer-instances > 1; only one
// bucket per bucket group (Gale's bucket groups always hold one bucket); without the distributed
// optimizer the gradients are all-reduced and it changes nothing. Gale's own limits: not with
// --quant-grads (its store reduces the gradients) or ZeRO-2/3 (no buckets).
//
// --ddp-param-name-patterns-for-fp32-local-accumulation P...: the parameters whose Gale
// (Megatron-Core) name matches one of the fnmatch patterns, or all with 'all', accumulate their
// gradients across micro-batches in f32 although the buffer is bf16; the sum is rounded to bf16 once
// when the bucket's reduction starts (DataParallelConfig::fp32_local_accumulation). Megatron's rule:
// not when the gradients already accumulate in fp32. Without --bf16 Gale's (and Megatron's fp32)
// buffer is f32 already and the patterns change nothing.
//
// --create-all-gather-group: a duplicate of the dp-cp group (and of the expert-dp group with expert
// parallelism) carries the distributed optimizer's parameter all-gathers
// (DataParallelConfig::all_gather_group). Megatron main creates these groups for its
// Megatron-FSDP's parameter all-gathers; Gale uses them for the distributed optimizer's
// (bit-identical results). Not with ZeRO-2/3 (not supported yet: Zero3Sync gathers on its group).
//
// Tests: tests/comm/reduce_scatter_fp32_accumulation_mpi_test.cc (exact sums, fixed order, against a
// bf16 ring), tests/optim/ddp_precision_mpi_test.cc (buckets, fp32 local accumulation, the all-gather
// group, DP2 training), tests/features/ddp_precision_feature_test.cc (the rules).
#include "features/registry.h"
#include "train/ddp_precision.h"

namespace gale {

namespace {

std::string zero_flag(const Arguments& a) {
  if (a.parallel.layerzero) return "--layerzero";
  if (a.parallel.use_torch_fsdp2) return "--use-torch-fsdp2";
  return "--data-parallel-sharding-strategy " + a.parallel.data_parallel_sharding_strategy;
}

class ReduceScatterWithFp32Accumulation : public Feature {
 public:
  std::string name() const override { return "ddp-reduce-scatter-with-fp32-accumulation"; }
  std::string flag() const override { return "--ddp-reduce-scatter-with-fp32-accumulation"; }
  FeatureModule module() const override { return FeatureModule::kMegatron; }
  int level() const override { return 0; }
  std::string counterpart() const override { return "Megatron reduce_scatter_with_fp32_accumulation"; }
  std::string description() const override {
    return "the distributed optimizer's gradient reduce-scatter as an all-to-all of the (bf16) buffer values and a "
           "local fp32 sum in rank order, rounded once";
  }
  bool requested(const FeatureContext& ctx) const override {
    return ctx.args->parallel.ddp_reduce_scatter_with_fp32_accumulation;
  }
  Status validate(const FeatureContext& ctx) const override {
    const Arguments& a = *ctx.args;
    if (!reduce_scatter_with_fp32_accumulation(a)) return Status::Ok();  // turned off: applicable() says so
    const ParallelArgs& p = a.parallel;
    if (p.num_distributed_optimizer_instances > 1)
      return InvalidArgument("--ddp-reduce-scatter-with-fp32-accumulation: not supported with "
                             "--num-distributed-optimizer-instances > 1 (Megatron's rule), found ",
                             p.num_distributed_optimizer_instances);
    if (a.training.quant_grads)
      return InvalidArgument("--ddp-reduce-scatter-with-fp32-accumulation: conflicts with --quant-grads (its FP16 "
                             "gradient store does the reduction); use one of them");
    if (p.zero2() || p.zero3())
      return Unimplemented("--ddp-reduce-scatter-with-fp32-accumulation with ZeRO-2/3 (", zero_flag(a),
                           "): not supported yet (expected --use-distributed-optimizer)");
    return Status::Ok();
  }
  bool applicable(const FeatureContext& ctx, std::string* why) const override {
    const Arguments& a = *ctx.args;
    if (accumulates_grads_in_fp32(a)) {  // Megatron's warning, and the flag is off
      *why = "Setting args.ddp_reduce_scatter_with_fp32_accumulation to False since "
             "--accumulate-allreduce-grads-in-fp32 already reduces in fp32";
      return false;
    }
    if (!a.parallel.use_distributed_optimizer) {
      *why = "without --use-distributed-optimizer the gradients are all-reduced (Megatron's rule)";
      return false;
    }
    return true;
  }
};

class Fp32LocalAccumulation : public Feature {
 public:
  std::string name() const override { return "ddp-param-name-patterns-for-fp32-local-accumulation"; }
  std::string flag() const override { return "--ddp-param-name-patterns-for-fp32-local-accumulation"; }
  FeatureModule module() const override { return FeatureModule::kMegatron; }
  int level() const override { return 0; }
  std::string counterpart() const override { return "Megatron param_name_patterns_for_fp32_local_accumulation"; }
  std::string description() const override {
    return "the gradients of the parameters whose name matches an fnmatch pattern ('all': every one) accumulate "
           "across micro-batches in fp32 with a bf16 gradient buffer, rounded once before the reduction";
  }
  bool requested(const FeatureContext& ctx) const override {
    return !ctx.args->parallel.ddp_param_name_patterns_for_fp32_local_accumulation.empty();
  }
  Status validate(const FeatureContext& ctx) const override {
    const Arguments& a = *ctx.args;
    if (accumulates_grads_in_fp32(a))
      return InvalidArgument("--ddp-param-name-patterns-for-fp32-local-accumulation: Only need to explicitly "
                             "specify param_name patterns for FP32 local accumulation if .main_grads aren't already "
                             "in FP32 (Megatron's rule); found the gradients accumulated in fp32 (",
                             a.training.bf16 ? "--bf16 without --grad-reduce-in-bf16 or --main-grads-dtype bf16"
                                             : "--accumulate-allreduce-grads-in-fp32",
                             ")");
    for (const std::string& pattern : a.parallel.ddp_param_name_patterns_for_fp32_local_accumulation)
      if (pattern.empty())
        return InvalidArgument("--ddp-param-name-patterns-for-fp32-local-accumulation: expected fnmatch patterns "
                               "or 'all', found an empty one");
    return Status::Ok();
  }
  bool applicable(const FeatureContext& ctx, std::string* why) const override {
    if (!ctx.args->training.bf16_grad_reduce()) {
      *why = "the gradient buffer is fp32 without --bf16 and bf16 gradient reduction: nothing to promote";
      return false;
    }
    return true;
  }
};

class CreateAllGatherGroup : public Feature {
 public:
  std::string name() const override { return "create-all-gather-group"; }
  std::string flag() const override { return "--create-all-gather-group"; }
  FeatureModule module() const override { return FeatureModule::kMegatron; }
  int level() const override { return 0; }
  std::string counterpart() const override { return "Megatron create_all_gather_groups (dp_cp_ag, expt_dp_ag)"; }
  std::string description() const override {
    return "a duplicate of the dp-cp (and expert-dp) group for the distributed optimizer's parameter all-gathers, "
           "so they overlap the gradient reduce-scatters; bit-identical results";
  }
  bool requested(const FeatureContext& ctx) const override { return ctx.args->parallel.create_all_gather_group; }
  Status validate(const FeatureContext& ctx) const override {
    const Arguments& a = *ctx.args;
    if (a.parallel.zero2() || a.parallel.zero3())
      return Unimplemented("--create-all-gather-group with ZeRO-2/3 (", zero_flag(a),
                           "): not supported yet (their parameter all-gathers stay on the data-parallel group)");
    return Status::Ok();
  }
  bool applicable(const FeatureContext& ctx, std::string* why) const override {
    const Arguments& a = *ctx.args;
    const bool emerging = a.training.optimizer == "muon" || a.training.optimizer == "lion";
    if (!a.parallel.use_distributed_optimizer || emerging) {
      *why = "no group is created: only the element-wise distributed optimizer (--use-distributed-optimizer, not "
             "with muon or lion) all-gathers parameter buckets";
      return false;
    }
    return true;
  }
};

}  // namespace

void register_feature_ddp_precision(FeatureRegistry& registry) {
  registry.add(std::make_unique<ReduceScatterWithFp32Accumulation>());
  registry.add(std::make_unique<Fp32LocalAccumulation>());
  registry.add(std::make_unique<CreateAllGatherGroup>());
}

}  // namespace gale
