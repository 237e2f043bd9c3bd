// Gradient reductions over DP (bucketed), TP (sequence-parallel parameters) and the embedding group.
#include "train/grad_sync.h"

#include <algorithm>
#include <map>

#include "kernels/cpu/optimizer.h"
#include "model/moe_router.h"
#include "train/expert_placer.h"

namespace gale {

namespace {

void allreduce_sequence_parallel_grads(const ParallelState& ps, const std::vector<GPTModel*>& chunks) {
  if (ps.tp_size() == 1) return;
  std::vector<std::pair<float*, int64_t>> grads;
  int64_t total = 0;
  for (GPTModel* m : chunks) {
    const ParamBuffer& pb = m->params();
    for (int id = 0; id < pb.size(); ++id)
      if (pb.spec(id).sequence_parallel && pb.spec(id).trainable) {
        grads.emplace_back(pb.grad_data(id), pb.spec(id).local_numel());
        total += pb.spec(id).local_numel();
      }
  }
  if (total == 0) return;
  std::vector<float> packed(static_cast<size_t>(total));
  int64_t at = 0;
  for (auto [p, n] : grads) at = std::copy(p, p + n, packed.begin() + at) - packed.begin();
  ps.tp()->all_reduce(packed.data(), total, DType::kF32, ReduceOp::kSum);
  at = 0;
  for (auto [p, n] : grads) {
    std::copy(packed.begin() + at, packed.begin() + at + n, p);
    at += n;
  }
}

// DualPipeV: the embedding (chunk 0) and its copy (chunk 1) are both on pipeline rank 0; each gets the
// sum of the two gradients, as the embedding group's all-reduce gives them on two ranks.
void sum_embedding_grads_of_v(const std::vector<GPTModel*>& chunks) {
  if (chunks.size() != 2) return;
  const std::vector<int> first = chunks[0]->embedding_group_param_ids();
  const std::vector<int> second = chunks[1]->embedding_group_param_ids();
  if (first.empty() && second.empty()) return;
  GALE_CHECK_EQ(first.size(), second.size()) << "the V's embedding copies differ";
  for (size_t i = 0; i < first.size(); ++i) {
    ParamBuffer& a = chunks[0]->params();
    ParamBuffer& b = chunks[1]->params();
    if (!a.spec(first[i]).trainable) continue;  // frozen (LoRA): no gradient
    const int64_t n = a.spec(first[i]).local_numel();
    GALE_CHECK_EQ(n, b.spec(second[i]).local_numel());
    float* ga = a.grad_data(first[i]);
    float* gb = b.grad_data(second[i]);
    for (int64_t k = 0; k < n; ++k) ga[k] = gb[k] = ga[k] + gb[k];
  }
}

void allreduce_embedding_grads(const ParallelState& ps, const std::vector<GPTModel*>& chunks) {
  if (ps.pp_size() == 1 || !ps.embedding() || ps.embedding()->size() == 1) return;
  if (ps.dist_train()) {
    // --dist-train: the two copies are split over different TP sizes, so the sum goes over whole
    // tensors: each rank places its shard (its replicas' first only: they hold the same), all add.
    const bool first_replica = ps.dist_train()->first_replica(ps.world_rank());
    for (GPTModel* m : chunks)
      for (int id : m->embedding_group_param_ids()) {
        const ParamSpec& s = m->params().spec(id);
        if (!s.trainable) continue;
        int64_t numel = 1;
        for (int64_t d : s.global_shape) numel *= d;
        std::vector<float> whole(static_cast<size_t>(numel), 0.0f);
        float* g = m->params().grad_data(id);
        if (first_replica && (s.split_dim >= 0 || ps.coords().tp == 0))  // a TP-replicated one: once
          for (int64_t i = 0; i < s.local_numel(); ++i) whole[static_cast<size_t>(s.global_index(i))] = g[i];
        ps.embedding()->all_reduce(whole.data(), numel, DType::kF32, ReduceOp::kSum);
        for (int64_t i = 0; i < s.local_numel(); ++i) g[i] = whole[static_cast<size_t>(s.global_index(i))];
      }
    return;
  }
  // Tied embeddings or MTP layers: the first stage's embedding and the last stage's copy of it
  // (GPTModel::embedding_group_param_ids, the same list on both).
  for (GPTModel* m : chunks)
    for (int id : m->embedding_group_param_ids()) {
      if (!m->params().spec(id).trainable) continue;  // frozen (LoRA): no gradient
      ps.embedding()->all_reduce(m->params().grad_data(id), m->params().spec(id).local_numel(), DType::kF32,
                                 ReduceOp::kSum);
    }
}

// --moe-router-enable-expert-bias (Megatron's _update_router_expert_bias): the pairs each expert
// kept over the step's micro-batches, summed over TP×DP×CP (every rank of this stage that routes
// other tokens with the same router; EP ranks are among the DP ones), move every MoE layer's bias.
void update_router_expert_bias(const ParallelState& ps, const std::vector<GPTModel*>& chunks) {
  std::vector<float*> biases;
  std::vector<double> counts;
  int64_t E = 0;
  for (GPTModel* m : chunks) {
    std::map<int64_t, std::vector<int64_t>> n = m->take_moe_token_counts();
    const ModelPartition& part = m->partition();
    // The chunk's layers, then (last stage) its MTP layers: global layers num_layers ...
    const int64_t mtp = part.post_process ? m->config().mtp_num_layers : 0;
    std::vector<int64_t> layers;
    for (int64_t layer = part.first_layer; layer < part.first_layer + part.num_layers; ++layer) layers.push_back(layer);
    for (int64_t k = 0; k < mtp; ++k) layers.push_back(m->config().num_layers + k);
    for (int64_t layer : layers) {
      const int id = m->moe_expert_bias_id(layer);
      if (id < 0) continue;
      E = m->config().moe.num_experts;
      biases.push_back(m->params().param_data(id));
      const std::vector<int64_t>& mine = n[layer];  // empty: no training forward reached the layer
      for (int64_t e = 0; e < E; ++e) counts.push_back(mine.empty() ? 0.0 : static_cast<double>(mine[e]));
    }
  }
  if (biases.empty()) return;
  const int64_t total = static_cast<int64_t>(counts.size());
  if (ps.tp() && ps.tp()->size() > 1) ps.tp()->all_reduce(counts.data(), total, DType::kF64, ReduceOp::kSum);
  if (ps.dp_cp() && ps.dp_cp()->size() > 1) ps.dp_cp()->all_reduce(counts.data(), total, DType::kF64, ReduceOp::kSum);
  const double rate = chunks.front()->config().moe.bias_update_rate;
  for (size_t i = 0; i < biases.size(); ++i) update_expert_bias(biases[i], counts.data() + i * E, E, rate);
}

// --moe-router-load-balancing-type quantile_balancing (Megatron main's _update_router_qb_beta):
// every MoE layer's mean column quantile over the step's micro-batches (0 where none ran), averaged
// over DP×CP, then beta = ema·beta + (1 − ema)·avg minus its mean. The quantiles were taken over
// the TP×CP-gathered logits, so every TP and CP rank holds the same and ends with the same beta.
void update_router_qb_beta(const ParallelState& ps, const std::vector<GPTModel*>& chunks) {
  std::vector<float*> betas;
  std::vector<double> avg;
  int64_t E = 0;
  for (GPTModel* m : chunks) {
    const ModelPartition& part = m->partition();
    const int64_t mtp = part.post_process ? m->config().mtp_num_layers : 0;
    std::vector<int64_t> layers;
    for (int64_t layer = part.first_layer; layer < part.first_layer + part.num_layers; ++layer) layers.push_back(layer);
    for (int64_t k = 0; k < mtp; ++k) layers.push_back(m->config().num_layers + k);
    for (int64_t layer : layers) {
      const auto [id, qb] = m->moe_quantile_balancing(layer);
      if (id < 0 || !qb) continue;
      E = m->config().moe.num_experts;
      betas.push_back(m->params().param_data(id));
      const double count = static_cast<double>(std::max<int64_t>(qb->count, 1));  // Megatron's clamp(min=1)
      for (int64_t e = 0; e < E; ++e) avg.push_back(qb->sum[e] / count);
      qb->reset();
    }
  }
  if (betas.empty()) return;
  const int64_t total = static_cast<int64_t>(avg.size());
  if (ps.dp_cp() && ps.dp_cp()->size() > 1) {
    ps.dp_cp()->all_reduce(avg.data(), total, DType::kF64, ReduceOp::kSum);
    for (double& v : avg) v /= static_cast<double>(ps.dp_cp()->size());
  }
  const double ema = chunks.front()->config().moe.qb_ema;
  for (size_t i = 0; i < betas.size(); ++i) update_qb_beta(betas[i], avg.data() + i * E, E, ema);
}

// --fp8-recipe delayed (model/fp8.h): the iteration's amaxes (history row 0 of every FP8 linear
// layer, max-accumulated over its micro-batches) reduced with max over Megatron's amax reduction
// group, TP×DP×CP of this stage (every rank holds the same layers, so the same list), then every
// state's scale and history updated.
void update_fp8_delayed_scaling(const ParallelState& ps, const std::vector<GPTModel*>& chunks) {
  std::vector<Fp8StateRef> states;
  const Fp8Config* config = nullptr;
  for (GPTModel* m : chunks) {
    const std::vector<Fp8StateRef> s = fp8_delayed_states(m->params());
    states.insert(states.end(), s.begin(), s.end());
    if (!s.empty()) config = m->params().fp8_config();
  }
  if (states.empty()) return;
  std::vector<float> amax(states.size() * kFp8Roles);
  for (size_t i = 0; i < states.size(); ++i) std::copy(states[i].history, states[i].history + kFp8Roles, &amax[i * kFp8Roles]);
  const int64_t n = static_cast<int64_t>(amax.size());
  if (ps.tp() && ps.tp()->size() > 1) ps.tp()->all_reduce(amax.data(), n, DType::kF32, ReduceOp::kMax);
  if (ps.dp_cp() && ps.dp_cp()->size() > 1) ps.dp_cp()->all_reduce(amax.data(), n, DType::kF32, ReduceOp::kMax);
  for (size_t i = 0; i < states.size(); ++i) std::copy(&amax[i * kFp8Roles], &amax[(i + 1) * kFp8Roles], states[i].history);
  fp8_delayed_update_all(states, *config);
}

}  // namespace

void start_grad_sync_iteration(Engine& engine, int64_t num_microbatches) {
  for (auto& z : engine.zero3) z->start_iteration();
  if (engine.dp_sync.empty()) {
    for (auto& chunk : engine.chunks) chunk->params().zero_grads();
    return;
  }
  for (auto& sync : engine.dp_sync) sync->start_iteration(num_microbatches);
  for (auto& sync : engine.expert_dp_sync) sync->start_iteration(num_microbatches);
  for (auto& q : engine.quant_grads) q->zero();  // --quant-grads: the FP16 main gradients too
}

void finalize_model_grads(Engine& engine, std::optional<double> num_tokens) {
  const std::vector<GPTModel*> chunks = engine.chunk_pointers();
  if (engine.dp_sync.empty() && engine.zero3.empty())
    GALE_CHECK(!engine.ps.dp_cp() || engine.ps.dp_cp()->size() == 1) << "a data-parallel engine without its sync";
  {
    ScopedTimer timer = ScopedTimer::level1(engine.timers, "all-grads-sync");
    // --quant-grads: the FP16 gradients complete, their scales aligned over the data-parallel group,
    // then summed through the sync's buckets by the store (every chunk has one: no expert
    // parallelism, no ZeRO) and rounded to FP16 (optim/quant_grads.h).
    for (auto& q : engine.quant_grads) {
      q->accumulate_pending();
      q->align_scales();
      q->reduce();
    }
    if (engine.quant_grads.empty())
      for (auto& sync : engine.dp_sync) sync->finish_grad_sync();
    for (auto& sync : engine.expert_dp_sync) sync->finish_grad_sync();
    for (auto& z : engine.zero3) z->finish_grad_sync();  // LayerZeRO: the shards over the replicas
  }
  {
    ScopedTimer timer = ScopedTimer::level1(engine.timers, "layernorm-grads-all-reduce");
    allreduce_sequence_parallel_grads(engine.ps, chunks);
  }
  {
    ScopedTimer timer = ScopedTimer::level1(engine.timers, "embedding-grads-all-reduce");
    if (engine.dualpipev)
      sum_embedding_grads_of_v(chunks);
    else
      allreduce_embedding_grads(engine.ps, chunks);
  }
  update_router_expert_bias(engine.ps, chunks);
  update_router_qb_beta(engine.ps, chunks);
  update_fp8_delayed_scaling(engine.ps, chunks);
  if (num_tokens) {  // Megatron's per-token normalisation
    const ParallelState& ps = engine.ps;
    double total = *num_tokens;
    if (ps.pp_size() > 1) ps.pp()->broadcast(&total, 1, DType::kF64, engine.loss_pipeline_rank());
    if (ps.dp() && ps.dp()->size() > 1) ps.dp()->all_reduce(&total, 1, DType::kF64, ReduceOp::kSum);
    if (total > 0.0) {
      const float scale = static_cast<float>(1.0 / total);
      for (GPTModel* m : chunks) {
        const Tensor& g = m->params().flat_grads();
        if (g.defined() && g.numel() > 0) scale_inplace(g.data<float>(), g.numel(), scale);
      }
      for (auto& q : engine.quant_grads) q->scale(scale);  // --quant-grads: its gradients
    }
  }
}

StepResult optimizer_step(Engine& engine, double lr, double wd, bool count_zeros, float inv_grad_scale,
                          std::optional<double> decoupled_lr) {
  // --use-mup: the µP group's rate, the same schedule between --lr and --min-lr times its multiplier.
  std::optional<double> mup_lr;
  const double mup_mult = engine.optimizer->config().mup_lr_mult;
  if (mup_mult != 1.0 && engine.scheduler) {
    const LrSchedule& s = engine.scheduler->schedule();
    mup_lr = engine.scheduler->lr(s.max_lr * mup_mult, s.min_lr * mup_mult);
  }
  StepResult r =
      engine.optimizer->step(lr, wd, count_zeros, inv_grad_scale, engine.timers, decoupled_lr, mup_lr);
  if (engine.expert_placer) engine.expert_placer->after_step(engine);  // --enable-expert-placement
  if (!r.applied) return r;
  // Megatron times the distributed optimizer's all-gather when it runs here (not deferred to the
  // next forward by --overlap-param-gather).
  bool gathers_now = false;
  for (const auto& sync : engine.dp_sync)
    gathers_now = gathers_now || (sync->sharded() && !sync->config().overlap_param_gather);
  ScopedTimer timer = ScopedTimer::level1(gathers_now ? engine.timers : nullptr, "params-all-gather");
  // A chunk with gather_right_after_step (--overlap-param-gather-with-optimizer-step) started its
  // all-gather inside the step (build_engine's after-buffer hook).
  for (auto& sync : engine.dp_sync)
    if (!sync->config().gather_right_after_step) sync->after_optimizer_step();
  for (auto& sync : engine.expert_dp_sync) sync->after_optimizer_step();
  for (auto& z : engine.zero3) z->after_optimizer_step();  // ZeRO-2, LayerZeRO: the updated shards out
  return r;
}

GatheredParams::GatheredParams(const Engine& engine, bool write_back) : engine_(engine), write_back_(write_back) {
  for (const auto& z : engine_.zero3) z->gather_all();
}

GatheredParams::~GatheredParams() {
  for (const auto& z : engine_.zero3) z->release_all(write_back_);
}

void finish_param_sync(const Engine& engine) {
  for (const auto& sync : engine.dp_sync) sync->finish_param_sync();
  for (const auto& sync : engine.expert_dp_sync) sync->finish_param_sync();
}

}  // namespace gale
