// --ckpt-convert-format torch: Gale's checkpoint in --load rewritten in Megatron's torch format.
#include "train/ckpt_convert.h"

#include <filesystem>

#include "core/log.h"
#include "train/hf_convert.h"
#include "train/megatron_checkpoint.h"

namespace gale {
namespace {

Status convert_on_rank0(const Arguments& args, const std::string& out) {
  const CheckpointArgs& c = args.checkpoint;
  if (c.ckpt_step != kUnset)
    return InvalidArgument("--ckpt-step with --ckpt-convert-format: not supported yet (the latest checkpoint in --load "
                           "is converted)");
  GALE_ASSIGN_OR_RETURN(CheckpointFormat format, detect_checkpoint_format(c.load));
  if (format == CheckpointFormat::kNone)
    return NotFound("--ckpt-convert-format: no checkpoint in --load ", c.load, " (no tracker file)");
  if (format != CheckpointFormat::kGale)
    return InvalidArgument("--ckpt-convert-format ", c.ckpt_convert_format, ": --load ", c.load, " holds a Megatron ",
                           checkpoint_format_name(format),
                           " checkpoint; Gale converts its own checkpoints here (`gale convert --load-model-type mg` "
                           "reads Megatron's)");
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) return IOError("--ckpt-convert-save: cannot create ", out, ": ", ec.message());
  MegatronConvertOptions o;
  o.from = ModelFormat::kGale;
  o.to = ModelFormat::kMegatron;
  o.load_dir = c.load;
  o.save_dir = out;
  o.target_tensor_parallel_size = args.parallel.tensor_model_parallel_size;
  o.target_pipeline_parallel_size = args.parallel.pipeline_model_parallel_size;
  o.target_expert_parallel_size = args.moe.enabled() ? args.parallel.expert_model_parallel_size : 1;
  if (args.moe.enabled() && args.moe.expert_tensor_parallel_size != kUnset &&
      args.moe.expert_tensor_parallel_size != args.parallel.tensor_model_parallel_size)
    return Unimplemented("--ckpt-convert-format torch with --expert-tensor-parallel-size ",
                         args.moe.expert_tensor_parallel_size, " and --tensor-model-parallel-size ",
                         args.parallel.tensor_model_parallel_size, ": not supported yet (Megatron's torch format is "
                         "written with the experts split as the dense layers, expert TP = TP)");
  o.tokenizer_type = args.tokenizer.tokenizer_type;
  return convert_megatron(o, [](const std::string& line) { print_rank0(line); });
}

}  // namespace

Status convert_checkpoint_for_megatron(const Arguments& args, const Comm& world, std::string* line) {
  const std::string out = args.checkpoint.ckpt_convert_save + "/" + args.checkpoint.ckpt_convert_format;
  Status st = world->rank() == 0 ? convert_on_rank0(args, out) : Status::Ok();
  int32_t failed = st.ok() ? 0 : 1;
  world->all_reduce(&failed, 1, DType::kI32, ReduceOp::kMax);  // every rank ends with rank 0's verdict
  if (!st.ok()) return st;
  if (failed) return Internal("--ckpt-convert-format: rank 0 failed to convert --load ", args.checkpoint.load);
  *line = str_cat("> converted checkpoint: gale -> ", args.checkpoint.ckpt_convert_format, " (", out, ").");
  return Status::Ok();
}

}  // namespace gale
