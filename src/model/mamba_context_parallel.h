// Context parallelism of the Mamba mixer (Megatron-Core's MambaContextParallel): the all-to-alls between the sequence split and a head split, and each cp rank's slice of the mixer's small parameters.
//
// Under --context-parallel-size CP the mixer's input holds this cp rank's positions of every
// sequence (parallel/context_split.h: the load-balanced chunks r and 2·CP−1−r, or under
// adaptive_cp_algo the positions of the micro-batch's layout, parallel/cp_layout.h). The convolution and
// the scan run along whole sequences, so right after in_proj an all-to-all over the cp group trades
// the sequence split for a split of this TP rank's heads (mamba_cp_seq_to_heads): cp rank j receives
// every position of the sequence, in global position order (the load balancing undone), of its
// NH/CP heads: their DI/CP channels of z and x, their dt, and the B and C of the groups they read.
// With CP ≤ G (this TP rank's groups; CP divides G) rank j holds groups j·G/CP … (j+1)·G/CP − 1;
// with CP > G (G divides CP) each group's heads are spread over CP/G consecutive ranks, which all
// receive its B and C (Megatron's group repeat) and whose B and C gradients are summed on the way
// back. After the scan the gated output y·silu(z) returns to the sequence split
// (ulysses_heads_to_seq, model/context_parallel.h); the gated norm, whose groups of channels are
// whole on every rank, and out_proj then run on the sequence split as without CP.
//
// conv1d, A_log, D and dt_bias stay whole on every cp rank (Megatron's parameters, so checkpoints do
// not change with CP); each rank reads and gets gradients only for its slice (MambaCpWeights), and
// the data-parallel gradient reduction, which spans DP×CP, sums the slices into the whole gradient.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "model/mamba_mixer.h"

namespace gale {

// One cp rank's dims of `cp` ranks, from this TP rank's `d` (MambaDims::tp_local): DI/CP, NH/CP, and
// G/CP groups, or one group when CP > G. CP must divide NH and divide or be a multiple of G.
MambaDims mamba_cp_local(const MambaDims& d, int64_t cp);
// The number of consecutive cp ranks that share one group: CP/G when CP > G, else 1.
int64_t mamba_cp_group_repeat(const MambaDims& d, int64_t cp);

// in_proj's output zx [S_local·B, R] (this TP rank's rows z|x|B|C|dt of `d`) -> [S_global·B, R_cp]:
// this cp rank's heads and groups in mamba_cp_local(d)'s row layout, every position of the
// sequence in global order.
Tensor mamba_cp_seq_to_heads(const MambaCpComm& cp, const MambaDims& d, const Tensor& zx);
// Its backward: d_zx [S_global·B, R_cp] -> [S_local·B, R], the gradients of repeated B and C summed.
Tensor mamba_cp_seq_to_heads_backward(const MambaCpComm& cp, const MambaDims& d, const Tensor& d_zx);

// The scan's gated output g [S_global·B, DI_cp] of this rank's heads -> [S_local·B, DI] of all this
// TP rank's channels at this rank's positions; and its backward, the reverse all-to-all. Any
// mixer's head-split output of whole sequences goes back so (Gated DeltaNet's too).
Tensor mamba_cp_heads_to_seq(const MambaCpComm& cp, const Tensor& g);
Tensor mamba_cp_heads_to_seq_backward(const MambaCpComm& cp, const Tensor& d_g);

// The shared all-to-all of a mixer whose in_proj output splits by head (Mamba's here, Gated
// DeltaNet's in model/gdn_context_parallel.h): `cols` lists, for each column of the blocked row
// [CP·R_cp] (block j: cp rank j's row), the column of x [S_local·B, R] it reads; returns
// [S_global·B, R_cp], every position in global order. A column may appear in several blocks.
Tensor cp_columns_seq_to_heads(const MambaCpComm& cp, const std::vector<int64_t>& cols, const Tensor& x);
// Its backward: d [S_global·B, R_cp] -> [S_local·B, R] (R columns), a column read by several blocks
// getting their gradients summed.
Tensor cp_columns_seq_to_heads_backward(const MambaCpComm& cp, const std::vector<int64_t>& cols, int64_t R,
                                        const Tensor& d);

// This cp rank's dims and weights for the part between the all-to-alls: its channels of conv1d
// (copied, as they are not contiguous) and its heads of A_log, D and dt_bias (pointers into the
// whole parameters and gradients); the linears and the gated norm are `whole`'s. Without CP
// (whole.cp off) the dims and weights are `d` and `whole` themselves.
class MambaCpWeights {
 public:
  MambaCpWeights(const MambaDims& d, const MambaMixerWeights& whole);
  MambaCpWeights(const MambaCpWeights&) = delete;
  MambaCpWeights& operator=(const MambaCpWeights&) = delete;

  const MambaDims& dims() const { return d_; }
  const MambaMixerWeights& weights() const { return w_; }
  // Adds the conv1d gradients accumulated in the slice into the whole parameters' gradients
  // (A_log, D and dt_bias accumulate in place; nothing to do without CP).
  void add_grads() const;

 private:
  MambaDims d_;
  int64_t K_ = 0;
  std::vector<int64_t> channels_;  // the whole conv1d channel of each local one
  std::vector<float> conv_w_, conv_b_, g_conv_w_, g_conv_b_;
  float *whole_g_conv_w_ = nullptr, *whole_g_conv_b_ = nullptr;
  MambaMixerWeights w_;
};

}  // namespace gale
