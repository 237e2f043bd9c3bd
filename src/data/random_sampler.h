// Megatron's `--dataloader-type cyclic` sample order (MegatronPretrainingRandomSampler behind
// cyclic_iter) and the torch.randperm stream it shuffles with.
//
// Megatron's sampler, for one data-parallel rank, over a dataset of `total` samples (len(dataset))
// with micro-batch size `mbs` and `dp` data-parallel ranks:
//   active = total − total mod (mbs·dp)          (the samples an epoch consumes)
//   epoch  = consumed // active, offset = consumed mod active
//   --data-sharding (the default): rank r owns the bucket [r·B, (r+1)·B) with
//     B = (total // (mbs·dp))·mbs, shuffles it with p = torch.randperm(B) seeded with the epoch,
//     and reads r·B + p[offset/dp ...] in micro-batches of mbs;
//   --no-data-sharding: p = torch.randperm(F) with F = (total // mbs)·mbs, seeded with the epoch;
//     rank r reads p[offset + r], p[offset + r + dp], ... in micro-batches of mbs.
// Each micro-batch read advances the sampler's consumed count by mbs·dp; when an epoch's indices
// run out cyclic_iter starts the sampler again, which recomputes the epoch from the count. So the
// micro-batch that starts after `consumed` samples (all ranks together) is a pure function of
// `consumed`: a global batch can span two epochs, and a run resumed at a checkpoint's consumed
// samples reads what the uninterrupted run reads.
//
// As in Megatron, the order depends on the data-parallel size: with data sharding each rank
// shuffles its own bucket; without it the samples of each global batch are those of one process
// (only their split into micro-batches differs) as long as the epoch length `active` is the same.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"

namespace gale {

// The size from which torch's CPU randperm algorithms differ between releases: torch up to 2.5
// (2.5.1 checked at 214748363 and 214748364) takes a 32-bit draw modulo n − i at every size; later
// releases (pytorch PR #143682) switch at n ≥ UINT32_MAX / 20 to an inside-out shuffle with 64-bit
// draws. Gale reproduces the permutation below this size only, where all releases agree.
inline constexpr int64_t kTorchRandpermSmallLimit = 214748364;

// torch.randperm(n, generator=g) after g.manual_seed(seed) on the CPU (torch's mt19937, seeded as
// std::mt19937 with the low 32 bits of the seed): start from 0..n-1 and for i = 0 .. n−2 swap
// element i with element i + (next 32-bit draw mod (n − i)). Checked against torch 2.5.1
// (tools/reference/random_sampler_reference.py). An error names n at or above
// kTorchRandpermSmallLimit.
StatusOr<std::vector<int64_t>> torch_randperm(int64_t n, uint64_t seed);

struct RandomSamplerOptions {
  std::string name;  // the dataset in errors: "train", "validation", "test"
  int64_t total_samples = 0;  // len(dataset)
  int64_t micro_batch_size = 1;
  int64_t data_parallel_size = 1;
  int64_t data_parallel_rank = 0;
  bool data_sharding = true;  // --data-sharding (Megatron's default) / --no-data-sharding
};

class PretrainingRandomSampler {
 public:
  explicit PretrainingRandomSampler(RandomSamplerOptions options);

  // The `micro_batch_size` dataset indices this rank reads in the micro-batch that starts after
  // `consumed` samples, and its epoch. Errors, naming the dataset and the flag: fewer samples than
  // one micro-batch per rank (Megatron divides by zero), `consumed` not a multiple of mbs·dp
  // (Megatron's assertion, e.g. resuming at another data-parallel size), and, without data
  // sharding, crossing an epoch end at which Megatron's ranks would read different numbers of
  // micro-batches (when (total // mbs)·mbs exceeds `active` by enough, the first ranks read one
  // extra micro-batch from the old epoch and the ranks fall out of step; Megatron's sampler
  // started in a later epoch — a resumed run — is in step, so the first `consumed` asked for is
  // taken as this process's start). Thread-safe; the epoch's permutation is kept between calls.
  Status micro_batch(int64_t consumed, std::vector<int64_t>* indices, int64_t* epoch);

  // total − total mod (mbs·dp): the samples one epoch consumes.
  int64_t active_total_samples() const { return active_; }
  int64_t total_samples() const { return o_.total_samples; }

 private:
  Status check_in_step(int64_t epoch) const;

  RandomSamplerOptions o_;
  int64_t active_ = 0;
  std::mutex mu_;
  int64_t start_epoch_ = -1;  // the epoch of the first micro-batch asked for
  int64_t perm_epoch_ = -1;   // the epoch `perm_` was drawn for
  std::vector<int64_t> perm_;
};

}  // namespace gale
