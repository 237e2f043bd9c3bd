// Megatron-Core's --experimental-attention-variant in the registry: dsa (MindSpeed's DeepSeekSparseAttention)
// and gdn (Gated DeltaNet linear attention).
//
// What: DeepSeek-V3.2's sparse attention on multi-latent attention. Each MLA layer gets a lightning
// indexer (--dsa-indexer-n-heads small heads of --dsa-indexer-head-dim) scoring every visible key for
// every query, I(i, j) = Σ_h w_h(i)·ReLU(q_h(i)·k(j)); each query keeps its --dsa-indexer-topk best
// keys and MLA attends only to those. The indexer learns from a KL loss (--dsa-indexer-loss-coeff,
// optionally over the selected keys only: --dsa-indexer-use-sparse-loss) against the main attention's
// head-summed distribution, with the indexer's inputs detached from the model; the loss is logged
// as "indexer loss" (averaged over the DSA layers, as Megatron). With top-k ≥ the sequence length DSA
// is dense causal MLA. model/dsa_indexer.h has the math, kernels/cpu/dsa.h the kernels.
// --use-fused-sparse-flash-attention swaps the reference sparse attention kernels (level 0) for the
// fused ones (per-row gathered keys, online softmax, vectorised).
//
// How it differs from MindSpeed: MindSpeed accepts its four fusion flags only all together
// (--use-dsa-absorb with the NPU's fused lightning indexer, sparse flash attention and KL-loss
// operators); Gale has a CPU fused sparse attention only, so --use-fused-sparse-flash-attention stands
// alone and --use-dsa-absorb, --use-fused-lightning-indexer and --use-fused-lightning-indexer-kl-loss
// are refused as not supported yet. As MindSpeed, --qk-layernorm is required.
//
// Rules: needs --multi-latent-attention and --qk-layernorm; --dsa-indexer-head-dim ≥
// --qk-pos-emb-head-dim; refused (not supported yet): tensor (and so sequence and 2-D tensor) and
// context parallelism, --attention-dropout > 0, --mtp-num-layers.
// gale generate and evaluate run a DSA checkpoint (its args: --use-checkpoint-args): the KV cache
// keeps each layer's indexer keys and a decode step picks each new query's top-k among all cached
// positions (model/dsa_indexer.h dsa_indexer_decode); the batched engine (--prompts-file, dynamic
// batching) keeps each request's indexer keys in its blocks and selects among its own positions
// (dsa_indexer_ragged); --flash-decode is refused. gale convert reads and writes Hugging Face's
// DeepseekV32ForCausalLM (train/hf_deepseek_v32.h) and Megatron's formats (the indexer under
// core_attention, train/megatron_mla_names.h); a DSA model's MTP layers are refused there.
//
// gdn (Megatron's deprecated spelling gated_delta_net accepted): Qwen3-Next's Gated DeltaNet replaces
// self-attention in the layers --linear-attention-freq selects (an int N: every N-th layer keeps full
// attention; or a 0/1 list), sizes --linear-conv-kernel-dim, --linear-key-head-dim,
// --linear-value-head-dim, --linear-num-key-heads, --linear-num-value-heads (Megatron's defaults 4,
// 128, 128, 16, 32); model/gated_delta_net.h has the math (level 0: the reference recurrence).
// Tensor and sequence parallelism split the mixer by heads as Megatron's GatedDeltaNet
// (--linear-num-key-heads and --linear-num-value-heads multiples of the TP size).
// Context parallelism as Megatron-Core's GDN CP (model/gdn_context_parallel.h): an all-to-all gives
// each cp rank whole sequences of 1/CP of each TP rank's heads around the recurrence; TP×CP must
// divide --linear-num-key-heads.
// gale generate, evaluate and the batched engine run a GDN checkpoint (its args: --use-checkpoint-args):
// each sequence's GDN layers keep a decoding state (the convolution's last K−1 inputs and the delta
// rule's state, model/mamba_state.h) as Megatron's ssm_prefill / ssm_decode, its attention layers
// their keys and values.
// Rules: needs --swiglu and --normalization RMSNorm; refused (not supported yet): --tp-2d,
// --multi-latent-attention, --is-hybrid-model (its 'G' layers instead), LoRA on the GDN projections
// (in_proj / out_proj) at TP or CP > 1, --mtp-num-layers, conversion to or from Megatron's formats. gale convert reads and
// writes Hugging Face's Qwen3NextForCausalLM (a Qwen3-Next-shaped GDN model: train/hf_config.h).
// Tests: tests/model/gated_delta_net_test.cc (numpy golden, finite differences, causality, names and
// init), tests/model/gdn_decode_test.cc (cached decoding against whole-sequence forwards),
// tests/train/gdn_inference_test.cc (batched engine, evaluate's loss), tests/parallel/
// gdn_invariance_mpi_test.cc (TP 2 and 4, with and without SP, against one process),
// tests/cli/gdn_cli_test.cc (flags and refusals, gale pretrain: learning, CP 2 and TP 2 × CP 2 against
// their layouts without CP, save/resume, a TP 2
// checkpoint loaded at TP 1; gale generate / evaluate).
//
// gdn2 (Megatron-Core main's GatedDeltaNet2): gdn's layers (or a hybrid model's 'G' layers) with
// channel-wise decay, erase and write gates (model/gated_delta_net.h, GdnDims::gdn2); the same TP, CP,
// decoding and rules as gdn; LoRA on its projections and every conversion refused. Tests:
// tests/model/gated_delta_net2_test.cc, tests/parallel/gdn2_invariance_mpi_test.cc,
// tests/cli/gdn2_cli_test.cc, tests/train/arguments_gdn2_test.cc.
//
// DSA tests: tests/kernels/dsa_kernels_test.cc (top-k, dense equivalence, finite differences, fused vs
// reference, the numpy golden fixture), tests/model/dsa_attention_test.cc (top-k ≥ S equals dense MLA,
// finite differences of the model, indexer loss and its gradient, training), tests/features/dsa_feature_test.cc
// (flags and refusals), tests/model/dsa_decode_test.cc (cached decoding against whole-sequence
// forwards), tests/train/dsa_checkpoint_args_test.cc, tests/cli/dsa_cli_test.cc (gale pretrain:
// learning, the log line, fused, --bf16, two pipeline stages; gale generate / evaluate).
#include "features/registry.h"

