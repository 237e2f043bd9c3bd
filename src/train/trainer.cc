// The Megatron training loop.
#include "train/trainer.h"

#include "train/profiler.h"

#include <sys/utsname.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "comm/launcher.h"
#include "core/allocator.h"
#include "core/log.h"
#include "kernels/cpu/fused_ops.h"
#include "kernels/flop_counter.h"
#include "model/context_parallel.h"
#include "model/hybrid_layers.h"
#include "model/hybrid_pattern.h"
#include "model/qk_clip.h"
#include "schedule/schedules.h"
#include "data/pairwise_dataset.h"
#include "train/dpo.h"
#include "train/context_parallel_batch.h"
#include "train/exit_signal.h"
#include "train/ft_integration.h"
#include "train/grad_sync.h"
#include "train/logits_kd_hooks.h"
#include "train/memory_report.h"
#include "train/loss_reduction.h"
#include "train/model_setup.h"
#include "train/param_hash.h"
#include "train/phase_transitions.h"
#include "train/straggler_detector.h"
#include "train/timers_log.h"
#include "train/total_loss_dict.h"

namespace gale {

Trainer::Trainer(const Arguments& args, Engine* engine, const SampleDataset* train, const SampleDataset* valid,
                 const SampleDataset* test)
    : args_(args), engine_(engine), train_(train), valid_(valid), test_(test) {
  const TrainingArgs& t = args_.training;
  train_iters_ = train_iters_from_args(args_);
  StatusOr<NumMicroBatchesCalculator> calculator = num_micro_batches_calculator_from_args(args_);
  GALE_CHECK_OK(calculator.status());  // validated with the flags
  calculator_ = std::move(calculator).value();
  // Rounded down with --decrease-batch-size-if-needed (Megatron evaluates get_num_microbatches()).
  eval_num_microbatches_ = t.global_batch_size / (t.micro_batch_size * engine_->ps.dp_size());
  num_microbatches_ = eval_num_microbatches_;
  const RerunArgs& ra = args_.rerun;
  RerunConfig rc;
  rc.mode = parse_rerun_mode(ra.rerun_mode);
  rc.error_injection_rate = ra.error_injection_rate;
  rc.error_injection_type = parse_rerun_diagnostic(ra.error_injection_type);
  rc.tracker_filename = ra.result_rejected_tracker_filename;
  rc.seed = static_cast<uint64_t>(t.seed);
  // Megatron's node is the host name and its device the GPU; here the rank's index on its node.
  std::string node;
  if (const char* n = std::getenv("GALE_NODE_NAME"); n && *n) node = n;
  else if (utsname u; ::uname(&u) == 0) node = u.nodename;
  Communicator* world = engine_->ps.world().get();
  rerun_ = std::make_unique<RerunStateMachine>(rc, world, node, local_rank_from_launcher(world ? world->rank() : 0));
}

Status Trainer::validate_passes(const ForwardBackwardResult& fb) {
  const RerunArgs& ra = args_.rerun;
  const bool nan_checks = args_.training.check_for_nan_in_loss_and_grad && rerun_->mode() != RerunMode::kDisabled;
  auto is_nan = [](double v) { return std::isnan(v); };
  auto is_inf = [](double v) { return std::isinf(v); };
  // Megatron's loss_func: each micro-batch's local loss (the stage holding the loss).
  for (double loss : fb.micro_batch_loss_sums) {
    if (nan_checks) {
      GALE_RETURN_IF_ERROR(rerun_->validate_result(loss, is_nan, "found NaN in local forward loss calculation", 0.0, true));
      GALE_RETURN_IF_ERROR(rerun_->validate_result(loss, is_inf, "found Inf in local forward loss calculation", 0.0, true));
    }
    if (ra.check_for_spiky_loss) {
      auto spiky = [&](double v) { return rerun_->is_unexpectedly_large(v, 10.0, "loss"); };
      GALE_RETURN_IF_ERROR(rerun_->validate_result(loss, spiky, "Spiky loss", 0.0, false));
    }
  }
  if (!nan_checks && !ra.check_for_large_grads) return Status::Ok();
  // Megatron's gradient buffer check: each chunk's local gradient norm (here after the reduction:
  // a NaN or Inf of any rank's gradients is in it).
  for (size_t c = 0; c < engine_->chunks.size(); ++c) {
    const Tensor& g = engine_->chunks[c]->params().flat_grads();
    // --quant-grads: no flat buffer; the main gradients the optimizer reads, parameter by parameter.
    const double norm = g.defined() ? std::sqrt(fused_sum_of_squares(g.data<float>(), g.numel()))
                                    : std::sqrt(engine_->quant_grads.at(c)->local_sum_of_squares());
    const std::string where = str_cat("model chunk #", c, " after the backward pass");
    if (nan_checks) {
      GALE_RETURN_IF_ERROR(rerun_->validate_result(norm, is_nan, "found NaN in local grad norm for " + where, 0.0, true));
      GALE_RETURN_IF_ERROR(rerun_->validate_result(norm, is_inf, "found Inf in local grad norm for " + where, 0.0, true));
    }
    if (ra.check_for_large_grads) {
      auto large = [&](double v) { return rerun_->is_unexpectedly_large(v, 10.0, "grads"); };
      GALE_RETURN_IF_ERROR(rerun_->validate_result(norm, large, "found unexpected large grads in " + where, 0.0, false));
    }
  }
  return Status::Ok();
}

void Trainer::discard_pass_sums() {
  for (auto& chunk : engine_->chunks) {
    chunk->take_moe_losses();
    chunk->take_mtp_losses();
    chunk->take_dsa_indexer_loss();
    chunk->take_distillation_kl();
    chunk->take_moe_token_counts();
  }
}

void Trainer::reduce_losses(double* sums, int n) const {
  const ParallelState& ps = engine_->ps;
  // Every DP replica of the last stage holds its own micro-batches' sums (the model already summed
  // them over the cp group: every cp rank holds the whole sequences' sums).
  if (ps.dp() && ps.dp()->size() > 1) ps.dp()->all_reduce(sums, n, DType::kF64, ReduceOp::kSum);
  // Other stages learn the loss from the loss stage (for NaN decisions and logs on every rank).
  if (ps.pp_size() > 1) ps.pp()->broadcast(sums, n, DType::kF64, engine_->loss_pipeline_rank());
}

void Trainer::reduce_moe_losses(IterationResult* r) const {
  const ParallelState& ps = engine_->ps;
  const int64_t moe_layers = engine_->chunks.front()->config().num_moe_layers();  // of the whole model
  if (moe_layers == 0) return;  // dense models: no extra collective
  constexpr int n = kMoeAuxKinds + 1;
  double sums[n] = {};  // the load-balancing losses by kind, then the z-loss
  for (auto& chunk : engine_->chunks) {
    const MoeAuxLosses l = chunk->take_moe_losses();
    for (int kind = 0; kind < kMoeAuxKinds; ++kind) sums[kind] += l.balancing(kind);
    sums[kMoeAuxKinds] += l.z;
  }
  if (ps.pp_size() > 1) ps.pp()->all_reduce(sums, n, DType::kF64, ReduceOp::kSum);  // every stage's layers
  if (ps.dp() && ps.dp()->size() > 1) ps.dp()->all_reduce(sums, n, DType::kF64, ReduceOp::kSum);
  const double per = static_cast<double>(num_microbatches_) * static_cast<double>(std::max(1, ps.dp_size())) *
                     static_cast<double>(moe_layers);
  for (int kind = 0; kind < kMoeAuxKinds; ++kind) r->load_balancing_loss[kind] = sums[kind] / per;
  r->z_loss = sums[kMoeAuxKinds] / per;
}

void Trainer::reduce_mtp_losses(IterationResult* r) const {
  const int64_t D = args_.model.mtp_num_layers == kUnset ? 0 : args_.model.mtp_num_layers;
  if (D == 0) return;
  const ParallelState& ps = engine_->ps;
  std::vector<double> sums(static_cast<size_t>(D), 0.0);
  for (auto& chunk : engine_->chunks) {
    const std::vector<double> l = chunk->take_mtp_losses();
    for (size_t k = 0; k < l.size() && k < sums.size(); ++k) sums[k] += l[k];
  }
  // The MTP layers are on the last stage: every stage gets their losses (the others add zeros).
  if (ps.pp_size() > 1) ps.pp()->all_reduce(sums.data(), D, DType::kF64, ReduceOp::kSum);
  if (ps.dp() && ps.dp()->size() > 1) ps.dp()->all_reduce(sums.data(), D, DType::kF64, ReduceOp::kSum);
  const double per = static_cast<double>(num_microbatches_) * static_cast<double>(std::max(1, ps.dp_size()));
  for (double& v : sums) v /= per;
  r->mtp_losses = sums;
}

void Trainer::reduce_dsa_losses(IterationResult* r) const {
  const ModelConfig& c = engine_->chunks.front()->config();
  if (!c.dsa.enabled || !(c.dsa.loss_coeff > 0.0)) return;  // no loss (as Megatron: nothing logged), no collective
  int64_t dsa_layers = 0;      // of the whole model
  for (int64_t l = 0; l < c.num_layers; ++l) dsa_layers += c.is_noop_layer(l) ? 0 : 1;
  const ParallelState& ps = engine_->ps;
  double sum = 0.0;
  for (auto& chunk : engine_->chunks) sum += chunk->take_dsa_indexer_loss();
  if (ps.pp_size() > 1) ps.pp()->all_reduce(&sum, 1, DType::kF64, ReduceOp::kSum);  // every stage's layers
  if (ps.dp() && ps.dp()->size() > 1) ps.dp()->all_reduce(&sum, 1, DType::kF64, ReduceOp::kSum);
  r->indexer_loss = sum / (static_cast<double>(num_microbatches_) * static_cast<double>(std::max(1, ps.dp_size())) *
                           static_cast<double>(std::max<int64_t>(1, dsa_layers)));
}

void Trainer::reduce_qad_losses(IterationResult* r) const {
  if (!args_.qad.qad_enable) return;  // no collective without QAD
  const ParallelState& ps = engine_->ps;
  double sum = 0.0;
  for (auto& chunk : engine_->chunks) sum += chunk->take_distillation_kl();
  if (ps.pp_size() > 1) ps.pp()->all_reduce(&sum, 1, DType::kF64, ReduceOp::kSum);  // the last stage's, everywhere
  if (ps.dp() && ps.dp()->size() > 1) ps.dp()->all_reduce(&sum, 1, DType::kF64, ReduceOp::kSum);
  r->kl_loss = sum / (static_cast<double>(num_microbatches_) * static_cast<double>(std::max(1, ps.dp_size())));
}

Status Trainer::reduce_logits_kd_losses(IterationResult* r) const {
  const LogitsKdArgs& k = args_.logits_kd;
  if (k.logits_save_dir.empty() && k.logits_load_dir.empty()) return Status::Ok();  // no collective
  const ParallelState& ps = engine_->ps;
  Status error = Status::Ok();
  // kd, its tokens, total, its tokens, failed.
  double sums[5] = {0.0, 0.0, 0.0, 0.0, 0.0};
  for (auto& chunk : engine_->chunks) {
    HeadLogitsHook* hook = chunk->head_logits_hook();
    if (hook == nullptr) continue;
    if (Status e = hook->take_error(); !e.ok() && error.ok()) error = e;
    if (auto* kd = dynamic_cast<CachedLogitsKdHook*>(hook)) {
      const CachedLogitsKdHook::Sums s = kd->take_sums();
      sums[0] += s.kd;
      sums[1] += s.kd_tokens;
      sums[2] += s.total;
      sums[3] += s.total_tokens;
    }
  }
  sums[4] = error.ok() ? 0.0 : 1.0;
  // The sums of every TP rank are the same (the KL is all-reduced over TP): summed over CP (each
  // rank's sequence chunk) and DP; over PP the last stage's (the others hold no hook: zeros), so
  // that every rank holds the entries.
  if (ps.dp_cp() && ps.dp_cp()->size() > 1) ps.dp_cp()->all_reduce(sums, 4, DType::kF64, ReduceOp::kSum);
  if (ps.pp_size() > 1 && ps.pp()) ps.pp()->all_reduce(sums, 4, DType::kF64, ReduceOp::kSum);
  ps.world()->all_reduce(&sums[4], 1, DType::kF64, ReduceOp::kMax);
  if (!error.ok()) return error;
  if (sums[4] > 0.0)
    return FailedPrecondition("offline distillation (--logits-save-dir / --logits-load-dir) failed on another rank at iteration ",
                   state_.iteration, "; its error is in that rank's output");
  if (sums[1] > 0.0) r->logits_kd_losses.emplace_back("logits distillation loss", sums[0] / sums[1]);
  if (sums[3] > 0.0) r->logits_kd_losses.emplace_back("total loss", sums[2] / sums[3]);
  return Status::Ok();
}

std::optional<double> Trainer::decoupled_learning_rate() const {
  const TrainingArgs& t = args_.training;
  if (std::isnan(t.decoupled_lr)) return std::nullopt;
  return engine_->scheduler->lr(t.decoupled_lr, std::isnan(t.decoupled_min_lr) ? t.min_lr : t.decoupled_min_lr);
}

FlopsModel Trainer::flops_model() const {
  const ModelArgs& m = args_.model;
  FlopsModel f;
  f.seq_length = m.seq_length;
  f.num_layers = m.num_layers - static_cast<int64_t>(m.noop_layers.size());  // noop layers compute nothing
  f.hidden = m.hidden_size;
  f.heads = m.num_attention_heads;
  f.query_groups = m.group_query_attention ? m.num_query_groups : m.num_attention_heads;
  f.kv_channels = m.kv_channels;
  f.ffn = m.ffn_hidden_size;
  f.padded_vocab = m.padded_vocab_size;
  f.swiglu = m.swiglu;
  f.attention_output_gate = m.attention_output_gate;
  if (m.is_hybrid_model) {
    std::string layers;  // validated at start-up
    GALE_CHECK(allocate_hybrid_layers(m.num_layers, m.hybrid_attention_ratio, m.hybrid_mlp_ratio,
                                      m.hybrid_override_pattern, &layers)
                   .ok());
    // Megatron's get_hybrid_layer_counts: the MTP depths' layers count too.
    if (m.mtp_num_layers != kUnset && m.mtp_num_layers > 0) {
      StatusOr<HybridLayerPattern> parsed = parse_hybrid_layer_pattern(m.hybrid_override_pattern, "");
      if (parsed.ok())
        for (int64_t k = 0; k < parsed->mtp_depths; ++k) layers += parsed->mtp;
    }
    f.hybrid = true;
    f.gqa = m.group_query_attention;
    f.attention_layers = std::count(layers.begin(), layers.end(), '*');
    f.mlp_layers = std::count(layers.begin(), layers.end(), '-');
    f.mamba_layers = std::count(layers.begin(), layers.end(), 'M');
    f.mamba_state_dim = m.mamba_state_dim;
    f.mamba_head_dim = m.mamba_head_dim;
    f.mamba_num_groups = m.mamba_num_groups;
    f.gdn_layers = std::count(layers.begin(), layers.end(), kHybridGatedDeltaNet);
    f.gdn_key_head_dim = m.linear_key_head_dim;
    f.gdn_value_head_dim = m.linear_value_head_dim;
    f.gdn_num_key_heads = m.linear_num_key_heads;
    f.gdn_num_value_heads = m.linear_num_value_heads;
    f.gdn_conv_kernel = m.linear_conv_kernel_dim;
    f.gdn_use_gdn2 = m.experimental_attention_variant == "gdn2";
  }
  if (args_.moe.enabled()) {
    for (size_t i = 0; i < args_.moe.layer_pattern.size(); ++i)  // MoE layers that are not noop layers
      f.num_moe_layers += args_.moe.layer_pattern[i] != 0 &&
                          std::find(m.noop_layers.begin(), m.noop_layers.end(), static_cast<int64_t>(i)) ==
                              m.noop_layers.end();
    f.moe_ffn = args_.moe.moe_ffn_hidden_size;
    f.moe_topk = args_.moe.moe_router_topk;
    if (args_.moe.moe_shared_expert_intermediate_size != kUnset)
      f.moe_shared_ffn = args_.moe.moe_shared_expert_intermediate_size;
    // A hybrid model's MTP depths' 'E' layers (moe.layer_pattern holds the decoder's only).
    if (m.is_hybrid_model && m.mtp_num_layers != kUnset && m.mtp_num_layers > 0) {
      const std::string mtp = hybrid_pattern_mtp_layers(m.hybrid_override_pattern);
      f.num_moe_layers += std::count(mtp.begin(), mtp.end(), kHybridMoe);
    }
  }
  if (m.mtp_num_layers != kUnset) {  // Megatron: each MTP layer is one more layer of the last layer's kind
    f.mtp_num_layers = m.mtp_num_layers;
    f.num_layers += m.mtp_num_layers;
    const bool last_is_moe = !m.is_hybrid_model && args_.moe.enabled() && (args_.moe.layer_pattern.empty() || args_.moe.layer_pattern.back() != 0);
    if (last_is_moe) f.num_moe_layers += m.mtp_num_layers;
  }
  return f;
}

int64_t Trainer::micro_batch_length(const std::vector<TrainingSample>& samples) const {
  const int64_t full = args_.model.seq_length;
  if (!args_.data.variable_seq_lengths) return full;
  int64_t longest = 1;
  for (const TrainingSample& s : samples)
    longest = std::max(longest, s.unpadded_length > 0 ? s.unpadded_length : full);
  // Sequence parallelism splits the micro-batch's positions over the TP ranks.
  const int64_t multiple = args_.parallel.sequence_parallel ? args_.parallel.tensor_model_parallel_size : 1;
  return std::min(full, (longest + multiple - 1) / multiple * multiple);
}

Status Trainer::micro_batch_samples(const SampleDataset& data, int64_t consumed, std::vector<int64_t>* indices,
                                    std::vector<int64_t>* ids) {
  const int64_t mbs = args_.training.micro_batch_size, dp_rank = engine_->ps.coords().dp;
  indices->resize(static_cast<size_t>(mbs));
  ids->resize(static_cast<size_t>(mbs));
  if (args_.data.dataloader_type != "cyclic") {
    for (int64_t b = 0; b < mbs; ++b) (*indices)[b] = (*ids)[b] = consumed + dp_rank * mbs + b;
    return Status::Ok();
  }
  std::unique_ptr<PretrainingRandomSampler>& sampler = samplers_[&data];
  if (!sampler || sampler->total_samples() != data.size()) {  // (a dataset at a reused address)
    RandomSamplerOptions o;
    o.name = &data == train_ ? "train" : &data == valid_ ? "validation" : &data == test_ ? "test" : "evaluation";
    o.total_samples = data.size();
    o.micro_batch_size = mbs;
    o.data_parallel_size = engine_->ps.dp_size();
    o.data_parallel_rank = dp_rank;
    o.data_sharding = args_.data.data_sharding;
    sampler = std::make_unique<PretrainingRandomSampler>(std::move(o));
  }
  int64_t epoch = 0;
  GALE_RETURN_IF_ERROR(sampler->micro_batch(consumed, indices, &epoch));
  for (int64_t b = 0; b < mbs; ++b) (*ids)[b] = epoch * data.size() + (*indices)[b];
  return Status::Ok();
}

Status Trainer::read_skipped_micro_batches(int64_t micro_batches) {
  const int64_t mbs = args_.training.micro_batch_size, dp = engine_->ps.dp_size();
  const int64_t consumed = state_.consumed_train_samples - train_sample_offset_;
  std::vector<int64_t> indices, ids;
  TrainingSample sample;
  for (int64_t m = 0; m < micro_batches; ++m) {
    GALE_RETURN_IF_ERROR(micro_batch_samples(*train_, consumed + m * mbs * dp, &indices, &ids));
    for (int64_t index : indices) {
      if (index >= train_->size())
        return OutOfRange("--iterations-to-skip: the dataset has ", train_->size(), " samples; sample ", index,
                          " was requested");
      GALE_RETURN_IF_ERROR(train_->get(index, &sample));
    }
  }
  return Status::Ok();
}

Status Trainer::load_micro_batch(const SampleDataset& data, const std::vector<int64_t>& indices,
                                 const std::vector<int64_t>& ids, MicroBatch* mb) const {
  const int64_t B = args_.training.micro_batch_size, full = args_.model.seq_length;
  std::vector<TrainingSample> samples(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    int64_t index = indices[b];
    if (index >= data.size())
      return OutOfRange("the dataset has ", data.size(), " samples; sample ", index, " was requested");
    GALE_RETURN_IF_ERROR(data.get(index, &samples[b]));
    if (static_cast<int64_t>(samples[b].tokens.size()) != full)
      return Internal("sample ", index, " has ", samples[b].tokens.size(), " tokens; expected --seq-length ", full);
  }
  const int64_t S = micro_batch_length(samples);
  mb->B = B;
  mb->S = S;
  mb->tokens.resize(B * S);
  mb->labels.resize(B * S);
  mb->loss_mask.resize(B * S);
  mb->position_ids.resize(B * S);
  mb->document_ids.clear();
  // --use-multiparameter-pipeline-model-parallel: the stages after the first take the document ids
  // from the pipeline transfer (schedule/stage_tensors.h); only the first pipeline rank reads them.
  const bool document_ids =
      args_.data.document_attention() && !(engine_->stage_tensors && engine_->ps.coords().pp > 0);
  if (document_ids) mb->document_ids.resize(B * S);
  mb->sample_ids.resize(B);
  for (int64_t b = 0; b < B; ++b) {  // the first S positions of each sample
    const TrainingSample& sample = samples[b];
    std::copy_n(sample.tokens.begin(), S, mb->tokens.begin() + b * S);
    std::copy_n(sample.labels.begin(), S, mb->labels.begin() + b * S);
    std::copy_n(sample.loss_mask.begin(), S, mb->loss_mask.begin() + b * S);
    std::copy_n(sample.position_ids.begin(), S, mb->position_ids.begin() + b * S);
    if (document_ids) std::copy_n(sample.document_ids.begin(), S, mb->document_ids.begin() + b * S);
    mb->sample_ids[b] = ids[b];
  }
  return keep_context_parallel_positions(engine_->ps, S, engine_->chunks.front()->config().common_window(),
                                         engine_->adaptive_cp.get(), mb);
}

Status Trainer::load_pair_micro_batch(const SampleDataset& data, const std::vector<int64_t>& indices,
                                      const std::vector<int64_t>& ids, MicroBatch* mb) const {
  const auto* pairs = dynamic_cast<const PairwiseDataset*>(&data);
  if (!pairs) return FailedPrecondition("--stage dpo: the training data is not a pairwise dataset");
  const int64_t n = static_cast<int64_t>(indices.size()), full = args_.model.seq_length;
  std::vector<TrainingSample> samples(static_cast<size_t>(2 * n));
  for (int64_t i = 0; i < n; ++i) {
    if (indices[i] >= data.size())
      return OutOfRange("the dataset has ", data.size(), " pairs; pair ", indices[i], " was requested");
    GALE_RETURN_IF_ERROR(pairs->get_pair(indices[i], &samples[i], &samples[n + i]));
  }
  const int64_t S = micro_batch_length(samples);
  mb->B = 2 * n;
  mb->S = S;
  mb->S_global = 0;
  mb->tokens.resize(2 * n * S);
  mb->labels.resize(2 * n * S);
  mb->loss_mask.resize(2 * n * S);
  mb->position_ids.resize(2 * n * S);
  mb->document_ids.clear();
  mb->seq_positions.clear();
  mb->key_document_ids.clear();
  mb->sample_ids.resize(2 * n);
  for (int64_t b = 0; b < 2 * n; ++b) {
    const TrainingSample& sample = samples[b];
    if (static_cast<int64_t>(sample.tokens.size()) != full)
      return Internal("a pair sample has ", sample.tokens.size(), " tokens; expected --seq-length ", full);
    std::copy_n(sample.tokens.begin(), S, mb->tokens.begin() + b * S);
    std::copy_n(sample.labels.begin(), S, mb->labels.begin() + b * S);
    std::copy_n(sample.loss_mask.begin(), S, mb->loss_mask.begin() + b * S);
    std::copy_n(sample.position_ids.begin(), S, mb->position_ids.begin() + b * S);
    mb->sample_ids[b] = 2 * ids[b % n] + (b < n ? 0 : 1);
  }
  return keep_context_parallel_positions(engine_->ps, S, engine_->chunks.front()->config().common_window(),
                                         engine_->adaptive_cp.get(), mb);
}

namespace {

DpoOptions dpo_options(const DpoArgs& a) {
  DpoOptions o;
  o.loss_type = a.dpo_loss_type;
  o.beta = a.dpo_beta;
  o.label_smoothing = a.dpo_label_smoothing;
  o.pref_ftx = a.pref_ftx;
  return o;
}

}  // namespace

StatusOr<ForwardBackwardResult> Trainer::dpo_forward_backward_all(int64_t consumed, double* accuracy) {
  const int64_t mbs = args_.training.micro_batch_size, dp = engine_->ps.dp_size();
  std::vector<int64_t> indices, ids;
  auto source = [&](int64_t m, MicroBatch* mb) {
    GALE_RETURN_IF_ERROR(micro_batch_samples(*train_, consumed - train_sample_offset_ + m * mbs * dp, &indices, &ids));
    return load_pair_micro_batch(*train_, indices, ids, mb);
  };
  // The reference model's pass is forward only: no deferred weight gradients, no RiPipe order.
  auto run = [&](const std::vector<GPTModel*>& chunks, bool forward_only, const MicroBatchLoss& loss) {
    return forward_backward(chunks, engine_->ps, num_microbatches_, source, forward_only, {}, microbatch_group(),
                            engine_->timers, engine_->dualpipev, !forward_only && engine_->dualpipev_dw_detach,
                            forward_only ? RiPipe::kNone : engine_->ripipe, engine_->pp_backward,
                            engine_->stage_tensors.get(), loss);
  };
  GALE_ASSIGN_OR_RETURN(const DpoIterationStats st,
                        dpo_iteration(engine_->chunk_pointers(), dpo_reference_, num_microbatches_,
                                      /*forward_only=*/false, dpo_options(args_.dpo), run));
  ForwardBackwardResult fb;
  fb.loss_sum = st.loss_sum;
  fb.tokens = st.micro_batches;
  fb.micro_batch_loss_sums = st.micro_batch_losses;
  // rewards/accuracies: the mean over micro-batches and data-parallel ranks (MindSpeed-LLM averages
  // each micro-batch's over DP, Megatron over the micro-batches), shared from the loss stage.
  double sums[2] = {st.accuracy_sum, st.micro_batches};
  reduce_losses(sums);
  *accuracy = sums[1] > 0.0 ? sums[0] / sums[1] : 0.0;
  return fb;
}

StatusOr<IterationResult> Trainer::train_step() {
  const TrainingArgs& t = args_.training;
  const int64_t mbs = t.micro_batch_size, dp = engine_->ps.dp_size();
  const int64_t consumed = state_.consumed_train_samples;
  const int64_t gbs = calculator_.running_global_batch_size(consumed);  // --decrease-batch-size-if-needed: rounded
  const int64_t skipped = calculator_.global_batch_size(consumed) - gbs;
  GALE_ASSIGN_OR_RETURN(num_microbatches_, calculator_.num_micro_batches(consumed));
  if (t.test_mode) GALE_RETURN_IF_ERROR(run_realtime_tests());
  // --op-cal-tflops: count this step's kernels, as MindSpeed wraps Megatron's train_step.
  if (args_.logging.op_cal_tflops) flop_counter_start();
  SmartSwap* smart_swap = engine_->smart_swap.get();  // --smart-swap: the iteration's bounds
  if (smart_swap) smart_swap->begin_iteration();
  GradScaler* scaler = engine_->grad_scaler.get();  // --fp16
  for (auto& chunk : engine_->chunks) chunk->set_grad_scale(scaler ? scaler->scale() : 1.0f);
  // Megatron's sampler: micro-batch m of this iteration starts after consumed + m·mbs·dp samples
  // (with --dataloader-type single, DP rank r holds samples consumed + m·mbs·dp + r·mbs + [0, mbs)).
  std::vector<int64_t> indices, ids;
  auto source = [&](int64_t m, MicroBatch* mb) {
    GALE_RETURN_IF_ERROR(micro_batch_samples(*train_, consumed - train_sample_offset_ + m * mbs * dp, &indices, &ids));
    return load_micro_batch(*train_, indices, ids, mb);
  };
  Timers* timers = engine_->timers;
  // --logits-save-dir / --logits-load-dir: the head's hooks act in this step's forwards only.
  struct ActiveHooks {
    std::vector<HeadLogitsHook*> hooks;
    ~ActiveHooks() {
      for (HeadLogitsHook* h : hooks) h->set_active(false);
    }
  } active_hooks;
  for (auto& chunk : engine_->chunks)
    if (HeadLogitsHook* h = chunk->head_logits_hook()) active_hooks.hooks.push_back(h);
  for (HeadLogitsHook* h : active_hooks.hooks) h->set_active(true);
  // Megatron's forward-backward covers the schedule and finalize_model_grads.
  ScopedTimer forward_backward_timer = ScopedTimer::level1(timers, "forward-backward");
  ForwardBackwardResult fb;
  double dpo_accuracy = -1.0;
  // Megatron's rerun loop: the passes run once, and again (from the same parameters and samples)
  // when --rerun-mode asks for it (train/rerun_state_machine.h).
  for (bool rerun = false; rerun_->should_run_forward_backward(state_.iteration); rerun = true) {
    if (rerun) discard_pass_sums();
    for (auto& chunk : engine_->chunks) chunk->reset_moe_global_aux();  // global_aux_loss: a step's counts
    if (t.freeze_all_layers) {
      // --freeze-all-layers (Megatron's forward_only train step): the micro-batches forward only, as
      // evaluation runs them (no RiPipe order, no gradients to reduce).
      GALE_ASSIGN_OR_RETURN(fb, forward_backward(engine_->chunk_pointers(), engine_->ps, num_microbatches_, source,
                                                 /*forward_only=*/true, {}, microbatch_group(), timers,
                                                 engine_->dualpipev, false, RiPipe::kNone, engine_->pp_backward,
                                                 engine_->stage_tensors.get()));
      GALE_RETURN_IF_ERROR(validate_passes(fb));
      continue;
    }
    start_grad_sync_iteration(*engine_, num_microbatches_);
    if (args_.dpo.enabled()) {
      GALE_ASSIGN_OR_RETURN(fb, dpo_forward_backward_all(consumed, &dpo_accuracy));
    } else {
      GALE_ASSIGN_OR_RETURN(fb, forward_backward(engine_->chunk_pointers(), engine_->ps, num_microbatches_, source,
                                                 /*forward_only=*/false, {}, microbatch_group(), timers,
                                                 engine_->dualpipev, engine_->dualpipev_dw_detach, engine_->ripipe,
                                                 engine_->pp_backward, engine_->stage_tensors.get()));
    }
    finalize_model_grads(*engine_, t.calculate_per_token_loss ? std::optional<double>(fb.tokens) : std::nullopt);
    GALE_RETURN_IF_ERROR(validate_passes(fb));
  }
  forward_backward_timer.stop();
  IterationResult r;
  r.rerun = rerun_->should_checkpoint_and_exit();
  if (r.rerun.exit) {  // Megatron's train_step returns before the optimizer step
    if (args_.logging.op_cal_tflops) flop_counter_stop();
    return r;
  }
  r.dpo_accuracy = dpo_accuracy;
  // Megatron's all-reduce of the logged loss over DP, shared from the last pipeline stage; with
  // --async-log-allreduce (MindSpeed) only started here and finished after the optimizer step.
  const ParallelState& ps = engine_->ps;
  const bool async_loss = args_.logging.async_log_allreduce;
  Communicator* loss_pp = ps.pp_size() > 1 ? ps.pp().get() : nullptr;
  LossReduction loss = LossReduction::start(ps.dp().get(), fb.loss_sum, fb.tokens, async_loss);
  if (!async_loss) loss.finish(loss_pp, engine_->loss_pipeline_rank());
  reduce_moe_losses(&r);
  reduce_mtp_losses(&r);
  reduce_dsa_losses(&r);
  reduce_qad_losses(&r);
  GALE_RETURN_IF_ERROR(reduce_logits_kd_losses(&r));
  LrScheduler& scheduler = *engine_->scheduler;
  ScopedTimer optimizer_timer = ScopedTimer::level1(timers, "optimizer");
  if (t.freeze_all_layers) {
    // Nothing trains: no optimizer step (Megatron's optimizer holds no parameters), the step counted
    // as applied with no gradient norm (0) and the loss scale kept; the schedule still advances.
    r.step.applied = true;
    if (args_.logging.log_num_zeros_in_grad) r.step.num_zeros = 0;
  } else {
    r.step = optimizer_step(*engine_, scheduler.lr(), scheduler.weight_decay(), args_.logging.log_num_zeros_in_grad,
                            scaler ? scaler->inv_scale() : 1.0f, decoupled_learning_rate());
    if (scaler) scaler->update(/*found_inf=*/!r.step.applied);
  }
  if (args_.model.qk_clip || args_.model.log_max_attention_logit) {
    // Megatron's clip_qk after optimizer.step() (inside its optimizer timer, applied or not): the
    // f32 master values are rescaled before the GEMM copy below is refreshed.
    const ModelArgs& m = args_.model;
    const QkClipOptions o{m.qk_clip, m.qk_clip_alpha, m.qk_clip_threshold};
    for (auto& chunk : engine_->chunks)
      r.max_attention_logit = std::max(r.max_attention_logit, qk_clip_step(*chunk, o, ps.dp_cp().get()));
  }
  {
    // --bf16/--fp16: the GEMM copy of the new weights (Megatron's copy of the main params to the model's).
    const bool half = engine_->chunks.front()->params().has_gemm_copy();
    ScopedTimer copy_timer = ScopedTimer::level1(half ? timers : nullptr, "optimizer-copy-main-to-model-params");
    for (auto& chunk : engine_->chunks) chunk->params().refresh_gemm_copy();
  }
  optimizer_timer.stop();
  if (async_loss) loss.finish(loss_pp, engine_->loss_pipeline_rank());  // the loss is first read after train_step
  r.loss_sum = loss.loss_sum();
  r.tokens = loss.tokens();
  r.loss_scale = scaler ? scaler->scale() : 1.0f;  // as Megatron logs it: after the update
  if (r.step.applied) scheduler.step(gbs);
  r.global_batch_size = gbs;
  if (args_.logging.op_cal_tflops) {
    flop_counter_stop();
    r.flops = flop_counter_counts();
  }
  if (smart_swap && smart_swap->end_iteration()) print_all(" > " + smart_swap->policy()->describe());
  state_.consumed_train_samples += gbs;
  state_.skipped_train_samples += skipped;
  return r;
}

StatusOr<double> Trainer::evaluate(const SampleDataset& data, int64_t* consumed, int64_t iters) {
  GALE_ASSIGN_OR_RETURN(LossDict losses, evaluate_losses(data, consumed, iters));
  return losses.back().second;  // lm loss
}

StatusOr<LossDict> Trainer::evaluate_losses(const SampleDataset& data, int64_t* consumed, int64_t iters) {
  const TrainingArgs& t = args_.training;
  const int64_t mbs = t.micro_batch_size, dp = engine_->ps.dp_size();
  const bool dpo = args_.dpo.enabled();
  double sums[3] = {0.0, 0.0, 0.0};  // loss, tokens (DPO: micro-batches), DPO: accuracy
  for (int64_t it = 0; it < iters; ++it) {
    if (t.test_mode) GALE_RETURN_IF_ERROR(run_realtime_tests());
    const int64_t base = *consumed;
    std::vector<int64_t> indices, ids;
    if (ft_) ft_->on_eval_step_start();
    auto source = [&](int64_t m, MicroBatch* mb) {
      GALE_RETURN_IF_ERROR(micro_batch_samples(data, base + m * mbs * dp, &indices, &ids));
      return dpo ? load_pair_micro_batch(data, indices, ids, mb) : load_micro_batch(data, indices, ids, mb);
    };
    auto run = [&](const std::vector<GPTModel*>& chunks, bool forward_only, const MicroBatchLoss& loss) {
      return forward_backward(chunks, engine_->ps, eval_num_microbatches_, source, forward_only, {},
                              microbatch_group(), nullptr, engine_->dualpipev, false, RiPipe::kNone,
                              engine_->pp_backward, engine_->stage_tensors.get(), loss);
    };
    if (dpo) {  // MindSpeed-LLM: each micro-batch's loss and accuracy, averaged over the micro-batches
      GALE_ASSIGN_OR_RETURN(const DpoIterationStats st,
                            dpo_iteration(engine_->chunk_pointers(), dpo_reference_, eval_num_microbatches_,
                                          /*forward_only=*/true, dpo_options(args_.dpo), run));
      sums[0] += st.loss_sum;
      sums[1] += st.micro_batches;
      sums[2] += st.accuracy_sum;
    } else {
      GALE_ASSIGN_OR_RETURN(ForwardBackwardResult fb, run(engine_->chunk_pointers(), /*forward_only=*/true, {}));
      sums[0] += fb.loss_sum;
      sums[1] += fb.tokens;
    }
    if (ft_) ft_->on_eval_step_end();
    *consumed += eval_num_microbatches_ * mbs * dp;  // --global-batch-size, or rounded down
  }
  reduce_losses(sums, dpo ? 3 : 2);
  const double lm_loss = sums[1] > 0.0 ? sums[0] / sums[1] : 0.0;
  if (!dpo) return LossDict{{"lm loss", lm_loss}};
  return LossDict{{"rewards/accuracies", sums[1] > 0.0 ? sums[2] / sums[1] : 0.0}, {"lm loss", lm_loss}};
}

Status Trainer::evaluate_and_print(const SampleDataset& data, int64_t* consumed, const std::string& prefix,
                                   bool to_tensorboard) {
  GALE_ASSIGN_OR_RETURN(LossDict losses, evaluate_losses(data, consumed, args_.logging.eval_iters));
  if (tensorboard_ && to_tensorboard) {
    add_validation_scalars(*tensorboard_, args_.logging.log_validation_ppl_to_tensorboard, losses, state_.iteration,
                           state_.consumed_train_samples);
    GALE_RETURN_IF_ERROR(flush_tensorboard());
  }
  print_rank_last(format_validation_block(prefix, losses));
  return Status::Ok();
}

Status Trainer::flush_tensorboard() {
  if (wandb_) {  // as TensorBoard: a failed write stops the run
    Status w = wandb_->flush();
    if (!w.ok()) return IOError("--wandb-save-dir: ", w.message());
  }
  if (!tensorboard_) return Status::Ok();
  Status st = tensorboard_->flush();
  if (!st.ok()) return IOError("--tensorboard-dir ", args_.logging.tensorboard_dir, ": ", st.message());
  return Status::Ok();
}

Status Trainer::finish_run() {
  GALE_RETURN_IF_ERROR(flush_tensorboard());
  if (profiler_) GALE_RETURN_IF_ERROR(profiler_->finish(state_.iteration));
  if (ft_) ft_->on_checkpointing_start();
  if (finalize_saves_fn_) GALE_RETURN_IF_ERROR(finalize_saves_fn_(/*blocking=*/true));
  if (ft_) GALE_RETURN_IF_ERROR(ft_->on_checkpointing_end(/*is_async_finalization=*/true));
  return Status::Ok();
}

Status Trainer::run_realtime_tests() {
  finish_param_sync(*engine_);  // the full parameters, also under --overlap-param-gather
  std::vector<const ParamBuffer*> chunks;
  for (const auto& c : engine_->chunks) chunks.push_back(&c->params());
  return check_qk_layernorm_replicas(chunks, engine_->ps.dp(), engine_->ps.tp());
}

Status Trainer::check_weight_hashes() {
  finish_param_sync(*engine_);  // Megatron's disable_forward_pre_hook(param_sync=True)
  std::vector<const ParamBuffer*> chunks;
  for (const auto& c : engine_->chunks) chunks.push_back(&c->params());
  GALE_RETURN_IF_ERROR(check_param_hashes_across_dp_replicas(chunks, engine_->ps.dp(), engine_->ps.expert_dp()));
  engine_->ps.world()->barrier();
  print_rank0(str_cat(">>> Weight hashes match after ", state_.iteration, " iterations..."));
  return Status::Ok();
}

Status Trainer::run() {
  const TrainingArgs& t = args_.training;
  const LoggingArgs& l = args_.logging;
  const bool do_valid = valid_ != nullptr && l.eval_iters > 0;
  const bool do_test = test_ != nullptr && l.eval_iters > 0;
  const FlopsModel flops = flops_model();
  const double start = now_seconds();
  // A checkpoint saved to rerun its next iteration (--rerun-mode validate_results).
  GALE_RETURN_IF_ERROR(rerun_->load_state_dict(state_.rerun_state_machine, "the loaded checkpoint"));
  state_.rerun_state_machine = nullptr;
  double interval_start = start;
  // Accumulators of the current log interval.
  TotalLossDict totals;  // Megatron's total_loss_dict: kept, in its order, for the whole run
  int64_t advanced = 0, skipped = 0, nan_iters = 0, iters_in_interval = 0;
  double flops_since_last_log = 0.0;  // Megatron's num_floating_point_operations_since_last_log_event
  bool saved_at_last_iteration = false, exit_for_duration = false, skipped_at_save_interval = false;
  int64_t last_global_batch_size = calculator_.global_batch_size(state_.consumed_train_samples);
  MemoryReporter memory_reporter(args_, state_.iteration);  // train/memory_report.h
  // Megatron's calculator says when it rounds a global batch size down (at start-up and at each
  // ramp-up step).
  auto say_if_decreased = [&](int64_t global) {
    const int64_t running = calculator_.running_global_batch_size(state_.consumed_train_samples);
    if (running != global)
      print_rank0(str_cat("decreasing batch size from ", global, " to ", running, " to keep divisibility by "
                          "micro_batch_size=", t.micro_batch_size, " * data_parallel_size=", engine_->ps.dp_size()));
  };
  // Megatron's save_checkpoint_and_time: the save timed as save-checkpoint and reported at once
  // (a collective), its duration left out of the log interval's elapsed time.
  auto save_with = [&](const SaveFn& fn, const char* timer_name) -> Status {
    const double save_start = now_seconds();
    ScopedTimer timer(engine_->timers, timer_name, 0);
    if (ft_) ft_->on_checkpointing_start();  // Megatron's save_checkpoint
    GALE_RETURN_IF_ERROR(fn(state_));
    if (ft_) GALE_RETURN_IF_ERROR(ft_->on_checkpointing_end(/*is_async_finalization=*/false));
    timer.stop();
    if (engine_->timers) log_timers(*engine_->timers, {timer_name}, *engine_->ps.world());
    interval_start += now_seconds() - save_start;
    return Status::Ok();
  };
  auto save = [&]() { return save_with(save_fn_, "save-checkpoint"); };
  const int64_t non_persistent_interval = args_.checkpoint.non_persistent_save_interval;
  if (!t.skip_train) say_if_decreased(last_global_batch_size);
  if (t.skip_train) print_rank0("skipping training (--skip-train is on) ...");
  if (t.test_mode)
    print_rank0("--test-mode: before every training and evaluation iteration the --qk-layernorm parameters are "
                "compared across the data- and tensor-parallel ranks");
  const int64_t hash_interval = t.check_weight_hash_across_dp_replicas_interval;
  // Megatron checks the hashes before the first iteration too.
  if (!t.skip_train && hash_interval != kUnset) GALE_RETURN_IF_ERROR(check_weight_hashes());
  // Megatron's train() prints this after starting its interval timer, before its loop.
  if (!t.skip_train && train_iters_ > 0) print_datetime("before the start of training step");
  while (!t.skip_train && state_.iteration < train_iters_) {
    // Megatron's maybe_finalize_async_save(blocking=False): the previous --async-save, if written.
    // --enable-ft-package: inside "checkpointing" whether or not a save is in flight, as Megatron.
    if (ft_) ft_->on_checkpointing_start();
    if (finalize_saves_fn_) GALE_RETURN_IF_ERROR(finalize_saves_fn_(/*blocking=*/false));
    if (ft_) GALE_RETURN_IF_ERROR(ft_->on_checkpointing_end(/*is_async_finalization=*/true));
    // Megatron checkpoints the iterations before a ramp-up step of the batch size.
    const int64_t global_batch_size = calculator_.global_batch_size(state_.consumed_train_samples);
    if (global_batch_size != last_global_batch_size) {
      print_rank0(str_cat("ramping up batch size from ", last_global_batch_size, " to ", global_batch_size));
      say_if_decreased(global_batch_size);
      if (state_.iteration != 0 && save_fn_ && !saved_at_last_iteration) GALE_RETURN_IF_ERROR(save());
    }
    last_global_batch_size = global_batch_size;
    // --iterations-to-skip (Megatron): the iteration draws its global batch (consumed samples
    // advance by it, so the next iteration sees the next batch, and it counts as skipped samples)
    // and runs nothing: no forward, backward or optimizer step, no scheduler step, no FLOPs, no log
    // line, evaluation, checkpoint or exit check.
    const std::vector<int64_t>& to_skip = t.iterations_to_skip;
    if (std::find(to_skip.begin(), to_skip.end(), state_.iteration) != to_skip.end()) {
      GALE_ASSIGN_OR_RETURN(const int64_t micro_batches, calculator_.num_micro_batches(state_.consumed_train_samples));
      if (args_.data.fim_data) GALE_RETURN_IF_ERROR(read_skipped_micro_batches(micro_batches));
      const int64_t batch = micro_batches * t.micro_batch_size * engine_->ps.dp_size();
      ++state_.iteration;
      state_.consumed_train_samples += batch;
      state_.skipped_train_samples += batch;
      saved_at_last_iteration = false;
      // Megatron's final save is for an iteration that is not a multiple of --save-interval.
      skipped_at_save_interval =
          args_.checkpoint.save_interval > 0 && state_.iteration % args_.checkpoint.save_interval == 0;
      continue;
    }
    skipped_at_save_interval = false;
    const double step_start = now_seconds();
    if (profiler_) profiler_->before_step(state_.iteration);
    if (ft_) ft_->on_training_step_start(state_.iteration + 1);
    GALE_ASSIGN_OR_RETURN(IterationResult r, train_step());
    if (ft_) ft_->on_training_step_end();
    if (r.rerun.exit) {  // --rerun-mode validate_results: the iteration's start saved, then exit
      state_.rerun_state_machine = rerun_->state_dict();  // collective
      if (r.rerun.checkpoint && save_fn_) GALE_RETURN_IF_ERROR(save());
      if (r.rerun.checkpoint && !save_fn_)
        print_rank0("WARNING: no --save directory: the iteration to rerun cannot be checkpointed");
      state_.rerun_state_machine = nullptr;
      exit_code_ = r.rerun.exit_code;
      print_datetime(str_cat("exiting program at iteration ", state_.iteration, " with exit code ", exit_code_,
                             " (--rerun-mode validate_results)"));
      return finish_run();
    }
    ++state_.iteration;
    if (profiler_) GALE_RETURN_IF_ERROR(profiler_->after_step(state_.iteration));
    if (step_observer_) step_observer_(state_.iteration, now_seconds() - step_start);
    ++iters_in_interval;
    const double flops_per_iteration = num_floating_point_operations(flops, r.global_batch_size);
    state_.floating_point_operations_so_far += flops_per_iteration;
    flops_since_last_log += flops_per_iteration;
    const double loss = r.tokens > 0.0 ? r.loss_sum / r.tokens : 0.0;
    // The loss dict of the iteration (summed when it advanced), then the trackers' values (summed
    // every iteration), as Megatron's training_log.
    LossDict loss_dict;
    if (args_.dpo.enabled()) loss_dict.emplace_back("rewards/accuracies", r.dpo_accuracy);
    loss_dict.emplace_back("lm loss", loss);
    for (const auto& entry : r.logits_kd_losses) loss_dict.push_back(entry);
    if (r.kl_loss >= 0.0) loss_dict.emplace_back("kl loss", r.kl_loss);
    totals.add_loss_dict(loss_dict, r.step.applied);
    LossDict tracked;
    if (args_.moe.enabled()) {  // Megatron's MoE tracker: the selected load-balancing types, then z_loss
      // Megatron's tracker adds every iteration's forward values, an fp16-skipped one's too.
      for (int kind : moe_tracked_aux_kinds(args_.moe.moe_router_load_balancing_type,
                                            args_.moe.moe_router_load_balancing_types))
        tracked.emplace_back(kMoeAuxLossNames[kind], r.load_balancing_loss[kind]);
      if (!unset(args_.moe.moe_z_loss_coeff)) tracked.emplace_back("z_loss", r.z_loss);
    }
    for (size_t k = 0; k < r.mtp_losses.size(); ++k) tracked.emplace_back(str_cat("mtp_", k + 1, " loss"), r.mtp_losses[k]);
    if (r.indexer_loss >= 0.0) tracked.emplace_back("indexer loss", r.indexer_loss);
    totals.add_tracked(tracked);
    if (r.step.applied) {
      ++advanced;
    } else {
      ++skipped;
      // Megatron counts a skipped iteration as a NaN one when its loss is not finite. Under --fp16
      // an overflowing gradient is the loss scaler's routine signal, not a NaN; without loss
      // scaling a non-finite gradient is one.
      if (!std::isfinite(loss) || (!engine_->grad_scaler && !std::isfinite(r.step.grad_norm))) ++nan_iters;
      if (t.check_for_nan_in_loss_and_grad)
        return InvalidArgument("found NaN or inf in the gradients at iteration ", state_.iteration,
                               " (grad norm ", r.step.grad_norm, ", loss ", loss,
                               "); lower --lr or use --no-check-for-nan-in-loss-and-grad to skip such iterations");
    }
    const bool log_due = state_.iteration % l.log_interval == 0;
    // Megatron's fp16 optimizer returns no gradient norm for a skipped (overflowed) iteration.
    const bool has_grad_norm = r.step.applied || !engine_->grad_scaler;
    // TensorBoard's iterations are the same on every rank (the params norm is a collective).
    const bool tensorboard_due = !l.tensorboard_dir.empty() && state_.iteration % l.tensorboard_log_interval == 0;
    const double params_norm =
        l.log_params_norm && (log_due || tensorboard_due) ? engine_->optimizer->params_norm() : -1.0;
    if (tensorboard_ && tensorboard_due) {
      TensorBoardTrainingScalars s;
      s.iteration = state_.iteration;
      s.consumed_samples = state_.consumed_train_samples;
      // --freeze-all-layers: 0, as Megatron logs it (its optimizer has no parameter group).
      s.learning_rate = args_.training.freeze_all_layers ? 0.0 : engine_->scheduler->lr();
      s.batch_size = r.global_batch_size;
      s.world_size = engine_->ps.world_size();
      s.lm_loss = loss;
      s.grad_norm = r.step.grad_norm;
      s.has_grad_norm = has_grad_norm;
      s.loss_scale = r.loss_scale;
      s.num_zeros = has_grad_norm ? r.step.num_zeros : -1;
      s.params_norm = params_norm;
      const Allocator& a = host_allocator();
      s.mem_reserved_bytes = a.reserved_bytes();
      s.mem_allocated_bytes = a.current_bytes();
      s.mem_max_allocated_bytes = a.peak_bytes();
      s.mem_allocated_count = a.live_allocations();
      TensorBoardTrainingFlags flags;
      flags.learning_rate = l.log_learning_rate_to_tensorboard;
      flags.batch_size = l.log_batch_size_to_tensorboard;
      flags.loss_scale = l.log_loss_scale_to_tensorboard;
      flags.world_size = l.log_world_size_to_tensorboard;
      flags.memory = l.log_memory_to_tensorboard;
      add_training_scalars(*tensorboard_, flags, s);
      if (args_.model.log_max_attention_logit)  // Megatron's: after the memory scalars
        tensorboard_->add_scalar("max_attention_logit", r.max_attention_logit, state_.iteration);
    }
    if (tensorboard_ && args_.moe.enabled()) {  // Megatron's MoE tracker: every iteration
      for (int kind : moe_tracked_aux_kinds(args_.moe.moe_router_load_balancing_type,
                                            args_.moe.moe_router_load_balancing_types))  // the line's names
        tensorboard_->add_scalar(kMoeAuxLossNames[kind], r.load_balancing_loss[kind], state_.iteration);
      if (!unset(args_.moe.moe_z_loss_coeff)) tensorboard_->add_scalar("z_loss", r.z_loss, state_.iteration);
    }
    if (tensorboard_ && tensorboard_due && r.dpo_accuracy >= 0.0)  // Megatron writes every loss-dict key
      tensorboard_->add_scalar("rewards/accuracies", r.dpo_accuracy, state_.iteration);
    if (tensorboard_ && r.indexer_loss >= 0.0)  // Megatron's DSA indexer-loss tracker: every iteration
      tensorboard_->add_scalar("indexer loss", r.indexer_loss, state_.iteration);
    if (tensorboard_ && tensorboard_due && r.kl_loss >= 0.0)  // a loss-dict key, like lm loss
      tensorboard_->add_scalar("kl loss", r.kl_loss, state_.iteration);
    if (tensorboard_ && tensorboard_due)  // --logits-load-dir's loss-dict keys, like lm loss
      for (const auto& [name, value] : r.logits_kd_losses) tensorboard_->add_scalar(name, value, state_.iteration);
    if (tensorboard_)  // Megatron's MTP tracker: every iteration
      for (size_t k = 0; k < r.mtp_losses.size(); ++k)
        tensorboard_->add_scalar(str_cat("mtp_", k + 1, " loss"), r.mtp_losses[k], state_.iteration);
    if (log_due) {
      const double now = now_seconds();
      const double per_iter = (now - interval_start) / static_cast<double>(iters_in_interval);
      TrainingLogFields f;
      f.iteration = state_.iteration;
      f.train_iters = train_iters_;
      f.consumed_samples = state_.consumed_train_samples;
      f.skipped_samples = state_.skipped_train_samples;
      f.elapsed_ms_per_iteration = per_iter * 1000.0;
      f.log_throughput = l.log_throughput;
      f.tflops_per_gpu = flops_per_iteration / (per_iter * 1e12 * static_cast<double>(engine_->ps.world_size()));
      if (l.log_throughput && l.op_cal_tflops) {
        // MindSpeed's: the logged iteration's counts summed over every rank, per rank and second.
        int64_t counts[2] = {r.flops.model, r.flops.with_recompute};
        engine_->ps.world()->all_reduce(counts, 2, DType::kI64, ReduceOp::kSum);
        const double per_gpu = per_iter * 1e12 * static_cast<double>(engine_->ps.world_size());
        f.op_cal_tflops = true;
        f.actual_tflops_per_gpu = static_cast<double>(counts[0]) / per_gpu;
        f.actual_tflops_with_recompute_per_gpu = static_cast<double>(counts[1]) / per_gpu;
      }
      f.learning_rate = args_.training.freeze_all_layers ? 0.0 : engine_->scheduler->lr();  // as above
      f.global_batch_size = r.global_batch_size;
      f.losses = totals.averages(advanced);
      f.grad_norm = r.step.grad_norm;
      f.has_grad_norm = has_grad_norm;
      f.loss_scale = r.loss_scale;
      f.num_zeros = has_grad_norm ? r.step.num_zeros : -1;
      f.params_norm = params_norm;
      f.skipped_iterations = skipped;
      f.nan_iterations = nan_iters;
      if (tensorboard_ && l.log_timers_to_tensorboard) {
        tensorboard_->add_scalar("iteration-time", per_iter, state_.iteration);
        if (l.log_throughput) tensorboard_->add_scalar("throughput", f.tflops_per_gpu, state_.iteration);
      } else if (wandb_ && l.log_timers_to_tensorboard) {  // Megatron logs these two to W&B without TensorBoard too
        wandb_->log("iteration-time", per_iter, state_.iteration);
        if (l.log_throughput) wandb_->log("throughput", f.tflops_per_gpu, state_.iteration);
      }
      // Megatron's timers of --timing-log-level, per iteration of the log interval (one collective
      // over the world group; none at level 0): written to TensorBoard, then printed after the line.
      GatheredTimes timer_times;
      if (engine_->timers) {
        timer_times = gather_timers(*engine_->timers, training_timer_names(engine_->timers->log_level()),
                                    *engine_->ps.world(), /*reset=*/true);
        if (l.log_timers_to_tensorboard)
          write_timers(timer_times, tensorboard_, state_.iteration, static_cast<double>(l.log_interval));
      }
      GALE_RETURN_IF_ERROR(flush_tensorboard());
      if (profiler_) GALE_RETURN_IF_ERROR(profiler_->at_log(state_.iteration));
      print_rank_last(format_training_log_line(f));
      GALE_RETURN_IF_ERROR(memory_reporter.after_log_line(state_.iteration, engine_->ps.world()->rank(),
                                                          engine_->ps.coords().dp, num_microbatches_));
      if (engine_->timers) print_timers(*engine_->timers, timer_times, static_cast<double>(l.log_interval));
      if (straggler_)
        for (const std::string& line : straggler_->report(flops_since_last_log, l.log_interval)) print_rank0(line);
      flops_since_last_log = 0.0;
      totals.reset();
      advanced = skipped = nan_iters = iters_in_interval = 0;
      interval_start = now;
    }
    if (do_valid && state_.iteration % l.eval_interval == 0)
      GALE_RETURN_IF_ERROR(
          evaluate_and_print(*valid_, &state_.consumed_valid_samples, str_cat("iteration ", state_.iteration), true));
    // Megatron's post_training_step_callbacks.
    if (hash_interval != kUnset && state_.iteration % hash_interval == 0) GALE_RETURN_IF_ERROR(check_weight_hashes());
    // Megatron's checkpoint_and_decide_exit: SIGTERM first, then the regular save, then the
    // duration and iteration limits. The signal and the duration are decided by all ranks together
    // (one all-reduce), so every rank stops at the same iteration.
    saved_at_last_iteration = false;
    if (t.exit_signal_handler || !unset(t.exit_duration_in_mins)) {
      int64_t exits[2] = {t.exit_signal_handler && exit_signal_received() ? 1 : 0,
                          !unset(t.exit_duration_in_mins) && (now_seconds() - start) / 60.0 > t.exit_duration_in_mins};
      const Comm& world = engine_->ps.world();
      if (world->size() > 1) world->all_reduce(exits, 2, DType::kI64, ReduceOp::kMax);
      if (exits[0]) {
        if (save_fn_) GALE_RETURN_IF_ERROR(save());
        print_datetime("exiting program after receiving SIGTERM.");
        return finish_run();
      }
      exit_for_duration = exits[1] != 0;
    }
    bool saved_non_persistent = false;
    if (save_fn_ && args_.checkpoint.save_interval > 0 && state_.iteration % args_.checkpoint.save_interval == 0) {
      GALE_RETURN_IF_ERROR(save());
      saved_at_last_iteration = true;
    } else if (non_persistent_save_fn_ && non_persistent_interval > 0 &&
               state_.iteration % non_persistent_interval == 0) {
      GALE_RETURN_IF_ERROR(save_with(non_persistent_save_fn_, "save-checkpoint-non-persistent"));
      saved_non_persistent = true;
    }
    if (exit_for_duration) {
      if (save_fn_ && !saved_at_last_iteration && !saved_non_persistent) GALE_RETURN_IF_ERROR(save());
      print_datetime(str_cat("exiting program after ", (now_seconds() - start) / 60.0, " minutes"));
      return finish_run();
    }
    if ((t.exit_interval > 0 && state_.iteration % t.exit_interval == 0) ||
        is_phase_transition(args_.data.phase_transitions, state_.iteration)) {  // --phase-transition-iterations
      if (save_fn_ && !saved_at_last_iteration && !saved_non_persistent) GALE_RETURN_IF_ERROR(save());
      print_datetime(str_cat("exiting program at iteration ", state_.iteration));
      return finish_run();
    }
  }
  // Megatron's pretrain: after train() returns (not after an exit inside it), before the final save.
  if (!t.skip_train) print_datetime("after training is done");
  if (save_fn_ && !t.skip_train && state_.iteration > 0 && !saved_at_last_iteration && !skipped_at_save_interval)
    GALE_RETURN_IF_ERROR(save());
  // Megatron writes the final evaluations to TensorBoard unless --skip-train (the test set's under
  // the same 'lm loss validation' tags).
  if (do_valid)
    GALE_RETURN_IF_ERROR(evaluate_and_print(*valid_, &state_.consumed_valid_samples,
                                            str_cat("iteration ", state_.iteration, " on validation set"),
                                            !t.skip_train));
  if (do_test) {
    int64_t consumed_test = 0;
    GALE_RETURN_IF_ERROR(evaluate_and_print(*test_, &consumed_test, str_cat("iteration ", state_.iteration, " on test set"),
                                            !t.skip_train));
  }
  return finish_run();
}

}  // namespace gale
