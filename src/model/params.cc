// Flat parameter/gradient buffers and layout-independent initialisation.
#include "model/params.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/bf16_split.h"
#include "core/rng.h"
#include "core/threads.h"
#include "kernels/cpu/gemm.h"
#include "parallel/tp_share.h"

namespace gale {

namespace {

// Global extent of block b along the split dimension.
int64_t block_extent(const ParamSpec& s, int64_t b) {
  if (!s.split_block_extents.empty()) return s.split_block_extents[static_cast<size_t>(b)];
  return s.global_shape[static_cast<size_t>(s.split_dim)] / s.split_blocks;
}

// The rank's units of block b of the split dimension (parallel/tp_share.h).
TpShare block_share(const ParamSpec& s, int64_t b) {
  const int64_t extent = s.global_shape[static_cast<size_t>(s.split_dim)];
  if (s.split_block_extents.empty()) {
    GALE_CHECK(s.split_unit >= 1 && extent % (s.split_blocks * s.split_unit) == 0)
        << s.name << ": dimension " << s.split_dim << " (" << extent << ") is not " << s.split_blocks
        << " block(s) of units of " << s.split_unit;
  } else {
    int64_t sum = 0;
    for (int64_t e : s.split_block_extents) {
      GALE_CHECK(s.split_unit >= 1 && e % s.split_unit == 0)
          << s.name << ": block of " << e << " rows is not units of " << s.split_unit;
      sum += e;
    }
    GALE_CHECK(sum == extent && static_cast<int64_t>(s.split_block_extents.size()) == s.split_blocks)
        << s.name << ": " << s.split_block_extents.size() << " blocks of " << sum << " rows for " << s.split_blocks
        << " blocks of dimension " << s.split_dim << " (" << extent << ")";
  }
  return tp_share(block_extent(s, b) / s.split_unit, s.split_parts, s.split_rank);
}

}  // namespace

int64_t ParamSpec::split_block_rows() const {
  GALE_CHECK(split_block_extents.empty()) << name << ": unequal blocks (split_block)";
  if (split_dim < 0) return global_shape.empty() ? 1 : global_shape[0];
  if (split_parts == 1) return global_shape[static_cast<size_t>(split_dim)] / split_blocks;
  return block_share(*this, 0).count * split_unit;
}

int64_t ParamSpec::split_block_offset() const {
  GALE_CHECK(split_block_extents.empty()) << name << ": unequal blocks (split_block)";
  if (split_dim < 0 || split_parts == 1) return 0;
  return block_share(*this, 0).offset * split_unit;
}

ParamSpec::SplitBlock ParamSpec::split_block(int64_t b) const {
  GALE_CHECK(split_dim >= 0 && b >= 0 && b < split_blocks) << name << ": block " << b;
  SplitBlock out;
  for (int64_t k = 0; k <= b; ++k) {
    const int64_t extent = block_extent(*this, k);
    const TpShare share = split_parts > 1 ? block_share(*this, k) : TpShare{0, extent / split_unit};
    if (k == b) {
      out.rows = share.count * split_unit;
      out.offset = share.offset * split_unit;
    } else {
      out.global_start += extent;
      out.local_start += share.count * split_unit;
    }
  }
  return out;
}

int64_t ParamSpec::split2_offset() const {
  if (split2_parts == 1) return 0;
  GALE_CHECK(global_shape.size() == 2 && split_dim == 0 && global_shape[1] % split2_parts == 0)
      << name << ": a --tp-2d column split needs a 2-D tensor split along dimension 0 with columns divisible by "
      << split2_parts;
  return split2_rank * (global_shape[1] / split2_parts);
}

Shape ParamSpec::local_shape() const {
  Shape s = global_shape;
  if (split_dim >= 0 && split_parts > 1) {
    if (split_block_extents.empty()) {
      s[static_cast<size_t>(split_dim)] = split_blocks * split_block_rows();
    } else {
      block_share(*this, 0);  // checks the blocks
      int64_t rows = 0;
      for (int64_t extent : split_block_extents) rows += tp_share(extent / split_unit, split_parts, split_rank).count;
      s[static_cast<size_t>(split_dim)] = rows * split_unit;
    }
  }
  if (split2_parts > 1) {
    split2_offset();  // checks the shape
    s[1] /= split2_parts;
  }
  return s;
}

int64_t ParamSpec::local_numel() const { return shape_numel(local_shape()); }

int64_t ParamSpec::global_index(int64_t i) const {
  if (split2_parts > 1) {  // --tp-2d: rows split along dimension 0 as below, columns shifted to this rank's
    const int64_t local_cols = global_shape[1] / split2_parts, r = i / local_cols;
    int64_t row = r;
    if (split_parts > 1) {
      const int64_t block_local = split_block_rows(), block_global = global_shape[0] / split_blocks;
      row = (r / block_local) * block_global + split_block_offset() + r % block_local;
    }
    return row * global_shape[1] + split2_offset() + i % local_cols;
  }
  if (split_dim < 0 || split_parts == 1) return i;
  Shape local = local_shape();
  // Decompose i into (outer, d, inner) around the split dimension.
  int64_t inner = 1;
  for (size_t k = static_cast<size_t>(split_dim) + 1; k < local.size(); ++k) inner *= local[k];
  int64_t dl = local[split_dim];
  int64_t outer = i / (dl * inner), d = (i / inner) % dl, in = i % inner;
  int64_t dg = global_shape[split_dim];
  if (split_block_extents.empty()) {
    const int64_t block_local = dl / split_blocks, block_global = dg / split_blocks;
    const int64_t block = d / block_local, within = d % block_local;
    return (outer * dg + block * block_global + split_block_offset() + within) * inner + in;
  }
  int64_t global_start = 0, local_start = 0;  // one pass over the blocks (split_block's walk)
  for (int64_t extent : split_block_extents) {
    const TpShare share = tp_share(extent / split_unit, split_parts, split_rank);
    const int64_t rows = share.count * split_unit;
    if (d < local_start + rows)
      return (outer * dg + global_start + share.offset * split_unit + d - local_start) * inner + in;
    global_start += extent;
    local_start += rows;
  }
  GALE_CHECK(false) << name << ": local row " << d << " of " << dl;
  return -1;
}

int ParamBuffer::add(ParamSpec spec) {
  GALE_CHECK(!finalized()) << "add(" << spec.name << ") after finalize";
  GALE_CHECK_EQ(find(spec.name), -1) << "duplicate parameter " << spec.name;
  spec.offset = numel_;
  numel_ += spec.local_numel();
  specs_.push_back(std::move(spec));
  return static_cast<int>(specs_.size()) - 1;
}

void ParamBuffer::insert_padding(const std::vector<std::pair<int64_t, int64_t>>& gaps) {
  GALE_CHECK(params_.defined() && !sharded_) << "insert_padding needs finalized, unsharded flat buffers";
  GALE_CHECK(grad_alias_.empty()) << "insert_padding: before alias_grads";
  GALE_CHECK(!reuse_fp32_) << "insert_padding: --reuse-fp32-param's split storage cannot be padded";
  int64_t added = 0;
  for (const auto& [at, count] : gaps) {
    GALE_CHECK(at >= 0 && at <= trainable_numel_ && count >= 0)
        << "padding of " << count << " at " << at << " outside the trainable buffer of " << trainable_numel_;
    added += count;
  }
  if (added == 0) return;
  // Elements inserted at or before `offset`: how far an element at `offset` moves.
  auto shift = [&](int64_t offset) {
    int64_t n = 0;
    for (const auto& [at, count] : gaps)
      if (at <= offset) n += count;
    return n;
  };
  for (auto& [at, count] : padding_) at += shift(at);  // earlier padding moves with what follows it
  for (const auto& [at, count] : gaps)
    if (count > 0) padding_.emplace_back(at + shift(at) - count, count);
  std::sort(padding_.begin(), padding_.end());
  Tensor params = Tensor::zeros({numel_ + added}), grads = Tensor::zeros({trainable_numel_ + shift(trainable_numel_)});
  for (ParamSpec& s : specs_) {
    const int64_t to = s.offset + shift(s.offset), n = s.local_numel();
    if (n > 0) {
      std::memcpy(params.data<float>() + to, params_.data<float>() + s.offset, static_cast<size_t>(n) * sizeof(float));
      if (s.trainable)
        std::memcpy(grads.data<float>() + to, grads_.data<float>() + s.offset, static_cast<size_t>(n) * sizeof(float));
    }
    s.offset = to;
  }
  dense_numel_ += shift(dense_numel_);
  trainable_numel_ += shift(trainable_numel_);
  numel_ += added;
  params_ = std::move(params);
  grads_ = std::move(grads);
  if (params_gemm_.defined()) {
    params_gemm_ = Tensor::zeros({numel_}, params_gemm_.dtype());
    refresh_gemm_copy();
  }
}

int64_t ParamBuffer::padding_numel() const {
  int64_t n = 0;
  for (const auto& [at, count] : padding_) n += count;
  return n;
}

void ParamBuffer::freeze(int id) {
  GALE_CHECK(!finalized()) << "freeze(" << spec(id).name << ") after finalize";
  specs_.at(static_cast<size_t>(id)).trainable = false;
}

void ParamBuffer::rename_prefix(int id, const std::string& from, const std::string& to) {
  GALE_CHECK(!finalized()) << "rename_prefix(" << spec(id).name << ") after finalize";
  ParamSpec& s = specs_.at(static_cast<size_t>(id));
  for (std::string* n : {&s.name, &s.global_name}) {
    if (n->empty()) continue;
    GALE_CHECK(n->compare(0, from.size(), from) == 0) << *n << " does not start with " << from;
    *n = to + n->substr(from.size());
  }
  GALE_CHECK_EQ(find(s.name), id) << "duplicate parameter " << s.name;
}

void ParamBuffer::set_init(int id, InitKind init, float init_std) {
  GALE_CHECK(!finalized()) << "set_init(" << spec(id).name << ") after finalize";
  ParamSpec& s = specs_.at(static_cast<size_t>(id));
  s.init = init;
  s.init_std = init_std;
}

void ParamBuffer::set_qat(int id, MxElement element, int64_t block) {
  ParamSpec& s = specs_.at(static_cast<size_t>(id));
  GALE_CHECK(s.global_shape.size() == 2) << "--qat-scheme on " << s.name << ", not a 2-D weight";
  s.qat_element = element;
  s.qat_block = block;
}

void ParamBuffer::set_fp8(int id, int state_id) {
  ParamSpec& s = specs_.at(static_cast<size_t>(id));
  GALE_CHECK(s.global_shape.size() == 2) << "--fp8-format on " << s.name << ", not a 2-D weight";
  s.fp8 = true;
  s.fp8_state = state_id;
}

float xavier_uniform_bound(int64_t fan_out, int64_t fan_in) {
  GALE_CHECK(fan_out > 0 && fan_in > 0) << "fan_out " << fan_out << ", fan_in " << fan_in;
  return static_cast<float>(std::sqrt(6.0 / static_cast<double>(fan_in + fan_out)));
}

void ParamBuffer::finalize() {
  // Trainable dense parameters, trainable expert_parallel ones, then the frozen ones, each group
  // in registration order.
  int64_t at = 0, largest_frozen = 0;
  for (ParamSpec& s : specs_)
    if (s.trainable && !s.expert_parallel) s.offset = at, at += s.local_numel();
  dense_numel_ = at;
  for (ParamSpec& s : specs_)
    if (s.trainable && s.expert_parallel) s.offset = at, at += s.local_numel();
  trainable_numel_ = at;
  for (ParamSpec& s : specs_)
    if (!s.trainable) {
      s.offset = at;
      at += s.local_numel();
      if (s.global_shape.size() == 1) largest_frozen = std::max(largest_frozen, s.local_numel());
    }
  GALE_CHECK_EQ(at, numel_);
  params_ = Tensor::zeros({numel_});
  grads_ = Tensor::zeros({trainable_numel_});
  if (largest_frozen > 0) frozen_grad_sink_ = Tensor::zeros({largest_frozen});
}

int ParamBuffer::find(const std::string& name) const {
  for (size_t i = 0; i < specs_.size(); ++i)
    if (specs_[i].name == name) return static_cast<int>(i);
  return -1;
}

Tensor ParamBuffer::param(int id) const {
  return Tensor::from_blob(param_data(id), spec(id).local_shape(), DType::kF32);
}

Tensor ParamBuffer::grad(int id) const {
  return Tensor::from_blob(grad_data(id), spec(id).local_shape(), DType::kF32);
}

void ParamBuffer::enable_gemm_copy(DType dtype, bool reuse_fp32) {
  GALE_CHECK(finalized());
  GALE_CHECK(dtype == DType::kBF16 || dtype == DType::kF16) << "a GEMM copy in " << dtype_name(dtype);
  if (reuse_fp32) {
    GALE_CHECK(dtype == DType::kBF16) << "--reuse-fp32-param needs bf16, not " << dtype_name(dtype);
    if (reuse_fp32_) return;
    params_gemm_ = Tensor();
    split_.assign(specs_.size(), false);
    reuse_fp32_ = true;
    std::vector<float> values;
    for (int id = 0; id < size(); ++id) {
      const ParamSpec& s = spec(id);
      if (!s.gemm_weight || !s.trainable) continue;
      const float* p = params_.data<float>() + s.offset;
      values.assign(p, p + s.local_numel());
      split_[static_cast<size_t>(id)] = true;
      store_split(id, 0, s.local_numel(), values.data());
    }
    return;
  }
  GALE_CHECK(!reuse_fp32_) << "a GEMM copy after --reuse-fp32-param";
  if (!params_gemm_.defined() || params_gemm_.dtype() != dtype) params_gemm_ = Tensor::empty({numel_}, dtype);
  refresh_gemm_copy();
}

void ParamBuffer::refresh_gemm_copy() { refresh_gemm_copy(0, numel_); }

void ParamBuffer::refresh_gemm_copy(int64_t offset, int64_t count) {
  if (!params_gemm_.defined()) return;  // none, or --reuse-fp32-param (split storage is its own copy)
  GALE_CHECK(offset >= 0 && offset + count <= numel_);
  if (params_gemm_.dtype() == DType::kBF16)
    convert_f32_to_bf16(params_.data<float>() + offset, params_gemm_.data<bf16>() + offset, count);
  else
    convert_f32_to_f16(params_.data<float>() + offset, params_gemm_.data<f16>() + offset, count);
}

void ParamBuffer::merge_split(int id, int64_t begin, int64_t count, float* out) const {
  const ParamSpec& s = spec(id);
  const int64_t n = s.local_numel();
  GALE_CHECK(begin >= 0 && begin + count <= n);
  const uint16_t* b = reinterpret_cast<const uint16_t*>(params_.data<float>() + s.offset) + begin;
  const uint16_t* r = reinterpret_cast<const uint16_t*>(params_.data<float>() + s.offset) + n + begin;
  const int64_t flat = s.offset + begin;
  parallel_for(count, 1 << 14, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const bool tie = r[i] == 0x8000u && std::binary_search(ties_.begin(), ties_.end(), flat + i);
      out[i] = merge_bf16_residual_to_f32(b[i], r[i], tie);
    }
  });
}

