// Context parallelism of the Mamba mixer: the all-to-alls around its convolution and scan (shared with Gated DeltaNet), and each cp rank's parameter slice.
#include "model/mamba_context_parallel.h"

#include <algorithm>

#include "core/check.h"
#include "model/context_parallel.h"

namespace gale {

namespace {

int64_t batch_of(const MambaCpComm& cp, int64_t rows, int64_t positions) {
  GALE_CHECK(cp.group && cp.split && cp.split->cp_size == static_cast<int64_t>(cp.group->size()))
      << "context-parallel mixer without its cp group and split";
  GALE_CHECK(positions > 0 && rows % positions == 0) << "context-parallel mixer: " << rows << " rows for "
                                                     << positions << " positions";
  return rows / positions;
}

// The in_proj column (of d's row z|x|B|C|dt) of each column of the blocked row [CP·R_cp], whose
// block j is cp rank j's row in mamba_cp_local(d)'s layout.
std::vector<int64_t> blocked_columns(const MambaDims& d, int64_t cp) {
  const MambaDims c = mamba_cp_local(d, cp);
  const int64_t repeat = mamba_cp_group_repeat(d, cp), GN = d.G * d.N, GNc = c.G * c.N;
  std::vector<int64_t> cols;
  cols.reserve(static_cast<size_t>(cp * c.in_proj_rows()));
  auto range = [&](int64_t first, int64_t n) {
    for (int64_t i = 0; i < n; ++i) cols.push_back(first + i);
  };
  for (int64_t j = 0; j < cp; ++j) {
    const int64_t group_first = (j / repeat) * GNc;
    range(j * c.DI, c.DI);                      // z
    range(d.DI + j * c.DI, c.DI);               // x
    range(2 * d.DI + group_first, GNc);         // B
    range(2 * d.DI + GN + group_first, GNc);    // C
    range(2 * d.DI + 2 * GN + j * c.NH, c.NH);  // dt
  }
  return cols;
}

}  // namespace

MambaDims mamba_cp_local(const MambaDims& d, int64_t cp) {
  GALE_CHECK(cp >= 1 && d.NH % cp == 0 && (d.G % cp == 0 || cp % d.G == 0))
      << "Mamba mixer: context-parallel size " << cp << " must divide the heads (" << d.NH
      << ") and divide or be a multiple of the groups (" << d.G << ") of a tensor-parallel rank";
  MambaDims c = d;
  c.DI /= cp;
  c.NH /= cp;
  c.G = std::max<int64_t>(d.G / cp, 1);
  return c;
}

int64_t mamba_cp_group_repeat(const MambaDims& d, int64_t cp) { return cp > d.G ? cp / d.G : 1; }

Tensor cp_columns_seq_to_heads(const MambaCpComm& cp, const std::vector<int64_t>& cols, const Tensor& x) {
  const int64_t B = batch_of(cp, x.size(0), cp.split->local_length());
  const int64_t T = x.size(0), R = x.size(1), W = static_cast<int64_t>(cols.size());
  GALE_CHECK(W % cp.split->cp_size == 0) << "context-parallel mixer: " << W << " blocked columns for "
                                         << cp.split->cp_size << " cp ranks";
  Tensor blocked = Tensor::empty({T, W});
  const float* in = x.data<float>();
  float* out = blocked.data<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < W; ++k) out[t * W + k] = in[t * R + cols[static_cast<size_t>(k)]];
  return ulysses_seq_to_heads(*cp.group, *cp.split, B, blocked);
}

Tensor cp_columns_seq_to_heads_backward(const MambaCpComm& cp, const std::vector<int64_t>& cols, int64_t R,
                                        const Tensor& d) {
  const int64_t B = batch_of(cp, d.size(0), cp.split->seq_length), N = cp.split->cp_size;
  GALE_CHECK_EQ(d.size(1) * N, static_cast<int64_t>(cols.size()));
  const Tensor blocked = ulysses_heads_to_seq(*cp.group, *cp.split, B, d);  // [S_local·B, CP·R_cp]
  const int64_t T = blocked.size(0), W = blocked.size(1);
  Tensor out = Tensor::zeros({T, R});
  const float* in = blocked.data<float>();
  float* o = out.data<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < W; ++k) o[t * R + cols[static_cast<size_t>(k)]] += in[t * W + k];
  return out;
}

