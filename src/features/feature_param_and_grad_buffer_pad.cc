// MindSpeed's --param-and-grad-buffer-pad N (BufferPadFeature) in the registry.
//
// MindSpeed pads each gradient bucket of the distributed optimizer's param-and-grad buffer to a
// multiple of dp·N/element-size elements, so that every bucket (and every rank's shard of it)
// starts at a multiple of N bytes (512 suits Ascend's DMA). Gale does the same in its flat f32
// buffers (optim/grad_buckets.h pad_grad_buckets, ParamBuffer::insert_padding): every bucket of
// every DataParallelSync starts at a multiple of N bytes and is padded with zeros at its high end to
// a multiple of N bytes, or, with --use-distributed-optimizer, of dp·N bytes (every shard aligned).
// Unlike MindSpeed, whose padding only acts with the distributed optimizer, Gale aligns the buckets
// of plain data parallelism too. The padding belongs to no parameter: it stays zero, no optimizer
// segment, weight decay, norm or checkpoint tensor reaches it, so training is bit-identical to an
// unpadded run and checkpoints are the same files either way. The --bf16 GEMM copy sits at the same
// element offsets (aligned to N/2 bytes).
//
// Level 2, memory module, as MindSpeed's. N: a positive multiple of 4 (the f32 element size).
// Not with ZeRO-3/ZeRO-2 (--layerzero, --use-torch-fsdp2, --use-custom-fsdp: no buckets),
// --reuse-fp32-param (split storage) or expert parallelism (not supported yet).
// tests/features/param_and_grad_buffer_pad_feature_test.cc, tests/optim/grad_buckets_pad_test.cc,
// tests/parallel/param_and_grad_buffer_pad_mpi_test.cc.
#include "features/registry.h"

namespace gale {

namespace {

class ParamAndGradBufferPadFeature : public Feature {
 public:
  std::string name() const override { return "param-and-grad-buffer-pad"; }
  std::string flag() const override { return "--param-and-grad-buffer-pad"; }
  FeatureModule module() const override { return FeatureModule::kMemory; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed BufferPadFeature (L2)"; }
  std::string description() const override {
    return "pad the flat parameter and gradient buffers with zeros so that every bucket (and distributed-optimizer "
           "shard) starts at a multiple of N bytes; bit-identical training and checkpoints";
  }
  bool requested(const FeatureContext& ctx) const override {
    return ctx.args->parallel.param_and_grad_buffer_pad != kUnset;
  }
  Status validate(const FeatureContext& ctx) const override {
    const Arguments& a = *ctx.args;
    const int64_t n = a.parallel.param_and_grad_buffer_pad;
    if (n <= 0 || n % 4 != 0)
      return InvalidArgument("--param-and-grad-buffer-pad: expected a positive multiple of 4 bytes (the f32 element "
                             "size of the parameter and gradient buffers), found ", n);
    if (a.parallel.zero3() || a.parallel.zero2())
      return Unimplemented("--param-and-grad-buffer-pad with ZeRO-3/ZeRO-2 (--layerzero, --use-torch-fsdp2, "
                           "--use-custom-fsdp): not supported yet (they shard per layer unit, not per bucket)");
    if (a.training.reuse_fp32_param)
      return Unimplemented("--param-and-grad-buffer-pad with --reuse-fp32-param: not supported yet (the split "
                           "bf16 + residual storage is not re-laid out)");
    if (a.parallel.expert_model_parallel_size > 1)
      return Unimplemented("--param-and-grad-buffer-pad with --expert-model-parallel-size ",
                           a.parallel.expert_model_parallel_size, ": not supported yet (expected 1)");
    return Status::Ok();
  }
};

}  // namespace

void register_feature_param_and_grad_buffer_pad(FeatureRegistry& registry) {
  registry.add(std::make_unique<ParamAndGradBufferPadFeature>());
}

}  // namespace gale
