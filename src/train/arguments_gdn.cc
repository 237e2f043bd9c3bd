// Gated DeltaNet's flags (Megatron-Core names and defaults) and their checks.
#include "train/arguments.h"

#include "core/log.h"

namespace gale {

void add_gdn_args(ArgParser& p, ModelArgs& a) {
  p.group("Gated DeltaNet linear attention");
  p.add("--linear-attention-freq", &a.linear_attention_freq,
        "with --experimental-attention-variant gdn: an int N (every N-th layer keeps full attention, the others "
        "are Gated DeltaNet) or a list of one 0/1 per layer such as \"([1]*3+[0]*1)*2\" (1: Gated DeltaNet)");
  p.add("--linear-conv-kernel-dim", &a.linear_conv_kernel_dim, "Gated DeltaNet's causal convolution width");
  p.add("--linear-key-head-dim", &a.linear_key_head_dim, "Gated DeltaNet's query and key head dimension");
  p.add("--linear-value-head-dim", &a.linear_value_head_dim, "Gated DeltaNet's value and gate head dimension");
  p.add("--linear-num-key-heads", &a.linear_num_key_heads, "Gated DeltaNet's query and key heads");
  p.add("--linear-num-value-heads", &a.linear_num_value_heads,
        "Gated DeltaNet's value and gate heads (a multiple of --linear-num-key-heads)");
}

Status validate_gdn_args(ModelArgs& m, const ArgParser& p) {
  std::string& v = m.experimental_attention_variant;
  if (v == "gated_delta_net") {  // Megatron's deprecated spelling, normalised as Megatron does
    warn_rank0("--experimental-attention-variant gated_delta_net is deprecated (Megatron-Core); using gdn");
    v = "gdn";
  }
  if (v == "gdn2")
    return Unimplemented("--experimental-attention-variant gdn2: not supported yet (only gdn and dsa)");
  m.linear_attention_pattern.clear();
  if (v != "gdn") {
    for (const char* flag : {"--linear-attention-freq", "--linear-conv-kernel-dim", "--linear-key-head-dim",
                             "--linear-value-head-dim", "--linear-num-key-heads", "--linear-num-value-heads"})
      if (p.was_set(flag)) return InvalidArgument(flag, " needs --experimental-attention-variant gdn");
    return Status::Ok();
  }
  if (m.linear_attention_freq.empty())
    return InvalidArgument("--experimental-attention-variant gdn needs --linear-attention-freq (an int N or a list "
                           "of one 0/1 per layer), found none");
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
      return InvalidArgument(s.flag, ": expected a positive integer with --experimental-attention-variant gdn, found ",
                             s.value);
  if (m.linear_num_value_heads % m.linear_num_key_heads != 0)
    return InvalidArgument("--linear-num-value-heads: expected a multiple of --linear-num-key-heads (",
                           m.linear_num_key_heads, "), found ", m.linear_num_value_heads);
  // Megatron's get_linear_attention_pattern: an int N gives 0 (full attention) where (i + 1) % N == 0.
  GALE_ASSIGN_OR_RETURN(m.linear_attention_pattern,
                        parse_layer_pattern("--linear-attention-freq", m.linear_attention_freq, m.num_layers,
                                            [](int64_t k, int64_t i) { return (i + 1) % k != 0; }));
  if (m.multi_latent_attention)
    return Unimplemented("--experimental-attention-variant gdn with --multi-latent-attention: not supported yet "
                         "(the full-attention layers are standard attention)");
  if (m.is_hybrid_model)
    return Unimplemented("--experimental-attention-variant gdn with --is-hybrid-model: not supported yet");
  // The GDN projections are not among the linears these quantise (in_proj / out_proj, as Mamba's).
  if (!m.fp8_format.empty())
    return Unimplemented("--experimental-attention-variant gdn with --fp8-format ", m.fp8_format, ": not supported yet");
  if (!m.qat_scheme.empty())
    return Unimplemented("--experimental-attention-variant gdn with --qat-scheme ", m.qat_scheme, ": not supported yet");
  if (!m.swiglu)  // Megatron's GDN applies config.activation_func, which its FLA kernels require to be SiLU
    return InvalidArgument("--experimental-attention-variant gdn needs --swiglu (the convolution's and the output "
                           "gate's activation is the model's, SiLU), found ", m.squared_relu ? "--squared-relu" : "GeLU");
  if (m.normalization != "RMSNorm")
    return Unimplemented("--experimental-attention-variant gdn with --normalization ", m.normalization,
                         ": not supported yet (expected RMSNorm, the gated output norm's type)");
  return Status::Ok();
}

}  // namespace gale
