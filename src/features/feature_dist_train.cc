// MindSpeed's --dist-train (DistTrainFeature) in the registry: sub-worlds with their own parallel layouts in one job.
//
// What MindSpeed does (mindspeed/core/multi_modal/dist_train/, used by MindSpeed-MM): the job's
// ranks are cut into sub-worlds by the "dist_config" of MindSpeed-MM's model JSON, one per sub-model
// (a ViT and an LLM, a VAE and a DiT), in model_index order, each with its own tensor, pipeline
// and context-parallel sizes; every rank overwrites its TP/PP/CP arguments with its sub-world's and
// builds Megatron's groups inside it. The sub-worlds form one pipeline: the last stage of one sends
// its output to the first stage of the next (the two stages' TP groups matched block-wise,
// dist_ranks_match.py), gradients travel back, and a forward_only sub-world (a frozen encoder)
// receives none. main_dp names the sub-world whose DP size is the job's when they differ.
//
// What it does in Gale (docs/parallelism.md §6.11): Gale's model is one GPT decoder, so the
// sub-worlds cut it along its layers — each config entry gives its "num_layers" — the first holding
// the embedding, the last the output layer and the loss. Each rank builds its sub-world's grid
// (parallel/dist_train_layout.h, ParallelState::create_dist_train), and the pipeline group becomes
// one communicator over every stage of all sub-worlds (DistTrainPipelineComm), so the 1F1B
// schedule, the loss and the gradient norm (over all sub-worlds) run unchanged. Across a boundary
// the receiving rank of TP coordinate j takes its tensor from the sending rank ⌊j·t_send/t_recv⌋
// (with --sequence-parallel the TP ranks' sequence slices are gathered or cut instead).
// Data-parallel sizes may differ when each is a multiple of the smallest (MindSpeed's main_dp): a
// sub-world of k times the replicas runs micro-batches k times smaller, slices of the other's, and
// the transfers are cut and joined along the batch. Losses and gradients equal the single-process
// run (tests/parallel/dist_train_mpi_test.cc).
//
// Rules: --mm-model FILE is required; the TP/PP/CP and pipeline-split flags are refused (the
// config gives them); the config's rules are MindSpeed's plus Gale's num_layers
// (train/dist_train_config.h). Forward-only sub-worlds (a leading run; not the last) are frozen and
// run forwards only, receiving no gradient. Not supported yet: forward_only after a trainable
// sub-world, CP sizes that differ between sub-worlds (equal ones work),
// DP sizes that are not multiples of the smallest (and, with different DP sizes, the distributed
// optimizer, per-token loss, other dataloaders and MoE), use_multiparam_send_recv,
// MTP, DPO, EP, DualPipeV, --sequence-parallel with TP sizes that do not divide one another, ZeRO-3/FSDP,
// --optimize-send-recv-comm and --use-multiparameter-pipeline-model-parallel. Checkpoints are
// written by whole-model names and load at any layout, dist-train or not.
// MindSpeed files the feature at level 2; in Gale it works at every --optimization-level, as the
// layout of the job cannot depend on it.
#include "features/registry.h"

namespace gale {

namespace {

class DistTrainFeature : public Feature {
 public:
  std::string name() const override { return "dist-train"; }
  std::string flag() const override { return "--dist-train"; }
  FeatureModule module() const override { return FeatureModule::kMultimodal; }
  int level() const override { return 0; }
  std::string counterpart() const override { return "MindSpeed DistTrainFeature (L2)"; }
  std::string description() const override {
    return "several sub-worlds with their own TP/PP/DP layouts in one job (--mm-model's dist_config), chained along "
           "the model's layers: activations and gradients cross between them point to point";
  }
  bool requested(const FeatureContext& ctx) const override { return ctx.args->parallel.dist_train; }
  Status validate(const FeatureContext& ctx) const override {
    const ParallelArgs& p = ctx.args->parallel;
    if (p.optimize_send_recv_comm) return Unimplemented("--dist-train with --optimize-send-recv-comm: not supported yet");
    if (p.use_multiparameter_pipeline_model_parallel)
      return Unimplemented("--dist-train with --use-multiparameter-pipeline-model-parallel: not supported yet");
    return Status::Ok();
  }
};

}  // namespace

void register_feature_dist_train(FeatureRegistry& registry) { registry.add(std::make_unique<DistTrainFeature>()); }

}  // namespace gale
