// Context parallelism of the Gated DeltaNet mixer: the head-split all-to-alls and each cp rank's parameter slice.
#include "model/gdn_context_parallel.h"

#include <algorithm>

#include "core/check.h"

namespace gale {

namespace {

// The in_proj column (of d's row q|k|v|z|β|α, or GDN2's q|k|v|z|f|b|w) of each column of the blocked
// row [CP·R_cp], whose block j is cp rank j's row in gdn_cp_local(d)'s layout: the j-th CP-th of
// every section.
std::vector<int64_t> blocked_columns(const GdnDims& d, int64_t cp) {
  const GdnDims c = gdn_cp_local(d, cp);
  const std::vector<int64_t> sections = d.in_proj_sections();
  std::vector<int64_t> cols;
  cols.reserve(static_cast<size_t>(cp * c.in_proj_rows()));
  for (int64_t j = 0; j < cp; ++j) {
    int64_t first = 0;
    for (int64_t n : sections) {
      for (int64_t i = 0; i < n / cp; ++i) cols.push_back(first + j * (n / cp) + i);
      first += n;
    }
  }
  return cols;
}

}  // namespace

GdnDims gdn_cp_local(const GdnDims& d, int64_t cp) {
  GALE_CHECK(cp >= 1 && d.NK % cp == 0 && d.NV % cp == 0)
      << "Gated DeltaNet: context-parallel size " << cp << " must divide the key heads (" << d.NK
      << ") and value heads (" << d.NV << ") of a tensor-parallel rank";
  GdnDims c = d;
  c.NK /= cp;
  c.NV /= cp;
  return c;
}

Tensor gdn_cp_seq_to_heads(const MambaCpComm& cp, const GdnDims& d, const Tensor& zx) {
  GALE_CHECK_EQ(zx.size(1), d.in_proj_rows());
  return cp_columns_seq_to_heads(cp, blocked_columns(d, cp.split->cp_size), zx);
}

Tensor gdn_cp_seq_to_heads_backward(const MambaCpComm& cp, const GdnDims& d, const Tensor& d_zx) {
  return cp_columns_seq_to_heads_backward(cp, blocked_columns(d, cp.split->cp_size), d.in_proj_rows(), d_zx);
}

GdnCpWeights::GdnCpWeights(const GdnDims& d, const GdnWeights& whole) : d_(d), w_(whole) {
  if (!whole.cp.on()) return;
  const int64_t cp_size = whole.cp.split->cp_size, cp_rank = whole.cp.split->cp_rank;
  const GdnDims c = gdn_cp_local(d, cp_size);
  d_ = c;
  // conv1d's channels are in_proj's q|k|v columns; this rank's are the first conv_dim of its block.
  const std::vector<int64_t> cols = blocked_columns(d, cp_size);
  const size_t first = static_cast<size_t>(cp_rank * c.in_proj_rows());
  for (size_t k = first; k < first + static_cast<size_t>(c.conv_dim()); ++k) channels_.push_back(cols[k]);
  const size_t CD = channels_.size(), K = static_cast<size_t>(d.K);
  conv_w_.resize(CD * K);
  for (size_t i = 0; i < CD; ++i)
    std::copy_n(whole.conv_w + static_cast<size_t>(channels_[i]) * K, K, conv_w_.data() + i * K);
  w_.conv_w = conv_w_.data();
  whole_g_conv_w_ = whole.g_conv_w;
  if (whole_g_conv_w_) {
    g_conv_w_.assign(CD * K, 0.0f);
    w_.g_conv_w = g_conv_w_.data();
  }
  // GDN: A_log and dt_bias of this rank's value heads; GDN2: A_log of its key heads, dt_bias of their channels.
  const int64_t a_first = cp_rank * c.a_log_dim(), dt_first = cp_rank * c.dt_bias_dim();
  w_.a_log = whole.a_log + a_first;
  w_.dt_bias = whole.dt_bias + dt_first;
  w_.g_a_log = whole.g_a_log ? whole.g_a_log + a_first : nullptr;
  w_.g_dt_bias = whole.g_dt_bias ? whole.g_dt_bias + dt_first : nullptr;
}

void GdnCpWeights::add_grads() const {
  if (!whole_g_conv_w_) return;
  const size_t K = static_cast<size_t>(d_.K);
  for (size_t i = 0; i < channels_.size(); ++i)
    for (size_t k = 0; k < K; ++k)
      whole_g_conv_w_[static_cast<size_t>(channels_[i]) * K + k] += g_conv_w_[i * K + k];
}

}  // namespace gale
