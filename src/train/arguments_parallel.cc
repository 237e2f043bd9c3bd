// Validation of the distributed layout flags against the world size and the model shape.
#include "train/arguments.h"

namespace gale {

Status validate_parallel_args(Arguments& a, const ArgParser& p, int64_t world_size) {
  ParallelArgs& par = a.parallel;
  const ModelArgs& m = a.model;
  par.world_size = world_size;
  auto positive = [](int64_t v, const char* flag) -> Status {
    if (v <= 0) return InvalidArgument(flag, ": expected a positive integer, found ", v);
    return Status::Ok();
  };
  GALE_RETURN_IF_ERROR(positive(par.tensor_model_parallel_size, "--tensor-model-parallel-size"));
  GALE_RETURN_IF_ERROR(positive(par.pipeline_model_parallel_size, "--pipeline-model-parallel-size"));
  GALE_RETURN_IF_ERROR(positive(par.context_parallel_size, "--context-parallel-size"));
  GALE_RETURN_IF_ERROR(positive(par.expert_model_parallel_size, "--expert-model-parallel-size"));
  int64_t model_parallel = par.tensor_model_parallel_size * par.pipeline_model_parallel_size * par.context_parallel_size;
  if (world_size % model_parallel != 0)
    return InvalidArgument("world size ", world_size, " is not divisible by --tensor-model-parallel-size ",
                           par.tensor_model_parallel_size, " x --pipeline-model-parallel-size ",
                           par.pipeline_model_parallel_size, " x --context-parallel-size ", par.context_parallel_size);
  par.data_parallel_size = world_size / model_parallel;
  if (par.context_parallel_size > 1) return Unimplemented("--context-parallel-size > 1: not supported yet");
  if (par.expert_model_parallel_size > 1) return Unimplemented("--expert-model-parallel-size > 1: not supported yet");
  int64_t tp = par.tensor_model_parallel_size;
  if (m.num_attention_heads % tp != 0)
    return InvalidArgument("--num-attention-heads ", m.num_attention_heads, " must be divisible by --tensor-model-parallel-size ", tp);
  if (m.num_kv_heads % tp != 0)
    return InvalidArgument(m.num_kv_heads == m.num_attention_heads ? "--num-attention-heads " : "--num-query-groups ",
                           m.num_kv_heads, " must be divisible by --tensor-model-parallel-size ", tp);
  if (par.sequence_parallel && tp == 1) par.sequence_parallel = false;  // as Megatron (it warns)
  if (par.sequence_parallel && m.seq_length % tp != 0)
    return InvalidArgument("--seq-length ", m.seq_length, " must be divisible by --tensor-model-parallel-size ", tp,
                           " with --sequence-parallel");
  if (par.overlap_param_gather && !(par.use_distributed_optimizer && par.overlap_grad_reduce))
    return InvalidArgument("--overlap-param-gather needs --use-distributed-optimizer and --overlap-grad-reduce");
  int64_t pp = par.pipeline_model_parallel_size;
  if (pp == 1 && (par.num_layers_per_virtual_pipeline_stage != kUnset || par.num_virtual_stages_per_pipeline_rank != kUnset))
    return InvalidArgument("--num-layers-per-virtual-pipeline-stage needs --pipeline-model-parallel-size > 1");
  if (pp > 1 || par.decoder_first_pipeline_num_layers != kUnset || par.decoder_last_pipeline_num_layers != kUnset) {
    return Unimplemented("--pipeline-model-parallel-size > 1: not supported yet");
  }
  if (tp > 1) return Unimplemented("--tensor-model-parallel-size > 1: not supported yet");
  (void)p;
  return Status::Ok();
}

}  // namespace gale
