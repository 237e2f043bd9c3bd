// The MoE layers of a hybrid Mamba model (--is-hybrid-model with --num-experts): the pattern's 'E' layers.
#include "model/hybrid_layers.h"
#include "model/hybrid_pattern.h"
#include "train/arguments.h"

namespace gale {

StatusOr<std::vector<int>> hybrid_moe_layer_pattern(const Arguments& a, const ArgParser& p) {
  const ModelArgs& m = a.model;
  if (p.was_set("--moe-layer-freq"))
    return InvalidArgument("--moe-layer-freq with --is-hybrid-model: expected no --moe-layer-freq (a hybrid model's "
                           "MoE layers are the 'E' layers of --hybrid-override-pattern), found '",
                           a.moe.moe_layer_freq, "'");
  std::string layers;
  GALE_RETURN_IF_ERROR(allocate_hybrid_layers(m.num_layers, m.hybrid_attention_ratio, m.hybrid_mlp_ratio,
                                              m.hybrid_override_pattern, &layers));
  // 'E' layers in the MTP depths only are MoE layers too (the returned flags are the decoder's).
  const bool mtp = m.mtp_num_layers != kUnset && m.mtp_num_layers > 0;
  GALE_RETURN_IF_ERROR(
      check_hybrid_moe_layers(mtp ? layers + hybrid_pattern_mtp_layers(m.hybrid_override_pattern) : layers, true));
  // MindSpeed's MoE accelerations and upcycling are tested on GPT models only.
  for (const char* flag :
       {"--moe-use-upcycling", "--moe-alltoall-overlap-comm", "--moe-allgather-overlap-comm", "--moe-tp-extend-ep",
        "--balanced-moe-experts", "--enable-expert-placement", "--moe-zero-memory", "--moe-alltoall-mc2"})
    if (p.was_set(flag)) return Unimplemented("--is-hybrid-model with --num-experts and ", flag, ": not supported yet");
  return hybrid_moe_layer_flags(layers);
}

}  // namespace gale
