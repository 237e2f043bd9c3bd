// Gradient reductions over TP (sequence-parallel parameters), the embedding group and DP.
#include "train/grad_sync.h"

#include <algorithm>

#include "kernels/cpu/optimizer.h"

namespace gale {

namespace {

void allreduce_sequence_parallel_grads(const ParallelState& ps, const std::vector<GPTModel*>& chunks) {
  if (ps.tp_size() == 1) return;
  std::vector<std::pair<float*, int64_t>> grads;
  int64_t total = 0;
  for (GPTModel* m : chunks) {
    const ParamBuffer& pb = m->params();
    for (int id = 0; id < pb.size(); ++id)
      if (pb.spec(id).sequence_parallel) {
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
    ps.embedding()->all_reduce(m->params().grad_data(id), m->params().spec(id).local_numel(), DType::kF32,
                               ReduceOp::kSum);
  }
}

void allreduce_data_parallel_grads(const ParallelState& ps, const std::vector<GPTModel*>& chunks) {
  const Comm& dp = ps.dp_cp();
  if (!dp || dp->size() == 1) return;
  const float scale = 1.0f / static_cast<float>(dp->size());
  for (GPTModel* m : chunks) {
    const Tensor& g = m->params().flat_grads();
    dp->all_reduce(g.raw(), g.numel(), DType::kF32, ReduceOp::kSum);
    scale_inplace(g.data<float>(), g.numel(), scale);
  }
}

}  // namespace

void finalize_model_grads(const ParallelState& ps, const std::vector<GPTModel*>& chunks) {
  allreduce_data_parallel_grads(ps, chunks);
  allreduce_sequence_parallel_grads(ps, chunks);
  allreduce_embedding_grads(ps, chunks);
}

}  // namespace gale