void ParamBuffer::store_split(int id, int64_t begin, int64_t count, const float* in) {
  const ParamSpec& s = spec(id);
  const int64_t n = s.local_numel();
  GALE_CHECK(begin >= 0 && begin + count <= n);
  uint16_t* b = reinterpret_cast<uint16_t*>(params_.data<float>() + s.offset) + begin;
  uint16_t* r = reinterpret_cast<uint16_t*>(params_.data<float>() + s.offset) + n + begin;
  parallel_for(count, 1 << 14, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) split_f32_to_bf16_residual(in[i], &b[i], &r[i]);
  });
  // The tie list of [flat, flat + count): replaced by this piece's ties.
  const int64_t flat = s.offset + begin;
  std::vector<int64_t> found;
  for (int64_t i = 0; i < count; ++i) {
    uint32_t u;
    std::memcpy(&u, in + i, 4);
    if (bf16_split_tie_down(u)) found.push_back(flat + i);
  }
  auto lo = std::lower_bound(ties_.begin(), ties_.end(), flat);
  auto hi = std::lower_bound(lo, ties_.end(), flat + count);
  if (found.empty() && lo == hi) return;
  const auto at = ties_.erase(lo, hi) - ties_.begin();
  ties_.insert(ties_.begin() + at, found.begin(), found.end());
}

