// Data-parallel gradient reduction and parameter gathering for one model chunk, bucket by bucket
// (Megatron's DistributedDataParallel with its param-and-grad buffer, and the communication half
// of the DistributedOptimizer).
//
// Per iteration, as Megatron:
//   start_iteration(m)         zero the gradients; arm the grad-ready counting for m micro-batches;
//                              with --overlap-param-gather launch the all-gather of the first bucket
//                              the forward needs
//   on_params_needed(ids)      forward pre-hook (--overlap-param-gather): wait for the all-gather of
//                              the bucket holding these parameters and prefetch the next one (the
//                              one below in the buffer, or, with reset_bucket_group_order, the one
//                              the first forward used next)
//   on_grads_ready(ids)        backward hook (--overlap-grad-reduce): a bucket whose parameters are
//                              all complete for the last micro-batch starts its reduction at once
//   finish_grad_sync()         launch the buckets not yet launched, wait for every one
//   [optimizer step on the owned ranges]
//   after_optimizer_step()     distributed optimizer: all-gather the updated shards (blocking), or,
//                              with --overlap-param-gather, leave it to the next forward (or, with
//                              gather_right_after_step, start it now and let the forward wait);
//                              each gathered bucket refreshes its part of the --bf16 weight copy.
//                              Calling it again before the gathers complete changes nothing.
//   finish_param_sync()        complete every pending all-gather now (checkpoints, evaluation)
//
// Gradients are averaged over the data-parallel group: each bucket is scaled by 1/dp (CP/dp with
// context parallelism, DataParallelConfig::context_parallel_size) and then summed, all-reduced (every rank gets the whole bucket) or, with the distributed optimizer,
// reduce-scattered (rank r gets only its shard; the rest of its gradient buffer is left as it
// was and is meaningless). A bucket whose size is not a multiple of dp is reduced through a padded
// staging copy, so the collective's blocks stay equal (Megatron pads the buffer itself instead).
//
// All collectives go to the data-parallel communicator (the parameter all-gathers to
// DataParallelConfig::all_gather_group when set) from the calling thread, in an order that is the
// same on every data-parallel rank (they run the same backward and forward).
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "model/params.h"
#include "optim/grad_buckets.h"

