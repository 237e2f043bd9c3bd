// MindSpeed's --qat-scheme / --qat-quant-block-size (QATQuantEngineFeature, key scenarios, level 2).
//
// What: the transformer layers' linear weights (linear_qkv, linear_proj, linear_fc1, linear_fc2 of
// dense MLPs, routed and shared experts, MLA's five projections; with "-moe-only" the routed
// experts' only) are MX
// fake-quantised in every GEMM that reads them — MXFP4 (E2M1 elements, w4a16-mxfp4) or MXFP8 (E4M3,
// w8a16-mxfp8), one E8M0 power-of-two scale per block of 32 or 128 elements along the input
// dimension, round-to-nearest-even with saturation (kernels/cpu/mx_quant.h). Activations stay as
// they are (a16). Backward is the straight-through estimator: the input gradient uses the
// fake-quantised weight, the weight gradient (dyᵀ·x) goes into the f32 master gradient, and the
// master weights are never changed by quantisation (model/qat.h).
//
// How it differs from MindSpeed: MindSpeed patches Megatron's LinearWithGradAccumulationAndAsync-
// Communication (its column/row-parallel linears, with --transformer-impl local and one of
// --gradient-accumulation-fusion / --sequence-parallel / async all-reduce, else it only warns) and
// uses Ascend's MX quantisation kernels; Gale hooks its one linear-weight accessor, so every layout
// and path (TP, SP, CoC, MC2, experts, recomputation) sees the same fake-quantised weight, and the
// output layer and router stay unquantised. MindSpeed reads --qat-quant-block-size only for its
// w4a8 scheme (its MX schemes use 32); Gale applies it to the MX schemes (default 32).
// MindSpeed's w4a4-mxfp4 and w4a8-moe-only (quantised activations) are not supported yet.
//
// Rules: the block size divides every quantised weight's input dimension on each rank (hidden
// size; heads·kv-channels / TP for linear_proj; ffn / TP for linear_fc2; the expert and shared
// expert ffn over their TP; with MLA its latent ranks and heads·v-head-dim / TP; under
// --unaligned-linear every rank's uneven share); -moe-only needs --num-experts; --fp16, LoRA and
// --tp-2d are not supported yet.
//
// Tests: tests/kernels/mx_quant_test.cc (kernels vs the numpy fixture), tests/model/qat_test.cc
// (STE gradient, training per scheme, -moe-only leaves dense layers alone, bf16, recomputation),
// tests/parallel/qat_mpi_test.cc (TP2 = TP1), tests/features/qat_feature_test.cc (rules).
#include "features/registry.h"
#include "model/qat.h"
#include "parallel/tp_share.h"

