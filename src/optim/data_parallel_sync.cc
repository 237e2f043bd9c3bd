// Bucketed data-parallel gradient reduction and parameter all-gather.
#include "optim/data_parallel_sync.h"

#include <algorithm>
#include <cstring>

#include "comm/reduce_scatter_fp32_accumulation.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/optimizer.h"

namespace gale {

struct DataParallelSync::BucketState {
  int pending_params = 0;  // parameters not yet complete for the last micro-batch
  bool grad_launched = false;
  WorkPtr grad_work;
  Tensor grad_staging, shard_staging;  // padded copies when the bucket is not a multiple of dp
  Tensor bf16_staging, bf16_shard;     // DataParallelConfig::reduce_in_bf16: the bucket and the shard in bf16
  bool params_stale = false;           // this rank's shard was updated; the others not yet gathered
  WorkPtr param_work;
  Tensor param_staging;
};

DataParallelSync::DataParallelSync(ParamBuffer* params, Comm dp, DataParallelConfig config)
    : params_(params), dp_(std::move(dp)), config_(std::move(config)) {
  GALE_CHECK(params_ && params_->finalized());
  GALE_CHECK(dp_) << "data-parallel sync needs the data-parallel group";
  GALE_CHECK(!config_.inter_instance || config_.use_distributed_optimizer)
      << "several distributed-optimizer instances need the distributed optimizer";
  GALE_CHECK(!config_.inter_instance || !config_.reduce_scatter_with_fp32_accumulation)
      << "--ddp-reduce-scatter-with-fp32-accumulation: not supported with --num-distributed-optimizer-instances > 1 "
         "(Megatron's rule)";
  GALE_CHECK(!config_.all_gather_group || config_.all_gather_group->world_ranks() == dp_->world_ranks())
      << "--create-all-gather-group: the all-gather group must hold the data-parallel group's ranks";
  dp_size_ = dp_->size();
  dp_rank_ = dp_->rank();
  GALE_CHECK(config_.context_parallel_size >= 1 && dp_size_ % config_.context_parallel_size == 0)
      << "the data-parallel group of " << dp_size_ << " ranks cannot hold context parallelism "
      << config_.context_parallel_size;
  region_ = config_.region.end < 0 ? FlatRange{0, params_->trainable_numel()} : config_.region;
  const BucketPlanOptions plan{config_.bucket_size, dp_size_, config_.separate_params, region_};
  buckets_ = plan_grad_buckets(*params_, plan);
  if (config_.buffer_pad > 0)
    region_ = pad_grad_buckets(params_, &buckets_, plan, config_.buffer_pad, config_.use_distributed_optimizer);
  bucket_of_param_.assign(static_cast<size_t>(params_->size()), -1);
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (int id : buckets_[b].param_ids) bucket_of_param_[static_cast<size_t>(id)] = static_cast<int>(b);
  fp32_local_.assign(static_cast<size_t>(params_->size()), false);
  for (int id : config_.fp32_local_accumulation) fp32_local_.at(static_cast<size_t>(id)) = true;
  state_.resize(buckets_.size());
  ready_count_.assign(static_cast<size_t>(params_->size()), 0);
  // The forward runs the buffer backwards: from the last bucket (the embedding end) to bucket 0.
  next_gather_.resize(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) next_gather_[b] = static_cast<int>(b) - 1;
  first_gather_ = static_cast<int>(buckets_.size()) - 1;
  recorded_.assign(buckets_.size(), false);
}

DataParallelSync::~DataParallelSync() {
  // Collectives still in flight reference our buffers: let them land first.
  for (BucketState& s : state_) {
    if (s.grad_work) s.grad_work->wait();
    if (s.param_work) s.param_work->wait();
  }
}

std::vector<FlatRange> DataParallelSync::owned_ranges() const {
  if (!sharded()) return {region_};
  return gale::owned_ranges(buckets_, dp_size_, dp_rank_);
}

void DataParallelSync::start_iteration(int64_t num_microbatches) {
  GALE_CHECK_GE(num_microbatches, 1);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    GALE_CHECK(!state_[b].grad_work) << "gradient reduction of bucket " << b << " still in flight";
    state_[b].grad_launched = false;
    state_[b].pending_params = static_cast<int>(buckets_[b].param_ids.size());
  }
  num_microbatches_ = num_microbatches;
  std::fill(ready_count_.begin(), ready_count_.end(), 0);
  if (!params_->grads_aliased())  // --quant-grads: its store zeroes its gradients
    std::fill(params_->flat_grads().data<float>() + region_.begin, params_->flat_grads().data<float>() + region_.end,
              0.0f);
  // The bucket the forward needs first: the last one (the embedding end of the buffer), or the
  // first of the recorded order.
  if (config_.overlap_param_gather && first_gather_ >= 0) start_param_gather(static_cast<size_t>(first_gather_));
}

