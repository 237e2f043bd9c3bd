// MindSpeed's --disable-gloo-group (DisableGlooGroupFeature) in the registry: no Gloo process groups.
//
// Megatron creates a Gloo copy of the data-parallel groups for the distributed optimizer's
// checkpoint path: DP rank 0 gathers every rank's optimizer-state shard over Gloo and writes it,
// and loading scatters it back the same way (Gloo's full-mesh set-up fails at thousands of ranks).
// MindSpeed's flag moves that gather/scatter onto the main backend (HCCL) in --hccl-slice-size
// pieces and stops creating the Gloo groups (Megatron's --disable-gloo-process-groups).
//
// Gale behaves like that always, so the flag is accepted and reported active without changing
// anything: Gale creates no Gloo groups (one communicator interface, MPI or NCCL), and its
// distributed optimizer never gathers the state: each data-parallel rank writes the boxes of its
// own shards into its own checkpoint shard file and reads back only the boxes it needs
// (docs/formats/checkpoint.md), so there is no gather to slice. --hccl-slice-size is accepted for
// the same command lines and checked to be positive. Level 2, in the communication module, as
// MindSpeed's; tests/features/disable_gloo_group_test.cc.
#include "features/registry.h"

namespace gale {

namespace {

class DisableGlooGroupFeature : public Feature {
 public:
  std::string name() const override { return "disable-gloo-group"; }
  std::string flag() const override { return "--disable-gloo-group"; }
  FeatureModule module() const override { return FeatureModule::kCommunication; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed DisableGlooGroupFeature (L2)"; }
  std::string description() const override {
    return "no Gloo process groups: always the case in Gale, whose distributed optimizer writes and reads each "
           "rank's own state shards over no gather (--hccl-slice-size accepted)";
  }
  void register_args(ArgParser& parser) override {
    parser.add_flag("--disable-gloo-group", &on_,
                    "MindSpeed: distributed-optimizer checkpoints without Gloo groups (always so in Gale: each rank "
                    "writes and reads its own state shards, nothing is gathered)");
    parser.add("--hccl-slice-size", &slice_size_,
               "MindSpeed: slice size of the HCCL state gather with --disable-gloo-group (default 10485760); "
               "accepted, Gale gathers nothing");
  }
  bool requested(const FeatureContext& ctx) const override { return on_; }
  Status validate(const FeatureContext& ctx) const override {
    if (slice_size_ <= 0) return InvalidArgument("--hccl-slice-size: expected a positive integer, found ", slice_size_);
    return Status::Ok();
  }

 private:
  bool on_ = false;
  int64_t slice_size_ = 10 * 1024 * 1024;
};

}  // namespace

void register_feature_disable_gloo_group(FeatureRegistry& registry) {
  registry.add(std::make_unique<DisableGlooGroupFeature>());
}

}  // namespace gale
