// --quant-grads: one model chunk's main gradients held as FP16 codes with an f32 scale per
// parameter between the micro-batches of an iteration and through the data-parallel reduction
// (MindSpeed's low-precision optimizer with quant_grads; the codec is kernels/cpu/quant_grads.h).
//
// Where it sits in Gale: the backward still accumulates each micro-batch's contribution into the
// chunk's f32 gradient buffer (ParamBuffer::flat_grads, Gale's analogue of the per-micro-batch
// param.grad), and the held FP16 gradient takes it over per parameter as the model reports the
// parameter complete for the micro-batch (GPTModel's grad-ready hook), leaving the f32 slice zero.
// Per iteration (train/grad_sync.cc):
//   zero()                 start: codes 0 (the scales stay, as MindSpeed's)
//   accumulate(ids)        the grad-ready hook, once per parameter group and micro-batch
//   accumulate_pending()   finalize: any contribution the hooks did not see (a fused LM head's
//                          eager weight gradient of a later micro-batch) is taken over too
//   align_scales()         MIN of every scale over the data-parallel group (divided by the
//                          sum's headroom where it needs one, see the constructor), the codes of
//                          the parameters whose scale changed rescaled (MindSpeed's start_grad_sync)
//   stage_for_reduction()  the f32 buffer ← float(codes): the FP16 values in the scaled domain,
//                          which the data-parallel sync then scales by 1/DP and sums in f32
//   finish_reduction()     on the owned ranges: codes ← fp16(reduced sum) (one rounding, as an
//                          FP16 reduction with f32 accumulation), f32 buffer ← float(codes)·scale_inv
//                          — the dequantised main gradient the optimizer, the norm and clipping read
// Steps after the data-parallel sum (sequence-parallel and tied-embedding sums, the per-token
// division, --fp16's unscaling) run in f32 on the dequantised values.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "model/params.h"
#include "optim/grad_buckets.h"

namespace gale {

class QuantGradStore {
 public:
  // `dp`: the group whose ranks' gradients are summed (null or size 1: none). `owned`: the ranges of
  // the flat buffer whose reduced gradient this rank uses (the distributed optimizer's shards);
  // empty: every trainable element. `sum_factor`: what the data-parallel sync multiplies each
  // rank's values by before summing them (DataParallelConfig::grad_scale; 1/|dp| normally, CP/|dp|
  // over the dp-cp group, 1 with --calculate-per-token-loss). Where |dp|·sum_factor = h > 1 the sum
  // of h·65503-sized terms could overflow FP16, so align_scales divides the aligned scales by h (as
  // MindSpeed divides its embedding-group scales by the group size); MindSpeed's 1/|dp| needs nothing.
  QuantGradStore(ParamBuffer* params, Comm dp, std::vector<FlatRange> owned = {}, double sum_factor = 0.0);

  void zero();
  void accumulate(const std::vector<int>& param_ids);
  void accumulate_pending();
  void align_scales();
  void stage_for_reduction();
  void finish_reduction();

  // Parameter `id`'s scale (1 before its first gradient; 0 for a frozen parameter).
  float scale(int id) const { return scales_.at(static_cast<size_t>(id)); }
  void set_scale(int id, float s) { scales_.at(static_cast<size_t>(id)) = s; }
  // Parameter `id`'s codes (local_numel() of them), or null for a frozen or empty one.
  const f16* codes(int id) const;
  // Bytes this store holds: 2 per trainable element (the codes) + 4 per trainable parameter (its
  // scale). The f32 gradient buffer is not counted: it stays allocated (see above).
  int64_t bytes() const;

 private:
  bool holds(int id) const;
  f16* codes_of(int id);

  ParamBuffer* params_;
  Comm dp_;
  std::vector<FlatRange> owned_;
  float headroom_ = 1.0f;      // the divisor of the aligned scales (see the constructor)
  Tensor codes_;               // kF16, trainable_numel() elements at the gradient buffer's offsets
  std::vector<float> scales_;  // per parameter id
};

}  // namespace gale
