// Gated DeltaNet's flags (Megatron-Core names and defaults) and their checks.
#include "train/arguments.h"
#include "train/arguments_gdn.h"

#include "core/log.h"

namespace gale {

void add_gdn_args(ArgParser& p, ModelArgs& a) {
  p.group("Gated DeltaNet linear attention");
  p.add("--linear-attention-freq", &a.linear_attention_freq,
        "with --experimental-attention-variant gdn: an int N (every N-th layer keeps full attention, the others "
        "are Gated DeltaNet) or a list of one 0/1 per layer such as \"([1]*3+[0]*1)*2\" (1: Gated DeltaNet)");
  add_gdn_size_args(p, a);
}

void add_gdn_size_args(ArgParser& p, ModelArgs& a) {
  p.add("--linear-conv-kernel-dim", &a.linear_conv_kernel_dim, "Gated DeltaNet's causal convolution width");
  p.add("--linear-key-head-dim", &a.linear_key_head_dim, "Gated DeltaNet's query and key head dimension");
  p.add("--linear-value-head-dim", &a.linear_value_head_dim, "Gated DeltaNet's value and gate head dimension");
  p.add("--linear-num-key-heads", &a.linear_num_key_heads, "Gated DeltaNet's query and key heads");
  p.add("--linear-num-value-heads", &a.linear_num_value_heads,
        "Gated DeltaNet's value and gate heads (a multiple of --linear-num-key-heads)");
}

namespace {

// The GDN mixer's sizes and what it needs of the model, for `who` (the flag or pattern that asks for
// GDN layers): positive sizes, NV a multiple of NK, SiLU, RMSNorm, no FP8 / QAT linears.
Status check_gdn_layers(const ModelArgs& m, const char* who) {
  struct Size {
    const char* flag;
    int64_t value;
  };
  for (const Size& s : {Size{"--linear-conv-kernel-dim", m.linear_conv_kernel_dim},
                        Size{"--linear-key-head-dim", m.linear_key_head_dim},
                        Size{"--linear-value-head-dim", m.linear_value_head_dim},
                        Size{"--linear-num-key-heads", m.linear_num_key_heads},
                        Size{"--linear-num-value-heads", m.linear_num_value_heads}})
    if (s.value <= 0)
      return InvalidArgument(s.flag, ": expected a positive integer with ", who, ", found ", s.value);
  if (m.linear_num_value_heads % m.linear_num_key_heads != 0)
    return InvalidArgument("--linear-num-value-heads: expected a multiple of --linear-num-key-heads (",
                           m.linear_num_key_heads, "), found ", m.linear_num_value_heads);
  // The GDN projections are not among the linears these quantise (in_proj / out_proj, as Mamba's).
  if (!m.fp8_format.empty())
    return Unimplemented(who, " with --fp8-format ", m.fp8_format, ": not supported yet");
  if (!m.qat_scheme.empty())
    return Unimplemented(who, " with --qat-scheme ", m.qat_scheme, ": not supported yet");
  if (!m.swiglu)  // Megatron's GDN applies config.activation_func, which its FLA kernels require to be SiLU
    return InvalidArgument(who, " needs --swiglu (the convolution's and the output gate's activation is the model's, "
                           "SiLU), found ", m.squared_relu ? "--squared-relu" : "GeLU");
  if (m.normalization != "RMSNorm")
    return Unimplemented(who, " with --normalization ", m.normalization, ": not supported yet (expected RMSNorm, the gated output norm's type)");
  return Status::Ok();
}

// Megatron-Core main's hybrid 'G' layers (model/hybrid_layers.h): the ratios never give one, so the
// pattern decides.
bool hybrid_gdn_layers(const ModelArgs& m) {
  return m.is_hybrid_model && m.hybrid_override_pattern.find('G') != std::string::npos;
}

}  // namespace

Status validate_gdn_args(ModelArgs& m, const ArgParser& p) {
  std::string& v = m.experimental_attention_variant;
  if (v == "gated_delta_net") {  // Megatron's deprecated spelling, normalised as Megatron does
    warn_rank0("--experimental-attention-variant gated_delta_net is deprecated (Megatron-Core); using gdn");
    v = "gdn";
  }
  m.linear_attention_pattern.clear();
  // gdn2 (Gated DeltaNet-2): in a GPT model it is gdn's layer pattern with GatedDeltaNet2 mixers; in a
  // hybrid model it makes the 'G' layers GatedDeltaNet2 (Megatron's hybrid_block.py).
  const bool hybrid_gdn2 = v == "gdn2" && m.is_hybrid_model;
  if (v != "gdn" && (v != "gdn2" || hybrid_gdn2)) {
    // A hybrid model's 'G' layers take their sizes from the same flags (not --linear-attention-freq).
    const bool hybrid_gdn = hybrid_gdn_layers(m);
    for (const char* flag : {"--linear-attention-freq", "--linear-conv-kernel-dim", "--linear-key-head-dim",
                             "--linear-value-head-dim", "--linear-num-key-heads", "--linear-num-value-heads"})
      if (p.was_set(flag) && !(hybrid_gdn && std::string(flag) != "--linear-attention-freq"))
        return InvalidArgument(flag, m.is_hybrid_model ? " needs Gated DeltaNet layers ('G') in --hybrid-override-pattern"
                                                       : " needs --experimental-attention-variant gdn or gdn2");
    // Without 'G' layers gdn2 changes nothing in a hybrid model (as in Megatron).
    if (!hybrid_gdn) return Status::Ok();
    return check_gdn_layers(m, hybrid_gdn2 ? "the Gated DeltaNet-2 layers ('G' with --experimental-attention-variant "
                                             "gdn2) of --hybrid-override-pattern"
                                           : "the Gated DeltaNet layers ('G') of --hybrid-override-pattern");
  }
  const std::string variant = "--experimental-attention-variant " + v;
  if (m.linear_attention_freq.empty())
    return InvalidArgument(variant, " needs --linear-attention-freq (an int N or a list of one 0/1 per layer), "
                           "found none");
  // Megatron's get_linear_attention_pattern: an int N gives 0 (full attention) where (i + 1) % N == 0.
  GALE_ASSIGN_OR_RETURN(m.linear_attention_pattern,
                        parse_layer_pattern("--linear-attention-freq", m.linear_attention_freq, m.num_layers,
                                            [](int64_t k, int64_t i) { return (i + 1) % k != 0; }));
  if (m.multi_latent_attention)
    return Unimplemented(variant, " with --multi-latent-attention: not supported yet "
                         "(the full-attention layers are standard attention)");
  if (m.is_hybrid_model)
    return InvalidArgument("--experimental-attention-variant gdn with --is-hybrid-model: expected a hybrid model's "
                           "Gated DeltaNet layers as 'G' in --hybrid-override-pattern, found --experimental-attention-"
                           "variant gdn");
  // Megatron builds each MTP layer from the last decoder layer's spec (gpt_builders.py); Gale's MTP
  // layers are full-attention layers, so the last decoder layer must be one.
  if (m.mtp_num_layers != kUnset && m.mtp_num_layers > 0 &&
      (m.linear_attention_pattern.empty() || m.linear_attention_pattern.back() != 0))
    return Unimplemented(variant, " with --mtp-num-layers ", m.mtp_num_layers,
                         ": not supported yet when the last decoder layer is a Gated DeltaNet layer (Megatron's MTP "
                         "layer takes the last decoder layer's spec; Gale's MTP layers are full-attention layers)");
  return check_gdn_layers(m, variant.c_str());
}

}  // namespace gale
