// MindSpeed's --reset-bucket-group-order (ResetBucketGroupOrderFeature) in the registry.
//
// With --overlap-param-gather the distributed optimizer leaves each bucket's parameter all-gather
// to the next forward, which waits for the bucket it needs and prefetches the next. "Next" is the
// bucket below in the buffer, right when the model uses its parameters in reverse buffer order.
// MindSpeed added the flag for models whose definition order differs from their execution order
// (multimodal ones, redefined blocks), where the prefetched bucket is not the next one needed and
// the forward waits for an all-gather it could have overlapped. With the flag, DataParallelSync
// records the order in which the first forward asks for each bucket and prefetches in that order
// from then on (optim/data_parallel_sync.h). Gale's GPTModel registers its parameters in forward
// order on every pipeline stage, so for it the recorded order is the buffer's and nothing changes;
// the flag matters for a model that does not. It changes when all-gathers start, never what they
// carry: losses and parameters are bit-identical.
//
// Level 2, communication module, as MindSpeed's. Needs --overlap-param-gather (MindSpeed's check;
// Gale's --overlap-param-gather itself needs --use-distributed-optimizer and --overlap-grad-reduce).
// tests/features/reset_bucket_group_order_feature_test.cc, tests/optim/data_parallel_sync_mpi_test.cc,
// tests/parallel/reset_bucket_group_order_mpi_test.cc.
#include "features/registry.h"

namespace gale {

namespace {

class ResetBucketGroupOrderFeature : public Feature {
 public:
  std::string name() const override { return "reset-bucket-group-order"; }
  std::string flag() const override { return "--reset-bucket-group-order"; }
  FeatureModule module() const override { return FeatureModule::kCommunication; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed ResetBucketGroupOrderFeature (L2)"; }
  std::string description() const override {
    return "--overlap-param-gather prefetches each bucket's all-gather in the order the first forward used the "
           "buckets (recorded), not the buffer's reverse order";
  }
  bool requested(const FeatureContext& ctx) const override { return ctx.args->parallel.reset_bucket_group_order; }
  Status validate(const FeatureContext& ctx) const override {
    if (!ctx.args->parallel.overlap_param_gather)
      return InvalidArgument("--reset-bucket-group-order reorders the --overlap-param-gather prefetch: expected "
                             "--overlap-param-gather (with --use-distributed-optimizer and --overlap-grad-reduce)");
    return Status::Ok();
  }
};

}  // namespace

void register_feature_reset_bucket_group_order(FeatureRegistry& registry) {
  registry.add(std::make_unique<ResetBucketGroupOrderFeature>());
}

}  // namespace gale
