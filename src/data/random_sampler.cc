// torch.randperm on the CPU and Megatron's MegatronPretrainingRandomSampler (--dataloader-type cyclic).
#include "data/random_sampler.h"

#include <numeric>
#include <random>
#include <utility>

namespace gale {

StatusOr<std::vector<int64_t>> torch_randperm(int64_t n, uint64_t seed) {
  if (n < 0) return InvalidArgument("randperm: expected a non-negative size, found ", n);
  if (n >= kTorchRandpermSmallLimit)
    return Unimplemented("a permutation of ", n, " samples: Gale reproduces torch.randperm below ",
                         kTorchRandpermSmallLimit, " elements only (from that size on torch 2.6 and later draw 64-bit "
                         "numbers, torch 2.5 and earlier 32-bit ones)");
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), int64_t{0});
  std::mt19937 mt(static_cast<uint32_t>(seed));  // torch's CPUGeneratorImpl: mt19937 of the seed's low 32 bits
  for (int64_t i = 0; i + 1 < n; ++i) {
    const int64_t z = static_cast<int64_t>(static_cast<uint32_t>(mt()) % static_cast<uint64_t>(n - i));
    std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(i + z)]);
  }
  return p;
}

PretrainingRandomSampler::PretrainingRandomSampler(RandomSamplerOptions options) : o_(std::move(options)) {
  const int64_t chunk = o_.micro_batch_size * o_.data_parallel_size;
  active_ = chunk > 0 ? o_.total_samples - o_.total_samples % chunk : 0;
}

Status PretrainingRandomSampler::check_in_step(int64_t epoch) const {
  if (o_.data_sharding || epoch <= start_epoch_) return Status::Ok();
  // Without sharding rank r reads ceil((F − r) / dp) // mbs micro-batches of an epoch started at
  // offset 0 (offsets are multiples of mbs·dp, which changes nothing below); rank 0 reads the most.
  const int64_t mbs = o_.micro_batch_size, dp = o_.data_parallel_size;
  const int64_t full = o_.total_samples / mbs * mbs;
  const int64_t in_step = active_ / (mbs * dp);
  int64_t ahead = 0;  // ranks 0 .. ahead-1 read one micro-batch more
  while (ahead < dp && (full - ahead + dp - 1) / dp / mbs > in_step) ++ahead;
  if (ahead == 0) return Status::Ok();
  return FailedPrecondition(
      "--dataloader-type cyclic --no-data-sharding: the ", o_.name, " dataset's ", o_.total_samples,
      " samples with --micro-batch-size ", mbs, " and data-parallel size ", dp, " give data-parallel rank",
      ahead > 1 ? str_cat("s 0-", ahead - 1) : std::string(" 0"), " one micro-batch more per epoch than the others (",
      in_step + 1, " instead of ", in_step, "), so Megatron's ranks fall out of step at the end of epoch ", start_epoch_,
      "; use data sharding (drop --no-data-sharding) or another micro-batch or data-parallel size");
}

Status PretrainingRandomSampler::micro_batch(int64_t consumed, std::vector<int64_t>* indices, int64_t* epoch_out) {
  const int64_t mbs = o_.micro_batch_size, dp = o_.data_parallel_size, rank = o_.data_parallel_rank;
  if (active_ <= 0)
    return FailedPrecondition("--dataloader-type cyclic: the ", o_.name, " dataset has ", o_.total_samples,
                              " samples, fewer than one micro-batch per data-parallel rank (--micro-batch-size ", mbs,
                              " x data-parallel size ", dp, ")");
  if (consumed < 0 || consumed % (mbs * dp) != 0)
    return FailedPrecondition("--dataloader-type cyclic: ", consumed, " consumed ", o_.name,
                              " samples are not a multiple of --micro-batch-size ", mbs, " x data-parallel size ", dp,
                              " (Megatron's sampler asserts it; was the checkpoint saved at another data-parallel size?)");
  const int64_t epoch = consumed / active_, offset = consumed % active_;
  std::lock_guard<std::mutex> lock(mu_);
  if (start_epoch_ < 0) start_epoch_ = epoch;
  GALE_RETURN_IF_ERROR(check_in_step(epoch));
  if (perm_epoch_ != epoch) {
    const int64_t n = o_.data_sharding ? o_.total_samples / (mbs * dp) * mbs : o_.total_samples / mbs * mbs;
    StatusOr<std::vector<int64_t>> p = torch_randperm(n, static_cast<uint64_t>(epoch));
    if (!p.ok()) return InvalidArgument("--dataloader-type cyclic: the ", o_.name, " dataset: ", p.status().message());
    perm_ = std::move(p).value();
    perm_epoch_ = epoch;
  }
  indices->resize(static_cast<size_t>(mbs));
  if (o_.data_sharding) {
    const int64_t bucket = static_cast<int64_t>(perm_.size()), first = offset / dp;
    for (int64_t j = 0; j < mbs; ++j) (*indices)[j] = rank * bucket + perm_[first + j];
  } else {
    for (int64_t j = 0; j < mbs; ++j) (*indices)[j] = perm_[offset + j * dp + rank];
  }
  if (epoch_out) *epoch_out = epoch;
  return Status::Ok();
}

}  // namespace gale
