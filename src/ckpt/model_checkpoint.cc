// Parameter shards <-> checkpoint pieces.
#include "ckpt/model_checkpoint.h"

namespace gale {

namespace {

// Adds the local tensor `local` (laid out as spec's local shape) under `name`, one piece per box.
Status add_local(CheckpointWriter& w, const ParamSpec& spec, const std::string& name, const Tensor& local) {
  for (const ShardBox& b : shard_boxes(spec)) {
    Tensor piece = local;
    if (b.local != whole_box(local.shape())) {  // a sub-box of the local tensor: copy it out
      piece = Tensor::empty(b.local.shape);
      GALE_RETURN_IF_ERROR(copy_box_region(local.raw(), StDType::kF32, whole_box(local.shape()), piece.raw(),
                                           DType::kF32, b.local, b.local, name));
    }
    GALE_RETURN_IF_ERROR(w.add(name, spec.global_shape, b.global.offsets, piece));
  }
  return Status::Ok();
}

Status read_local(const CheckpointReader& r, const ParamSpec& spec, const std::string& name, Tensor& local) {
  for (const ShardBox& b : shard_boxes(spec)) {
    if (b.local == whole_box(local.shape())) {
      GALE_RETURN_IF_ERROR(r.read_slice_into(name, spec.global_shape, b.global.offsets, local));
      continue;
    }
    Tensor piece = Tensor::empty(b.local.shape);
    GALE_RETURN_IF_ERROR(r.read_slice_into(name, spec.global_shape, b.global.offsets, piece));
    GALE_RETURN_IF_ERROR(copy_box_region(piece.raw(), StDType::kF32, b.local, local.raw(), DType::kF32,
                                         whole_box(local.shape()), b.local, name));
  }
  return Status::Ok();
}

Tensor state_view(const ParamSpec& spec, const Tensor& flat) {
  return Tensor::from_blob(flat.data<float>() + spec.offset, spec.local_shape(), DType::kF32);
}

Status check_flat(const ParamBuffer& params, const std::string& state, const Tensor& flat) {
  if (!flat.defined() || flat.dtype() != DType::kF32 || flat.numel() != params.numel())
    return InvalidArgument("optimizer state '", state, "': expected an f32 buffer of ", params.numel(),
                           " elements (one per parameter element)");
  return Status::Ok();
}

}  // namespace

std::vector<ShardBox> shard_boxes(const ParamSpec& spec) {
  const Shape local = spec.local_shape();
  if (!spec.is_split()) return {ShardBox{whole_box(spec.global_shape), whole_box(local)}};
  const size_t d = static_cast<size_t>(spec.split_dim);
  std::vector<ShardBox> boxes;
  for (int64_t b = 0; b < spec.split_blocks; ++b) {
    const ParamSpec::SplitBlock k = spec.split_block(b);
    ShardBox sb{whole_box(local), whole_box(local)};
    sb.global.shape[d] = sb.local.shape[d] = k.rows;
    sb.global.offsets[d] = k.global_start + k.offset;
    sb.local.offsets[d] = k.local_start;
    if (spec.split2_parts > 1) {  // --tp-2d: this rank's columns
      sb.global.shape[1] = local[1];
      sb.global.offsets[1] = spec.split2_offset();
    }
    boxes.push_back(std::move(sb));
  }
  return boxes;
}

std::string optimizer_state_name(const std::string& state, const std::string& param_name) {
  return "optimizer." + state + "." + param_name;
}

Status add_parameters(CheckpointWriter& w, const ParamBuffer& params) {
  for (int id = 0; id < params.size(); ++id) {
    const ParamSpec& s = params.spec(id);
    if (s.split_dim < 0 && s.split_rank != 0) continue;
    GALE_RETURN_IF_ERROR(add_local(w, s, s.name, params.param_values(id)));
  }
  return Status::Ok();
}

Status add_parameter_state(CheckpointWriter& w, const ParamBuffer& params, const std::string& state,
                           const Tensor& flat) {
  GALE_RETURN_IF_ERROR(check_flat(params, state, flat));
  for (int id = 0; id < params.size(); ++id) {
    const ParamSpec& s = params.spec(id);
    if (s.split_dim < 0 && s.split_rank != 0) continue;
    GALE_RETURN_IF_ERROR(add_local(w, s, optimizer_state_name(state, s.name), state_view(s, flat)));
  }
  return Status::Ok();
}

Status load_parameters(const CheckpointReader& r, ParamBuffer& params, bool use_ema) {
  for (int id = 0; id < params.size(); ++id) {
    Tensor local = params.param_values(id);  // a copy under --reuse-fp32-param: stored split below
    const std::string& name = params.spec(id).name;
    // --fp8-recipe delayed's state (model/fp8.h) from a checkpoint saved without it: the initial
    // state stands (scales 1, empty histories), as TE starts from an empty _extra_state.
    if (params.spec(id).buffer && params.spec(id).fp8_state_buffer && !r.has_tensor(name)) continue;
    GALE_RETURN_IF_ERROR(read_local(r, params.spec(id), use_ema ? ema_weight_name(r, name) : name, local));
    if (params.is_split(id)) params.set_param_values(id, local.data<float>());
  }
  return Status::Ok();
}

Status load_parameter_state(const CheckpointReader& r, const ParamBuffer& params, const std::string& state,
                            Tensor& flat) {
  GALE_RETURN_IF_ERROR(check_flat(params, state, flat));
  for (int id = 0; id < params.size(); ++id) {
    const ParamSpec& s = params.spec(id);
    Tensor local = state_view(s, flat);
    GALE_RETURN_IF_ERROR(read_local(r, s, optimizer_state_name(state, s.name), local));
  }
  return Status::Ok();
}

std::string ema_weight_name(const CheckpointReader& r, const std::string& name) {
  const std::string ema = optimizer_state_name("ema_params", name);
  return r.has_tensor(ema) ? ema : name;
}

Status check_checkpoint_has_ema(const CheckpointReader& r, const std::string& flag) {
  const StatusOr<nlohmann::json> o = r.section("optimizer");
  if (o.ok() && o.value().is_object() && o.value().contains("ema_decay")) return Status::Ok();
  return FailedPrecondition(flag, ": checkpoint ", r.directory(), " holds no parameter EMA (expected one saved by "
                            "`gale pretrain --optimizer-selection fused_ema_adamw` with its optimizer state)");
}

}  // namespace gale
