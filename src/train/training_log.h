// Megatron's console output: the per-interval training log line, the validation block, and
// the FLOPs formula behind "throughput per GPU (TFLOP/s/GPU)".
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/tensorboard_writer.h"

namespace gale {

// Inputs of Megatron's num_floating_point_operations (standard GPT or MoE; no MLA/MTP).
struct FlopsModel {
  int64_t seq_length = 0, num_layers = 0, hidden = 0, heads = 0, query_groups = 0, kv_channels = 0, ffn = 0;
  int64_t padded_vocab = 0;
  bool swiglu = false;
  // --attention-output-gate: linear_qkv's gate rows (Megatron-Core main's gate_projection_size).
  bool attention_output_gate = false;
  // MoE: the layers with experts, each token through `moe_topk` experts of FFN size `moe_ffn` and
  // the shared expert of FFN size `moe_shared_ffn` (0: none).
  int64_t num_moe_layers = 0, moe_ffn = 0, moe_topk = 0, moe_shared_ffn = 0;
  // --mtp-num-layers D: num_layers and num_moe_layers count the D MTP transformer layers too, and
  // the formula adds their norms and eh_proj and D more output-layer products (Megatron's).
  int64_t mtp_num_layers = 0;
  // --is-hybrid-model: Megatron's hybrid_flops instead (attention, MLP and Mamba layers counted
  // from the allocation, its MoE layers ('E') are num_moe_layers; `gqa` = --group-query-attention
  // with query_groups its groups).
  bool hybrid = false;
  bool gqa = false;
  int64_t attention_layers = 0, mlp_layers = 0, mamba_layers = 0;
  int64_t mamba_state_dim = 0, mamba_head_dim = 0, mamba_num_groups = 0;
  // Its Gated DeltaNet layers ('G', Megatron-Core main's gdn_layer_flops): NK key heads of DK, NV
  // value heads of DV, convolution width K (the --linear-* flags).
  int64_t gdn_layers = 0, gdn_key_head_dim = 0, gdn_value_head_dim = 0, gdn_num_key_heads = 0,
          gdn_num_value_heads = 0, gdn_conv_kernel = 0;
  bool gdn_use_gdn2 = false;  // --experimental-attention-variant gdn2: in_proj gives 4·qk + 3·v rows (q, k, v, z, f, b, w)
};

// FLOPs of one forward+backward over `batch_size` sequences (Megatron's formula, §5).
double num_floating_point_operations(const FlopsModel& m, int64_t batch_size);

// An ordered loss dict, (key, value) in the loss function's key order ("lm loss"; --stage dpo:
// "rewards/accuracies", then "lm loss"), as Megatron's training log and evaluation average it.
using LossDict = std::vector<std::pair<std::string, double>>;

struct TrainingLogFields {
  int64_t iteration = 0, train_iters = 0, consumed_samples = 0, skipped_samples = 0;
  // --rl-use-sequence-packing: the bins trained so far, printed after consumed samples when > 0
  // (Megatron's "consumed bins").
  int64_t consumed_bins = 0;
  double elapsed_ms_per_iteration = 0.0;
  bool log_throughput = false;
  double tflops_per_gpu = 0.0;
  // --op-cal-tflops (MindSpeed's TflopsCalculateFeature): with log_throughput, printed after
  // tflops_per_gpu as "actual throughput per GPU (TFLOP/s/GPU)" (the FLOPs the kernels counted,
  // recomputation left out) and "actual throughput per GPU with recompute (TFLOP/s/GPU)".
  bool op_cal_tflops = false;
  double actual_tflops_per_gpu = 0.0, actual_tflops_with_recompute_per_gpu = 0.0;
  // Megatron main prints no decoupled learning rate (--decoupled-lr): its optimizer refactor of
  // November 2025 dropped the field from the line and from TensorBoard.
  double learning_rate = 0.0;
  int64_t global_batch_size = 0;
  // Megatron's total_loss_dict averaged over the interval's advanced iterations, in its order
  // (train/total_loss_dict.h): the loss dict's keys ("lm loss"; --stage dpo: "rewards/accuracies"
  // first; --perform-rl-step's rl/kl_term, ...; --qad-enable's "kl loss"), then the trackers' (the
  // MoE auxiliary losses under their tracker names load_balancing_loss, seq_load_balancing_loss,
  // global_load_balancing_loss and z_loss, mean over the MoE layers without coefficients; "mtp_1
  // loss", "mtp_2 loss", ...; "indexer loss"). Each entry is printed as " key: %.6E |" when its
  // average is >= 0 (so a present zero prints, e.g. lm loss of an interval whose iterations were
  // all skipped); a key that is absent is not printed.
  LossDict losses;
  double loss_scale = 1.0;
  bool has_grad_norm = true;
  double grad_norm = 0.0;
  int64_t num_zeros = -1;      // printed when >= 0 (--log-num-zeros-in-grad)
  double params_norm = -1.0;   // printed when >= 0 (--log-params-norm)
  int64_t skipped_iterations = 0, nan_iterations = 0;
  // --perform-rl-step: Megatron's RL token-throughput fields (" toks/s: N | ..."), appended after
  // the skipped and nan counts as they are (train/grpo.h).
  std::string rl_throughput;
  std::string timestamp;  // "YYYY-mm-dd HH:MM:SS.ffffff" (Megatron main's %f); now when empty
};

// What Megatron's training_log writes to TensorBoard at an iteration that is a multiple of
// --tensorboard-log-interval (values of that iteration, not interval averages).
struct TensorBoardTrainingScalars {
  int64_t iteration = 0, consumed_samples = 0;
  double learning_rate = 0.0;  // no 'decoupled-learning-rate' (Megatron main dropped it)
  int64_t batch_size = 0, world_size = 1;
  double lm_loss = 0.0;  // this iteration's
  double loss_scale = 1.0;
  bool has_grad_norm = true;
  double grad_norm = 0.0;
  int64_t num_zeros = -1;     // written when >= 0 (--log-num-zeros-in-grad)
  double params_norm = -1.0;  // written when >= 0 (--log-params-norm)
  // --log-memory-to-tensorboard: torch.cuda.memory_stats()' reserved_bytes / allocated_bytes
  // (current and peak) / allocation (current count), from Gale's host allocator.
  int64_t mem_reserved_bytes = 0, mem_allocated_bytes = 0, mem_max_allocated_bytes = 0, mem_allocated_count = 0;
};

// Which of them are written (Megatron's --log-*-to-tensorboard flags).
struct TensorBoardTrainingFlags {
  bool learning_rate = true, batch_size = false, loss_scale = true, world_size = false, memory = false;
};

// Adds the scalars in Megatron's order and with its tags ('learning-rate', 'learning-rate vs
// samples', 'batch-size', ..., 'lm loss', 'lm loss vs samples', 'loss-scale', 'world-size',
// 'grad-norm', 'num-zeros', 'params-norm', 'mem-*'): "X vs samples" at step = consumed samples,
// the rest at step = iteration (docs/formats/tensorboard.md).
void add_training_scalars(TensorBoardWriter& w, const TensorBoardTrainingFlags& flags,
                          const TensorBoardTrainingScalars& s);

// evaluate_and_print_results' scalars, for each key: '<key> validation' (and with `ppl` '<key>
// validation ppl', exp(min(20, value))), each also "vs samples" at step = consumed training samples.
void add_validation_scalars(TensorBoardWriter& w, bool ppl, const LossDict& losses, int64_t iteration,
                            int64_t consumed_samples);

// " [2025-05-20 15:48:49.123456] iteration        1/      50 | consumed samples: ... |" exactly as
// Megatron main's training_log.
std::string format_training_log_line(const TrainingLogFields& f);

// The three lines Megatron prints after an evaluation: a dashed rule, " validation loss at
// <prefix> | lm loss value: ... | lm loss PPL: ... | " (each key's value and PPL in turn), and the
// rule again.
std::string format_validation_block(const std::string& prefix, const LossDict& losses);
std::string format_validation_block(const std::string& prefix, double lm_loss);

}  // namespace gale
