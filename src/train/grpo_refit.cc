// GRPO's rollout model: the whole-model copy of a TP/PP/CP policy and its refit (train/grpo_refit.h).
#include "train/grpo_refit.h"

#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <utility>

#include "comm/communicator.h"

namespace gale {

void write_held_values(const ParamBuffer& from, int id, float* whole) {
  const ParamSpec& a = from.spec(id);
  if (!from.values_sharded()) {
    const Tensor local = from.param_values(id);  // split storage (--reuse-fp32-param) merged
    const float* v = local.data<float>();
    for (int64_t i = 0; i < a.local_numel(); ++i) whole[a.global_index(i)] = v[i];
    return;
  }
  // ZeRO-3 / FSDP: this rank's shard of the parameter's unit (possibly none of the parameter).
  const int u = from.unit_of(id);
  const ParamUnit& x = from.unit(u);
  const int64_t lo = std::max(x.own_begin, a.offset), hi = std::min(x.own_end, a.offset + a.local_numel());
  const float* shard = from.shard_values(u) + (lo - x.own_begin);
  for (int64_t f = lo; f < hi; ++f) whole[a.global_index(f - a.offset)] = shard[f - lo];
}

GrpoRolloutModel::GrpoRolloutModel(std::vector<GPTModel*> policy, const Comm& world, const OpTable* ops)
    : policy_(std::move(policy)), world_(world) {
  const GPTModel& first = *policy_.front();
  const ModelPartition& part = first.partition();
  if (policy_.size() > 1 || part.tp_size() > 1 || part.cp_size() > 1 || !part.pre_process || !part.post_process ||
      first.params().sharded()) {
    ModelConfig config = first.config();
    config.reuse_fp32_param = false;  // never stepped: plain f32 values and their GEMM copy (the same bf16)
    copy_ = std::make_unique<GPTModel>(config, single_process_partition(config), ops);
  }
}

Status GrpoRolloutModel::refit() {
  if (!copy_) return Status::Ok();
  ParamBuffer& to = copy_->params();
  // The policy's parameters by their whole-model names, in each chunk (a virtual stage's chunk holds
  // its layers of the stacked layer tensors under the same names as the others).
  std::vector<std::map<std::string, int>> held(policy_.size());
  for (size_t c = 0; c < policy_.size(); ++c) {
    const ParamBuffer& from = policy_[c]->params();
    for (int id = 0; id < from.size(); ++id) held[c][from.spec(id).whole_model_name()] = id;
  }
  constexpr float kUnwritten = -std::numeric_limits<float>::infinity();
  for (int id = 0; id < to.size(); ++id) {
    const ParamSpec& b = to.spec(id);
    std::vector<float> whole(static_cast<size_t>(shape_numel(b.global_shape)), kUnwritten);
    for (size_t c = 0; c < policy_.size(); ++c) {
      auto it = held[c].find(b.name);
      if (it == held[c].end()) continue;
      const ParamBuffer& from = policy_[c]->params();
      const ParamSpec& a = from.spec(it->second);
      if (a.global_shape != b.global_shape)
        return Internal("the GRPO rollout model's parameter ", b.name, " has another shape than the policy's");
      write_held_values(from, it->second, whole.data());
    }
    // Every holder of an element holds the same value (replicas are equal): the maximum is it.
    world_->all_reduce(whole.data(), static_cast<int64_t>(whole.size()), DType::kF32, ReduceOp::kMax);
    if (std::find(whole.begin(), whole.end(), kUnwritten) != whole.end())
      return Internal("no rank of the policy holds all of ", b.name, " of the GRPO rollout model");
    to.set_param_values(id, whole.data());  // and its GEMM copy
  }
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
