// MindSpeed's --swap-optimizer (SwapOptimizerFeature, memory, level 2) in the registry.
//
// What: the optimizer's fp32 state (AdamW's exp_avg and exp_avg_sq; SGD's momentum buffer) lives
// outside memory during forward and backward, and the step brings it back in
// --swap-optimizer-times chunks (default 16), updating each chunk's parameters and writing the
// chunk back before the next one, so the resident state is one chunk instead of all of it.
//
// How (optim/state_swap.h): MindSpeed swaps between NPU and host memory; on a CPU both are the same
// RAM, so Gale's lower tier is a file, as DeepSpeed's NVMe offload: one anonymous temporary file per
// rank in --swap-optimizer-dir (Gale's flag; default $TMPDIR or /tmp), unlinked right after
// mkstemp so nothing is left behind even after a crash, its blocks reserved at start-up, read and
// written with pread/pwrite through ONE staging buffer of about state/times. Chunk boundaries fall
// on multiples of 64 elements inside a parameter, so every AdamW call sees the same vector lanes as
// in an unchunked step: training is bit-identical to the unswapped run. (Gale's AVX2/AVX-512 AdamW
// computes its masked tail with the same operations, so unaligned edges were bit-identical too
// when tried; the alignment keeps that true for any kernel.) Checkpoints read the state from the file and a
// load writes it back (each buffer's state is materialised for the duration of the save/load).
//
// Differences from MindSpeed: the f32 master weights stay resident. Gale's f32 parameter buffer is
// the model's (the forward reads the embeddings, norms and biases in f32; the distributed optimizer
// all-gathers into it), so it is what MindSpeed calls an fp32 model parameter, whose master it does
// not swap either ("no_swap_params": only the optimizer states). The transfers are synchronous (no
// copy streams to overlap). --swap-optimizer-times 0 (MindSpeed: everything in one go) is one
// chunk. SGD is supported (MindSpeed swaps only for Adam and Muon).
//
// Rules, as MindSpeed: needs --use-distributed-optimizer (the same requirement, Gale's wording);
// conflicts with --reuse-fp32-param. Muon is refused (Gale's Muon refuses the distributed optimizer,
// MindSpeed swaps it with its layer-wise one); --optimizer-selection fused_ema_adamw is refused by
// the fused-ema-adamw feature (as MindSpeed). A directory where the file cannot be created or reserved is a
// start-up error naming the directory and the file.
//
// Tests: tests/optim/state_swap_test.cc (chunk plan, staging), tests/core/swap_file_test.cc (file IO, errors),
// tests/train/swap_optimizer_test.cc (bit-identical training for times 1, 3, 16, SGD, checkpoint
// resume either way, allocator bytes, unwritable directory),
// tests/optim/swap_optimizer_mpi_test.cc (DP2 distributed optimizer, bit-identical),
// tests/features/swap_optimizer_feature_test.cc (registry and rules).
#include "features/registry.h"

namespace gale {

namespace {

class SwapOptimizer : public Feature {
 public:
  std::string name() const override { return "swap-optimizer"; }
  std::string flag() const override { return "--swap-optimizer"; }
  FeatureModule module() const override { return FeatureModule::kMemory; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed SwapOptimizerFeature (L2)"; }
  std::string description() const override {
    return "optimizer fp32 state (Adam moments, SGD momentum) kept in an unlinked temporary file "
           "(--swap-optimizer-dir) and brought back in --swap-optimizer-times chunks through one staging buffer "
           "during the step: resident state about 1/times, bit-identical training and checkpoints; needs "
           "--use-distributed-optimizer";
  }
  bool requested(const FeatureContext& ctx) const override { return ctx.args->training.swap_optimizer; }
  Status validate(const FeatureContext& ctx) const override {
    const Arguments& a = *ctx.args;
    if (a.training.swap_optimizer_times < 0)
      return InvalidArgument("--swap-optimizer-times: expected a number of chunks >= 0 (0: all at once), found ",
                             a.training.swap_optimizer_times);
    if (!a.parallel.use_distributed_optimizer)
      return InvalidArgument("--swap-optimizer: needs --use-distributed-optimizer (as MindSpeed), found the "
                             "distributed optimizer off");
    if (a.training.reuse_fp32_param)
      return InvalidArgument("--swap-optimizer: conflicts with --reuse-fp32-param (as MindSpeed)");
    if (a.training.optimizer == "muon" || a.training.optimizer == "lion")
      return Unimplemented("--swap-optimizer with --optimizer ", a.training.optimizer,
                           ": not supported (its distributed optimizer is the layer-wise one, not the flat shards "
                           "the state file follows)");
    return Status::Ok();
  }
};

}  // namespace

void register_feature_swap_optimizer(FeatureRegistry& registry) { registry.add(std::make_unique<SwapOptimizer>()); }

}  // namespace gale
