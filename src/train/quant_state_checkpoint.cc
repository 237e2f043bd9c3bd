// Saving and restoring the quantised optimizer state of --quant-states, rank by rank.
#include "train/quant_state_checkpoint.h"

#include <cstring>

namespace gale {

namespace {

std::string prefix(int rank, size_t c) { return str_cat("optimizer.quantised.rank", rank, ".chunk", c, "."); }

Tensor segment_table(const Optimizer& optimizer, size_t c, const ParamBuffer& pb) {
  const auto& segs = optimizer.segments(c);
  Tensor t = Tensor::zeros({static_cast<int64_t>(segs.size()), 4}, DType::kI64);
  int64_t* d = t.data<int64_t>();
  for (const Optimizer::Segment& s : segs) {
    *d++ = s.param_id;
    *d++ = s.begin;
    *d++ = s.numel;
    *d++ = pb.spec(s.param_id).local_numel();
  }
  return t;
}

}  // namespace

Status add_quantised_state(CheckpointWriter& w, const Optimizer& optimizer, int rank) {
  if (!optimizer.quantised()) return Status::Ok();
  for (size_t c = 0; c < optimizer.num_buffers(); ++c) {
    const std::string p = prefix(rank, c);
    for (const auto& [name, t] : optimizer.quantised_state(c))
      if (t.numel() > 0) GALE_RETURN_IF_ERROR(w.add(p + name, t));
    if (!optimizer.segments(c).empty())
      GALE_RETURN_IF_ERROR(w.add(p + "segments", segment_table(optimizer, c, optimizer.buffer_params(c))));
  }
  return Status::Ok();
}

StatusOr<bool> load_quantised_state(const CheckpointReader& r, const std::string& saved_quant_states,
                                    Optimizer& optimizer, int rank) {
  if (!optimizer.quantised() || saved_quant_states != optimizer.state_format()) return false;
  // Every buffer must match before any is overwritten.
  for (size_t c = 0; c < optimizer.num_buffers(); ++c) {
    const std::string p = prefix(rank, c);
    if (optimizer.segments(c).empty()) continue;
    if (!r.has_tensor(p + "segments")) return false;
    const Tensor mine = segment_table(optimizer, c, optimizer.buffer_params(c));
    StatusOr<Tensor> saved = r.read(p + "segments", mine.shape(), DType::kI64);
    if (!saved.ok()) return false;  // another number of segments
    if (std::memcmp(saved.value().data<int64_t>(), mine.data<int64_t>(), mine.nbytes()) != 0) return false;
    for (const auto& [name, t] : optimizer.quantised_state(c)) {
      if (t.numel() == 0) continue;
      if (!r.has_tensor(p + name)) return false;
      GALE_ASSIGN_OR_RETURN(Shape shape, r.global_shape(p + name));
      if (shape != t.shape()) return false;
    }
  }
  for (size_t c = 0; c < optimizer.num_buffers(); ++c) {
    const std::string p = prefix(rank, c);
    for (auto& [name, t] : optimizer.quantised_state(c)) {
      if (t.numel() == 0) continue;
      Tensor dst = t;  // shares the optimizer's storage
      GALE_RETURN_IF_ERROR(r.read_slice_into(p + name, t.shape(), std::vector<int64_t>(t.shape().size(), 0), dst));
    }
  }
  return true;
}

}  // namespace gale
