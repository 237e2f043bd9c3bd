// MindSpeed's --async-log-allreduce (AsyncLogAllreduceFeature): the data-parallel all-reduce of the
// loss that is only logged becomes non-blocking.
//
// Megatron sums each iteration's lm loss (loss sum and token count) over the data-parallel group
// for the log line, TensorBoard and the NaN check, a blocking all-reduce between the last
// micro-batch and the optimizer step. With the feature the trainer starts that all-reduce when the
// micro-batches are done and waits for it after the optimizer step, where the loss is first read
// (train/loss_reduction.h), so it overlaps the gradient clipping and the optimizer; the values are
// the same (the same reduction, only finished later). As MindSpeed's, it covers the lm loss of the
// training steps only: the MoE and MTP loss trackers and the evaluation losses stay blocking.
// Level 2, in the communication module.
#include "features/registry.h"

namespace gale {

namespace {

class AsyncLogAllreduceFeature : public Feature {
 public:
  std::string name() const override { return "async-log-allreduce"; }
  std::string flag() const override { return "--async-log-allreduce"; }
  FeatureModule module() const override { return FeatureModule::kCommunication; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed AsyncLogAllreduceFeature (L2)"; }
  std::string description() const override {
    return "non-blocking data-parallel all-reduce of the logged lm loss: started after the micro-batches, "
           "waited for after the optimizer step";
  }
  void register_args(ArgParser& parser) override {
    parser.add_flag("--async-log-allreduce", &on_,
                    "make the data-parallel all-reduce of the logged loss non-blocking (it overlaps the optimizer "
                    "step)");
  }
  bool requested(const FeatureContext& ctx) const override { return on_; }

 private:
  bool on_ = false;
};

}  // namespace

void register_feature_async_log_allreduce(FeatureRegistry& registry) {
  registry.add(std::make_unique<AsyncLogAllreduceFeature>());
}

}  // namespace gale
