// --dist-train's argument rules: the dist_config of --mm-model, what is refused with it, and each
// sub-world's view of the arguments.
#include <algorithm>

#include "train/arguments.h"
#include "train/dist_train_config.h"

namespace gale {

namespace {

Status refuse(const std::string& what) {
  return Unimplemented("--dist-train with ", what, ": not supported yet");
}

}  // namespace

Status validate_dist_train_args(Arguments& a, const ArgParser& p, int64_t world_size, int64_t world_rank) {
  ParallelArgs& par = a.parallel;
  if (par.mm_model.empty())
    return InvalidArgument("--dist-train needs --mm-model FILE (MindSpeed-MM's model JSON, whose \"dist_config\" ",
                           "gives the sub-worlds), found no --mm-model");
  // The layout comes from the dist_config, as MindSpeed overwrites these arguments per rank.
  for (const char* flag :
       {"--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size", "--num-layer-list",
        "--pipeline-num-transformer-layers", "--pipeline-model-parallel-layout", "--decoder-first-pipeline-num-layers",
        "--decoder-last-pipeline-num-layers", "--num-layers-per-virtual-pipeline-stage",
        "--num-virtual-stages-per-pipeline-rank", "--account-for-embedding-in-pipeline-split",
        "--account-for-loss-in-pipeline-split"})
    if (p.was_set(flag))
      return InvalidArgument("--dist-train takes the parallel layout from --mm-model's dist_config (each sub-world's ",
                             "tensor/pipeline/context-parallel sizes and num_layers): expected no ", flag,
                             ", found it given");
  if (a.model.mtp_num_layers != kUnset && a.model.mtp_num_layers > 0) return refuse("--mtp-num-layers");
  if (a.dpo.enabled()) return refuse("--stage dpo");
  if (par.schedules_method == "dualpipev") return refuse("--schedules-method dualpipev (the 1F1B schedule runs)");
  if (par.expert_model_parallel_size > 1) return refuse("--expert-model-parallel-size > 1");
  if (par.use_tp_pp_dp_mapping) return refuse("--use-tp-pp-dp-mapping (each sub-world lays out tp-dp-pp)");
  if (par.tp_2d) return refuse("--tp-2d");
  if (par.use_custom_fsdp || par.layerzero || par.use_torch_fsdp2)
    return refuse("--use-custom-fsdp / --layerzero / --use-torch-fsdp2");

  GALE_ASSIGN_OR_RETURN(DistTrainLayout layout, load_dist_train_config(par.mm_model, world_size, a.model.num_layers));
  layout.sequence_parallel = par.sequence_parallel;
  bool tp_differs = false;
  for (size_t i = 1; i < layout.subworlds.size(); ++i) {
    const DistTrainSubWorld& p = layout.subworlds[i - 1];
    const DistTrainSubWorld& s = layout.subworlds[i];
    tp_differs = tp_differs || p.tp != s.tp;
    if (par.sequence_parallel && p.tp % s.tp != 0 && s.tp % p.tp != 0)
      return refuse(str_cat("--sequence-parallel and neighbouring sub-worlds whose tensor-parallel sizes do not divide ",
                            "one another (\"", p.name, "\" ", p.tp, ", \"", s.name, "\" ", s.tp,
                            "): their sequence slices would not nest"));
  }
  const bool dp_differs = std::any_of(layout.subworlds.begin(), layout.subworlds.end(),
                                      [&](const DistTrainSubWorld& s) { return s.dp != layout.dp(); });
  if (dp_differs) {
    // The sub-worlds of more replicas split each micro-batch: --micro-batch-size is the main DP's.
    const char* what = par.use_distributed_optimizer               ? "--use-distributed-optimizer"
                       : a.training.calculate_per_token_loss       ? "--calculate-per-token-loss"
                       : a.data.dataloader_type != "single"        ? "--dataloader-type other than single"
                       : a.moe.num_experts > 0 && a.moe.num_experts != kUnset ? "--num-experts"
                                                                              : nullptr;
    if (!what && par.sequence_parallel && tp_differs)
      what = "--sequence-parallel, tensor-parallel sizes that differ";
    if (what) return refuse(str_cat(what, " and sub-worlds of different data-parallel sizes"));
    for (size_t i = 0; i < layout.subworlds.size(); ++i)
      if (a.training.micro_batch_size % layout.dp_ratio(static_cast<int>(i)) != 0)
        return InvalidArgument("--dist-train: sub-world \"", layout.subworlds[i].name, "\" has ",
                               layout.dp_ratio(static_cast<int>(i)), " times the data-parallel size ", layout.dp(),
                               " and splits each micro-batch as many ways: expected a --micro-batch-size divisible by ",
                               layout.dp_ratio(static_cast<int>(i)), ", found ", a.training.micro_batch_size);
  }
  std::string stage_layers;
  for (int64_t n : layout.stage_layers()) stage_layers += str_cat(stage_layers.empty() ? "" : ",", n);
  const int mine = layout.subworld_of(static_cast<int>(world_rank));
  const Arguments original = a;
  // Every sub-world's view passes the usual checks on a world of its TP x all stages x DP.
  for (size_t i = 0; i < layout.subworlds.size(); ++i) {
    const DistTrainSubWorld& s = layout.subworlds[i];
    Arguments view = original;
    view.parallel.dist_train = false;
    view.parallel.tensor_model_parallel_size = s.tp;
    view.parallel.context_parallel_size = s.cp;
    view.parallel.pipeline_model_parallel_size = layout.num_stages();
    view.parallel.num_layer_list = stage_layers;
    view.training.micro_batch_size = a.training.micro_batch_size / layout.dp_ratio(static_cast<int>(i));
    const int64_t view_world = int64_t{s.tp} * s.cp * layout.num_stages() * s.dp;
    Status st = validate_all_pretrain_args(view, p, view_world);
    if (!st.ok())
      return Status(st.code(), str_cat("--dist-train sub-world \"", s.name, "\" (tensor_model_parallel_size ", s.tp,
                                       ", pipeline stages ", s.first_stage, "-", s.first_stage + s.pp - 1, " of ",
                                       layout.num_stages(), "): ", st.message()));
    if (static_cast<int>(i) != mine) continue;
    view.parallel.dist_train = true;
    view.parallel.world_size = world_size;
    view.parallel.dist_train_layout = layout;
    view.parallel.dist_train_subworld = mine;
    a = std::move(view);
  }
  return Status::Ok();
}

}  // namespace gale