namespace gale {

struct DataParallelConfig {
  bool overlap_grad_reduce = false;
  bool use_distributed_optimizer = false;
  bool overlap_param_gather = false;
  int64_t bucket_size = 0;           // elements; 0 = one bucket (see chunk_bucket_size)
  // CP when the group is Megatron's dp-cp group of DP·CP ranks: the cp ranks of one replica hold
  // partial gradients of the same micro-batches (each its own positions), which are summed, so
  // the gradients are scaled by CP/(DP·CP) = 1/DP before the sum (Megatron instead scales the loss
  // by CP and the gradients by 1/(DP·CP)).
  int64_t context_parallel_size = 1;
  std::vector<int> separate_params;  // parameters that get a bucket of their own
  // The part of the buffer this sync reduces (end < 0: all of it). Expert parallelism runs two
  // syncs over one buffer: the dense parameters over the data-parallel group and the expert
  // parameters (ParamBuffer::dense_numel() onwards) over the expert-data-parallel group.
  FlatRange region{0, -1};
  // The factor applied to each bucket before the sum (Megatron's gradient_scaling_factor);
  // 0: context_parallel_size / dp. Expert parameters use 1 / (the dense DP size): each expert's
  // gradient already sums the tokens of the EP ranks' micro-batches, so the sum over the
  // expert-DP group covers the DP·CP replicas' data once.
  double grad_scale = 0.0;
  // Megatron's partial distributed optimizer (--num-distributed-optimizer-instances): the group
  // across the instances (parallel/distopt_instance_groups.h), `dp` being this rank's instance.
  // After the reduce-scatter inside the instance, finish_grad_sync all-reduces this rank's shard
  // of every bucket over it, so each instance holds the gradient summed over all DP·CP ranks.
  // Null: one instance. Only with use_distributed_optimizer.
  Comm inter_instance;
  // --overlap-param-gather-with-optimizer-step (with overlap_param_gather): after_optimizer_step
  // starts every bucket's all-gather at once instead of leaving them to the next forward, which
  // then only waits. Megatron sets it on the first model chunk, which then has one bucket.
  bool gather_right_after_step = false;
  // MindSpeed's --reset-bucket-group-order (with overlap_param_gather): the forward's prefetch
  // assumes it uses the buckets from the last to the first (the buffer holds the parameters in
  // reverse forward order). Where a model runs them in another order, a bucket is prefetched long
  // before it is needed and the next one has to be gathered while the forward waits (GPTModel
  // registers its parameters in forward order, so it always matches). With this set, the order in which the forward first asks for each bucket is recorded;
  // once every bucket has been asked for, prefetching follows it: start_iteration launches the
  // first bucket of that order and each on_params_needed the one after the bucket it waited for.
  bool reset_bucket_group_order = false;
  // MindSpeed's --param-and-grad-buffer-pad, in elements of the flat buffers (0: none): the
  // constructor pads the buffer so that every bucket starts at a multiple of it and, with the
  // distributed optimizer, every rank's shard too (optim/grad_buckets.h pad_grad_buckets). The
  // buckets' ranges then include their padding; the optimizer's segments do not.
  int64_t buffer_pad = 0;
  // Megatron's bf16 gradient reduction (--grad-reduce-in-bf16, or --main-grads-dtype bf16, under
  // --bf16): each bucket, once scaled, is rounded to bf16 (nearest even) and reduced as bf16 (half
  // the bytes of the f32 collective as CommStats counts them and NCCL moves them; MPI widens bf16
  // sums to f32 on the wire; the sum of the bf16 addends rounded to bf16 once: comm/), and the result
  // comes back into the f32 buffer, so the optimizer reads bf16 values. With one rank the bucket is
  // rounded all the same. The buffer itself stays f32; the owner calls
  // DataParallelSync::round_grads_to_bf16 after each micro-batch's contribution, so that it holds
  // what Megatron's bf16 buffer holds (each accumulation summed in f32 and rounded to bf16 once).
  bool reduce_in_bf16 = false;
  // Megatron's --ddp-reduce-scatter-with-fp32-accumulation (with use_distributed_optimizer; without
  // it the buckets are all-reduced as before): each bucket's reduce-scatter is an all-to-all of its
  // (bf16 with reduce_in_bf16, else f32) values followed by a local f32 sum in rank order, rounded
  // once (comm/reduce_scatter_fp32_accumulation.h). Not with inter_instance (Megatron's rule).
  bool reduce_scatter_with_fp32_accumulation = false;
  // Megatron's --ddp-param-name-patterns-for-fp32-local-accumulation: the parameters (ids) whose
  // gradients accumulate across micro-batches in f32 even with reduce_in_bf16 (Megatron gives them a
  // separate f32 main_grad): round_grads_to_bf16 leaves them alone, and their accumulated f32 sum is
  // rounded to bf16 once, when their bucket's reduction starts (Megatron's copy into the bf16 buffer),
  // before the scaling. Without reduce_in_bf16 the buffer is f32 and they change nothing.
  std::vector<int> fp32_local_accumulation;
  // Megatron's --create-all-gather-group: a second communicator over the same ranks as `dp` (its
  // duplicate, comm::make_group) that carries the distributed optimizer's parameter all-gathers, so
  // that they need not queue behind the gradient reduce-scatters on `dp` (collectives of one
  // communicator run in issue order; of two, concurrently). Null: the all-gathers use `dp`.
  Comm all_gather_group;
};

class DataParallelSync {
 public:
  // `dp` is the data-parallel group (Megatron's dp-cp group). The buffer must outlive this object.
  DataParallelSync(ParamBuffer* params, Comm dp, DataParallelConfig config);
  ~DataParallelSync();
  DataParallelSync(const DataParallelSync&) = delete;
  DataParallelSync& operator=(const DataParallelSync&) = delete;