namespace gale {

namespace {

class QatFeature : public Feature {
 public:
  std::string name() const override { return "qat"; }
  std::string flag() const override { return "--qat-scheme"; }
  FeatureModule module() const override { return FeatureModule::kKeyScenarios; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed QATQuantEngineFeature (L2)"; }
  std::string description() const override {
    return "quantisation-aware training: the transformer layers' linear weights MX fake-quantised in their GEMMs "
           "(w4a16-mxfp4: E2M1, w8a16-mxfp8: E4M3; E8M0 scale per --qat-quant-block-size (32 or 128) elements along the "
           "input dimension; -moe-only: routed experts only), straight-through gradients into the f32 masters";
  }
  bool requested(const FeatureContext& ctx) const override { return !ctx.args->model.qat_scheme.empty(); }
  Status validate(const FeatureContext& ctx) const override {
    const Arguments& a = *ctx.args;
    const ModelArgs& m = a.model;
    StatusOr<QatConfig> qat = parse_qat_scheme(m.qat_scheme, m.qat_quant_block_size);
    GALE_RETURN_IF_ERROR(qat.status());
    const QatConfig& c = qat.value();
    const std::string scheme = "--qat-scheme " + m.qat_scheme;
    if (a.training.fp16) return InvalidArgument(scheme, " with --fp16: not supported yet (use --bf16 or f32)");
    if (a.lora.enabled()) return InvalidArgument(scheme, " with --lora-target-modules (LoRA): not supported yet");
    if (a.parallel.tp_2d) return InvalidArgument(scheme, " with --tp-2d: not supported yet");
    const bool moe = a.moe.enabled();
    if (c.moe_only && !moe)
      return InvalidArgument(scheme, " quantises only the routed experts' weights: it needs a MoE model "
                             "(--num-experts), found none");
    // The input dimension of every quantised weight on each rank, with the flags that make it:
    // `units` whole units of `width` columns dealt out to `parts` ranks (parallel/tp_share.h: evenly,
    // or under --unaligned-linear one more to each of the first ranks).
    const int64_t tp = a.parallel.tensor_model_parallel_size;
    bool dense_mlp = !moe;
    for (int layer : a.moe.layer_pattern) dense_mlp = dense_mlp || layer == 0;
    struct Input {
      const char* weight;
      int64_t units, width, parts;
      const char* flags;
    };
    std::vector<Input> inputs;
    const bool mla = m.multi_latent_attention;
    inputs.push_back({mla ? "linear_q_proj / linear_q_down_proj / linear_kv_down_proj / linear_fc1"
                          : "linear_qkv / linear_fc1",
                      m.hidden_size, 1, 1, "--hidden-size"});
    if (!c.moe_only && mla) {
      if (m.q_lora_rank > 0) inputs.push_back({"linear_q_up_proj", m.q_lora_rank, 1, 1, "--q-lora-rank"});
      inputs.push_back({"linear_kv_up_proj", m.kv_lora_rank, 1, 1, "--kv-lora-rank"});
      inputs.push_back({"linear_proj", m.num_attention_heads, m.v_head_dim, tp,
                        "--num-attention-heads x --v-head-dim / --tensor-model-parallel-size"});
    } else if (!c.moe_only) {
      const int64_t groups = m.num_kv_heads > 0 ? m.num_kv_heads : m.num_attention_heads;
      const int64_t group_width = groups > 0 ? m.num_attention_heads / groups * m.kv_channels : 0;
      inputs.push_back({"linear_proj", groups, group_width, tp,
                        "--num-attention-heads x --kv-channels / --tensor-model-parallel-size"});
    }
    if (!c.moe_only) {
      if (dense_mlp)
        inputs.push_back({"linear_fc2", m.ffn_hidden_size, 1, tp, "--ffn-hidden-size / --tensor-model-parallel-size"});
      if (moe && a.moe.moe_shared_expert_intermediate_size > 0)
        inputs.push_back({"the shared experts' linear_fc2", a.moe.moe_shared_expert_intermediate_size, 1, tp,
                          "--moe-shared-expert-intermediate-size / --tensor-model-parallel-size"});
    }
    if (moe)
      inputs.push_back({"the experts' linear_fc2", a.moe.moe_ffn_hidden_size, 1, a.moe.expert_tensor_parallel_size,
                        "--moe-ffn-hidden-size / --expert-tensor-parallel-size"});
    for (const Input& in : inputs) {
      if (in.units <= 0 || in.width <= 0 || in.parts <= 0) continue;  // not derived yet (pretrain validates first)
      for (int64_t r = 0; r < in.parts; ++r) {
        const int64_t local = tp_share(in.units, in.parts, r).count * in.width;
        if (local % c.block != 0)
          return InvalidArgument("--qat-quant-block-size ", c.block, " must divide the input dimension of ", in.weight,
                                 " on each rank (", in.flags, " = ", local,
                                 in.units % in.parts != 0 ? " on rank " + std::to_string(r) : std::string(),
                                 ") for ", scheme);
      }
    }
    return Status::Ok();
  }
};

}  // namespace

void register_feature_qat(FeatureRegistry& registry) { registry.add(std::make_unique<QatFeature>()); }

}  // namespace gale
