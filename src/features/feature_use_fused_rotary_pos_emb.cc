// --use-fused-rotary-pos-emb: vectorised in-place RoPE on the packed QKV rows.
#include "features/kernel_feature.h"
#include "features/registry.h"

namespace gale {

void register_feature_use_fused_rotary_pos_emb(FeatureRegistry& registry) {
  KernelFeatureSpec s;
  s.name = "use-fused-rotary-pos-emb";
  s.flag = "--use-fused-rotary-pos-emb";
  s.level = 2;
  s.counterpart = "MindSpeed FusedRoPEFeature (npu_rotary_position_embedding)";
  s.description = "fused rotary position embedding on queries and keys, forward and backward (also on YaRN's and LongRoPE's tables)";
  s.ops = {"rope"};
  s.requirement_error = [](const Arguments& a) {
    const std::string& type = a.model.position_embedding_type;  // yarn / longrope: the same kernel on their tables
    return type == "rope" || type == "yarn" || a.model.use_rotary_position_embeddings
               ? std::string()
               : std::string("--use-fused-rotary-pos-emb requires --position-embedding-type rope or yarn");
  };
  s.not_applicable = [](const Arguments& a) {
    return a.model.rotary_interleaved ? std::string("--rotary-interleaved: the fused kernel rotates halves only")
                                      : std::string();
  };
  registry.add(std::make_unique<KernelFeature>(std::move(s)));
}

}  // namespace gale
