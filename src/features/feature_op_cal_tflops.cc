// MindSpeed's --op-cal-tflops (TflopsCalculateFeature): the log line's throughputs of the FLOPs the
// kernels actually ran.
//
// Active, the feature wraps the op table's GEMM and attention entries in FLOP counters
// (kernels/flop_counter.h says what each call counts); the trainer counts each training step
// (forward, backward and recomputation, every micro-batch), sums the two counts of the logged
// iteration over all ranks (one all-reduce of two int64 over the world group at each log line) and
// prints, after Megatron's "throughput per GPU (TFLOP/s/GPU)" of the analytic formula (unchanged):
//   actual throughput per GPU (TFLOP/s/GPU)                 counted FLOPs without recomputation (MFU)
//   actual throughput per GPU with recompute (TFLOP/s/GPU)  counted FLOPs with it (HFU)
// each the world's sum / (time per iteration of the log interval × 10¹² × world size), as
// MindSpeed's training_log (which writes NPU where Megatron's line, and Gale's, write GPU). Like
// MindSpeed's, both need --log-throughput (without it the feature stays off and says so) and reject
// --multi-latent-attention. Off, nothing is wrapped or counted. Level 2.
#include "features/registry.h"
#include "kernels/flop_counter.h"

namespace gale {

namespace {

class OpCalTflopsFeature : public Feature {
 public:
  std::string name() const override { return "op-cal-tflops"; }
  std::string flag() const override { return "--op-cal-tflops"; }
  FeatureModule module() const override { return FeatureModule::kKeyScenarios; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed TflopsCalculateFeature (L2)"; }
  std::string description() const override {
    return "count the FLOPs of the GEMMs and attention the kernels run (recomputation apart) and log "
           "\"actual throughput per GPU (TFLOP/s/GPU)\" and \"... with recompute\" after the formula's";
  }
  void register_args(ArgParser& parser) override {
    parser.add_flag("--op-cal-tflops", &on_,
                    "count the FLOPs the GEMM and attention kernels run and log the actual throughputs (MFU and "
                    "HFU) with --log-throughput");
  }
  bool requested(const FeatureContext& ctx) const override { return on_; }
  Status validate(const FeatureContext& ctx) const override {
    if (ctx.args->model.multi_latent_attention)
      return InvalidArgument("--op-cal-tflops with --multi-latent-attention: not supported (MindSpeed's FLOP "
                             "counter rejects multi-head latent attention too)");
    return Status::Ok();
  }
  bool applicable(const FeatureContext& ctx, std::string* why) const override {
    if (ctx.args->logging.log_throughput) return true;
    *why = "its throughputs are printed only with --log-throughput";
    return false;
  }
  // The registry applies the key-scenarios module after the fused-compute one, so the wrappers
  // call the kernels the fused-compute features installed (flash attention, partitioned GEMM).
  Status apply(const FeatureContext& ctx, EngineSetup& setup) const override {
    install_flop_counting(setup.ops);
    return Status::Ok();
  }

 private:
  bool on_ = false;
};

}  // namespace

void register_feature_op_cal_tflops(FeatureRegistry& registry) {
  registry.add(std::make_unique<OpCalTflopsFeature>());
}

}  // namespace gale
