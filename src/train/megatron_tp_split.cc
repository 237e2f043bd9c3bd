// Megatron-Core's tensor-parallel splits of GPT tensors: which dimension, merging the pieces, cutting them.
#include "train/megatron_tp_split.h"

#include <algorithm>
#include <cstring>

#include "train/megatron_mla_names.h"

namespace gale {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

MegatronSplit megatron_split_of(const std::string& name, bool swiglu) {
  if (ends_with(name, ".linear_fc1.weight") || ends_with(name, ".linear_fc1.bias"))
    return swiglu ? MegatronSplit::kGatedRows : MegatronSplit::kRows;
  if (ends_with(name, "self_attention.linear_qkv.weight") || ends_with(name, "self_attention.linear_qkv.bias") ||
      ends_with(name, "self_attention.core_attention.softmax_offset") ||  // --softmax-type learnable: heads
      name == "embedding.word_embeddings.weight" || name == "output_layer.weight" ||
      ends_with(name, ".eh_proj.weight"))  // an MTP layer's column-parallel projection [H, 2H]
    return MegatronSplit::kRows;
  if (const size_t a = name.find("self_attention.");
      a != std::string::npos && megatron_mla_column_parallel(name.substr(a)))
    return MegatronSplit::kRows;  // multi-latent attention's projections (train/megatron_mla_names.h)
  if (ends_with(name, "self_attention.linear_proj.weight") || ends_with(name, ".linear_fc2.weight"))
    return MegatronSplit::kColumns;
  return MegatronSplit::kReplicated;  // norms, row-parallel biases, position embeddings
}

void megatron_copy_rows(const Tensor& src, int64_t r0, int64_t n, Tensor& dst, int64_t d0) {
  const int64_t row_bytes = src.numel() / std::max<int64_t>(src.shape()[0], 1) * dtype_size(src.dtype());
  std::memcpy(static_cast<char*>(dst.raw()) + d0 * row_bytes, static_cast<const char*>(src.raw()) + r0 * row_bytes,
              static_cast<size_t>(n * row_bytes));
}

StatusOr<Tensor> megatron_merge_tp(const std::vector<Tensor>& parts, MegatronSplit split, const std::string& name,
                                   const std::string& where) {
  const Tensor& first = parts[0];
  for (const Tensor& p : parts)
    if (p.shape() != first.shape() || p.dtype() != first.dtype())
      return DataLoss(where, ": tensor '", name, "' has shape ", first.shape_string(), " on tensor-parallel rank 0 but ",
                      p.shape_string(), " (", dtype_name(p.dtype()), ") on another");
  const int64_t tp = static_cast<int64_t>(parts.size());
  if (split == MegatronSplit::kReplicated || tp == 1) return first.clone();
  if (first.ndim() == 0) return DataLoss(where, ": tensor '", name, "' is a scalar; expected a split tensor");
  const int64_t rows = first.shape()[0];
  if (split == MegatronSplit::kRows || split == MegatronSplit::kGatedRows) {
    Shape shape = first.shape();
    shape[0] = rows * tp;
    Tensor out = Tensor::empty(shape, first.dtype());
    if (split == MegatronSplit::kRows) {
      for (int64_t t = 0; t < tp; ++t) megatron_copy_rows(parts[t], 0, rows, out, t * rows);
    } else {
      if (rows % 2) return DataLoss(where, ": SwiGLU tensor '", name, "' has an odd number of rows (", rows, ")");
      const int64_t half = rows / 2;
      for (int64_t t = 0; t < tp; ++t) {
        megatron_copy_rows(parts[t], 0, half, out, t * half);                 // gate
        megatron_copy_rows(parts[t], half, half, out, tp * half + t * half);  // up
      }
    }
    return out;
  }
  if (first.ndim() != 2) return DataLoss(where, ": row-parallel tensor '", name, "' is not 2-D: ", first.shape_string());
  const int64_t cols = first.shape()[1], es = dtype_size(first.dtype());
  Tensor out = Tensor::empty({rows, cols * tp}, first.dtype());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = 0; t < tp; ++t)
      std::memcpy(static_cast<char*>(out.raw()) + (r * cols * tp + t * cols) * es,
                  static_cast<const char*>(parts[t].raw()) + r * cols * es, static_cast<size_t>(cols * es));
  return out;
}

StatusOr<Tensor> megatron_cut_tp(const Tensor& whole, MegatronSplit split, int64_t tp, int64_t t,
                                 const std::string& name) {
  if (split == MegatronSplit::kReplicated || tp == 1) return whole;
  const int64_t rows = whole.shape()[0];
  if (split == MegatronSplit::kRows || split == MegatronSplit::kGatedRows) {
    const int64_t parts = split == MegatronSplit::kGatedRows ? 2 * tp : tp;
    if (rows % parts)
      return InvalidArgument("tensor '", name, "' of shape ", whole.shape_string(), ": ", rows,
                             " rows do not split into ", parts, " equal parts for tensor-parallel size ", tp);
    Shape shape = whole.shape();
    shape[0] = rows / tp;
    Tensor out = Tensor::empty(shape, whole.dtype());
    if (split == MegatronSplit::kRows) {
      megatron_copy_rows(whole, t * (rows / tp), rows / tp, out, 0);
    } else {
      const int64_t half = rows / 2, piece = half / tp;
      megatron_copy_rows(whole, t * piece, piece, out, 0);
      megatron_copy_rows(whole, half + t * piece, piece, out, piece);
    }
    return out;
  }
  const int64_t cols = whole.shape()[1], es = dtype_size(whole.dtype());
  if (cols % tp)
    return InvalidArgument("tensor '", name, "' of shape ", whole.shape_string(), ": ", cols,
                           " columns do not split into ", tp, " equal parts");
  const int64_t c = cols / tp;
  Tensor out = Tensor::empty({rows, c}, whole.dtype());
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(out.raw()) + r * c * es,
                static_cast<const char*>(whole.raw()) + (r * cols + t * c) * es, static_cast<size_t>(c * es));
  return out;
}

}  // namespace gale
