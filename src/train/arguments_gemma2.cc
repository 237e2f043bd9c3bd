// Gemma-2's flags as MindSpeed-LLM trains it (soft-capping, query-pre-attn-scalar, post norms, interleaved windows).
#include "train/arguments.h"

#include <cmath>

namespace gale {

void add_gemma2_args(ArgParser& p, ModelArgs& a) {
  p.add("--output-logit-softcapping", &a.output_logit_softcapping,
        "MindSpeed-LLM (Gemma-2): the output layer's logits z become C*tanh(z/C) before the cross-entropy and "
        "before sampling; unset: no capping");
  p.add("--attn-logit-softcapping", &a.attn_logit_softcapping,
        "MindSpeed-LLM (Gemma-2): every scaled attention score s becomes C*tanh(s/C) before the mask and the "
        "softmax; unset: no capping");
  p.add("--query-pre-attn-scalar", &a.query_pre_attn_scalar,
        "MindSpeed-LLM (Gemma-2): the attention softmax scale is 1/sqrt(N) instead of 1/sqrt(--kv-channels); "
        "unset: 1/sqrt(--kv-channels)");
  p.add_flag("--post-norm", &a.post_norm,
             "MindSpeed-LLM (Gemma-2's sandwich norms): a norm (the model's type and epsilon) after the attention "
             "and after the MLP, before each residual add (weights post_attn_norm / post_mlp_layernorm)");
  p.add("--interleave-sliding-window", &a.interleave_sliding_window,
        "MindSpeed-LLM (Gemma-2): a sliding window of W tokens in layers 1, 3, 5, ... (1-based), full causal "
        "attention in the others; the same as --sliding-window W --window-attn-skip-freq 2");
}

Status validate_gemma2_args(ModelArgs& m) {
  for (auto [flag, v] : {std::pair{"--output-logit-softcapping", m.output_logit_softcapping},
                         {"--attn-logit-softcapping", m.attn_logit_softcapping}})
    if (!unset(v) && !(v > 0.0 && std::isfinite(v)))
      return InvalidArgument(flag, ": expected a finite number greater than zero, found ", v);
  if (m.query_pre_attn_scalar != kUnset && m.query_pre_attn_scalar <= 0)
    return InvalidArgument("--query-pre-attn-scalar: expected a positive integer, found ", m.query_pre_attn_scalar);
  if (m.interleave_sliding_window == kUnset) return Status::Ok();
  const int64_t w = m.interleave_sliding_window;
  if (w <= 0) return InvalidArgument("--interleave-sliding-window: expected a positive window (tokens), found ", w);
  // MindSpeed-LLM's TransformerLayerWithPostNorm: layer number n (1-based) is windowed iff (n − 1) % 2 == 0,
  // its mask hiding the keys i − W and earlier, i.e. Gale's window W; Megatron's skip frequency 2
  // windows n % 2 != 0, the same layers.
  if (m.window_size.empty() && m.sliding_window == w && m.window_attn_skip_freq == "2")
    return Status::Ok();  // mapped already (the arguments validated again)
  if (!m.window_size.empty() || m.sliding_window != kUnset)
    return InvalidArgument("--interleave-sliding-window ", w, " sets the window itself; expected neither "
                           "--window-size nor --sliding-window with it, found ",
                           m.window_size.empty() ? "--sliding-window " + std::to_string(m.sliding_window)
                                                 : "--window-size " + m.window_size);
  if (!m.window_attn_skip_freq.empty() && m.window_attn_skip_freq != "2")
    return InvalidArgument("--interleave-sliding-window windows every other layer (--window-attn-skip-freq 2), "
                           "found --window-attn-skip-freq ", m.window_attn_skip_freq);
  m.sliding_window = w;
  m.window_attn_skip_freq = "2";
  return Status::Ok();
}

Status validate_gemma2_combinations(const Arguments& a) {
  const ModelArgs& m = a.model;
  const bool attn_cap = !unset(m.attn_logit_softcapping), scalar = m.query_pre_attn_scalar != kUnset;
  for (auto [on, flag] : {std::pair{attn_cap, "--attn-logit-softcapping"}, {scalar, "--query-pre-attn-scalar"},
                          {m.post_norm, "--post-norm"}}) {
    if (!on) continue;
    if (m.multi_latent_attention)
      return Unimplemented(flag, " with --multi-latent-attention: not supported (MindSpeed-LLM applies it to "
                                 "Gemma-2's standard attention)");
    if (!m.experimental_attention_variant.empty())
      return Unimplemented(flag, " with --experimental-attention-variant ", m.experimental_attention_variant,
                           ": not supported yet");
    if (m.is_hybrid_model) return Unimplemented(flag, " with --is-hybrid-model: not supported yet");
    if (a.parallel.tp_2d) return Unimplemented(flag, " with --tp-2d: not supported yet");
  }
  if (attn_cap && m.position_embedding_type == "alibi")
    return Unimplemented("--attn-logit-softcapping with --position-embedding-type alibi: not supported (the order of "
                         "the cap and the bias is not defined by MindSpeed-LLM)");
  if (scalar && m.use_mup)
    return InvalidArgument("--query-pre-attn-scalar with --use-mup: both set the attention softmax scale; expected "
                           "one of them");
  if (!unset(m.output_logit_softcapping)) {  // the model asserts these too (model/gpt_model.cc)
    if (a.qad.qad_enable)
      return Unimplemented("--output-logit-softcapping with --qad-enable: not supported yet (the KL gradient does not "
                           "go through the cap)");
    for (const auto& [dir, flag] : {std::pair{&a.logits_kd.logits_save_dir, "--logits-save-dir"},
                                    {&a.logits_kd.logits_load_dir, "--logits-load-dir"}})
      if (!dir->empty())
        return Unimplemented("--output-logit-softcapping with ", flag, ": not supported yet (the distillation hook "
                             "sees the logits before the cap)");
  }
  if (m.post_norm) {
    if (m.enable_mhc_connections) return Unimplemented("--post-norm with --enable-mhc-connections: not supported yet");
    if (!m.heterogeneous_layers_config_path.empty())
      return Unimplemented("--post-norm with --heterogeneous-layers-config-path: not supported yet");
    if (!m.recompute_granularity.empty())
      return Unimplemented("--post-norm with --recompute-granularity ", m.recompute_granularity,
                           ": not supported yet (the post norms' inputs are kept, not recomputed)");
  }
  return Status::Ok();
}

}  // namespace gale
