// --mla-down-proj-fusion on the CPU: MLA's input norm + q/kv down projections, unfused (norm, f32
// output, conversion to the GEMM input type, two GEMMs; backward two input-gradient and two weight
// GEMMs) against fused (the norm written straight in the GEMM input type, one GEMM over
// [q_down; kv_down]; backward one input-gradient and one weight GEMM), model/mla_down_proj.h.
//
//   build/bench/mla_down_proj_bench
// Sizes: DeepSeek-V3's down projections scaled down (H 1024, q_lora_rank 256, kv_lora_rank 64 +
// qk_pos_emb_head_dim 16), RMSNorm, T = 2048 tokens. Arguments: fused (0/1), pass
// (0 forward, 1 forward + backward), bf16 (0 f32 GEMMs, 1 bf16 GEMMs with f32 accumulation).
#include <benchmark/benchmark.h>

#include <vector>

#include "core/rng.h"
#include "kernels/op_table.h"
#include "model/linear.h"
#include "model/mla_down_proj.h"
#include "model/norm_weight.h"
#include "model/param_builders.h"

namespace gale {
namespace {

constexpr int64_t kT = 2048, kH = 1024, kCq = 256, kCkvR = 64 + 16;

void BM_MlaDownProj(benchmark::State& state) {
  const bool fused = state.range(0) != 0, backward = state.range(1) != 0, bf16 = state.range(2) != 0;
  ModelConfig c;
  c.hidden = kH;
  c.rms_norm = true;
  c.bf16 = bf16;
  ParamBuffer pb;
  MlaDownProjIds ids;
  ids.norm_w = pb.add(make_param_spec("input_layernorm.weight", {kH}, InitKind::kOnes, 0.0f, false));
  ids.q_down = pb.add(make_param_spec("linear_q_down_proj.weight", {kCq, kH}, InitKind::kNormal, 0.02f, true));
  ids.kv_down = pb.add(make_param_spec("linear_kv_down_proj.weight", {kCkvR, kH}, InitKind::kNormal, 0.02f, true));
  pb.finalize();
  if (bf16) pb.enable_gemm_copy(DType::kBF16);
  pb.initialize(1);
  OpTable ops = reference_ops();
  LayerRuntime rt;
  rt.config = &c;
  rt.ops = &ops;
  Tensor x = Tensor::empty({kT, kH});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = normal_at(3, 4, static_cast<uint64_t>(i));
  Tensor dy = Tensor::empty({kT, kCq + kCkvR}), dyq = Tensor::empty({kT, kCq}), dykv = Tensor::empty({kT, kCkvR});
  for (int64_t i = 0; i < dy.numel(); ++i) dy.data<float>()[i] = 1e-3f * normal_at(5, 6, static_cast<uint64_t>(i));
  for (int64_t i = 0; i < dyq.numel(); ++i) dyq.data<float>()[i] = dy.data<float>()[i];
  for (int64_t i = 0; i < dykv.numel(); ++i) dykv.data<float>()[i] = dy.data<float>()[i];
  const DType gemm = c.gemm_dtype();
  for (auto _ : state) {
    if (fused) {
      MlaDownProjSaved saved;
      Tensor y = mla_down_proj_forward(rt, pb, ids, x, &saved);
      benchmark::DoNotOptimize(y.raw());
      if (backward) benchmark::DoNotOptimize(mla_down_proj_backward(rt, pb, ids, saved, dy).raw());
    } else {
      Tensor xn = Tensor::empty({kT, kH}), stats = Tensor::empty({1, kT});
      ops.norm_forward(NormSpec{true, c.norm_eps}, x.data<float>(), NormScale(c, pb, ids.norm_w).data(), nullptr,
                       xn.data<float>(), stats.data<float>(), kT, kH);
      const Tensor xg = to_gemm_input(xn, gemm);
      const LinearWeight q = linear_weight(pb, ids.q_down, ops.gemm, ops.bf16_gemm);
      const LinearWeight kv = linear_weight(pb, ids.kv_down, ops.gemm, ops.bf16_gemm);
      Tensor yq = linear_forward(xg, q), ykv = linear_forward(xg, kv);
      benchmark::DoNotOptimize(yq.raw());
      benchmark::DoNotOptimize(ykv.raw());
      if (backward) {
        Tensor dxn = linear_backward(dyq, xg, q);
        const Tensor dxn2 = linear_backward(dykv, xg, kv);
        for (int64_t i = 0; i < dxn.numel(); ++i) dxn.data<float>()[i] += dxn2.data<float>()[i];
        Tensor dx = Tensor::empty({kT, kH});
        ops.norm_backward(NormSpec{true, c.norm_eps}, dxn.data<float>(), x.data<float>(),
                          NormScale(c, pb, ids.norm_w).data(), stats.data<float>(), dx.data<float>(),
                          pb.grad_data(ids.norm_w), nullptr, kT, kH);
        benchmark::DoNotOptimize(dx.raw());
      }
    }
  }
  const double flops = 2.0 * kT * kH * (kCq + kCkvR) * (backward ? 3.0 : 1.0);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

BENCHMARK(BM_MlaDownProj)
    ->ArgNames({"fused", "bwd", "bf16"})
    ->ArgsProduct({{0, 1}, {0, 1}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace gale

BENCHMARK_MAIN();