void DataParallelSync::on_grads_ready(const std::vector<int>& param_ids) {
  for (int id : param_ids) {
    if (bucket_of_param_[static_cast<size_t>(id)] < 0) continue;  // another sync's region, or frozen (no gradient)
    int64_t& count = ready_count_.at(static_cast<size_t>(id));
    GALE_CHECK_LT(count, num_microbatches_)
        << "gradient of " << params_->spec(id).name << " reported complete more often than there are micro-batches";
    if (++count < num_microbatches_) continue;
    const int b = bucket_of_param_[static_cast<size_t>(id)];
    if (--state_[static_cast<size_t>(b)].pending_params == 0) start_grad_reduce(static_cast<size_t>(b));
  }
}

float DataParallelSync::bucket_scale() const {
  return config_.grad_scale > 0.0 ? static_cast<float>(config_.grad_scale)
                                  : static_cast<float>(config_.context_parallel_size) / static_cast<float>(dp_size_);
}

void DataParallelSync::round_grads_to_bf16(const std::vector<int>& param_ids) {
  float* grads = params_->flat_grads().data<float>();
  for (int id : param_ids) {
    if (bucket_of_param_[static_cast<size_t>(id)] < 0) continue;  // another sync's region, or frozen
    if (fp32_local_[static_cast<size_t>(id)]) continue;            // accumulates in f32 (start_grad_reduce rounds it)
    const ParamSpec& spec = params_->spec(id);
    float* g = grads + spec.offset;
    for (int64_t i = 0, n = spec.local_numel(); i < n; ++i) g[i] = bf16_to_float(float_to_bf16(g[i]));
  }
}

void DataParallelSync::start_grad_reduce(size_t b) {
  BucketState& s = state_[b];
  GALE_CHECK(!s.grad_launched) << "bucket " << b << " reduced twice in one iteration";
  s.grad_launched = true;
  if (!scales_buckets() && !config_.reduce_in_bf16) return;
  GALE_CHECK(!params_->grads_aliased()) << "--quant-grads: its store reduces the gradients, not the sync";
  const GradBucket& bucket = buckets_[b];
  float* grads = params_->flat_grads().data<float>();
  float* g = grads + bucket.range.begin;
  const int64_t n = bucket.numel();
  // --ddp-param-name-patterns-for-fp32-local-accumulation: Megatron copies the f32 main_grad into
  // the bf16 buffer (one rounding) before scaling it there.
  if (config_.reduce_in_bf16)
    for (int id : bucket.param_ids)
      if (fp32_local_[static_cast<size_t>(id)]) {
        const ParamSpec& spec = params_->spec(id);
        float* pg = grads + spec.offset;
        for (int64_t i = 0, m = spec.local_numel(); i < m; ++i) pg[i] = bf16_to_float(float_to_bf16(pg[i]));
      }
  // Megatron's gradient_scaling_factor (times CP: the cp ranks' partial gradients add up), then sum.
  scale_inplace(g, n, bucket_scale());
  if (config_.reduce_in_bf16) {
    start_bf16_grad_reduce(b);
    return;
  }
  if (dp_size_ == 1) return;
  if (!sharded()) {
    s.grad_work = dp_->all_reduce_async(g, n, DType::kF32, ReduceOp::kSum);
    return;
  }
  const int64_t shard = bucket.shard_numel(dp_size_);
  if (bucket.padded_numel == n) {
    s.grad_work = reduce_scatter(g, g + dp_rank_ * shard, shard, DType::kF32);
    return;
  }
  s.grad_staging = Tensor::zeros({bucket.padded_numel});
  std::memcpy(s.grad_staging.raw(), g, static_cast<size_t>(n) * sizeof(float));
  s.shard_staging = Tensor::empty({shard});
  s.grad_work = reduce_scatter(s.grad_staging.raw(), s.shard_staging.raw(), shard, DType::kF32);
}