Tensor mamba_cp_seq_to_heads(const MambaCpComm& cp, const MambaDims& d, const Tensor& zx) {
  GALE_CHECK_EQ(zx.size(1), d.in_proj_rows());
  return cp_columns_seq_to_heads(cp, blocked_columns(d, cp.split->cp_size), zx);
}

Tensor mamba_cp_seq_to_heads_backward(const MambaCpComm& cp, const MambaDims& d, const Tensor& d_zx) {
  return cp_columns_seq_to_heads_backward(cp, blocked_columns(d, cp.split->cp_size), d.in_proj_rows(), d_zx);
}

Tensor mamba_cp_heads_to_seq(const MambaCpComm& cp, const Tensor& g) {
  return ulysses_heads_to_seq(*cp.group, *cp.split, batch_of(cp, g.size(0), cp.split->seq_length), g);
}

Tensor mamba_cp_heads_to_seq_backward(const MambaCpComm& cp, const Tensor& d_g) {
  return ulysses_seq_to_heads(*cp.group, *cp.split, batch_of(cp, d_g.size(0), cp.split->local_length()), d_g);
}

MambaCpWeights::MambaCpWeights(const MambaDims& d, const MambaMixerWeights& whole) : d_(d), K_(d.K), w_(whole) {
  if (!whole.cp.on()) return;
  const int64_t cp_size = whole.cp.split->cp_size, cp_rank = whole.cp.split->cp_rank;
  const MambaDims c = mamba_cp_local(d, cp_size);
  d_ = c;
  // The conv1d channels are in_proj's x|B|C columns less its z; this rank's are its block's.
  const std::vector<int64_t> cols = blocked_columns(d, cp_size);
  const size_t first = static_cast<size_t>(cp_rank * c.in_proj_rows() + c.DI);
  for (size_t k = first; k < first + static_cast<size_t>(c.conv_dim()); ++k) channels_.push_back(cols[k] - d.DI);
  const size_t CD = channels_.size(), K = static_cast<size_t>(K_);
  conv_w_.resize(CD * K);
  conv_b_.resize(CD);
  for (size_t i = 0; i < CD; ++i) {
    const size_t ch = static_cast<size_t>(channels_[i]);
    std::copy_n(whole.conv_w + ch * K, K, conv_w_.data() + i * K);
    conv_b_[i] = whole.conv_b[ch];
  }
  w_.conv_w = conv_w_.data();
  w_.conv_b = conv_b_.data();
  whole_g_conv_w_ = whole.g_conv_w;
  whole_g_conv_b_ = whole.g_conv_b;
  if (whole_g_conv_w_) {
    g_conv_w_.assign(CD * K, 0.0f);
    w_.g_conv_w = g_conv_w_.data();
  }
  if (whole_g_conv_b_) {
    g_conv_b_.assign(CD, 0.0f);
    w_.g_conv_b = g_conv_b_.data();
  }
  const int64_t head = cp_rank * c.NH;
  w_.a_log = whole.a_log + head;
  w_.d = whole.d + head;
  w_.dt_bias = whole.dt_bias + head;
  w_.g_a_log = whole.g_a_log ? whole.g_a_log + head : nullptr;
  w_.g_d = whole.g_d ? whole.g_d + head : nullptr;
  w_.g_dt_bias = whole.g_dt_bias ? whole.g_dt_bias + head : nullptr;
}

void MambaCpWeights::add_grads() const {
  const size_t K = static_cast<size_t>(K_);
  for (size_t i = 0; i < channels_.size(); ++i) {
    const size_t ch = static_cast<size_t>(channels_[i]);
    if (whole_g_conv_w_)
      for (size_t k = 0; k < K; ++k) whole_g_conv_w_[ch * K + k] += g_conv_w_[i * K + k];
    if (whole_g_conv_b_) whole_g_conv_b_[ch] += g_conv_b_[i];
  }
}

}  // namespace gale