void ParamBuffer::read_values(int64_t offset, int64_t count, float* out) const {
  GALE_CHECK(offset >= 0 && offset + count <= numel_);
  if (!reuse_fp32_) {
    std::memcpy(out, params_.data<float>() + offset, static_cast<size_t>(count) * sizeof(float));
    return;
  }
  for (int id = 0; id < size(); ++id) {
    const ParamSpec& s = spec(id);
    const int64_t lo = std::max(offset, s.offset), hi = std::min(offset + count, s.offset + s.local_numel());
    if (hi <= lo) continue;
    if (is_split(id))
      merge_split(id, lo - s.offset, hi - lo, out + (lo - offset));
    else
      std::memcpy(out + (lo - offset), params_.data<float>() + lo, static_cast<size_t>(hi - lo) * sizeof(float));
  }
}

void ParamBuffer::write_values(int64_t offset, int64_t count, const float* in) {
  GALE_CHECK(offset >= 0 && offset + count <= numel_);
  if (!reuse_fp32_) {
    float* dst = params_.data<float>() + offset;
    if (dst != in) std::memcpy(dst, in, static_cast<size_t>(count) * sizeof(float));
    refresh_gemm_copy(offset, count);
    return;
  }
  for (int id = 0; id < size(); ++id) {
    const ParamSpec& s = spec(id);
    const int64_t lo = std::max(offset, s.offset), hi = std::min(offset + count, s.offset + s.local_numel());
    if (hi <= lo) continue;
    if (is_split(id)) {
      store_split(id, lo - s.offset, hi - lo, in + (lo - offset));
    } else {
      float* dst = params_.data<float>() + lo;
      if (dst != in + (lo - offset))
        std::memcpy(dst, in + (lo - offset), static_cast<size_t>(hi - lo) * sizeof(float));
    }
  }
}