  const DataParallelConfig& config() const { return config_; }
  const std::vector<GradBucket>& buckets() const { return buckets_; }
  const Comm& group() const { return dp_; }
  // The communicator of the parameter all-gathers: DataParallelConfig::all_gather_group, else group().
  const Comm& param_gather_group() const { return config_.all_gather_group ? config_.all_gather_group : dp_; }
  int64_t dp_size() const { return dp_size_; }
  int64_t dp_rank() const { return dp_rank_; }
  bool sharded() const { return config_.use_distributed_optimizer; }
  // The parts of the buffer whose reduced gradient this rank holds and whose parameters its
  // optimizer updates: its shard of every bucket (distributed optimizer), else the whole region.
  std::vector<FlatRange> owned_ranges() const;

  // The factor each bucket is multiplied by before the sum (Megatron's gradient_scaling_factor:
  // grad_scale, else CP/dp) and whether it is applied at all (not with one rank and no grad_scale).
  float bucket_scale() const;
  bool scales_buckets() const { return !(dp_size_ == 1 && config_.grad_scale <= 0.0); }
  // --quant-grads (optim/quant_grads.h): the chunk's gradients are reduced by its QuantGradStore
  // through the same buckets, so start_iteration leaves an aliased gradient buffer alone and
  // finish_grad_sync must not be called.
  void start_iteration(int64_t num_microbatches);
  void on_grads_ready(const std::vector<int>& param_ids);
  // DataParallelConfig::reduce_in_bf16: rounds the gradients of `param_ids` (those in this sync's
  // region, except fp32_local_accumulation's) to bf16 in place, nearest even: call it when a
  // micro-batch's contribution to them is complete (before on_grads_ready), as Megatron's bf16
  // buffer rounds every accumulation.
  void round_grads_to_bf16(const std::vector<int>& param_ids);
  void finish_grad_sync();
  void after_optimizer_step();
  void on_params_needed(const std::vector<int>& param_ids);
  void finish_param_sync();
  // Buckets whose parameter all-gather has started and not yet been waited for.
  int64_t param_gathers_in_flight() const;
  // Times on_params_needed found the bucket it needs stale with no all-gather in flight, so the
  // forward waited for a whole all-gather it could have overlapped (since construction).
  int64_t unprefetched_param_gathers() const { return unprefetched_param_gathers_; }
  // The buckets in the order the forward asked for them (reset_bucket_group_order), complete once
  // every bucket has been asked for; empty otherwise.
  const std::vector<int>& recorded_bucket_order() const { return recorded_order_; }
  // The bucket whose all-gather is prefetched after bucket b's (-1: none), and the one
  // start_iteration launches.
  int next_param_gather(size_t b) const { return next_gather_.at(b); }
  int first_param_gather() const { return first_gather_; }

 private:
  struct BucketState;
  void start_grad_reduce(size_t b);
  // DataParallelConfig::reduce_in_bf16: the scaled bucket b as bf16, summed (reduce-scattered).
  void start_bf16_grad_reduce(size_t b);
  // The reduce-scatter of one bucket on the data-parallel group: Megatron's fp32-accumulation one
  // with DataParallelConfig::reduce_scatter_with_fp32_accumulation, else the group's own.
  WorkPtr reduce_scatter(const void* send, void* recv, int64_t shard, DType dtype);
  void start_param_gather(size_t b);
  void finish_param_gather(size_t b);
  void record_bucket_use(int b);

  ParamBuffer* params_;
  Comm dp_;
  DataParallelConfig config_;
  int64_t dp_size_ = 1, dp_rank_ = 0;
  std::vector<GradBucket> buckets_;
  std::vector<int> bucket_of_param_;  // bucket index of each parameter id
  std::vector<bool> fp32_local_;      // per parameter id: DataParallelConfig::fp32_local_accumulation
  std::vector<BucketState> state_;
  std::vector<int64_t> ready_count_;  // per parameter: micro-batches whose gradient is complete
  int64_t num_microbatches_ = 1;
  FlatRange region_;
  // Parameter all-gather order: next_gather_[b] follows bucket b, first_gather_ starts the forward.
  std::vector<int> next_gather_;
  int first_gather_ = -1;
  std::vector<int> recorded_order_;  // reset_bucket_group_order: first-use order seen so far
  std::vector<bool> recorded_;       // per bucket: in recorded_order_ (complete: all buckets, chained)
  int64_t unprefetched_param_gathers_ = 0;
};

}  // namespace gale
