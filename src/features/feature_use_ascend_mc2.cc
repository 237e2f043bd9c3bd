// MindSpeed's --use-ascend-mc2 (MC2Feature, L2): the TP linears' fused matmul + collective, with the column-parallel input gathered again in backward.
//
// MindSpeed replaces Megatron's column- and row-parallel linears under sequence parallelism by
// ones built on Ascend's fused MC2 kernels (npu_all_gather_base_mm, npu_mm_reduce_scatter_base):
// each kernel cuts its GEMM and its collective into pieces that pipeline, and the column-parallel
// linear keeps only this rank's input rows for backward (all-gather recomputation), gathering
// them again there while the input gradient multiplies, then reduce-scattering that gradient
// while the weight gradient multiplies. Gale runs the same dataflow on its own pieces: the
// pipelined all-gather + GEMM and GEMM + reduce-scatter of the chunked TP path (parallel/coc.h)
// in kMc2PipelineChunks row chunks (the fused kernel's internal split is not specified; two is the
// fewest that overlap), and model/tp_linear.h's re-gathering column backward
// (OpTable::tp_regather_input). The saving: each layer keeps norm1's and norm2's outputs as
// [Tl, H] instead of [T, H] (T = Tl·TP rows), at the cost of one more all-gather of them per
// backward. Results: the re-gathering backward is the same GEMMs on the same values as the plain
// one; the chunked forward rounds like --use-ascend-coc (1e-5 relative on AVX2, bit for bit where
// the GEMM is row-split exact).
//
// MindSpeed's rules: TP > 1 and --sequence-parallel are required (its assertion; an error here
// too, not a silent no-op), and --use-ascend-coc conflicts (so does Megatron's --tp-comm-overlap,
// which runs the same chunked path here). It refuses --unaligned-linear, and its docs exclude MoE
// models. Gale also refuses MLA (its projections gather their inputs themselves, model/
// mla_attention.h) and LoRA (the adapters' branch is not carried, as with CoC). Tests:
// tests/features/mc2_feature_test.cc, tests/parallel/coc_mpi_test.cc (the re-gathering linear),
// tests/parallel/coc_invariance_mpi_test.cc (training layouts).
#include "features/registry.h"

namespace gale {

namespace {

constexpr int kMc2PipelineChunks = 2;

class Mc2Feature : public Feature {
 public:
  std::string name() const override { return "use-ascend-mc2"; }
  std::string flag() const override { return "--use-ascend-mc2"; }
  FeatureModule module() const override { return FeatureModule::kFusedCompute; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed MC2Feature (L2)"; }
  std::string description() const override {
    return "MC2 TP linears under sequence parallelism: all-gather + GEMM and GEMM + reduce-scatter pipelined in 2 "
           "row chunks; column-parallel inputs kept as this rank's rows and gathered again in backward (the norms' "
           "outputs [Tl, H] instead of [T, H]); needs TP > 1 and --sequence-parallel; conflicts with "
           "--use-ascend-coc, --tp-comm-overlap, --unaligned-linear, MoE, MLA, LoRA";
  }
  void register_args(ArgParser& parser) override {
    parser.add_flag("--use-ascend-mc2", &on_,
                    "MindSpeed: MC2 TP linears (pipelined matmul + collective; column-parallel inputs gathered again in "
                    "backward); needs TP > 1 and --sequence-parallel");
  }
  bool requested(const FeatureContext& ctx) const override { return on_; }
  Status validate(const FeatureContext& ctx) const override {
    const Arguments& a = *ctx.args;
    const ParallelArgs& p = a.parallel;
    if (!p.sequence_parallel || p.tensor_model_parallel_size <= 1)
      return InvalidArgument("--use-ascend-mc2: needs --tensor-model-parallel-size > 1 and --sequence-parallel (as "
                             "MindSpeed), found TP ", p.tensor_model_parallel_size, " with sequence parallelism ",
                             p.sequence_parallel ? "on" : "off");
    for (const char* other : {"--use-ascend-coc", "--tp-comm-overlap"})
      if (ctx.parser->was_set(other))
        return InvalidArgument("--use-ascend-mc2: conflicts with ", other,
                               " (as MindSpeed: both replace the TP linears' communication)");
    if (p.unaligned_linear)
      return InvalidArgument("--use-ascend-mc2: conflicts with --unaligned-linear (as MindSpeed)");
    if (a.moe.enabled())
      return InvalidArgument("--use-ascend-mc2: not supported with MoE (--num-experts ", a.moe.num_experts,
                             "; MindSpeed's MC2 excludes MoE models)");
    if (a.model.multi_latent_attention)
      return InvalidArgument("--use-ascend-mc2: not supported with --multi-latent-attention (its projections gather "
                             "their inputs themselves)");
    if (a.lora.enabled())
      return InvalidArgument("--use-ascend-mc2: conflicts with --lora-target-modules (the MC2 linears do not carry "
                             "the LoRA branch)");
    return Status::Ok();
  }
  Status apply(const FeatureContext& ctx, EngineSetup& setup) const override {
    setup.ops->tp_comm_chunks = kMc2PipelineChunks;
    setup.ops->tp_regather_input = true;
    setup.ops->impl["tp-comm"] =
        str_cat("mc2 (", kMc2PipelineChunks, " chunks; column-parallel inputs gathered again in backward)");
    return Status::Ok();
  }

 private:
  bool on_ = false;
};

}  // namespace

void register_feature_use_ascend_mc2(FeatureRegistry& registry) { registry.add(std::make_unique<Mc2Feature>()); }

}  // namespace gale