Tensor ParamBuffer::param_values(int id) const {
  if (!is_split(id)) return param(id);
  Tensor t = Tensor::empty(spec(id).local_shape());
  merge_split(id, 0, spec(id).local_numel(), t.data<float>());
  return t;
}

void ParamBuffer::zero_grads() {
  if (grads_.defined()) grads_.zero();
  if (grad_storage_.defined()) grad_storage_.zero();
  if (shard_grads_.defined()) shard_grads_.zero();
  for (Tensor& g : unit_grads_)
    if (g.defined()) g.zero();
  if (frozen_grad_sink_.defined()) frozen_grad_sink_.zero();
}

int ParamBuffer::unit_at(int64_t offset) const {
  auto it = std::upper_bound(units_.begin(), units_.end(), offset,
                             [](int64_t o, const ParamUnit& u) { return o < u.begin; });
  GALE_CHECK(it != units_.begin()) << "flat offset " << offset << " before the first unit";
  const int u = static_cast<int>(it - units_.begin()) - 1;
  GALE_CHECK(offset < units_[static_cast<size_t>(u)].end) << "flat offset " << offset << " past the last unit";
  return u;
}

float* ParamBuffer::master_data(int64_t offset) const {
  if (!values_sharded_) return params_.data<float>() + offset;
  const ParamUnit& x = units_[static_cast<size_t>(unit_at(offset))];
  GALE_CHECK(offset >= x.own_begin && offset < x.own_end) << "flat offset " << offset << " is not in this rank's shard";
  return shard_values_.data<float>() + x.shard_offset + (offset - x.own_begin);
}

