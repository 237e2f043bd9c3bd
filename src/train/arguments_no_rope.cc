// --no-rope-freq (Megatron-Core's NoPE layers: RoPE skipped in every N-th layer or in a listed pattern) and its checks.
#include "train/arguments.h"

#include <algorithm>
#include <cctype>

namespace gale {

void add_no_rope_args(ArgParser& p, ModelArgs& a) {
  p.add("--no-rope-freq", &a.no_rope_freq,
        "layers whose attention skips RoPE (Llama 4's NoPE layers): an int N (every N-th layer, N dividing "
        "--num-layers) or a list of one 0/1 per layer such as \"([0]*3+[1]*1)*3\" (1: no RoPE); unset: RoPE in every "
        "layer");
}

Status validate_no_rope_args(ModelArgs& m) {
  m.no_rope_pattern.clear();
  if (m.no_rope_freq.empty()) return Status::Ok();
  if (m.position_embedding_type != "rope" && m.position_embedding_type != "yarn")
    return InvalidArgument("--no-rope-freq needs --position-embedding-type rope or yarn, found ",
                           m.position_embedding_type);
  GALE_ASSIGN_OR_RETURN(m.no_rope_pattern,
                        parse_layer_pattern("--no-rope-freq", m.no_rope_freq, m.num_layers,
                                            [](int64_t k, int64_t i) { return (i + 1) % k == 0; }));
  // Megatron's TransformerConfig: an int N must divide the layers ([0]*(N-1)+[1] repeated).
  const bool every_n = std::all_of(m.no_rope_freq.begin(), m.no_rope_freq.end(),
                                   [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)) || ch == ' '; });
  if (every_n && m.num_layers % std::stoll(m.no_rope_freq) != 0)
    return InvalidArgument("--no-rope-freq ", m.no_rope_freq, ": expected a divisor of --num-layers ", m.num_layers);
  if (m.multi_latent_attention)
    return InvalidArgument("--no-rope-freq with --multi-latent-attention: MLA's rotary part is not skipped (Megatron's "
                           "MLA does not read no_rope_freq)");
  if (m.is_hybrid_model) return Unimplemented("--no-rope-freq with --is-hybrid-model: not supported yet");
  if (m.mtp_num_layers != kUnset && m.mtp_num_layers > 0)
    return Unimplemented("--no-rope-freq with --mtp-num-layers ", m.mtp_num_layers,
                         ": not supported yet (the MTP layers' place in the pattern)");
  return Status::Ok();
}

}  // namespace gale
