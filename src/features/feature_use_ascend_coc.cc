// MindSpeed's --use-ascend-coc (CoCFeature, L2) and Megatron's --tp-comm-overlap: chunked TP compute-over-communication.
//
// Each tensor-parallel linear's GEMM and its collective are cut into --coc-parallel-num row chunks
// so the collective of one chunk overlaps the GEMM of another (parallel/coc.h, model/tp_linear.h):
// under sequence parallelism the column-parallel all-gather + GEMM and the row-parallel GEMM +
// reduce-scatter, without it the row-parallel GEMM + all-reduce, and in backward the matching pairs
// (input gradient + reduce-scatter / all-reduce, all-gather + input gradient; the weight gradient
// over the whole rows while the last chunks travel). The feature sets OpTable::tp_comm_chunks.
//
// Flags as MindSpeed's: --coc-parallel-num 1|2|4|8 (default 1), --coc-mode -1|0|1|2 (default -1:
// 2 when the chunk count is above 1, else 0). Modes 0 (Megatron's original mappings) and 1
// (MindSpeed's rewritten, unchunked ones) compute the same thing on a CPU: Gale's plain mappings;
// mode 2 is the chunked pipeline (with 1 chunk, the plain path again). --coc-fused-kernel (Ascend
// LCAL fused matmul-collective kernels) is refused. MindSpeed's rules: at TP 1 the feature does
// nothing (reported inactive here); it conflicts with LoRA (MindSpeed-LLM's CoC check: Gale's
// chunked path does not carry the adapters' branch).
//
// Megatron's --tp-comm-overlap (Transformer Engine userbuffers) runs the same chunked path, with
// Megatron's requirements (--sequence-parallel, TP > 1), with --coc-parallel-num chunks when that is
// above 1, else 4 (Transformer Engine's pipelined overlap's default split). Its userbuffer settings
// stay refused (train/arguments_megatron_compat.cc). Tests: tests/features/coc_feature_test.cc,
// tests/parallel/coc_mpi_test.cc, tests/parallel/coc_invariance_mpi_test.cc.
#include "features/registry.h"

namespace gale {

namespace {

constexpr int kTpCommOverlapDefaultChunks = 4;

class CocFeature : public Feature {
 public:
  std::string name() const override { return "use-ascend-coc"; }
  std::string flag() const override { return "--use-ascend-coc"; }
  FeatureModule module() const override { return FeatureModule::kFusedCompute; }
  int level() const override { return 2; }
  std::string counterpart() const override {
    return "MindSpeed CoCFeature (L2); Megatron --tp-comm-overlap (Transformer Engine userbuffers)";
  }
  std::string description() const override {
    return "chunked TP compute-over-communication: each TP linear's GEMM and all-gather / reduce-scatter / "
           "all-reduce cut into --coc-parallel-num (1, 2, 4 or 8) row chunks, one chunk's collective overlapping "
           "another's GEMM, forward and backward; --coc-mode -1 to 2; --tp-comm-overlap runs it too (needs "
           "--sequence-parallel); --coc-fused-kernel refused; conflicts with LoRA";
  }
  void register_args(ArgParser& parser) override {
    parser.add_flag("--use-ascend-coc", &use_coc_,
                    "MindSpeed: chunk each TP linear's GEMM and its collective so they overlap (--coc-parallel-num "
                    "chunks)");
    parser.add("--coc-parallel-num", &parallel_num_,
               "MindSpeed: row chunks per TP linear under --use-ascend-coc: 1, 2, 4 or 8 (default 1: unchunked)");
    parser.add("--coc-mode", &mode_,
               "MindSpeed: -1 (default: 2 with more than one chunk, else 0), 0 original / 1 rewritten mappings "
               "(both Gale's plain mappings on a CPU), 2 chunked");
    parser.add_rejected("--coc-fused-kernel",
                        "not supported (Ascend LCAL fused matmul-collective kernels; --use-ascend-coc runs the "
                        "chunked path without it)");
    parser.add_flag("--tp-comm-overlap", &tp_comm_overlap_,
                    "Megatron: overlap TP communication with GEMMs; runs Gale's chunked path (--coc-parallel-num "
                    "chunks if above 1, else 4); needs --sequence-parallel");
  }
  bool requested(const FeatureContext& ctx) const override { return use_coc_ || tp_comm_overlap_; }
  std::string not_requested_reason(const FeatureContext& ctx) const override {
    return "not requested (--use-ascend-coc or --tp-comm-overlap)";
  }
  Status validate(const FeatureContext& ctx) const override {
    if (parallel_num_ != 1 && parallel_num_ != 2 && parallel_num_ != 4 && parallel_num_ != 8)
      return InvalidArgument("--coc-parallel-num: expected 1, 2, 4 or 8 (as MindSpeed), found ", parallel_num_);
    if (mode_ < -1 || mode_ > 2)
      return InvalidArgument("--coc-mode: expected -1, 0 (original), 1 (rewrite) or 2 (chunked), found ", mode_);
    const ParallelArgs& p = ctx.args->parallel;
    if (tp_comm_overlap_ && (!p.sequence_parallel || p.tensor_model_parallel_size <= 1))
      return InvalidArgument("--tp-comm-overlap: needs --sequence-parallel and --tensor-model-parallel-size > 1 "
                             "(as Megatron), found sequence parallelism ",
                             p.sequence_parallel ? "on" : "off", " at TP ", p.tensor_model_parallel_size);
    if (ctx.args->lora.enabled())
      return InvalidArgument(requesting_flag(), ": conflicts with --lora-target-modules (as MindSpeed-LLM: the "
                                                "chunked TP linears do not carry the LoRA branch)");
    return Status::Ok();
  }
  bool applicable(const FeatureContext& ctx, std::string* why) const override {
    if (ctx.args->parallel.tensor_model_parallel_size <= 1) {
      *why = "does nothing at --tensor-model-parallel-size 1 (no TP collective to overlap; MindSpeed runs mode 0)";
      return false;
    }
    return true;
  }
  Status apply(const FeatureContext& ctx, EngineSetup& setup) const override {
    setup.ops->tp_comm_chunks = chunks();
    setup.ops->impl["tp-comm"] =
        chunks() > 1 ? str_cat("chunked (", chunks(), " chunks)") : std::string("plain (coc mode 0/1 or 1 chunk)");
    return Status::Ok();
  }

 private:
  const char* requesting_flag() const { return use_coc_ ? "--use-ascend-coc" : "--tp-comm-overlap"; }
  // MindSpeed's resolution: mode -1 is 2 with more than one chunk, else 0; modes 0 and 1 never chunk.
  int chunks() const {
    if (!use_coc_) return parallel_num_ > 1 ? parallel_num_ : kTpCommOverlapDefaultChunks;  // --tp-comm-overlap
    const int mode = mode_ == -1 ? (parallel_num_ > 1 ? 2 : 0) : mode_;
    return mode == 2 ? parallel_num_ : 1;
  }

  bool use_coc_ = false;
  bool tp_comm_overlap_ = false;
  int parallel_num_ = 1;
  int mode_ = -1;
};

}  // namespace

void register_feature_use_ascend_coc(FeatureRegistry& registry) { registry.add(std::make_unique<CocFeature>()); }

}  // namespace gale