float* ParamBuffer::master_grad(int64_t offset) const {
  GALE_CHECK(grad_alias_.empty()) << "--quant-grads: the f32 gradient buffer is replaced by per-layer scratch; read "
                                     "the gradients through the QuantGradStore";
  if (!sharded_) return grads_.data<float>() + offset;
  const ParamUnit& x = units_[static_cast<size_t>(unit_at(offset))];
  GALE_CHECK(offset >= x.own_begin && offset < x.own_end) << "flat offset " << offset << " is not in this rank's shard";
  return shard_grads_.data<float>() + x.shard_offset + (offset - x.own_begin);
}

void ParamBuffer::alias_grads(std::vector<int64_t> offsets, Tensor storage) {
  GALE_CHECK(finalized() && !sharded_) << "alias_grads: after finalize, not with shard_storage";
  GALE_CHECK_EQ(static_cast<int>(offsets.size()), size());
  GALE_CHECK(storage.defined() && storage.dtype() == DType::kF32);
  for (int id = 0; id < size(); ++id)
    if (spec(id).trainable)
      GALE_CHECK(offsets[static_cast<size_t>(id)] >= 0 &&
                 offsets[static_cast<size_t>(id)] + spec(id).local_numel() <= storage.numel())
          << spec(id).name << ": its gradient lies outside the aliased storage";
  grad_alias_ = std::move(offsets);
  grad_storage_ = std::move(storage);
  grads_ = Tensor();
}

