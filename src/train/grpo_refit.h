// GRPO's rollout model under tensor parallelism: a whole (TP 1) copy of the policy refit from its TP shards.
//
// Gale's generation runs a whole model on one process (train/inference_engine.h), so a GRPO run at
// --tensor-model-parallel-size > 1 generates its rollouts (and its evaluation samples) with a TP-1
// copy of the policy on every rank, as Megatron-LM main does with a separate inference model of
// --rl-inference-tensor-model-parallel-size 1 that it refits from the trained one before each
// collection. Refit: every parameter's whole tensor is assembled from the TP ranks' shards (each
// rank writes its local elements at their global indices, ParamSpec::global_index, into a zeroed
// tensor — replicated tensors only TP rank 0 — and the TP group sums them: exact, each element has
// one writer), then the copy's GEMM copies are refreshed. The copy has the policy's configuration;
// its parameters have the whole-model shapes and the same names. At TP 1 the rollout model is the
// policy itself and refit does nothing.
//
// Every rank then generates the same rollouts from the same weights and seeds (as every DP rank
// already does; under expert parallelism the EP ranks decode in lockstep through the experts'
// all-to-all, each computing its own experts); check_same_rollouts makes that an error instead of
// an assumption.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"
#include "model/gpt_model.h"

namespace gale {

class GrpoRolloutModel {
 public:
  // `policy` must outlive this. `ops`: the kernels the copy runs on (the engine's).
  GrpoRolloutModel(GPTModel& policy, const OpTable* ops);
  // Makes the rollout model's weights the policy's current ones (a collective over the policy's
  // TP group at TP > 1; nothing at TP 1). Errors: sharded parameter storage (ZeRO-3, FSDP), a
  // parameter the copy lacks or shapes differently.
  Status refit();
  GPTModel& model() { return copy_ ? *copy_ : policy_; }
  bool is_copy() const { return copy_ != nullptr; }

 private:
  GPTModel& policy_;
  std::unique_ptr<GPTModel> copy_;
};

// The whole tensor of parameter `id` of `model` (its TP shards summed over the partition's TP group;
// collective at TP > 1), row-major in the parameter's global shape.
std::vector<float> gather_whole_param(const GPTModel& model, int id);

// FailedPrecondition when the ranks of `group` (the world) hold different `tokens` (a hash compared
// over it); Ok on one rank.
Status check_same_rollouts(const std::vector<int32_t>& tokens, const Comm& group);

}  // namespace gale
