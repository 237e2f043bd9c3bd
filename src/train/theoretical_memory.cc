// Megatron's theoretical memory footprint (train/theoretical_memory.h).
#include "train/theoretical_memory.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace gale {

namespace {

constexpr double kBytesInMegabyte = 1024.0 * 1024.0;

// Python's f"{value:<spec>}" for the fixed-point specs Megatron uses (" .2f", ".2f", ".4f", ".1f").
std::string fixed(const char* spec, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, spec, value);
  return buf;
}

struct Sizes {
  double s, b, h, ffn, l, tp, pp, vpp, vocab;
  bool interleaved;
};

// Megatron's compute_activation_memory (sequence parallel with selective recomputation).
double activation_with_sp(const Sizes& z, int64_t num_microbatches, std::vector<std::string>* lines) {
  double memory = z.s * z.b * z.h * (18.0 + 4.0 * (z.ffn / z.h));
  lines->push_back("Activation memory footprint per transformer layer: " +
                   fixed("%.1f", memory / kBytesInMegabyte / z.tp) + " MB");
  memory *= z.l;
  memory += 8.0 * z.s * z.b * z.pp;     // input to the embedding, PP micro-batches in flight
  memory += z.s * z.b * z.h * z.pp;     // the embedding's dropout
  if (z.interleaved) {
    const double penalty = 1.0 + (z.pp - 1.0) / (z.pp * z.vpp);
    lines->push_back("Memory penalty from interleaved schedule: " + fixed("%.2f", penalty));
    lines->push_back("Number of in-flight microbatches: " + std::to_string(static_cast<int64_t>(std::ceil(penalty * z.pp))));
    memory *= penalty;
  }
  if (!z.interleaved && z.pp > 1) {
    memory *= std::min(1.0, static_cast<double>(num_microbatches) / z.pp);
    lines->push_back("Number of in-flight microbatches: " +
                     std::to_string(std::min<int64_t>(num_microbatches, static_cast<int64_t>(z.pp))));
  }
  if (z.pp == 1) memory += z.s * z.b * z.h * 4.0 * (1.0 + z.vocab / z.h);  // output layer and loss inputs
  return memory / z.tp;
}

// Megatron's compute_activation_memory_without_sp.
double activation_without_sp(const Sizes& z, int64_t num_microbatches, std::vector<std::string>* lines) {
  const double per_layer = z.s * z.b * z.h * (10.0 + 24.0 / z.tp);
  lines->push_back("Activation memory footprint per transformer layer (precise, without SP): " +
                   fixed("%.1f", per_layer / kBytesInMegabyte) + " MB");
  double memory = per_layer * z.l;
  memory += 8.0 * z.s * z.b * z.pp;
  memory += z.s * z.b * z.h * z.pp;
  if (z.interleaved) {
    const double penalty = 1.0 + (z.pp - 1.0) / (z.pp * z.vpp);
    lines->push_back("Memory penalty from interleaved schedule: " + fixed("%.2f", penalty));
    lines->push_back("Number of in-flight microbatches: " + std::to_string(static_cast<int64_t>(std::ceil(penalty * z.pp))));
    memory *= penalty;
  }
  if (!z.interleaved && z.pp > 1) {
    memory *= std::min(1.0, static_cast<double>(num_microbatches) / z.pp);
    lines->push_back("Number of in-flight microbatches: " +
                     std::to_string(std::min<int64_t>(num_microbatches, static_cast<int64_t>(z.pp))));
  }
  if (z.pp == 1) {
    const double logits = z.s * z.b * z.vocab / z.tp, final_norm_output = z.s * z.b * z.h;
    memory += (logits + final_norm_output) * 2.0;
  }
  return memory * 1.05;  // Megatron's 5 % for the optimizer's and other temporaries
}

}  // namespace