int64_t ParamBuffer::grad_storage_bytes() const {
  int64_t bytes = 0;
  for (const Tensor* t : {&grads_, &grad_storage_, &shard_grads_})
    if (t->defined()) bytes += static_cast<int64_t>(t->nbytes());
  for (const Tensor& g : unit_grads_)
    if (g.defined()) bytes += static_cast<int64_t>(g.nbytes());
  return bytes;
}

float* ParamBuffer::unit_param_data(int id) const {
  const int u = unit_of(id);
  GALE_CHECK(unit_gathered(u)) << spec(id).name << " is read while its ZeRO-3 unit " << u << " is not gathered";
  if (unit_values_bf16_.empty() || !unit_values_bf16_[static_cast<size_t>(u)].defined())
    return unit_values_[static_cast<size_t>(u)].data<float>() + (spec(id).offset - units_[static_cast<size_t>(u)].begin);
  GALE_CHECK(!spec(id).gemm_weight) << spec(id).name << " is read in f32 while its unit " << u
                                    << " is gathered in bf16 (FSDP2 param_dtype bf16): read its bf16 values";
  return unit_values_[static_cast<size_t>(u)].data<float>() + compact_offset(id);
}

const bf16* ParamBuffer::unit_param_bf16_data(int id) const {
  const int u = unit_of(id);
  GALE_CHECK(unit_gathered(u)) << spec(id).name << " is read while its ZeRO-3 unit " << u << " is not gathered";
  GALE_CHECK(spec(id).gemm_weight && unit_values_bf16_[static_cast<size_t>(u)].defined())
      << spec(id).name << " has no bf16 values: FSDP2 param_dtype bf16 gathers the transformer layers' linear "
      << "weights in bf16" << (spec(id).gemm_weight ? " (its unit is gathered in f32 now)" : "");
  return unit_values_bf16_[static_cast<size_t>(u)].data<bf16>() + compact_offset(id);
}

bool ParamBuffer::f32_readable(int id) const {
  if (is_split(id)) return false;
  if (!sharded_bf16_ || !spec(id).gemm_weight) return true;
  const int u = unit_of(id);
  return !unit_values_bf16_[static_cast<size_t>(u)].defined();
}

void ParamBuffer::set_unit_storage_bf16(int u, Tensor values, Tensor values_bf16, Tensor grads) {
  GALE_CHECK(sharded_bf16_) << "set_unit_storage_bf16: the buffer does not gather in bf16";
  const ParamUnit& x = unit(u);
  GALE_CHECK(values.dtype() == DType::kF32 && values_bf16.dtype() == DType::kBF16 &&
             grads.numel() >= x.end - x.begin);
  unit_values_[static_cast<size_t>(u)] = std::move(values);
  unit_values_bf16_[static_cast<size_t>(u)] = std::move(values_bf16);
  unit_grads_[static_cast<size_t>(u)] = std::move(grads);
}

