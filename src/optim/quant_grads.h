// --quant-grads: one model chunk's main gradients held as FP16 codes with an f32 scale per
// parameter between the micro-batches of an iteration and through the data-parallel reduction
// (MindSpeed's low-precision optimizer with quant_grads; the codec is kernels/cpu/quant_grads.h),
// with f32 gradient storage only for one drain unit at a time.
//
// Where it sits in Gale: the backward accumulates each micro-batch's contribution in f32 (Gale's
// weight-gradient kernels add into ParamBuffer::grad_data, the analogue of the per-micro-batch
// param.grad), and the held FP16 gradient takes it over per parameter as the model reports the
// parameter complete for the micro-batch (GPTModel's grad-ready hook, once per drain unit: the
// head, each transformer layer, the embedding), leaving the f32 values zero. So the f32 gradients
// of different drain units are never alive at once, and the store replaces the chunk's flat f32
// gradient buffer (ParamBuffer::alias_grads) by
//   resident   one f32 slot per "resident" parameter: a parameter written outside its drain
//              unit's backward (the tied word embedding: the LM head's weight gradient first, the
//              embedding's last) or summed in f32 after the data-parallel reduction (the
//              sequence-parallel norms and biases, the embedding group's copies); they keep
//              today's f32 path whole (accumulated, reduced, then summed in place);
//   scratch    one region the size of the largest drain unit's other parameters, which every
//              unit's gradients share (each parameter at its place in its unit); it also serves
//              as the staging area of the data-parallel sum and the f32 copy the optimizer reads.
// Per iteration (train/grad_sync.cc):
//   zero()                 start: codes 0 (the scales stay, as MindSpeed's), f32 storage 0
//   accumulate(ids)        the grad-ready hook, once per drain unit and micro-batch
//   accumulate_pending()   finalize: a resident parameter's contribution the hooks did not see
//                          (a fused LM head's eager weight gradient of a later micro-batch); the
//                          scratch must be zero (every unit drained)
//   align_scales()         MIN of every scale over the data-parallel group (divided by the
//                          sum's headroom where it needs one, see the constructor), the codes of
//                          the parameters whose scale changed rescaled (MindSpeed's start_grad_sync)
//   reduce()               the data-parallel sum through the sync's buckets, a scratch-sized piece
//                          at a time: float(codes) (the FP16 values in the scaled domain) times
//                          the sync's factor, summed in f32 (all-reduce, or reduce-scatter of the
//                          owned shards), then codes ← fp16(sum) on the owned ranges (one rounding,
//                          as an FP16 reduction with f32 accumulation); a resident parameter's slot
//                          ← float(codes)·scale_inv there
//   scale(f)               an f32 factor on every main gradient (the per-token division, --fp16's
//                          unscaling): in place on the resident slots, recorded for the others
//   main_grad(id, ...)     what the optimizer, the norm and clipping read: the resident slot, or
//                          float(codes)·scale_inv times the recorded factors, in the scratch
// Steps after the data-parallel sum (sequence-parallel and tied-embedding sums) run in f32 on the
// resident slots; every element sees the same f32 operations as with a whole f32 buffer.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "model/params.h"
#include "optim/data_parallel_sync.h"
#include "optim/grad_buckets.h"

namespace gale {

class QuantGradStore {
 public:
  // `sync`: the chunk's data-parallel sync (its group, buckets, factor and owned ranges; the store
  // reduces through them and the sync's own finish_grad_sync is not used). `units`: the drain
  // units in the order of the grad-ready hook (GPTModel::backward_param_groups). `resident`: the
  // parameters that keep their own f32 slot (see above); a trainable parameter in no unit or in
  // two is resident too. `sum_factor`: what the sync multiplies each rank's values by before
  // summing them, as a real number (1/|dp| normally, CP/|dp| over the dp-cp group, 1 with
  // --calculate-per-token-loss). Where |dp|·sum_factor = h > 1 the sum of h·65503-sized terms could
  // overflow FP16, so align_scales divides the aligned scales by h (as MindSpeed divides its
  // embedding-group scales by the group size); MindSpeed's 1/|dp| needs nothing.
  // Replaces `params`' f32 gradient buffer (ParamBuffer::alias_grads).
  QuantGradStore(ParamBuffer* params, const DataParallelSync* sync, const std::vector<std::vector<int>>& units,
                 const std::vector<int>& resident, double sum_factor);

  void zero();
  void accumulate(const std::vector<int>& param_ids);
  void accumulate_pending();
  void align_scales();
  void reduce();
  void scale(float f);

  // The main gradient of flat elements [begin, begin + n) of parameter `id` (an owned piece after
  // reduce()), f32, valid until the next call: the optimizer's view.
  float* main_grad(int id, int64_t begin, int64_t n);
  // Σ g² over this rank's owned main gradients (after reduce(); the trainer's NaN / large-gradient check).
  double local_sum_of_squares();
  // Parameter `id`'s whole main gradient as main_grad gives it (a copy; tests, checks).
  std::vector<float> main_grad_copy(int id);

  // Parameter `id`'s scale (1 before its first gradient; 0 for a frozen parameter).
  float scale(int id) const { return scales_.at(static_cast<size_t>(id)); }
  void set_scale(int id, float s) { scales_.at(static_cast<size_t>(id)) = s; }
  // Parameter `id`'s codes (local_numel() of them), or null for a frozen or empty one.
  const f16* codes(int id) const;
  bool resident(int id) const { return resident_.at(static_cast<size_t>(id)); }
  // Bytes this store holds: 2 per trainable element (the codes) + 4 per trainable parameter (its
  // scale). The f32 storage (resident slots and scratch) is f32_bytes().
  int64_t bytes() const;
  int64_t f32_bytes() const { return static_cast<int64_t>(storage_.nbytes()); }
  int64_t resident_numel() const { return scratch_begin_; }
  int64_t scratch_numel() const { return storage_.numel() - scratch_begin_; }

 private:
  bool holds(int id) const;
  f16* codes_of(int id);
  float* scratch() { return storage_.data<float>() + scratch_begin_; }
  // The owned flat elements [lo, hi) whose reduced sums are in x[0, hi − lo): codes, resident slots.
  void finish_piece(const GradBucket& bucket, int64_t lo, int64_t hi, float* x);

  ParamBuffer* params_;
  const DataParallelSync* sync_;
  Comm dp_;
  float headroom_ = 1.0f;         // the divisor of the aligned scales (see the constructor)
  Tensor codes_;                  // kF16, trainable_numel() elements at the gradient buffer's offsets
  std::vector<float> scales_;     // per parameter id
  std::vector<bool> resident_;    // per parameter id
  std::vector<int64_t> slot_;     // per parameter id: its f32 gradient's offset in storage_
  Tensor storage_;                // f32: [0, scratch_begin_) the resident slots, then the scratch
  int64_t scratch_begin_ = 0;
  std::vector<float> factors_;    // scale(f)'s factors since zero(), in order
};

}  // namespace gale