WorkPtr DataParallelSync::reduce_scatter(const void* send, void* recv, int64_t shard, DType dtype) {
  if (config_.reduce_scatter_with_fp32_accumulation)
    return reduce_scatter_with_fp32_accumulation(*dp_, send, recv, shard, dtype, ReduceOp::kSum);
  return dp_->reduce_scatter_async(send, recv, shard, dtype, ReduceOp::kSum);
}

void DataParallelSync::start_bf16_grad_reduce(size_t b) {
  BucketState& s = state_[b];
  const GradBucket& bucket = buckets_[b];
  float* g = params_->flat_grads().data<float>() + bucket.range.begin;
  const int64_t n = bucket.numel();
  s.bf16_staging = Tensor::zeros({bucket.padded_numel}, DType::kBF16);
  convert_f32_to_bf16(g, s.bf16_staging.data<bf16>(), n);
  if (dp_size_ == 1) {  // nothing to sum: the bucket as bf16 values
    convert_bf16_to_f32(s.bf16_staging.data<bf16>(), g, n);
    s.bf16_staging = Tensor();
    return;
  }
  if (!sharded()) {
    s.grad_work = dp_->all_reduce_async(s.bf16_staging.raw(), n, DType::kBF16, ReduceOp::kSum);
    return;
  }
  const int64_t shard = bucket.shard_numel(dp_size_);
  s.bf16_shard = Tensor::empty({shard}, DType::kBF16);
  s.grad_work = reduce_scatter(s.bf16_staging.raw(), s.bf16_shard.raw(), shard, DType::kBF16);
}

void DataParallelSync::finish_grad_sync() {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    GALE_CHECK(!state_[b].params_stale) << "bucket " << b << " was never gathered: its parameters were not used";
    if (!state_[b].grad_launched) start_grad_reduce(b);
  }
  float* grads = params_->flat_grads().data<float>();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    BucketState& s = state_[b];
    const FlatRange own = bucket_shard(buckets_[b], dp_size_, dp_rank_);
    if (s.grad_work) {
      s.grad_work->wait();
      s.grad_work.reset();
      if (s.bf16_staging.defined()) {  // reduce_in_bf16: the bf16 sum back into the f32 buffer
        if (sharded())
          convert_bf16_to_f32(s.bf16_shard.data<bf16>(), grads + own.begin, own.size());
        else
          convert_bf16_to_f32(s.bf16_staging.data<bf16>(), grads + buckets_[b].range.begin, buckets_[b].numel());
        s.bf16_staging = s.bf16_shard = Tensor();
      } else if (s.shard_staging.defined()) {
        std::memcpy(grads + own.begin, s.shard_staging.raw(), static_cast<size_t>(own.size()) * sizeof(float));
        s.grad_staging = s.shard_staging = Tensor();
      }
    }
    // The partial distributed optimizer: sum this instance's shard with the other instances'.
    if (config_.inter_instance && config_.inter_instance->size() > 1 && own.size() > 0)
      config_.inter_instance->all_reduce(grads + own.begin, own.size(), DType::kF32, ReduceOp::kSum);
  }
}