float* ParamBuffer::unit_grad_data(int id) const {
  const int u = unit_of(id);
  GALE_CHECK(unit_gathered(u)) << spec(id).name << "'s gradient is used while its ZeRO-3 unit " << u
                               << " is not gathered";
  return unit_grads_[static_cast<size_t>(u)].data<float>() + (spec(id).offset - units_[static_cast<size_t>(u)].begin);
}

void ParamBuffer::shard_storage(std::vector<ParamUnit> units, bool values) {
  GALE_CHECK(params_.defined() && !sharded_) << "shard_storage: a finalized, unsharded buffer";
  GALE_CHECK(grad_alias_.empty()) << "shard_storage: not with alias_grads";
  GALE_CHECK(!has_frozen() && !reuse_fp32_) << "shard_storage: frozen parameters or --reuse-fp32-param";
  // A GEMM copy: bf16 with sharded values only (FSDP2's param_dtype bf16: gathers_bf16).
  GALE_CHECK(!params_gemm_.defined() || (values && params_gemm_.dtype() == DType::kBF16))
      << "shard_storage: a GEMM copy other than bf16 with sharded values";
  int64_t at = 0, shard = 0;
  for (ParamUnit& x : units) {
    GALE_CHECK(x.begin == at && x.end > x.begin && x.own_begin >= x.begin && x.own_end <= x.end &&
               x.own_begin <= x.own_end)
        << "ZeRO-3 units must tile the buffer in flat order";
    at = x.end;
    x.shard_offset = shard;
    shard += x.own_end - x.own_begin;
  }
  GALE_CHECK_EQ(at, numel_) << "ZeRO-3 units must tile the buffer";
  unit_of_param_.assign(specs_.size(), -1);
  units_ = std::move(units);
  for (int id = 0; id < size(); ++id) {
    const int u = unit_at(spec(id).offset);
    GALE_CHECK(spec(id).offset + spec(id).local_numel() <= units_[static_cast<size_t>(u)].end)
        << spec(id).name << " straddles two ZeRO-3 units";
    unit_of_param_[static_cast<size_t>(id)] = u;
  }
  grads_ = Tensor();  // zero: nothing to keep (freed first, so the whole buffers and the shards meet less)
  if (values) {
    shard_values_ = Tensor::empty({std::max<int64_t>(shard, 1)});
    for (const ParamUnit& x : units_)
      std::memcpy(shard_values_.data<float>() + x.shard_offset, params_.data<float>() + x.own_begin,
                  static_cast<size_t>(x.own_end - x.own_begin) * sizeof(float));
    params_ = Tensor();
  }
  shard_grads_ = Tensor::zeros({std::max<int64_t>(shard, 1)});
  unit_values_.assign(units_.size(), Tensor());
  unit_grads_.assign(units_.size(), Tensor());
  sharded_ = true;
  values_sharded_ = values;
  if (params_gemm_.defined()) {  // FSDP2 param_dtype bf16: the whole copy goes; each gather makes its unit's
    params_gemm_ = Tensor();
    sharded_bf16_ = true;
    unit_values_bf16_.assign(units_.size(), Tensor());
    compact_offset_.assign(specs_.size(), 0);
    std::vector<int> order(specs_.size());  // flat order
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
    std::sort(order.begin(), order.end(), [this](int a, int b) { return spec(a).offset < spec(b).offset; });
    std::vector<int64_t> f32_at(units_.size(), 0), bf16_at(units_.size(), 0);
    for (int id : order) {
      const size_t u = static_cast<size_t>(unit_of(id));
      int64_t& at = spec(id).gemm_weight ? bf16_at[u] : f32_at[u];
      compact_offset_[static_cast<size_t>(id)] = at;
      at += spec(id).local_numel();
    }
  }
}

void ParamBuffer::set_unit_storage(int u, Tensor values, Tensor grads) {
  const ParamUnit& x = unit(u);
  GALE_CHECK((values_sharded_ ? values.numel() >= x.end - x.begin : !values.defined()) &&
             grads.numel() >= x.end - x.begin);
  unit_values_[static_cast<size_t>(u)] = std::move(values);
  unit_grads_[static_cast<size_t>(u)] = std::move(grads);
}

