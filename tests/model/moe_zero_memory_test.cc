// --moe-zero-memory and --moe-alltoall-overlap-comm in one process: a MoE layer's outputs and
// gradients are bit-identical to the plain path at every level (with biases, padding to capacity,
// bf16 GEMMs), the kept bytes shrink exactly by what each level drops (off > level0 > level1), and
// a whole model with a gated shared expert (level1 reruns it) trains to the same bits.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "model/gpt_model.h"
#include "model/linear.h"
#include "model/moe_layer.h"
#include "model_test_batches.h"
#include "testing.h"

namespace gale {
namespace {

ModelConfig layer_config(bool swiglu, bool bias) {
  ModelConfig c;
  c.num_layers = 2;
  c.hidden = 8;
  c.ffn = 6;
  c.swiglu = swiglu;
  c.add_bias_linear = bias;
  c.init_std = 0.5f;
  c.moe.num_experts = 4;
  c.moe.topk = 2;
  c.moe.ffn = 6;
  c.moe.aux_loss_coeff = 0.3;
  c.moe.z_loss_coeff = 0.05;
  return c;
}

// One MoE layer's y, dx and parameter gradients (all as floats), and the bytes its forward kept.
struct LayerResult {
  std::vector<float> values;
  int64_t kept_bytes = 0;
};

LayerResult run_layer(const ModelConfig& c, MoeZeroMemory zero_memory, bool overlap_comm, int64_t T = 13) {
  OpTable ops = reference_ops();
  ops.moe_alltoall_overlap = overlap_comm;
  ParamBuffer pb;
  const MoeParamIds w = register_moe_params(pb, c, 0);
  pb.finalize();
  if (c.bf16) pb.enable_gemm_copy(DType::kBF16);
  pb.initialize(3);
  for (int id = 0; id < pb.size(); ++id)  // non-zero biases, so their gradients are compared too
    if (pb.spec(id).init == InitKind::kZeros) testing::fill_random(pb.param_data(id), pb.spec(id).local_numel(), 50 + id, 0.3f);
  if (c.bf16) pb.refresh_gemm_copy();
  Tensor x32 = Tensor::empty({T, c.hidden});
  testing::fill_random(x32.data<float>(), x32.numel(), 7);
  const Tensor x = to_gemm_input(x32, c.gemm_dtype());
  std::vector<float> r = testing::random_vector(T * c.hidden, 8);
  pb.zero_grads();
  MoeSaved saved;
  MoeAuxLosses aux;
  const Tensor y = moe_forward(c, ops, pb, w, x, &saved, &aux, nullptr, false, nullptr, nullptr, 1, {}, {}, zero_memory);
  LayerResult out;
  out.kept_bytes = saved.tensor_bytes();
  const Tensor dy = Tensor::from_blob(r.data(), {T, c.hidden}, DType::kF32);
  const Tensor dx = moe_backward(c, ops, pb, w, saved, dy, 1.0);
  out.values.assign(y.data<float>(), y.data<float>() + y.numel());
  out.values.insert(out.values.end(), dx.data<float>(), dx.data<float>() + dx.numel());
  const float* g = pb.flat_grads().data<float>();
  out.values.insert(out.values.end(), g, g + pb.numel());
  out.values.push_back(static_cast<float>(aux.load_balancing));
  return out;
}

void expect_bit_identical_at_every_level(const ModelConfig& c) {
  const LayerResult plain = run_layer(c, MoeZeroMemory::kOff, false);
  for (MoeZeroMemory level : {MoeZeroMemory::kOff, MoeZeroMemory::kLevel0, MoeZeroMemory::kLevel1})
    for (bool overlap : {false, true}) {
      const LayerResult r = run_layer(c, level, overlap);
      ASSERT_EQ(r.values.size(), plain.values.size());
      EXPECT_EQ(0, std::memcmp(r.values.data(), plain.values.data(), plain.values.size() * sizeof(float)))
          << "level " << static_cast<int>(level) << " overlap " << overlap;
    }
}

TEST(MoeZeroMemory, BitIdenticalGeluWithBiases) { expect_bit_identical_at_every_level(layer_config(false, true)); }

TEST(MoeZeroMemory, BitIdenticalSwigluPaddedToCapacity) {
  ModelConfig c = layer_config(true, false);
  c.moe.capacity_factor = 1.0;  // dropped pairs and weight-0 padding rows among the re-dispatched ones
  c.moe.pad_to_capacity = true;
  expect_bit_identical_at_every_level(c);
}

TEST(MoeZeroMemory, BitIdenticalWithBf16Gemms) {
  ModelConfig c = layer_config(true, false);
  c.bf16 = true;
  expect_bit_identical_at_every_level(c);
}

// Kept bytes: level0 drops the experts' input rows [R, H] and activations [R, Fe]; level1 also the
// fc1 outputs [R, 2Fe] (SwiGLU), all f32 here (R = T·k kept pairs, dropless).
TEST(MoeZeroMemory, KeptBytesShrinkByWhatEachLevelDrops) {
  const ModelConfig c = layer_config(true, false);
  const int64_t T = 13, R = T * c.moe.topk, H = c.hidden, Fe = c.moe.ffn, f32 = 4;
  const int64_t off = run_layer(c, MoeZeroMemory::kOff, true, T).kept_bytes;
  const int64_t level0 = run_layer(c, MoeZeroMemory::kLevel0, true, T).kept_bytes;
  const int64_t level1 = run_layer(c, MoeZeroMemory::kLevel1, true, T).kept_bytes;
  EXPECT_EQ(off - level0, R * (H + Fe) * f32);
  EXPECT_EQ(level0 - level1, R * 2 * Fe * f32);
  EXPECT_LT(level1, level0);
  EXPECT_LT(level0, off);
}

// A whole model (layers 0 and 2 MoE, a gated SwiGLU shared expert): flat gradients and loss of one
// training micro-batch.
std::vector<float> run_model(MoeZeroMemory level, int64_t level1_layers, bool overlap_comm) {
  ModelConfig c = testing::tiny_moe_config();
  c.moe.shared_ffn = 10;
  c.moe.shared_gate = true;
  c.recompute.moe_zero_memory = level;
  c.recompute.moe_zero_memory_level1_layers = level1_layers;
  OpTable ops = reference_ops();
  ops.moe_alltoall_overlap = overlap_comm;
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(6);
  const MicroBatch mb = testing::full_batch(c, 2, 23);
  GPTModel::LossSums sums;
  model.forward(0, mb, Tensor(), true, &sums);
  model.backward(0, Tensor(), static_cast<float>(1.0 / sums.tokens));
  const float* g = model.params().flat_grads().data<float>();
  std::vector<float> out(g, g + model.params().numel());
  out.push_back(static_cast<float>(sums.loss_sum));
  return out;
}

TEST(MoeZeroMemory, ModelWithSharedExpertBitIdentical) {
  const std::vector<float> plain = run_model(MoeZeroMemory::kOff, RecomputePlan::kAllLayers, false);
  EXPECT_EQ(plain, run_model(MoeZeroMemory::kOff, RecomputePlan::kAllLayers, true));
  EXPECT_EQ(plain, run_model(MoeZeroMemory::kLevel0, RecomputePlan::kAllLayers, true));
  EXPECT_EQ(plain, run_model(MoeZeroMemory::kLevel1, RecomputePlan::kAllLayers, true));
  EXPECT_EQ(plain, run_model(MoeZeroMemory::kLevel1, 1, true));  // layer 0 level1, layer 2 level0
}

}  // namespace
}  // namespace gale
