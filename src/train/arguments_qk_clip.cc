// --qk-clip, --qk-clip-alpha, --qk-clip-threshold, --log-max-attention-logit (Megatron-Core's MuonClip flags) and what they do not compose with yet.
#include "train/arguments.h"

namespace gale {

void add_qk_clip_args(ArgParser& p, ModelArgs& a) {
  p.add_flag("--qk-clip", &a.qk_clip,
             "MuonClip's QK-clip (Kimi K2; Megatron-Core's qk_clip): after every optimizer step, rescale the query "
             "and key projection rows of each head (query group) whose largest pre-softmax attention logit of the "
             "step exceeded --qk-clip-threshold (model/qk_clip.h); implies tracking that logit");
  p.add("--qk-clip-alpha", &a.qk_clip_alpha,
        "the query side's share of the QK-clip rescale: queries by eta^alpha, keys by eta^(1-alpha), "
        "eta = min(threshold / max logit, 1)");
  p.add("--qk-clip-threshold", &a.qk_clip_threshold, "the max attention logit above which --qk-clip rescales a head");
  p.add_flag("--log-max-attention-logit", &a.log_max_attention_logit,
             "track the step's largest pre-softmax attention logit over the model and write it to TensorBoard / "
             "W&B as max_attention_logit (without --qk-clip nothing is rescaled)");
}

Status validate_qk_clip(const Arguments& a) {
  const ModelArgs& m = a.model;
  if (m.qk_clip) {
    if (!(m.qk_clip_alpha > 0.0 && m.qk_clip_alpha < 1.0))
      return InvalidArgument("--qk-clip-alpha: expected a value between 0.0 and 1.0 (exclusive) with --qk-clip, "
                             "found ", m.qk_clip_alpha);
    if (!(m.qk_clip_threshold > 0.0))
      return InvalidArgument("--qk-clip-threshold: expected a value greater than 0 with --qk-clip, found ",
                             m.qk_clip_threshold);
  }
  if (!m.qk_clip && !m.log_max_attention_logit) return Status::Ok();
  const std::string flag = m.qk_clip ? "--qk-clip" : "--log-max-attention-logit";
  const ParallelArgs& par = a.parallel;
  if (par.context_parallel_size > 1) {
    // (after validate_parallel_args resolved --cp-comm-type onto the algorithms) Ring, all-gather and
    // Ulysses splits of whole query groups (MLA: of heads) record every head's logits.
    const std::string& algo = par.context_parallel_algo;
    const bool ulysses = algo == "ulysses_cp_algo", hybrid = algo == "hybrid_cp_algo";
    if ((ulysses || hybrid) && par.use_ulysses_allgather_kv)
      return Unimplemented(flag, " with --use-ulysses-allgather-kv: not supported yet (keys and values gathered "
                           "beside the query heads' split)");
    const int64_t groups = m.multi_latent_attention ? m.num_attention_heads
                           : m.group_query_attention ? m.num_query_groups
                                                     : m.num_attention_heads;
    const int64_t per_tp = groups / par.tensor_model_parallel_size;
    const int64_t degree = ulysses ? par.context_parallel_size : par.ulysses_degree_in_cp;
    if ((ulysses || hybrid) && degree > 1 && per_tp % degree != 0)
      return Unimplemented(flag, " with --context-parallel-algo ", algo, ": not supported yet when the query groups "
                           "per tensor-parallel rank (", per_tp, ") are not a multiple of the Ulysses degree ",
                           degree);
  }
  if (par.overlap_param_gather_with_optimizer_step)
    return Unimplemented(flag, " with --overlap-param-gather-with-optimizer-step: not supported yet (the "
                         "parameter all-gather starts inside the step, before the clip)");
  if (par.tp_2d) return Unimplemented(flag, " with --tp-2d: not supported yet (the 2-D attention layer)");
  if (a.training.reuse_fp32_param)
    return Unimplemented(flag, " with --reuse-fp32-param: not supported yet (the split bf16 weights)");
  if (par.zero3())
    return Unimplemented(flag, " with sharded parameters (ZeRO-3: --use-custom-fsdp optim_grads_params, "
                         "--use-torch-fsdp2, --layerzero): not supported yet");
  if (m.attention_output_gate)
    return Unimplemented(flag, " with --attention-output-gate: not supported yet (Megatron's clip_qk assumes "
                         "linear_qkv without gate rows)");
  if (!m.experimental_attention_variant.empty())
    return Unimplemented(flag, " with --experimental-attention-variant ", m.experimental_attention_variant,
                         ": not supported yet");
  if (m.is_hybrid_model) return Unimplemented(flag, " with --is-hybrid-model: not supported yet");
  if (!m.heterogeneous_layers_config_path.empty() || !m.heterogeneous_layers_config_encoded_json.empty())
    return Unimplemented(flag, " with heterogeneous layers: not supported yet");
  return Status::Ok();
}

}  // namespace gale