void ParamBuffer::release_unit(int u) {
  if (sharded_bf16_) unit_values_bf16_.at(static_cast<size_t>(u)) = Tensor();
  unit_values_.at(static_cast<size_t>(u)) = Tensor();
  unit_grads_.at(static_cast<size_t>(u)) = Tensor();
}

int64_t ParamBuffer::shard_bytes() const {
  if (!sharded_) return 0;
  return static_cast<int64_t>(shard_grads_.nbytes()) +
         (values_sharded_ ? static_cast<int64_t>(shard_values_.nbytes()) : 0);
}

int64_t ParamBuffer::gathered_bytes() const {
  int64_t bytes = 0;
  for (size_t u = 0; u < unit_values_.size(); ++u)
    if (unit_grads_[u].defined())
      bytes += static_cast<int64_t>(unit_grads_[u].nbytes()) +
               (unit_values_[u].defined() ? static_cast<int64_t>(unit_values_[u].nbytes()) : 0) +
               (sharded_bf16_ && unit_values_bf16_[u].defined() ? static_cast<int64_t>(unit_values_bf16_[u].nbytes()) : 0);
  return bytes;
}

int64_t ParamBuffer::value_bytes() const {
  int64_t bytes = params_.defined() ? static_cast<int64_t>(params_.nbytes()) : 0;
  if (params_gemm_.defined()) bytes += static_cast<int64_t>(params_gemm_.nbytes());
  return bytes + static_cast<int64_t>(ties_.size() * sizeof(int64_t));
}

uint64_t param_init_stream(const std::string& name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return mix_stream(h, 0x1417);
}

void ParamBuffer::initialize(uint64_t seed) {
  GALE_CHECK(finalized());

  std::vector<float> staged;  // a parameter stored split (--reuse-fp32-param) is set through its values
  for (int id = 0; id < size(); ++id) {
    const ParamSpec& s = spec(id);
    int64_t n = s.local_numel();
    if (is_split(id)) staged.resize(static_cast<size_t>(n));
    float* p = is_split(id) ? staged.data() : param_data(id);
    switch (s.init) {
      case InitKind::kZeros:
        for (int64_t i = 0; i < n; ++i) p[i] = 0.0f;
        break;
      case InitKind::kOnes:
        for (int64_t i = 0; i < n; ++i) p[i] = 1.0f;
        break;
      case InitKind::kConstant:
        for (int64_t i = 0; i < n; ++i) p[i] = s.init_std;
        break;
      case InitKind::kNormal: {
        uint64_t stream = param_init_stream(s.whole_model_name());
        parallel_for(n, 1 << 14, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i)
            p[i] = s.init_std * normal_at(seed, stream, static_cast<uint64_t>(s.global_index(i)));
        });
        break;
      }
      case InitKind::kUniform: {
        uint64_t stream = param_init_stream(s.whole_model_name());
        parallel_for(n, 1 << 14, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i)
            p[i] = s.init_std * (2.0f * uniform_at(seed, stream, static_cast<uint64_t>(s.global_index(i))) - 1.0f);
        });
        break;
      }
      case InitKind::kMambaALog:
      case InitKind::kMambaDtBias: {
        const uint64_t stream = param_init_stream(s.whole_model_name());
        for (int64_t i = 0; i < n; ++i) {
          const double r = uniform_at(seed, stream, static_cast<uint64_t>(s.global_index(i)));
          if (s.init == InitKind::kMambaALog) {
            p[i] = static_cast<float>(std::log(1.0 + 15.0 * r));
          } else {
            const double lo = std::log(0.001), hi = std::log(0.1);
            const double dt = std::max(std::exp(lo + r * (hi - lo)), 1e-4);
            p[i] = static_cast<float>(dt + std::log(-std::expm1(-dt)));  // softplus⁻¹
          }
        }
        break;
      }
    }
    if (is_split(id)) set_param_values(id, p);
  }
  refresh_gemm_copy();
}

}  // namespace gale
