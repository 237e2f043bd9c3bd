// Validation of MindSpeed's --tp-2d --tp-x --tp-y (TP2dFeature) against the layout and the model.
#include <string>

#include "train/arguments.h"

namespace gale {

namespace {

// What the 2-D path (model/tp2d_layer.h) does not implement, as "<flag> ..." when set.
std::string unsupported_with_tp2d(const Arguments& a) {
  const ModelArgs& m = a.model;
  const ParallelArgs& par = a.parallel;
  if (par.sequence_parallel) return "--sequence-parallel (2-D TP splits the sequence itself; as MindSpeed)";
  if (a.moe.num_experts > 0) return "--num-experts (MoE; as MindSpeed)";
  if (m.multi_latent_attention) return "--multi-latent-attention";
  if (a.lora.enabled()) return "--lora-target-modules (LoRA)";
  if (par.unaligned_linear) return "--unaligned-linear";
  if (par.context_parallel_size > 1 && par.context_parallel_algo == "hybrid_cp_algo")
    return "--context-parallel-algo hybrid_cp_algo (as MindSpeed: megatron_cp_algo or ulysses_cp_algo)";
  if (par.schedules_method == "dualpipev") return "--schedules-method dualpipev (as MindSpeed's DualPipeV)";
  if (m.mtp_num_layers > 0) return "--mtp-num-layers";
  if (m.embed_layernorm) return "--embed-layernorm";
  if (m.distribute_saved_activations) return "--distribute-saved-activations";
  for (const std::string& mod : m.recompute_modules)
    if (mod != "core_attn") return "--recompute-modules " + mod;
  if (a.training.optimizer == "muon") return "--optimizer muon";
  if (a.data.variable_seq_lengths) return "--variable-seq-lengths";
  return "";
}

}  // namespace

Status validate_tp2d(const Arguments& a) {
  const ParallelArgs& par = a.parallel;
  const ModelArgs& m = a.model;
  if (!par.tp_2d) {
    if (par.tp_x != 1 || par.tp_y != 1)
      return InvalidArgument("--tp-x ", par.tp_x, " / --tp-y ", par.tp_y, " apply only with --tp-2d");
    return Status::Ok();
  }
  const int64_t X = par.tp_x, Y = par.tp_y, tp = par.tensor_model_parallel_size;
  if (X < 1 || Y < 1) return InvalidArgument("--tp-2d: --tp-x and --tp-y must be positive, found ", X, " and ", Y);
  if (X * Y != tp)
    return InvalidArgument("--tp-2d: --tp-x ", X, " x --tp-y ", Y, " must equal --tensor-model-parallel-size ", tp,
                           ", found ", X * Y);
  const std::string unsupported = unsupported_with_tp2d(a);
  if (!unsupported.empty()) return InvalidArgument("--tp-2d does not support ", unsupported);
  const char* groups_flag = m.num_kv_heads == m.num_attention_heads ? "--num-attention-heads " : "--num-query-groups ";
  if (m.num_kv_heads % tp != 0)
    return InvalidArgument("--tp-2d: ", groups_flag, m.num_kv_heads, " must be divisible by --tp-x x --tp-y = ", tp,
                           " (whole query groups over X, then over Y for attention)");
  if (m.ffn_hidden_size % X != 0)
    return InvalidArgument("--tp-2d: --ffn-hidden-size ", m.ffn_hidden_size, " must be divisible by --tp-x ", X);
  if (m.hidden_size % Y != 0)
    return InvalidArgument("--tp-2d: --hidden-size ", m.hidden_size, " must be divisible by --tp-y ", Y);
  const int64_t cp = par.context_parallel_size, s_local = m.seq_length / cp;  // CP validation checks the division
  if (s_local % X != 0 || s_local % Y != 0)
    return InvalidArgument("--tp-2d: --seq-length ", m.seq_length, cp > 1 ? " / --context-parallel-size " : "",
                           cp > 1 ? std::to_string(cp) : "", " must be divisible by --tp-x ", X, " and --tp-y ", Y,
                           " (the rows are split by whole positions on both axes)");
  return Status::Ok();
}

}  // namespace gale
