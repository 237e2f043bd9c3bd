// Context parallelism of the Gated DeltaNet mixer (Megatron-Core's GDN CP): the all-to-alls around its convolution and recurrence, and each cp rank's parameter slice.
//
// As the Mamba mixer's (model/mamba_context_parallel.h, whose all-to-alls this shares) and as
// Megatron-Core's GatedDeltaNet (a2a_cp_to_hp / a2a_hp_to_cp, get_parameter_local_cp): under
// --context-parallel-size CP the mixer's input holds this cp rank's positions of every sequence
// (parallel/context_split.h: the load-balanced chunks r and 2·CP−1−r). Right after in_proj an
// all-to-all over the cp group trades that sequence split for a split of this TP rank's heads
// (gdn_cp_seq_to_heads): cp rank j receives every position, in global order, of key heads
// j·NK/CP … (j+1)·NK/CP − 1 and value heads j·NV/CP … (j+1)·NV/CP − 1 (this TP rank's NK and NV;
// each of in_proj's six sections q, k, v, z, β, α split on its own; GDN2's seven q, k, v, z, f, b, w). Value head h still reads key
// head h / r. The convolution, the l2 norms, the gated delta rule and the gated output norm run on
// those heads over whole sequences; the normed, gated output returns to the sequence split
// (mamba_cp_heads_to_seq) and out_proj runs as without CP.
//
// conv1d, A_log and dt_bias stay whole on every cp rank (checkpoints do not change with CP); each
// rank reads and gets gradients only for its slice (GdnCpWeights: conv1d's q, k and v channels of its
// heads, A_log and dt_bias of its value heads; GDN2: A_log of its key heads, dt_bias of their channels), and the data-parallel gradient reduction, which spans
// DP×CP, sums the slices into the whole gradient. out_norm.weight [DV] is shared by every head: each
// cp rank's partial gradient is summed by the same reduction. CP must divide this TP rank's NK (and
// so NV, a multiple of NK): --linear-num-key-heads a multiple of TP·CP.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "model/gated_delta_net.h"
#include "model/mamba_context_parallel.h"

namespace gale {

// One cp rank's dims of `cp` ranks from this TP rank's `d` (GdnDims::tp_local): NK/CP, NV/CP.
GdnDims gdn_cp_local(const GdnDims& d, int64_t cp);

// in_proj's output zx [S_local·B, R] (this TP rank's rows q|k|v|z|β|α of `d`) -> [S_global·B, R_cp]:
// this cp rank's heads in gdn_cp_local(d)'s row layout, every position in global order.
Tensor gdn_cp_seq_to_heads(const MambaCpComm& cp, const GdnDims& d, const Tensor& zx);
// Its backward: d_zx [S_global·B, R_cp] -> [S_local·B, R].
Tensor gdn_cp_seq_to_heads_backward(const MambaCpComm& cp, const GdnDims& d, const Tensor& d_zx);

// This cp rank's dims and weights for the part between the all-to-alls: its channels of conv1d
// (copied, as they are not contiguous) and its value heads of A_log and dt_bias (pointers into the
// whole parameters and gradients); the linears and out_norm are `whole`'s. Without CP (whole.cp
// off) the dims and weights are `d` and `whole` themselves.
class GdnCpWeights {
 public:
  GdnCpWeights(const GdnDims& d, const GdnWeights& whole);
  GdnCpWeights(const GdnCpWeights&) = delete;
  GdnCpWeights& operator=(const GdnCpWeights&) = delete;

  const GdnDims& dims() const { return d_; }
  const GdnWeights& weights() const { return w_; }
  // Adds the conv1d gradients accumulated in the slice into the whole parameter's gradient
  // (A_log and dt_bias accumulate in place; nothing to do without CP).
  void add_grads() const;

 private:
  GdnDims d_;
  std::vector<int64_t> channels_;  // the whole conv1d channel of each local one
  std::vector<float> conv_w_, g_conv_w_;
  float* whole_g_conv_w_ = nullptr;
  GdnWeights w_;
};

}  // namespace gale
