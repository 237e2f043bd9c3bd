// --enable-mhc-connections and the mhc_* flags (Megatron-Core's TransformerConfig hyper-connection
// fields) with Megatron's checks and what Gale does not compose them with yet.
#include <algorithm>

#include "core/log.h"
#include "train/arguments.h"

namespace gale {

void add_mhc_args(ArgParser& p, ModelArgs& a) {
  p.add_flag("--enable-mhc-connections", &a.enable_mhc_connections,
             "Megatron-Core's manifold-constrained hyper-connections (DeepSeek's mHC): n residual streams, mixed "
             "around every attention and MLP by learned H_pre, H_post and a Sinkhorn-projected doubly stochastic "
             "H_res (model/hyper_connection.h)");
  p.add("--mhc-num-residual-streams", &a.mhc_num_residual_streams, "mHC: residual streams (n in the paper)");
  p.add("--mhc-sinkhorn-iterations", &a.mhc_sinkhorn_iterations, "mHC: Sinkhorn-Knopp iterations projecting H_res");
  p.add("--mhc-init-gating-factor", &a.mhc_init_gating_factor, "mHC: initial value of the gating factors alpha");
  p.add("--mhc-recompute-layer-num", &a.mhc_recompute_layer_num,
        "mHC with --recompute-modules mhc: layers per recompute block (unset: the whole block)");
}

Status validate_mhc_args(const Arguments& a, const ArgParser& p) {
  const ModelArgs& m = a.model;
  const bool recompute_mhc = m.recompute_granularity == "selective" &&
                             std::find(m.recompute_modules.begin(), m.recompute_modules.end(), "mhc") !=
                                 m.recompute_modules.end();
  if (recompute_mhc) {  // Megatron's checks of 'mhc' in recompute_modules
    if (!m.enable_mhc_connections)
      return InvalidArgument("--recompute-modules mhc: expected --enable-mhc-connections, found it off");
    if (std::find(m.recompute_modules.begin(), m.recompute_modules.end(), "mlp") != m.recompute_modules.end())
      return InvalidArgument("--recompute-modules mhc and mlp: expected one of them (Megatron refuses both together)");
    if (m.mhc_recompute_layer_num != kUnset && m.mhc_recompute_layer_num < 1)
      return InvalidArgument("--mhc-recompute-layer-num: expected a positive integer, found ", m.mhc_recompute_layer_num);
  }
  if (!m.enable_mhc_connections) return Status::Ok();
  const std::string flag = "--enable-mhc-connections";
  if (m.mhc_num_residual_streams < 1)
    return InvalidArgument("--mhc-num-residual-streams: expected a positive integer, found ", m.mhc_num_residual_streams);
  if (m.mhc_sinkhorn_iterations < 1)
    return InvalidArgument("--mhc-sinkhorn-iterations: expected at least 1 (the Sinkhorn-Knopp backward assumes one "
                           "row normalisation), found ", m.mhc_sinkhorn_iterations);
  if (m.mhc_init_gating_factor < 0)
    return InvalidArgument("--mhc-init-gating-factor: expected a non-negative value, found ", m.mhc_init_gating_factor);
  // Megatron's own refusals (TransformerConfig.__post_init__, HyperConnectionTransformerLayer).
  if (a.parallel.pipeline_model_parallel_size > 1)
    return InvalidArgument(flag, " with --pipeline-model-parallel-size ", a.parallel.pipeline_model_parallel_size,
                           ": expected 1 (Megatron does not support mHC with pipeline parallelism yet)");
  if (m.mtp_num_layers != kUnset)
    return InvalidArgument(flag, " with --mtp-num-layers: expected no multi-token prediction (Megatron refuses it)");
  if (m.recompute_granularity == "full")
    return InvalidArgument(flag, " with --recompute-granularity full: expected selective or none (Megatron refuses "
                           "full recomputation with mHC)");
  if (p.was_set("--fp32-residual-connection"))
    return InvalidArgument(flag, " with --fp32-residual-connection: expected it off (Megatron refuses it: the mHC "
                           "residual is the n-stream tensor)");
  if (a.moe.num_experts != kUnset)
    return InvalidArgument(flag, " with --num-experts: expected a dense model (Megatron's "
                           "HyperConnectionTransformerLayer refuses MoE MLPs)");
  // Gale: not supported yet.
  if (m.is_hybrid_model) return Unimplemented(flag, " with --is-hybrid-model: not supported yet");
  if (!m.heterogeneous_layers_config_encoded_json.empty())
    return Unimplemented(flag, " with heterogeneous layers: not supported yet");
  if (!m.experimental_attention_variant.empty())
    return Unimplemented(flag, " with --experimental-attention-variant: not supported yet");
  if (!m.noop_layers.empty()) return Unimplemented(flag, " with --noop-layers: not supported yet");
  if (a.parallel.tp_2d) return Unimplemented(flag, " with --tp-2d: not supported yet");
  if (!recompute_mhc)  // Megatron's TransformerConfig warns so (its text, so logs read the same)
    warn_rank0("HyperConnections are enabled but 'mhc' is not in recompute_modules with selective recompute. "
               "Consider adding 'mhc' to recompute_modules with selective recompute to reduce activation memory.");
  return Status::Ok();
}

}  // namespace gale
