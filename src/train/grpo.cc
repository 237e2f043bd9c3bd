// Online GRPO: rollout collections, old and reference log-probabilities, and the optimizer steps over them (train/grpo.h).
#include "train/grpo.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>

#include "core/check.h"
#include "core/log.h"
#include "model/context_parallel.h"
#include "model/lora.h"
#include "schedule/schedules.h"
#include "train/checkpointing.h"
#include "train/context_parallel_batch.h"
#include "train/grad_sync.h"
#include "train/grpo_eval.h"
#include "train/grpo_packing.h"
#include "train/grpo_refit.h"
#include "train/memory_report.h"
#include "train/model_setup.h"
#include "train/total_loss_dict.h"
#include "train/training_log.h"

namespace gale {

MicroBatch grpo_micro_batch(const GrpoRollouts& rollouts, int64_t first, int64_t n, int32_t pad, int64_t id0) {
  return grpo_rows_micro_batch(grpo_unpacked_rows(rollouts, 1, 0), first, n, pad, id0);
}

void grpo_mtp_loss_mask(MicroBatch* mb) {
  const bool packed = mb->packed_sequences && !mb->document_ids.empty();
  for (int64_t b = 0; b < mb->B; ++b)
    for (int64_t s = 0; s < mb->S; ++s) {
      const int64_t t = b * mb->S + s;
      const bool label = s + 1 < mb->S && (!packed || mb->document_ids[t + 1] == mb->document_ids[t]);
      mb->loss_mask[t] = label ? 1.0f : 0.0f;
    }
}

std::vector<double> grpo_token_logprobs(GPTModel& model, const MicroBatch& mb) {
  model.set_num_microbatches(0);
  GPTModel::LossSums sums;
  model.forward(0, mb, Tensor(), /*training=*/false, &sums);
  std::vector<double> lp(sums.token_losses.size());
  for (size_t i = 0; i < lp.size(); ++i) lp[i] = -sums.token_losses[i];
  return lp;
}

std::vector<double> grpo_whole_logprobs(const GPTModel::LossSums& sums, int64_t B, int64_t S,
                                        const std::vector<int32_t>& positions, const Comm& cp) {
  const int64_t Sl = static_cast<int64_t>(positions.size());
  GALE_CHECK_EQ(static_cast<int64_t>(sums.token_losses.size()), B * Sl);
  std::vector<double> whole(static_cast<size_t>(B * S), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < Sl; ++s) whole[b * S + positions[s]] = -sums.token_losses[b * Sl + s];
  if (cp && cp->size() > 1) cp->all_reduce(whole.data(), B * S, DType::kF64, ReduceOp::kSum);  // one writer each
  return whole;
}

GrpoMicroBatchLoss grpo_scale_policy_loss(GPTModel& policy, int64_t mb_id, const std::vector<float>& mask, int64_t B,
                                          int64_t S, const GPTModel::LossSums& sums, const std::vector<double>& old,
                                          const std::vector<double>& ref, const std::vector<double>& advantages,
                                          const GrpoLossOptions& o, const std::vector<double>& inference,
                                          const std::vector<int32_t>& positions, const Comm& cp) {
  std::vector<int32_t> all;
  const std::vector<int32_t>* pos = &positions;
  if (positions.empty()) {  // the whole rows
    all.resize(static_cast<size_t>(S));
    for (int64_t s = 0; s < S; ++s) all[static_cast<size_t>(s)] = static_cast<int32_t>(s);
    pos = &all;
  }
  const std::vector<double> current = grpo_whole_logprobs(sums, B, S, *pos, cp);
  GrpoMicroBatchLoss loss = grpo_micro_batch_loss(current, old, ref, advantages, mask, B, S, 1, o, inference);
  // ℓ = −log p: the per-token loss gradient is −d loss / d log p (0 where the mask is), at this
  // rank's positions.
  const int64_t Sl = static_cast<int64_t>(pos->size());
  std::vector<float> weight(static_cast<size_t>(B * Sl));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < Sl; ++s) weight[b * Sl + s] = static_cast<float>(-loss.grad[b * S + (*pos)[s]]);
  policy.scale_loss_mask_tokens(mb_id, weight);
  return loss;
}

