// Gradient reductions over DP (bucketed), TP (sequence-parallel parameters) and the embedding group.
#include "train/grad_sync.h"

#include <algorithm>

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

void allreduce_embedding_grads(const ParallelState& ps, const std::vector<GPTModel*>& chunks) {
  if (ps.pp_size() == 1 || !ps.embedding() || ps.embedding()->size() == 1) return;
  for (GPTModel* m : chunks) {
    if (!m->config().tied_embeddings) return;
    const bool holds = (m->partition().pre_process && m->word_embedding_id() >= 0) ||
                       (m->partition().post_process && m->output_weight_id() >= 0);
    if (!holds) continue;
    const int id = m->partition().pre_process ? m->word_embedding_id() : m->output_weight_id();
    if (!m->params().spec(id).trainable) continue;  // frozen (LoRA): no gradient
    ps.embedding()->all_reduce(m->params().grad_data(id), m->params().spec(id).local_numel(), DType::kF32,
                               ReduceOp::kSum);
  }
}

}  // namespace

void start_grad_sync_iteration(Engine& engine, int64_t num_microbatches) {
  if (engine.dp_sync.empty()) {
    for (auto& chunk : engine.chunks) chunk->params().zero_grads();
    return;
  }
  for (auto& sync : engine.dp_sync) sync->start_iteration(num_microbatches);
  for (auto& sync : engine.expert_dp_sync) sync->start_iteration(num_microbatches);
}

void finalize_model_grads(Engine& engine) {
  const std::vector<GPTModel*> chunks = engine.chunk_pointers();
  if (engine.dp_sync.empty())
    GALE_CHECK(!engine.ps.dp_cp() || engine.ps.dp_cp()->size() == 1) << "a data-parallel engine without its sync";
  for (auto& sync : engine.dp_sync) sync->finish_grad_sync();
  for (auto& sync : engine.expert_dp_sync) sync->finish_grad_sync();
  allreduce_sequence_parallel_grads(engine.ps, chunks);
  allreduce_embedding_grads(engine.ps, chunks);
}

StepResult optimizer_step(Engine& engine, double lr, double wd, bool count_zeros) {
  StepResult r = engine.optimizer->step(lr, wd, count_zeros);
  if (r.applied)
    for (auto& sync : engine.dp_sync) sync->after_optimizer_step();
  if (r.applied)
    for (auto& sync : engine.expert_dp_sync) sync->after_optimizer_step();
  return r;
}

void finish_param_sync(const Engine& engine) {
  for (const auto& sync : engine.dp_sync) sync->finish_param_sync();
  for (const auto& sync : engine.expert_dp_sync) sync->finish_param_sync();
}

}  // namespace gale
