// GRPO's rollout model under tensor, pipeline and context parallelism: a whole (one-process) copy of the policy refit from its shards.
//
// Gale's generation runs a whole model on one process (train/inference_engine.h), so a GRPO run at
// --tensor-model-parallel-size, --pipeline-model-parallel-size or --context-parallel-size > 1
// (whose forwards need sliced micro-batches) generates its rollouts
// (and its evaluation samples) with a whole-model copy of the policy on every rank, as Megatron-LM
// main does with a separate inference model (--rl-inference-tensor-model-parallel-size 1) that it
// refits from the trained one before each collection. Refit, over the world: every rank writes the
// elements of its shards (TP and --tp-2d pieces, PP stage, each virtual stage's chunk, EP experts
// under their whole-model names, ETP pieces) at
// their global positions (ParamSpec::global_index) into whole tensors filled with −∞, and the world
// takes the element-wise maximum: replicas (DP, CP, the last stage's copy of a tied embedding) hold
// the same values, so the result is exact; an element nobody wrote is an error. Then the copy's
// GEMM copies are refreshed. The copy has the policy's configuration and the whole model's
// parameter names and shapes. Under ZeRO-2/3 and FSDP (--use-custom-fsdp --data-parallel-sharding-
// strategy optim_grads / optim_grads_params, --use-torch-fsdp2, --layerzero: the policy's storage is
// per-unit, gathered only inside its training schedule's hooks) there is a copy too: under ZeRO-3
// each rank writes its shards of every unit, so the refit is the all-gather of the shards; ZeRO-2's
// values are whole on every rank. Without TP, PP (and its virtual stages or DualPipeV's two chunks),
// CP and sharded storage the rollout model is the policy itself and refit does nothing (under EP
// the EP ranks then decode in lockstep, below).
//
// Every rank then generates the same rollouts from the same weights and seeds (as every DP rank
// already does; under expert parallelism, where the policy itself generates, the EP ranks decode in
// lockstep through the experts' all-to-all, each computing its own experts); check_same_rollouts
// makes that an error instead of an assumption.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"
#include "model/gpt_model.h"

namespace gale {

class GrpoRolloutModel {
 public:
  // `policy`: this rank's chunks (virtual stages) of the policy, which must outlive this; `world`:
  // every rank of the job; `ops`: the kernels the copy runs on.
  GrpoRolloutModel(std::vector<GPTModel*> policy, const Comm& world, const OpTable* ops);
  // Makes the rollout model's weights the policy's current ones (collective over the world when
  // there is a copy). Errors: an element of the whole model that no rank holds, a parameter whose
  // shape differs.
  Status refit();
  GPTModel& model() { return copy_ ? *copy_ : *policy_.front(); }
  bool is_copy() const { return copy_ != nullptr; }

 private:
  std::vector<GPTModel*> policy_;
  Comm world_;
  std::unique_ptr<GPTModel> copy_;
};

// Writes the values of `from`'s parameter `id` that this rank holds at their whole-model positions
// (ParamSpec::global_index) in `whole` (the whole tensor's elements): all of its local values (split
// storage merged), or under sharded values (ZeRO-3, FSDP) this rank's shard of them, possibly none.
void write_held_values(const ParamBuffer& from, int id, float* whole);

// FailedPrecondition when the ranks of `group` (the world) hold different `tokens` (a hash compared
// over it); Ok on one rank.
Status check_same_rollouts(const std::vector<int32_t>& tokens, const Comm& group);

}  // namespace gale
