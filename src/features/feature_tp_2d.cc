// MindSpeed's 2-D tensor parallelism (--tp-2d --tp-x X --tp-y Y, TP2dFeature) in the feature registry.
//
// What: the TP group of X·Y ranks is an X×Y grid (parallel/tp2d_groups.h: TP rank r at x = r mod X,
// y = r / X, as MindSpeed's consecutive tp-x groups). Between and inside the transformer layers
// each rank holds a [T/X, H/Y] piece of the activations; linear_qkv / linear_fc1 are MindSpeed's
// column form of ParallelLinear2D (all-gather rows over X, GEMM with the [out/X, H/Y] weight
// block, reduce-scatter rows over Y) and linear_proj / linear_fc2 its row form (Y and X swapped);
// LayerNorm / RMSNorm all-reduce their row statistics over Y; attention trades the Y row split
// for a head split with an all-to-all over Y (MindSpeed's Ulysses over tp-y) and runs
// NH/(X·Y) heads on all positions (model/tp2d_layer.h, tp2d_linear.h, tp2d_norm.h,
// parallel/tp2d_mappings.h). Communication stays in the X and Y groups. The embedding and the
// output layer / loss keep the 1-D vocabulary-parallel path over the whole TP group: the
// embedding's output is cut into the piece, and the last layer's pieces are gathered before the
// final norm. Weights are stored as 2-D blocks of the global tensors (ParamSpec::split2_*), so
// checkpoints hold global tensors and a TP2D checkpoint loads at TP 1 and back; norm weights and
// all biases stay whole on every TP rank with their gradients summed over TP.
//
// Differences from MindSpeed: level 0 (which ranks hold what must not depend on
// --optimization-level); the final norm runs on the gathered rows (MindSpeed runs it 2-D and
// gathers after); LayerNorm's variance is two-pass (MindSpeed: E[x²] − E[x]²); MindSpeed's
// overlap flags (--enable-overlap-ag-with-matmul, --enable-overlap-matmul-with-rs,
// --enable-backward-overlap-ag-with-matmul) are accepted and refused (--coc-fused-kernel is refused
// by --use-ascend-coc's feature).
// Refused (train/arguments_tp2d.cc and validate() below): --sequence-parallel, MoE,
// --use-fused-rmsnorm, --use-ascend-coc / --tp-comm-overlap, DualPipeV, hybrid_cp_algo (as
// MindSpeed); and, not implemented in Gale's 2-D path, MLA, LoRA, --unaligned-linear, MTP,
// --embed-layernorm, --recompute-norm, --recompute-activation-function, --recompute-modules other
// than core_attn, --distribute-saved-activations, --optimizer muon, --variable-seq-lengths. Data and
// pipeline parallelism (1F1B, interleaved), context parallelism (megatron_cp_algo ring or
// all-gather, ulysses_cp_algo: attention on this rank's heads over the cp group, as at 1-D TP), the
// distributed optimizer, full recomputation and --qk-layernorm work with it.
// Tests: tests/parallel/tp2d_mpi_test.cc (groups, mappings, linears and norms against plain math,
// 2 and 4 ranks), tests/parallel/tp2d_invariance_mpi_test.cc (2x1, 1x2, 2x2 GPT and LLaMA vs one
// process, with DP 2 + distributed optimizer, PP 2, CP 2, full recomputation; checkpoints 2x2 <-> TP 1),
// tests/cli/tp2d_cli_test.cc (mpirun -np 4 gale pretrain --tp-2d), tests/train/
// arguments_parallel_test.cc and tests/features/tp_2d_feature_test.cc (rules).
#include <array>

#include "features/registry.h"

namespace gale {

namespace {

class Tp2dFeature : public Feature {
 public:
  std::string name() const override { return "tp-2d"; }
  std::string flag() const override { return "--tp-2d"; }
  FeatureModule module() const override { return FeatureModule::kParallel; }
  int level() const override { return 0; }
  std::string counterpart() const override { return "MindSpeed TP2dFeature (L2)"; }
  std::string description() const override {
    return "--tp-2d --tp-x X --tp-y Y: 2-D tensor parallelism over an X x Y grid of the TP ranks "
           "(X x Y = TP): [T/X, H/Y] activation pieces, 2-D linear weight blocks, norms all-reduced over Y, "
           "attention heads split over X x Y; no SP, MoE, fused RMSNorm, CoC, DualPipeV or hybrid CP";
  }
  void register_args(ArgParser& parser) override {
    for (size_t i = 0; i < kOverlapFlags.size(); ++i)
      parser.add_flag(kOverlapFlags[i], &overlap_[i], "--tp-2d communication overlap (MindSpeed); not supported");
  }
  bool requested(const FeatureContext& ctx) const override { return ctx.args->parallel.tp_2d; }
  Status validate(const FeatureContext& ctx) const override {
    for (const char* f : {"--use-fused-rmsnorm", "--use-ascend-coc", "--tp-comm-overlap", "--recompute-norm",
                          "--recompute-activation-function"})
      if (ctx.parser->was_set(f)) return InvalidArgument("--tp-2d does not support ", f);
    for (size_t i = 0; i < kOverlapFlags.size(); ++i)
      if (overlap_[i])
        return InvalidArgument(kOverlapFlags[i], " is not supported: Gale's --tp-2d runs its collectives unoverlapped");
    return Status::Ok();
  }

 private:
  static constexpr std::array<const char*, 3> kOverlapFlags = {
      "--enable-overlap-ag-with-matmul", "--enable-overlap-matmul-with-rs", "--enable-backward-overlap-ag-with-matmul"};
  bool overlap_[3] = {false, false, false};
};

}  // namespace

void register_feature_tp_2d(FeatureRegistry& registry) { registry.add(std::make_unique<Tp2dFeature>()); }

}  // namespace gale