namespace gale {

namespace {

class DsaFeature : public Feature {
 public:
  std::string name() const override { return "experimental-attention-variant"; }
  std::string flag() const override { return "--experimental-attention-variant"; }
  FeatureModule module() const override { return FeatureModule::kMegatron; }
  int level() const override { return 0; }
  std::string counterpart() const override {
    return "MindSpeed DeepSeekSparseAttention (dsa); Megatron-Core GatedDeltaNet (gdn) and GatedDeltaNet2 (gdn2)";
  }
  std::string description() const override {
    return "--experimental-attention-variant gdn (or gated_delta_net): Gated DeltaNet linear attention in the "
           "layers --linear-attention-freq selects (--linear-conv-kernel-dim, --linear-key-head-dim, "
           "--linear-value-head-dim, --linear-num-key-heads, --linear-num-value-heads); needs --swiglu and RMSNorm; "
           "TP/SP split the heads; generate/evaluate/batched serving with per-sequence GDN decoding states; "
           "CP as Megatron-Core's (TP×CP divides --linear-num-key-heads); MTP (--mtp-num-layers) when the last "
           "decoder layer is full attention, with speculative decoding (--num-speculative-tokens) rolling the GDN "
           "states back; LoRA (in_proj / out_proj at any TP and CP 1, and the attention and MLP linears); no MLA; "
           "Megatron's torch-format GDN checkpoints load and convert both ways at any TP/PP, and its torch_dist (any "
           "saving TP) and TP 1 torch_dcp ones load and convert to Gale / torch (in_proj / conv1d sections joined); "
           "gale convert imports and exports Hugging Face Qwen3NextForCausalLM; "
           "--experimental-attention-variant gdn2: Gated DeltaNet-2 (channel-wise decay, erase and write gates) in "
           "the same layers or a hybrid model's 'G' layers, with TP/SP, CP and decoding as gdn, Megatron's torch format as "
           "gdn, no Hugging Face conversion or LoRA on its projections (a hybrid model's GDN layers are the 'G' layers of --hybrid-override-pattern, sized by the "
           "same --linear-* flags, recorded in its checkpoint args: CP, generate and evaluate as here). "
           "--experimental-attention-variant dsa: DeepSeek-V3.2 sparse attention on MLA; a lightning indexer "
           "(--dsa-indexer-n-heads, --dsa-indexer-head-dim) picks each query's --dsa-indexer-topk keys, MLA attends "
           "only to them, the indexer learns from a KL loss (--dsa-indexer-loss-coeff, --dsa-indexer-use-sparse-loss) "
           "logged as indexer loss; --use-fused-sparse-flash-attention: fused sparse attention kernels; needs "
           "--multi-latent-attention and --qk-layernorm; generate/evaluate and batched serving with a KV cache of "
           "indexer keys; gale convert to and from Hugging Face DeepseekV32ForCausalLM and Megatron's formats (torch both ways, "
           "torch_dist read at any saving TP); "
           "no TP/SP/CP, attention dropout, MTP, --flash-decode; --use-dsa-absorb, "
           "--use-fused-lightning-indexer, --use-fused-lightning-indexer-kl-loss not supported yet";
  }
  void register_args(ArgParser& parser) override {
    parser.add_flag("--use-fused-sparse-flash-attention", &fused_sfa_,
                    "MindSpeed DSA: the fused sparse attention kernels (gathered top-k keys, online softmax)");
    parser.add_unsupported("--use-dsa-absorb", "DSA with MLA's up-projections absorbed into the queries");
    parser.add_unsupported("--use-fused-lightning-indexer", "a fused lightning indexer kernel");
    parser.add_unsupported("--use-fused-lightning-indexer-kl-loss", "a fused lightning indexer KL-loss kernel");
  }
  bool requested(const FeatureContext& ctx) const override {
    const std::string& v = ctx.args->model.experimental_attention_variant;
    return v == "dsa" || v == "gdn" || v == "gdn2" || fused_sfa_;
  }
  std::string not_requested_reason(const FeatureContext& ctx) const override {
    return "not requested (--experimental-attention-variant dsa, gdn or gdn2)";
  }
  Status validate(const FeatureContext& ctx) const override {
    const Arguments& a = *ctx.args;
    const ModelArgs& m = a.model;
    const ParallelArgs& p = a.parallel;
    const bool gdn = m.experimental_attention_variant == "gdn" || m.experimental_attention_variant == "gdn2";
    if (gdn && !fused_sfa_) return validate_gdn(a);
    if (m.experimental_attention_variant != "dsa")
      return InvalidArgument("--use-fused-sparse-flash-attention needs --experimental-attention-variant dsa, found ",
                             m.experimental_attention_variant.empty() ? "none" : m.experimental_attention_variant);
    GALE_RETURN_IF_ERROR(check_dsa_model_args(m));  // MLA, its latent norms, the indexer's rotary dims
    if (p.tensor_model_parallel_size > 1 || p.sequence_parallel)
      return Unimplemented("--experimental-attention-variant dsa with --tensor-model-parallel-size ",
                           p.tensor_model_parallel_size, p.sequence_parallel ? " and --sequence-parallel" : "",
                           ": not supported yet (expected --tensor-model-parallel-size 1)");
    if (p.context_parallel_size > 1)
      return Unimplemented("--experimental-attention-variant dsa with --context-parallel-size ",
                           p.context_parallel_size, ": not supported yet (expected 1)");
    if (a.model.attention_dropout != 0.0)
      return Unimplemented("--experimental-attention-variant dsa with --attention-dropout ", a.model.attention_dropout,
                           ": not supported yet (expected --attention-dropout 0)");
    if (m.mtp_num_layers != kUnset && m.mtp_num_layers > 0)
      return Unimplemented("--experimental-attention-variant dsa with --mtp-num-layers ", m.mtp_num_layers,
                           ": not supported yet");
    return Status::Ok();
  }
  Status apply(const FeatureContext& ctx, EngineSetup& setup) const override {
    const std::string& v = ctx.args->model.experimental_attention_variant;
    if (v == "gdn" || v == "gdn2") return Status::Ok();  // level 0: model/gated_delta_net.h
    if (fused_sfa_) {
      setup.ops->dsa_sparse_attention_forward = dsa_sparse_attention_forward_fused;
      setup.ops->dsa_sparse_attention_backward = dsa_sparse_attention_backward_fused;
      setup.ops->impl["dsa_sparse_attention"] = "fused";
    } else {
      // Not one of the ISA-dispatched op groups (fused_kernel_ops()): named only while DSA is on.
      setup.ops->impl["dsa_sparse_attention"] = "reference";
    }
    return Status::Ok();
  }