StatusOr<TheoreticalMemory> theoretical_memory(const Arguments& a, int64_t num_microbatches) {
  const ModelArgs& m = a.model;
  const ParallelArgs& par = a.parallel;
  const MoeArgs& moe = a.moe;
  TheoreticalMemory out;
  if (m.is_hybrid_model) {
    out.lines.push_back("Theoretical memory footprints not yet supported for hybrid Mamba-Transformer models.");
    return out;
  }
  const double h = static_cast<double>(m.hidden_size), heads = static_cast<double>(m.num_attention_heads);
  const double groups = m.group_query_attention ? static_cast<double>(m.num_query_groups) : heads;
  const double query_ratio = static_cast<double>(m.kv_channels) * heads / h;
  const double gated = m.swiglu ? 1.5 : 1.0;  // Megatron's test is args.swiglu alone
  const int64_t L = m.num_layers;

  // Which layers are MoE (Megatron's moe_layer_pattern).
  std::vector<int> moe_pattern(static_cast<size_t>(L), 0);
  const bool has_moe = moe.enabled();
  if (has_moe) {
    GALE_ASSIGN_OR_RETURN(moe_pattern, parse_moe_layer_freq(moe.moe_layer_freq, L));
  }
  const double num_experts = has_moe ? static_cast<double>(moe.num_experts) : 1.0;
  int64_t moe_layers = 0;
  for (int v : moe_pattern) moe_layers += v;
  const double num_moe_layers = static_cast<double>(moe_layers), num_dense_layers = static_cast<double>(L - moe_layers);
  const double moe_ffn = has_moe ? static_cast<double>(moe.moe_ffn_hidden_size) : 0.0;
  const bool mtp = m.mtp_num_layers != kUnset;
  const double mtp_layers = mtp ? static_cast<double>(m.mtp_num_layers) : 0.0;
  const double mtp_moe = mtp && !moe_pattern.empty() ? moe_pattern.back() * mtp_layers : 0.0;
  const double mtp_dense = mtp ? mtp_layers - mtp_moe : 0.0;
  const double norm_size = m.normalization == "RMSNorm" ? 1.0 : 2.0;

  double attention;
  if (m.multi_latent_attention) {
    const double qk = static_cast<double>(m.qk_head_dim + m.qk_pos_emb_head_dim);
    const double q_term = m.q_lora_rank == kUnset
                              ? h * heads * qk
                              : static_cast<double>(m.q_lora_rank) * (h + heads * qk + norm_size);
    attention = q_term +
                static_cast<double>(m.kv_lora_rank) *
                    (h + heads * static_cast<double>(m.qk_head_dim + m.v_head_dim) + norm_size) +
                h * static_cast<double>(m.qk_pos_emb_head_dim) + heads * static_cast<double>(m.v_head_dim) * h;
  } else {
    attention = 2.0 * h * h * ((1.0 + groups / heads) * query_ratio);
  }
  const double vocab = static_cast<double>(m.padded_vocab_size);
  const double embedding = h * vocab, final_norm = norm_size * h;
  const double embedding_layers = m.untie_embeddings_and_output_weights ? 2.0 * embedding : embedding;
  const double shared_ffn =
      moe.moe_shared_expert_intermediate_size == kUnset ? 0.0 : static_cast<double>(moe.moe_shared_expert_intermediate_size);
  const double dense_mlp = 2.0 * h * static_cast<double>(m.ffn_hidden_size) * gated;
  const double shared_expert = 2.0 * h * shared_ffn * gated;
  const double routed = 2.0 * h * moe_ffn * num_experts * gated;  // Gale has no latent MoE: H
  const double active_routed = has_moe ? 2.0 * h * moe_ffn * static_cast<double>(moe.moe_router_topk) * gated : 0.0;
  const double norms = 2.0 * h * norm_size;
  const double router = has_moe ? h * num_experts + (m.add_bias_linear ? num_experts : 0.0) : 0.0;
  const double shared_gate = shared_ffn > 0.0 && moe.moe_shared_expert_gate ? h : 0.0;

  const double dense_layer = attention + dense_mlp + norms;
  const double moe_layer = attention + shared_expert + routed + norms + router + shared_gate;
  const double active_moe_layer = attention + shared_expert + active_routed + norms + router + shared_gate;
  const double block = dense_layer * num_dense_layers + moe_layer * num_moe_layers + final_norm;
  const double active_block = dense_layer * num_dense_layers + active_moe_layer * num_moe_layers + final_norm;
  const double mtp_block = dense_layer * mtp_dense + moe_layer * mtp_moe;
  const double total = block + mtp_block + embedding_layers, active = active_block + mtp_block + embedding_layers;
  out.lines.push_back("Number of parameters in transformer block in billions: " + fixed("% .2f", block / 1e9));
  out.lines.push_back("Number of active parameters in transformer block in billions: " +
                      fixed("% .2f", active_block / 1e9));
  if (mtp) out.lines.push_back("Number of parameters in mtp block in billions: " + fixed("% .2f", mtp_block / 1e9));
  out.lines.push_back("Number of parameters in embedding layers in billions: " + fixed("%.2f", embedding_layers / 1e9));
  out.lines.push_back("Total number of parameters in billions: " + fixed("%.2f", total / 1e9));
  out.lines.push_back("Total number of active parameters in billions: " + fixed("%.2f", active / 1e9));

  const double tp = static_cast<double>(par.tensor_model_parallel_size);
  const double pp = static_cast<double>(par.pipeline_model_parallel_size);
  const double etp = static_cast<double>(moe.expert_tensor_parallel_size == kUnset ? par.tensor_model_parallel_size
                                                                                   : moe.expert_tensor_parallel_size);
  const double ep = static_cast<double>(par.expert_model_parallel_size);
  const int64_t expert_dp = par.world_size / static_cast<int64_t>(etp * ep * pp);  // Python's //

  const double tp_block = (attention + dense_mlp) * num_dense_layers + (attention + shared_expert) * num_moe_layers;
  const double replicated_block =
      norms * num_dense_layers + (norms + router + shared_gate) * num_moe_layers + final_norm;
  const double expert_block = routed * num_moe_layers;
  const double tp_mtp = (attention + dense_mlp) * mtp_dense + (attention + shared_expert) * mtp_moe;
  const double replicated_mtp = norms * mtp_dense + (norms + router + shared_gate) * mtp_moe;
  const double expert_mtp = routed * mtp_moe;
  double tp_shard = (tp_block / pp + tp_mtp + embedding) / tp;
  const double replicated_shard = replicated_block / pp + replicated_mtp;
  const double expert_shard = (expert_block / pp + expert_mtp) / (etp * ep);
  double most_loaded = tp_shard + replicated_shard + expert_shard;
  if (m.untie_embeddings_and_output_weights && par.pipeline_model_parallel_size == 1) {
    tp_shard += embedding / tp;
    most_loaded += embedding / tp;
  }
  out.lines.push_back("Number of parameters in most loaded shard in billions: " + fixed("%.4f", most_loaded / 1e9));
  if (par.pipeline_model_parallel_size > 1) {
    const double other = tp_block / (pp * tp) + replicated_block / pp + expert_block / (pp * etp * ep);
    out.lines.push_back("Number of parameters in other shards in billions: " + fixed("%.4f", other / 1e9));
  }
  auto bytes_per_parameter = [&](double dp) { return par.use_distributed_optimizer ? 6.0 + 12.0 / dp : 18.0; };
  const double weight_and_optimizer =
      (tp_shard + replicated_shard) * bytes_per_parameter(static_cast<double>(par.data_parallel_size)) +
      expert_shard * bytes_per_parameter(static_cast<double>(expert_dp));
  out.weight_and_optimizer_mb = weight_and_optimizer / kBytesInMegabyte;

  const Sizes z{static_cast<double>(m.seq_length),
                static_cast<double>(a.training.micro_batch_size),
                h,
                static_cast<double>(m.ffn_hidden_size),
                static_cast<double>(L),
                tp,
                pp,
                static_cast<double>(par.virtual_pipeline_model_parallel_size),
                vocab,
                par.virtual_pipeline_model_parallel_size > 1};
  double activation;
  if (par.sequence_parallel && m.recompute_granularity == "selective") {
    out.lines.push_back("compute_activation_memory with SP");
    activation = activation_with_sp(z, num_microbatches, &out.lines);
  } else {
    out.lines.push_back("compute_activation_memory_without_sp");
    activation = activation_without_sp(z, num_microbatches, &out.lines);
  }
  out.activation_mb = activation / kBytesInMegabyte;
  out.total_mb = out.weight_and_optimizer_mb + out.activation_mb;
  out.lines.push_back("Theoretical memory footprints: weight and optimizer=" + fixed("%.2f", out.weight_and_optimizer_mb) +
                      " MB, activation=" + fixed("%.2f", out.activation_mb) + " MB, total=" +
                      fixed("%.2f", out.total_mb) + " MB");
  out.lines.push_back("");  // Megatron's print ends the text with "\n"
  return out;
}

}  // namespace gale
