// GRPO's rollout model: the whole-model copy of a TP policy and its refit (train/grpo_refit.h).
#include "train/grpo_refit.h"

#include <algorithm>

#include "comm/communicator.h"

namespace gale {

GrpoRolloutModel::GrpoRolloutModel(GPTModel& policy, const OpTable* ops) : policy_(policy) {
  if (policy.partition().tp_size() > 1)
    copy_ = std::make_unique<GPTModel>(policy.config(), single_process_partition(policy.config()), ops);
}

std::vector<float> gather_whole_param(const GPTModel& model, int id) {
  const ParamSpec& spec = model.params().spec(id);
  const ModelPartition& part = model.partition();
  std::vector<float> whole(static_cast<size_t>(shape_numel(spec.global_shape)), 0.0f);
  if (spec.is_split() || part.tp_rank() == 0) {
    const float* local = model.params().param_data(id);
    const int64_t n = spec.local_numel();
    for (int64_t i = 0; i < n; ++i) whole[static_cast<size_t>(spec.global_index(i))] = local[i];
  }
  if (part.tp_size() > 1)
    part.tp->all_reduce(whole.data(), static_cast<int64_t>(whole.size()), DType::kF32, ReduceOp::kSum);
  return whole;
}

Status GrpoRolloutModel::refit() {
  if (!copy_) return Status::Ok();
  const ParamBuffer& from = policy_.params();
  ParamBuffer& to = copy_->params();
  if (from.sharded()) return Unimplemented("--perform-rl-step with sharded parameters (ZeRO-3, FSDP): not supported yet");
  if (from.size() != to.size())
    return Internal("the GRPO rollout model has ", to.size(), " parameters, the policy ", from.size());
  for (int id = 0; id < from.size(); ++id) {
    const ParamSpec& a = from.spec(id);
    const ParamSpec& b = to.spec(id);
    if (a.name != b.name || a.global_shape != b.global_shape || b.local_numel() != shape_numel(b.global_shape))
      return Internal("the GRPO rollout model's parameter ", b.name, " does not match the policy's ", a.name);
    const std::vector<float> whole = gather_whole_param(policy_, id);
    std::copy(whole.begin(), whole.end(), to.param_data(id));
  }
  to.refresh_gemm_copy();
  return Status::Ok();
}

Status check_same_rollouts(const std::vector<int32_t>& tokens, const Comm& group) {
  if (!group || group->size() <= 1) return Status::Ok();
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the ids
  for (int32_t t : tokens) {
    h ^= static_cast<uint32_t>(t);
    h *= 1099511628211ull;
  }
  // max(h) and max(−h) (as signed 63-bit values): equal on every rank iff every rank has h.
  int64_t v[2] = {static_cast<int64_t>(h >> 1), -static_cast<int64_t>(h >> 1)};
  group->all_reduce(v, 2, DType::kI64, ReduceOp::kMax);
  if (v[0] != -v[1])
    return FailedPrecondition("--perform-rl-step: the ranks generated different rollouts (their rollout models or "
                              "sampling differ); the run cannot continue");
  return Status::Ok();
}

}  // namespace gale