void DataParallelSync::after_optimizer_step() {
  if (!sharded() || dp_size_ == 1) return;
  for (BucketState& s : state_) s.params_stale = true;
  if (config_.overlap_param_gather) {
    // Started now (in flight: start_param_gather skips them), else by the next forward, bucket by bucket.
    if (config_.gather_right_after_step)
      for (size_t b = 0; b < buckets_.size(); ++b) start_param_gather(b);
    return;
  }
  for (size_t b = 0; b < buckets_.size(); ++b) start_param_gather(b);
  for (size_t b = 0; b < buckets_.size(); ++b) finish_param_gather(b);
}

void DataParallelSync::start_param_gather(size_t b) {
  BucketState& s = state_[b];
  if (!s.params_stale || s.param_work) return;
  const GradBucket& bucket = buckets_[b];
  float* p = params_->flat_params().data<float>() + bucket.range.begin;
  const int64_t n = bucket.numel(), shard = bucket.shard_numel(dp_size_);
  // --reuse-fp32-param: the buffer holds split weights, so the f32 values travel through staging.
  if (bucket.padded_numel == n && !params_->reuses_fp32()) {
    s.param_work = param_gather_group()->all_gather_async(p + dp_rank_ * shard, p, shard, DType::kF32);
    return;
  }
  s.param_staging = Tensor::zeros({bucket.padded_numel});
  float* staging = s.param_staging.data<float>();
  const FlatRange own = bucket_shard(bucket, dp_size_, dp_rank_);
  if (own.size() > 0) params_->read_values(own.begin, own.size(), staging + dp_rank_ * shard);
  s.param_work = param_gather_group()->all_gather_async(staging + dp_rank_ * shard, staging, shard, DType::kF32);
}

void DataParallelSync::finish_param_gather(size_t b) {
  BucketState& s = state_[b];
  if (!s.params_stale) return;
  start_param_gather(b);
  s.param_work->wait();
  s.param_work.reset();
  const GradBucket& bucket = buckets_[b];
  if (s.param_staging.defined()) {  // with the GEMM copy of the gathered weights (--bf16/--fp16)
    params_->write_values(bucket.range.begin, bucket.numel(), s.param_staging.data<float>());
    s.param_staging = Tensor();
  } else {
    params_->refresh_gemm_copy(bucket.range.begin, bucket.numel());  // --bf16/--fp16: the GEMM copy of the gathered weights
  }
  s.params_stale = false;
}

void DataParallelSync::on_params_needed(const std::vector<int>& param_ids) {
  for (int id : param_ids) {
    const int b = bucket_of_param_.at(static_cast<size_t>(id));
    if (b < 0) continue;  // another sync's region, or frozen: never updated, nothing to gather
    if (config_.reset_bucket_group_order) record_bucket_use(b);
    BucketState& s = state_[static_cast<size_t>(b)];
    if (!s.params_stale) continue;
    if (!s.param_work) ++unprefetched_param_gathers_;
    finish_param_gather(static_cast<size_t>(b));
    // Prefetch the bucket the forward reaches next.
    const int next = next_gather_[static_cast<size_t>(b)];
    if (next >= 0) start_param_gather(static_cast<size_t>(next));
  }
}

void DataParallelSync::record_bucket_use(int b) {
  if (recorded_[static_cast<size_t>(b)]) return;  // seen already (complete: every bucket is)
  recorded_[static_cast<size_t>(b)] = true;
  recorded_order_.push_back(b);
  if (recorded_order_.size() < buckets_.size()) return;
  // Every bucket seen: chain the prefetches in the order of first use (MindSpeed keeps the order of
  // the first iteration's forward, as here, for the rest of the run).
  for (size_t i = 0; i < recorded_order_.size(); ++i)
    next_gather_[static_cast<size_t>(recorded_order_[i])] = i + 1 < recorded_order_.size() ? recorded_order_[i + 1] : -1;
  first_gather_ = recorded_order_.front();
}

int64_t DataParallelSync::param_gathers_in_flight() const {
  int64_t n = 0;
  for (const BucketState& s : state_) n += s.param_work ? 1 : 0;
  return n;
}

void DataParallelSync::finish_param_sync() {
  for (size_t b = buckets_.size(); b-- > 0;) finish_param_gather(b);
}

}  // namespace gale
