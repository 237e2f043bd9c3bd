// Formatting of Megatron's log line and validation block; Megatron's FLOPs formula.
#include "train/training_log.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/datetime.h"
#include "core/log.h"

namespace gale {

namespace {

// Megatron's hybrid_flops (training.py, core_v0.12.1): 3 × the forward's attention, MLP, Mamba
// (in_proj, a 7·d_inner·N scan estimate, out_proj) and logits products; Megatron-Core main's
// moe_layer_flops for the MoE layers ('E': the top-k routed experts and the shared expert) and
// gdn_layer_flops for the Gated DeltaNet layers ('G').
double hybrid_flops(const FlopsModel& m, int64_t batch_size) {
  const double bs = static_cast<double>(batch_size) * static_cast<double>(m.seq_length);
  const double h = static_cast<double>(m.hidden);
  const double p = static_cast<double>(m.kv_channels) * static_cast<double>(m.heads) / h;
  const double g = static_cast<double>(m.gqa ? m.query_groups : m.heads);
  const double attention = 4.0 * bs * h * p * (h + h * (g / static_cast<double>(m.heads)) + m.seq_length / 2.0);
  const double mlp = 4.0 * (static_cast<double>(m.ffn) / h) * (m.swiglu ? 1.5 : 1.0) * bs * h * h;
  const double d_in = 2.0 * h;
  const double nheads = std::floor(d_in / static_cast<double>(m.mamba_head_dim));
  const double mamba = 2.0 * bs * h * (2.0 * d_in + 2.0 * m.mamba_num_groups * m.mamba_state_dim + nheads) +
                       7.0 * bs * d_in * m.mamba_state_dim + 2.0 * bs * d_in * h;
  const double moe = 4.0 * bs * h *
                     (static_cast<double>(m.moe_ffn) * static_cast<double>(m.moe_topk) +
                      static_cast<double>(m.moe_shared_ffn)) *
                     (m.swiglu ? 1.5 : 1.0);
  // Gated DeltaNet: in_proj to q, k, v, z and the β, g rows, the convolution over q, k, v, the delta
  // rule's 4·NV·DV² per token, out_proj.
  const double qk_dim = static_cast<double>(m.gdn_key_head_dim * m.gdn_num_key_heads);
  const double v_dim = static_cast<double>(m.gdn_value_head_dim * m.gdn_num_value_heads);
  const double nv = static_cast<double>(m.gdn_num_value_heads), dv = static_cast<double>(m.gdn_value_head_dim);
  // GDN2's in_proj gives q, k, v, z and the f, b (qk_dim each) and w (v_dim) rows instead.
  const double in_proj_dim = m.gdn_use_gdn2 ? 4.0 * qk_dim + 3.0 * v_dim : 2.0 * qk_dim + 2.0 * v_dim + 2.0 * nv;
  const double gdn = 2.0 * bs *
                     (h * in_proj_dim +
                      static_cast<double>(m.gdn_conv_kernel) * (2.0 * qk_dim + v_dim) + nv * dv * dv * 4.0 + h * v_dim);
  const double forward = m.attention_layers * attention + m.mlp_layers * mlp + m.mamba_layers * mamba +
                         static_cast<double>(m.gdn_layers) * gdn +
                         static_cast<double>(m.num_moe_layers) * moe +
                         2.0 * bs * h * static_cast<double>(m.padded_vocab) * (1.0 + static_cast<double>(m.mtp_num_layers));
  return 3.0 * forward;
}

}  // namespace

double num_floating_point_operations(const FlopsModel& m, int64_t batch_size) {
  if (m.hybrid) return hybrid_flops(m, batch_size);
  const double h = static_cast<double>(m.hidden);
  const double gated = m.swiglu ? 1.5 : 1.0;
  const double query_projection_ratio = static_cast<double>(m.kv_channels) * m.heads / h;
  const double expansion = 3.0 * 2.0 * 2.0;
  // The gate's rows add h·(NH·HD) to the QKV projection: half the query and output projections' term.
  const double gate = m.attention_output_gate ? 0.5 : 0.0;
  const double attention =
      (1.0 + gate + static_cast<double>(m.query_groups) / m.heads + static_cast<double>(m.seq_length) / h / 2.0) *
      query_projection_ratio;
  const double dense_fraction = static_cast<double>(m.num_layers - m.num_moe_layers) / m.num_layers;
  const double moe_fraction = static_cast<double>(m.num_moe_layers) / m.num_layers;
  const double mlp = (static_cast<double>(m.ffn) * dense_fraction +
                      (static_cast<double>(m.moe_ffn) * static_cast<double>(m.moe_topk) +
                       static_cast<double>(m.moe_shared_ffn)) *
                          moe_fraction) /
                     h * gated;
  const double D = static_cast<double>(m.mtp_num_layers);
  const double logit = static_cast<double>(m.padded_vocab) * (1.0 + D) / (2.0 * m.num_layers * h);
  // MTP: enorm, hnorm and final norm (3h) and eh_proj (2h²) per MTP layer, forward and backward.
  const double mtp = 3.0 * 2.0 * D * (3.0 * h + 2.0 * h * h);
  return expansion * batch_size * m.seq_length * m.num_layers * h * h * (attention + mlp + logit) +
         static_cast<double>(batch_size) * m.seq_length * mtp;
}

std::string format_training_log_line(const TrainingLogFields& f) {
  char buf[256];
  std::string s = " [" + (f.timestamp.empty() ? datetime_now_micros() : f.timestamp) + "]";
  auto add = [&](const char* fmt, auto... v) {
    std::snprintf(buf, sizeof buf, fmt, v...);
    s += buf;
  };
  add(" iteration %8lld/%8lld |", static_cast<long long>(f.iteration), static_cast<long long>(f.train_iters));
  add(" consumed samples: %12lld |", static_cast<long long>(f.consumed_samples));
  if (f.consumed_bins > 0) add(" consumed bins: %12lld |", static_cast<long long>(f.consumed_bins));
  if (f.skipped_samples > 0) add(" skipped samples: %12lld |", static_cast<long long>(f.skipped_samples));
  add(" elapsed time per iteration (ms): %.1f |", f.elapsed_ms_per_iteration);
  if (f.log_throughput) add(" throughput per GPU (TFLOP/s/GPU): %.1f |", f.tflops_per_gpu);
  if (f.log_throughput && f.op_cal_tflops) {  // MindSpeed's two fields, after the formula's
    add(" actual throughput per GPU (TFLOP/s/GPU): %.1f |", f.actual_tflops_per_gpu);
    add(" actual throughput per GPU with recompute (TFLOP/s/GPU): %.1f |", f.actual_tflops_with_recompute_per_gpu);
  }
  add(" learning rate: %.6E |", f.learning_rate);
  add(" global batch size: %5lld |", static_cast<long long>(f.global_batch_size));
  // Megatron's training_log: every total_loss_dict entry whose average is >= 0.
  for (const auto& [key, value] : f.losses)
    if (value >= 0.0) add(" %s: %.6E |", key.c_str(), value);
  add(" loss scale: %.1f |", f.loss_scale);
  if (f.has_grad_norm) add(" grad norm: %.3f |", f.grad_norm);
  if (f.num_zeros >= 0) add(" num zeros: %lld |", static_cast<long long>(f.num_zeros));
  if (f.params_norm >= 0.0) add(" params norm: %.3f |", f.params_norm);
  add(" number of skipped iterations: %3lld |", static_cast<long long>(f.skipped_iterations));
  add(" number of nan iterations: %3lld |", static_cast<long long>(f.nan_iterations));
  s += f.rl_throughput;
  return s;
}

void add_training_scalars(TensorBoardWriter& w, const TensorBoardTrainingFlags& flags,
                          const TensorBoardTrainingScalars& s) {
  const int64_t it = s.iteration, samples = s.consumed_samples;
  auto both = [&](const std::string& tag, double v) {
    w.add_scalar(tag, v, it);
    w.add_scalar(tag + " vs samples", v, samples);
  };
  if (flags.learning_rate) both("learning-rate", s.learning_rate);
  if (flags.batch_size) both("batch-size", static_cast<double>(s.batch_size));
  both("lm loss", s.lm_loss);
  if (flags.loss_scale) both("loss-scale", s.loss_scale);
  if (flags.world_size) both("world-size", static_cast<double>(s.world_size));
  if (s.has_grad_norm) both("grad-norm", s.grad_norm);
  if (s.num_zeros >= 0) both("num-zeros", static_cast<double>(s.num_zeros));
  if (s.params_norm >= 0.0) both("params-norm", s.params_norm);
  if (flags.memory) {
    w.add_scalar("mem-reserved-bytes", static_cast<double>(s.mem_reserved_bytes), it);
    w.add_scalar("mem-allocated-bytes", static_cast<double>(s.mem_allocated_bytes), it);
    w.add_scalar("mem-max-allocated-bytes", static_cast<double>(s.mem_max_allocated_bytes), it);
    w.add_scalar("mem-allocated-count", static_cast<double>(s.mem_allocated_count), it);
  }
}

void add_validation_scalars(TensorBoardWriter& w, bool ppl, const LossDict& losses, int64_t iteration,
                            int64_t consumed_samples) {
  for (const auto& [key, value] : losses) {
    w.add_scalar(key + " validation", value, iteration);
    w.add_scalar(key + " validation vs samples", value, consumed_samples);
    if (ppl) {
      const double p = std::exp(std::min(20.0, value));
      w.add_scalar(key + " validation ppl", p, iteration);
      w.add_scalar(key + " validation ppl vs samples", p, consumed_samples);
    }
  }
}

std::string format_validation_block(const std::string& prefix, const LossDict& losses) {
  char value_text[32], ppl_text[32];
  std::string line = " validation loss at " + prefix + " | ";
  for (const auto& [key, value] : losses) {
    std::snprintf(value_text, sizeof value_text, "%.6E", value);
    std::snprintf(ppl_text, sizeof ppl_text, "%.6E", std::exp(std::min(20.0, value)));
    line += key + " value: " + value_text + " | " + key + " PPL: " + ppl_text + " | ";
  }
  std::string rule(line.size() + 1, '-');
  return rule + "\n" + line + "\n" + rule;
}

std::string format_validation_block(const std::string& prefix, double lm_loss) {
  return format_validation_block(prefix, LossDict{{"lm loss", lm_loss}});
}

}  // namespace gale