 private:
  // Gated DeltaNet's heads against the tensor-parallel size, and what it does not compose with yet
  // (the flags' own checks: train/arguments_gdn.cc).
  static Status validate_gdn(const Arguments& a) {
    const ParallelArgs& p = a.parallel;
    const int64_t tp = p.tensor_model_parallel_size;
    // Each TP rank holds NK/TP key heads and NV/TP value heads (Megatron's GatedDeltaNet splits them
    // so); NV is a multiple of NK (train/arguments_gdn.cc), so NK's check covers both.
    if (tp > 1 && a.model.linear_num_key_heads % tp != 0)
      return InvalidArgument("--linear-num-key-heads: expected a multiple of --tensor-model-parallel-size (", tp,
                             ": each rank holds 1/TP of the Gated DeltaNet heads), found ",
                             a.model.linear_num_key_heads);
    // Megatron-Core's GDN context parallelism (ssm/gated_delta_net/common.py) trades the sequence split
    // for a split of each TP rank's heads, so CP must divide NK/TP (and so NV/TP). The sizes are
    // the only GDN-specific rule of CP (the sequence's own, 2·CP dividing it, is the CP feature's).
    const int64_t cp = p.context_parallel_size;
    if (cp > 1 && a.model.linear_num_key_heads % (tp * cp) != 0)
      return InvalidArgument("--linear-num-key-heads: expected a multiple of --tensor-model-parallel-size × "
                             "--context-parallel-size (", tp, " × ", cp, " = ", tp * cp,
                             ": each rank holds 1/(TP·CP) of the Gated DeltaNet heads between the "
                             "all-to-alls), found ", a.model.linear_num_key_heads);
    if (p.tp_2d)
      return Unimplemented("--experimental-attention-variant ", a.model.experimental_attention_variant,
                           " with --tp-2d: not supported yet");
    // --mtp-num-layers: train/arguments_gdn.cc (the last decoder layer must be a full-attention layer).
    return Status::Ok();
  }

  bool fused_sfa_ = false;
};

}  // namespace

void register_feature_dsa(FeatureRegistry& registry) { registry.add(std::make_unique<DsaFeature>()); }

}  // namespace gale