GrpoMicroBatchLoss grpo_forward_backward(GPTModel& policy, const MicroBatch& mb, int64_t mb_id,
                                         const std::vector<double>& old, const std::vector<double>& ref,
                                         const std::vector<double>& advantages, const GrpoLossOptions& o,
                                         const std::vector<double>& inference) {
  policy.set_num_microbatches(0);  // the loss gradient is known after the forward (no eager LM-head backward)
  GPTModel::LossSums sums;
  policy.forward(mb_id, mb, Tensor(), /*training=*/true, &sums);
  GrpoMicroBatchLoss loss =
      grpo_scale_policy_loss(policy, mb_id, mb.loss_mask, mb.B, mb.S, sums, old, ref, advantages, o, inference);
  policy.backward(mb_id, Tensor(), 1.0f);
  return loss;
}

namespace {

// A [rows, S] slice of per-row arrays.
std::vector<double> rows_of(const std::vector<double>& v, int64_t first, int64_t n, int64_t S) {
  return std::vector<double>(v.begin() + first * S, v.begin() + (first + n) * S);
}

// Every parameter value of `from` into `to` (`to` has `from`'s parameters by name and local shape,
// less LoRA adapters; neither sharded nor split: one virtual stage's chunk of each), its GEMM copy
// refreshed. `from`'s values must be whole on this rank (not ZeRO-3's shards: the caller copies from
// the rollout model then); split storage (--reuse-fp32-param) is merged; a LoRA-adapted weight is
// copied merged, W + s·B·A (each rank its shards: B split like W's output rows, A like its input
// columns, model/lora.h).
Status copy_weights(const GPTModel& from, GPTModel& to) {
  const ParamBuffer& a = from.params();
  ParamBuffer& b = to.params();
  if (a.values_sharded() || b.sharded())
    return Internal("the GRPO reference model's weights are copied from sharded parameters");
  const LoraConfig& lora = from.config().lora;
  int adapters = 0;
  for (int id = 0; id < b.size(); ++id) {
    const ParamSpec& sb = b.spec(id);
    const int ia = a.find(sb.name);
    if (ia < 0 || a.spec(ia).local_numel() != sb.local_numel())
      return Internal("the GRPO reference model's parameter ", sb.name, " differs from the policy's");
    const Tensor v = a.param_values(ia);
    const std::string suffix = ".weight";
    const bool weight = sb.name.size() > suffix.size() &&
                        sb.name.compare(sb.name.size() - suffix.size(), suffix.size(), suffix) == 0;
    const int la = lora.enabled() && weight ? a.find(lora_a_name(sb.name)) : -1;
    if (la < 0) {
      b.set_param_values(id, v.data<float>());
      continue;
    }
    const int lb = a.find(lora_b_name(sb.name));
    const Shape sa = a.spec(la).local_shape(), sbb = a.spec(lb).local_shape();
    Tensor w = v.clone();
    LoraWeights l;
    l.a = a.param_data(la);
    l.b = a.param_data(lb);
    l.r = sa[0];
    l.in = sa[1];
    l.out = sbb[0];
    l.scaling = lora.scaling();
    GALE_CHECK_EQ(l.out * l.in, sb.local_numel());
    lora_merge(w.data<float>(), l);
    b.set_param_values(id, w.data<float>());
    adapters += 2;
  }
  if (a.size() != b.size() + adapters)
    return Internal("the GRPO reference model has ", b.size(), " parameters, the policy ", a.size(), " (", adapters,
                    " LoRA adapter factors)");
  return Status::Ok();
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// Megatron's log_rl_throughput_metrics fields: `batch` rollouts × --seq-length tokens over the
// interval's mean iteration time, per second and per process; packed, this rank's bins' positions
// (compute) and rollout tokens (actual) times DP, the collection's tokens over every rank's bin
// positions (packing_eff) and its mean rollout length (avg_seq_len, also printed unpacked with
// --log-throughput as --seq-length).
std::string rl_throughput_fields(int64_t batch, int64_t S, double seconds, int64_t world, int64_t dp,
                                 const GrpoTrainingRows& rows, bool packed, int64_t collection_rows,
                                 bool log_throughput) {
  const double per_second = static_cast<double>(batch * S) / seconds;
  std::string f = str_cat(" toks/s: ", fixed(per_second, 0), " | toks/s/gpu: ",
                          fixed(per_second / static_cast<double>(world), 0), " |");
  if (packed) {
    const double compute = static_cast<double>(rows.rows * S * dp) / seconds;
    const double actual = static_cast<double>(rows.rank_tokens * dp) / seconds;
    const double capacity = static_cast<double>(rows.rows * S * dp);
    const double efficiency = capacity > 0.0 ? static_cast<double>(rows.collection_tokens) / capacity : 0.0;
    f += str_cat(" compute_toks/s: ", fixed(compute, 0), " | compute_toks/s/gpu: ",
                 fixed(compute / static_cast<double>(world), 0), " | actual_toks/s: ", fixed(actual, 0),
                 " | actual_toks/s/gpu: ", fixed(actual / static_cast<double>(world), 0), " | packing_eff: ",
                 fixed(100.0 * efficiency, 1), "% |");
    f += str_cat(" avg_seq_len: ",
                 fixed(static_cast<double>(rows.collection_tokens) / static_cast<double>(collection_rows), 1), " |");
  } else if (log_throughput) {
    f += str_cat(" avg_seq_len: ", S, " |");
  }
  return f;
}

}  // namespace

Status run_grpo(const Arguments& args, const GrpoArgs& g, Engine& engine, const std::vector<GPTModel*>& reference,
                const Tokenizer& tokenizer, const RlEnvironment& env, TrainerState* state, const GrpoSaves& saves) {
  const GrpoSaveFn& save = saves.save;
  const std::vector<GPTModel*> chunks = engine.chunk_pointers();  // this rank's virtual stages
  if (reference.size() != chunks.size())
    return Internal("the GRPO reference model has ", reference.size(), " chunks on this rank, the policy ", chunks.size());
  GPTModel& policy = *chunks.front();  // the chunk whose settings stand for all (grad scale, config)
  // Rollouts and evaluation samples come from the policy itself or, at TP, PP (virtual stages,
  // DualPipeV) or CP > 1 and under ZeRO-2/3 and FSDP, its whole-model copy refit before each use
  // (train/grpo_refit.h).
  GrpoRolloutModel rollout_model(chunks, engine.ps.world(), &engine.ops);
  const std::string& pretrained = args.checkpoint.pretrained_checkpoint;
  if (pretrained.empty() && policy.params().sharded()) {
    // ZeRO-2/3, FSDP (data parallelism only, one chunk: the reference's partition is the whole
    // model's): the shards gathered into the rollout copy, and from it into the reference.
    if (chunks.size() != 1) return Internal("the GRPO policy has sharded parameters in ", chunks.size(), " chunks");
    GALE_RETURN_IF_ERROR(rollout_model.refit());
    GALE_RETURN_IF_ERROR(copy_weights(rollout_model.model(), *reference.front()));
  } else if (pretrained.empty()) {
    for (size_t c = 0; c < chunks.size(); ++c) GALE_RETURN_IF_ERROR(copy_weights(*chunks[c], *reference[c]));
  } else {  // Megatron: the reference weights come from --pretrained-checkpoint
    GALE_RETURN_IF_ERROR(load_model_weights("--pretrained-checkpoint", pretrained, reference, "GRPO reference model"));
    print_rank0(str_cat(" > GRPO reference model loaded from --pretrained-checkpoint ", pretrained));
  }
  const TrainingArgs& t = args.training;
  const int64_t S = args.model.seq_length, mbs = t.micro_batch_size, gbs = t.global_batch_size;
  const int64_t dp = engine.ps.dp_size(), dp_rank = engine.ps.coords().dp;
  const int64_t R = g.grpo_prompts_per_step * g.grpo_group_size;
  if (R % (mbs * dp) != 0 || gbs % (mbs * dp) != 0)
    return InvalidArgument("--global-batch-size ", gbs, " and --grpo-prompts-per-step x --grpo-group-size ", R,
                           ": expected multiples of --micro-batch-size x data-parallel size = ", mbs * dp);
  const int64_t steps_per_collection = g.grpo_iterations * (R / gbs);
  GrpoPackingOptions packing;
  packing.enabled = g.rl_use_sequence_packing;
  packing.max_sequences_per_bin = g.rl_sequence_packing_max_sequences_per_bin;
  packing.algo = g.rl_sequence_packing_algo;
  packing.seq_length_multiple = engine.ps.cp_size() > 1 ? 2 * engine.ps.cp_size() : 1;
  const int32_t pad = tokenizer.pad() >= 0 ? tokenizer.pad() : tokenizer.eod();
  if (tokenizer.bos() < 0)  // Megatron's warning at the inference engine's launch
    warn_rank0("Tokenizer has no BOS token so prompt will not have BOS token");
  GrpoLossOptions lo;
  lo.clamp_eps_lower = g.grpo_clamp_eps_lower;
  lo.clamp_eps_upper = g.grpo_clamp_eps_upper;
  lo.kl_beta = g.grpo_kl_beta;
  lo.entropy_weight = g.grpo_entropy_term_weight;
  lo.is_truncation_coef = g.rl_importance_sampling_truncation_coef;
  lo.per_token_loss = t.calculate_per_token_loss;
  const bool is_correction = g.rl_inference_logprobs_is_correction;
  if (lo.is_truncation_coef > 0.0 && !is_correction)  // Megatron applies the coefficient only with the correction
    warn_rank0("--rl-importance-sampling-truncation-coef: no effect without --rl-inference-logprobs-is-correction");
  const int64_t train_iters = train_iters_from_args(args);  // --train-iters, or --train-samples // gbs
  const LoggingArgs& l = args.logging;

  // The layout's schedule (no pipelining, 1F1B, interleaved 1F1B over the virtual stages, or
  // DualPipeV) with GRPO's per-micro-batch loss on the loss stage (schedule/schedules.h
  // MicroBatchLoss), as the trainer runs it; the forward-only passes without deferred weight
  // gradients. RiPipe's order is the trainer's alone.
  const int64_t group = args.parallel.microbatch_group_size_per_virtual_stage > 0
                            ? args.parallel.microbatch_group_size_per_virtual_stage : 0;
  auto run_schedule = [&](const std::vector<GPTModel*>& models, int64_t n, const MicroBatchSource& source,
                          bool forward_only, const MicroBatchLoss& loss) {
    return forward_backward(models, engine.ps, n, source, forward_only, {}, group, nullptr, engine.dualpipev,
                            !forward_only && engine.dualpipev_dw_detach, RiPipe::kNone, engine.pp_backward,
                            engine.stage_tensors.get(), loss);
  };
  // Context parallelism: each cp rank runs its positions of every micro-batch (Megatron's
  // load-balanced split, or adaptive_cp_algo's layout for the micro-batch) and learns the whole
  // rows' per-token log-probabilities by a sum over cp.
  const Comm& cp = engine.ps.cp();
  const int64_t window = policy.config().common_window();
  auto cp_slice = [&](MicroBatch whole, MicroBatch* mb, std::vector<int32_t>* pos) -> Status {
    GALE_RETURN_IF_ERROR(keep_context_parallel_positions(engine.ps, S, window, engine.adaptive_cp.get(), &whole));
    pos->resize(static_cast<size_t>(whole.S));
    for (int64_t i = 0; i < whole.S; ++i) (*pos)[static_cast<size_t>(i)] = whole.seq_position(i);
    *mb = std::move(whole);
    return Status::Ok();
  };
  auto whole_logprobs = [&](const GPTModel::LossSums& sums, const std::vector<int32_t>& pos) {
    return grpo_whole_logprobs(sums, mbs, S, pos, cp);
  };
  // Megatron's RL evaluation: at each --eval-interval and after training, when --eval-iters > 0.
  // --overlap-param-gather: the distributed optimizer's all-gathers of the stepped parameters are
  // still pending after optimizer_step; a refit reads the parameters outside any forward (whose
  // hooks would wait), so they complete first. (The policy's own decoding forwards wait in their hooks.)
  auto refit = [&]() -> Status {
    finish_param_sync(engine);
    return rollout_model.refit();
  };
  auto evaluate = [&](int64_t iteration) -> Status {
    GALE_RETURN_IF_ERROR(refit());
    GALE_ASSIGN_OR_RETURN(const GrpoEvaluation e, evaluate_grpo(rollout_model.model(), tokenizer, env, g, S,
                                                                static_cast<uint64_t>(t.seed), iteration));
    print_rank_last(str_cat(" > GRPO evaluation at iteration ", iteration, ": ", e.prompts, " prompts x ",
                            e.samples_per_prompt, " samples and 1 greedy completion"));
    print_rank_last(format_grpo_evaluation(e));
    return Status::Ok();
  };
  const bool do_valid = l.eval_iters > 0;
  GrpoRollouts rollouts;
  GrpoTrainingRows rows;  // this rank's rows of the collection (train/grpo_packing.h)
  // Micro-batches of this rank's rows, and per iteration (packed: ceil(gbs / R · bins), Megatron's
  // update_microbatch_calculator), set at each collection.
  int64_t local_batches = 0, num_mb = 0;
  int64_t consumed_bins = 0;  // --rl-use-sequence-packing (as Megatron's, not restored by --load)
  std::vector<double> old_lp, ref_lp;  // [rows, S]
  int64_t collected_at = -1;  // the iteration the current rollouts were collected at
  // The interval's sums of each iteration's token means: lm loss and the rl/ entries.
  constexpr int kTerms = 6;
  TotalLossDict totals;  // Megatron's total_loss_dict: the loss dict, then the MoE and MTP trackers'
  // MoE: the interval's sums of each iteration's load-balancing losses by kind, then the z-loss
  // (Megatron's track_moe_metrics entries, averaged as the trainer's).
  const int64_t moe_layers = policy.config().num_moe_layers();
  // --mtp-num-layers: the interval's sums of each iteration's MTP losses (means over the micro-batches
  // and the data-parallel ranks, as the trainer's "mtp_k loss").
  const int64_t mtp_layers = args.model.mtp_num_layers == kUnset ? 0 : args.model.mtp_num_layers;
  constexpr int kMoeTerms = kMoeAuxKinds + 1;
  int64_t advanced = 0, skipped = 0, nan_iters = 0, iters_in_interval = 0;
  double interval_start = now_seconds();
  MemoryReporter memory_reporter(args, state->iteration);  // Megatron's report after the log lines
  if (train_iters > 0) print_datetime("before the start of training step");  // Megatron's train()
  while (state->iteration < train_iters) {
    if (saves.finalize) GALE_RETURN_IF_ERROR(saves.finalize(/*blocking=*/false));  // --async-save
    if (collected_at < 0 || state->iteration - collected_at == steps_per_collection) {
      collected_at = state->iteration;
      GALE_RETURN_IF_ERROR(refit());
      GALE_ASSIGN_OR_RETURN(rollouts, collect_grpo_rollouts(rollout_model.model(), tokenizer, env, g, S,
                                                            static_cast<uint64_t>(t.seed), collected_at));
      GALE_RETURN_IF_ERROR(check_same_rollouts(rollouts.tokens, engine.ps.world()));
      if (packing.enabled) {
        GALE_ASSIGN_OR_RETURN(rows, grpo_packed_rows(rollouts, pad, packing, dp, dp_rank));
        print_rank0(str_cat("[SequencePacker] Packing distribution: ", rows.total_bins, " bins, avg ",
                            fixed(rows.mean_per_bin, 1), " seqs/bin, min ", rows.min_per_bin, ", max ",
                            rows.max_per_bin, " seqs/bin (limit: ", packing.max_sequences_per_bin, ")"));
        local_batches = rows.rows;
        num_mb = (gbs * rows.rows + R - 1) / R;
      } else {
        rows = grpo_unpacked_rows(rollouts, dp, dp_rank);
        local_batches = rows.rows / mbs;
        num_mb = gbs / (mbs * dp);
      }
      // π_old and the reference: forward-only passes through the schedule over this rank's
      // local_batches micro-batches; the loss stage keeps each one's per-token log-probabilities.
      old_lp.assign(static_cast<size_t>(rows.rows * S), 0.0);
      ref_lp.assign(static_cast<size_t>(rows.rows * S), 0.0);
      std::map<int64_t, std::vector<int32_t>> positions;  // each micro-batch's positions on this cp rank
      auto collection_source = [&](int64_t b, MicroBatch* mb) {
        return cp_slice(grpo_rows_micro_batch(rows, b * mbs, mbs, pad, collected_at * R + dp_rank * rows.rows + b * mbs),
                        mb, &positions[b]);
      };
      for (auto [models, into] : {std::pair{&chunks, &old_lp}, std::pair{&reference, &ref_lp}}) {
        auto keep = [&, into](GPTModel&, int64_t b, const GPTModel::LossSums& sums) {
          const std::vector<double> whole = whole_logprobs(sums, positions.at(b));
          std::copy(whole.begin(), whole.end(), into->begin() + b * mbs * S);
          return 0.0f;
        };
        GALE_RETURN_IF_ERROR(run_schedule(*models, local_batches, collection_source, /*forward_only=*/true, keep).status());
      }
      double completion = 0.0;
      for (int64_t n : rollouts.completion_tokens) completion += static_cast<double>(n);
      print_rank0(str_cat(" > GRPO collection at iteration ", state->iteration, ": ",
                          g.grpo_prompts_per_step, " prompts x ", g.grpo_group_size, " completions, reward mean ",
                          fixed(rollouts.reward_mean(), 4), " std ", fixed(rollouts.reward_std(), 4), ", ",
                          rollouts.filtered_groups, " groups filtered, mean completion length ",
                          fixed(completion / static_cast<double>(R), 2), " tokens"));
    }
    // One optimizer step over micro-batches k·num_mb .. (k+1)·num_mb − 1 of the cycle.
    const int64_t k = state->iteration - collected_at;
    start_grad_sync_iteration(engine, num_mb);
    const float saved_scale = policy.grad_scale();
    GradScaler* scaler = engine.grad_scaler.get();  // --fp16: the loss scale in every backward
    // --calculate-per-token-loss: each micro-batch's masked sum, divided by the global batch's tokens
    // in finalize_model_grads; else the token mean averaged over the micro-batches.
    for (GPTModel* c : chunks)
      c->set_grad_scale((scaler ? scaler->scale() : 1.0f) / (lo.per_token_loss ? 1.0f : static_cast<float>(num_mb)));
    double sums[kTerms + 1] = {};  // loss, kl, ratio, entropy, above, below, tokens (the loss stage's)
    auto local_batch = [&](int64_t m) { return (k * num_mb + m) % local_batches; };
    std::map<int64_t, std::vector<int32_t>> positions;  // each micro-batch's positions on this cp rank
    auto source = [&](int64_t m, MicroBatch* mb) {
      const int64_t first = local_batch(m) * mbs;
      MicroBatch whole = grpo_rows_micro_batch(rows, first, mbs, pad, collected_at * R + dp_rank * rows.rows + first);
      if (mtp_layers > 0) grpo_mtp_loss_mask(&whole);  // the MTP losses' mask (no CP with MTP)
      return cp_slice(std::move(whole), mb, &positions[m]);
    };
    // On the loss stage, after each micro-batch's training forward: its GRPO loss from the forward's
    // per-token losses, the loss mask scaled by its gradient, backward from scale 1.
    auto grpo_loss = [&](GPTModel& model, int64_t m, const GPTModel::LossSums& s) {
      const int64_t first = local_batch(m) * mbs;
      const std::vector<float> mask(rows.loss_mask.begin() + first * S, rows.loss_mask.begin() + (first + mbs) * S);
      const std::vector<double> inference =
          is_correction ? rows_of(rows.inference_logprobs, first, mbs, S) : std::vector<double>{};
      const GrpoMicroBatchLoss r =
          grpo_scale_policy_loss(model, m, mask, mbs, S, s, rows_of(old_lp, first, mbs, S), rows_of(ref_lp, first, mbs, S),
                                 rows_of(rows.advantages, first, mbs, S), lo, inference, positions.at(m), cp);
      const double terms[kTerms + 1] = {r.loss_sum, r.kl_sum, r.ratio_sum, r.entropy_sum, r.truncated_above_sum,
                                        r.truncated_below_sum, std::max(r.tokens, 1.0)};
      for (int i = 0; i <= kTerms; ++i) sums[i] += terms[i];
      return 1.0f;
    };
    GALE_RETURN_IF_ERROR(run_schedule(chunks, num_mb, source, /*forward_only=*/false, grpo_loss).status());
    // The rollouts this iteration trained, over the data-parallel ranks (packed: Megatron's global
    // batch size and consumed samples; an empty bin holds none, a reused bin counts again).
    int64_t sequences = 0;
    for (int64_t m = 0; m < num_mb; ++m)
      for (int64_t b = 0; b < mbs; ++b) sequences += static_cast<int64_t>(rows.members[local_batch(m) * mbs + b].size());
    engine.ps.dp()->all_reduce(&sequences, 1, DType::kI64, ReduceOp::kSum);
    for (GPTModel* c : chunks) c->set_grad_scale(saved_scale);
    finalize_model_grads(engine, lo.per_token_loss ? std::optional<double>(sums[kTerms]) : std::nullopt);
    engine.ps.dp()->all_reduce(sums, kTerms + 1, DType::kF64, ReduceOp::kSum);
    if (engine.ps.pp_size() > 1)  // every stage learns the loss stage's sums (the log and its NaN checks)
      engine.ps.pp()->broadcast(sums, kTerms + 1, DType::kF64, engine.loss_pipeline_rank());
    double moe[kMoeTerms] = {};  // this iteration's means over micro-batches, DP ranks and MoE layers
    if (moe_layers > 0) {
      for (GPTModel* c : chunks) {
        const MoeAuxLosses m = c->take_moe_losses();  // the training forwards' (others keep none)
        for (int kind = 0; kind < kMoeAuxKinds; ++kind) moe[kind] += m.balancing(kind);
        moe[kMoeAuxKinds] += m.z;
      }
      if (engine.ps.pp_size() > 1) engine.ps.pp()->all_reduce(moe, kMoeTerms, DType::kF64, ReduceOp::kSum);
      engine.ps.dp()->all_reduce(moe, kMoeTerms, DType::kF64, ReduceOp::kSum);
      for (double& v : moe) v /= static_cast<double>(num_mb * dp * moe_layers);
    }
    std::vector<double> mtp(static_cast<size_t>(mtp_layers), 0.0);
    if (mtp_layers > 0) {
      for (GPTModel* c : chunks) {  // the last stage's (last chunk's); the others add zeros
        const std::vector<double> l = c->take_mtp_losses();
        for (size_t i = 0; i < l.size() && i < mtp.size(); ++i) mtp[i] += l[i];
      }
      if (engine.ps.pp_size() > 1) engine.ps.pp()->all_reduce(mtp.data(), mtp_layers, DType::kF64, ReduceOp::kSum);
      engine.ps.dp()->all_reduce(mtp.data(), mtp_layers, DType::kF64, ReduceOp::kSum);
      for (double& v : mtp) v /= static_cast<double>(num_mb * dp);
    }
    LrScheduler& scheduler = *engine.scheduler;
    const StepResult step = optimizer_step(engine, scheduler.lr(), scheduler.weight_decay(), l.log_num_zeros_in_grad,
                                           scaler ? scaler->inv_scale() : 1.0f);
    if (scaler) scaler->update(/*found_inf=*/!step.applied);  // Megatron: skip and back off, or grow
    for (GPTModel* c : chunks) c->params().refresh_gemm_copy();
    // Megatron's scheduler increment: micro-batches × mbs × DP (packed: the bins).
    if (step.applied) scheduler.step(num_mb * mbs * dp);
    state->consumed_train_samples += sequences;
    if (packing.enabled) consumed_bins += num_mb * dp;
    ++state->iteration;
    ++iters_in_interval;
    // Megatron's training_log: the loss dict when the iteration advanced, the trackers' always.
    LossDict loss_dict;
    const char* names[kTerms] = {"lm loss", "rl/kl_term", "rl/pi_over_pi_old", "rl/entropy_term",
                                 "rl/truncated_from_above", "rl/truncated_from_below"};
    for (int i = 0; i < kTerms; ++i) loss_dict.emplace_back(names[i], sums[i] / sums[kTerms]);
    totals.add_loss_dict(loss_dict, step.applied);
    LossDict tracked;
    if (moe_layers > 0) {  // the selected load-balancing types under their tracker names, then z_loss
      // (a skipped iteration's too, as the trainer)
      for (int kind : moe_tracked_aux_kinds(args.moe.moe_router_load_balancing_type,
                                            args.moe.moe_router_load_balancing_types))
        tracked.emplace_back(kMoeAuxLossNames[kind], moe[kind]);
      if (!unset(args.moe.moe_z_loss_coeff)) tracked.emplace_back("z_loss", moe[kMoeAuxKinds]);
    }
    for (size_t i = 0; i < mtp.size(); ++i) tracked.emplace_back(str_cat("mtp_", i + 1, " loss"), mtp[i]);
    totals.add_tracked(tracked);
    if (step.applied) {
      ++advanced;
    } else {
      ++skipped;
      if (!scaler && !std::isfinite(step.grad_norm)) ++nan_iters;  // an overflow is the loss scaler's signal
    }
    if (state->iteration % l.log_interval == 0) {
      const double per_iter = (now_seconds() - interval_start) / static_cast<double>(iters_in_interval);
      TrainingLogFields f;
      f.iteration = state->iteration;
      f.train_iters = train_iters;
      f.consumed_samples = state->consumed_train_samples;
      f.elapsed_ms_per_iteration = per_iter * 1000.0;
      f.learning_rate = scheduler.lr();
      f.global_batch_size = sequences;
      f.consumed_bins = consumed_bins;
      f.rl_throughput = rl_throughput_fields(sequences, S, per_iter, engine.ps.world()->size(), dp, rows, packing.enabled,
                                             R, l.log_throughput);
      f.losses = totals.averages(advanced);
      f.grad_norm = step.grad_norm;
      f.has_grad_norm = step.applied || !scaler;  // Megatron's fp16 optimizer returns none for a skipped step
      if (scaler) f.loss_scale = scaler->scale();  // as Megatron logs it: after the update
      f.num_zeros = l.log_num_zeros_in_grad ? step.num_zeros : -1;
      f.skipped_iterations = skipped;
      f.nan_iterations = nan_iters;
      print_rank_last(format_training_log_line(f));
      GALE_RETURN_IF_ERROR(memory_reporter.after_log_line(state->iteration, engine.ps.world()->rank(),
                                                          static_cast<int>(dp_rank), num_mb));
      totals.reset();
      advanced = skipped = nan_iters = iters_in_interval = 0;
      interval_start = now_seconds();
    }
    const int64_t save_interval = args.checkpoint.save_interval;
    const bool last = state->iteration == train_iters;
    // --exit-interval (a multiple of the iterations per collection): Megatron saves (unless this
    // iteration just did) and exits, without the evaluation after training.
    const bool exit_now = t.exit_interval != kUnset && t.exit_interval > 0 && state->iteration % t.exit_interval == 0;
    const int64_t non_persistent_interval = args.checkpoint.non_persistent_save_interval;
    if (save && ((save_interval != kUnset && save_interval > 0 && state->iteration % save_interval == 0) || last ||
                 exit_now)) {
      const double save_start = now_seconds();
      GALE_RETURN_IF_ERROR(save(*state));
      interval_start += now_seconds() - save_start;  // as Megatron, the save is not iteration time
    } else if (saves.non_persistent && non_persistent_interval != kUnset && non_persistent_interval > 0 &&
               state->iteration % non_persistent_interval == 0) {
      const double save_start = now_seconds();
      GALE_RETURN_IF_ERROR(saves.non_persistent(*state));
      interval_start += now_seconds() - save_start;
    }
    if (do_valid && l.eval_interval > 0 && state->iteration % l.eval_interval == 0) {
      const double eval_start = now_seconds();
      GALE_RETURN_IF_ERROR(evaluate(state->iteration));
      interval_start += now_seconds() - eval_start;
    }
    if (exit_now) {
      print_datetime(str_cat("exiting program at iteration ", state->iteration));
      return saves.finalize ? saves.finalize(/*blocking=*/true) : Status::Ok();
    }
  }
  print_datetime("after training is done");  // Megatron's pretrain, after train() returns
  if (saves.finalize) GALE_RETURN_IF_ERROR(saves.finalize(/*blocking=*/true));  // --async-save
  if (do_valid) GALE_RETURN_IF_ERROR(evaluate(state->iteration));  // Megatron's evaluation after training
  return Status::Ok();
}

Status run_grpo_training(const Arguments& args, const GrpoArgs& g, Engine& engine, const Tokenizer& tokenizer,
                         TrainerState* state, const GrpoSaves& saves) {
  GALE_ASSIGN_OR_RETURN(const RlEnvironment env, load_rl_environment(g.langrl_env_config));
  print_rank0(str_cat(" > --langrl-env-config ", g.langrl_env_config, ": environment ", env.kind, ", ",
                      env.prompts.size(), " prompts from ", env.data_path));
  // The reference model's chunks of this rank's virtual stages, as the policy's.
  std::vector<std::unique_ptr<GPTModel>> reference;
  std::vector<GPTModel*> reference_chunks;
  for (const auto& policy : engine.chunks) {
    ModelConfig config = policy->config();
    config.lora = LoraConfig{};
    config.reuse_fp32_param = false;  // never stepped
    reference.push_back(std::make_unique<GPTModel>(config, policy->partition(), &engine.ops));
    reference_chunks.push_back(reference.back().get());
  }
  return run_grpo(args, g, engine, reference_chunks, tokenizer, env, state, saves);
}

}  // namespace gale
