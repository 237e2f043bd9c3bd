// The same tiny GPTModel with the reference op table and with every op group fused (each ISA this
// CPU has): equal losses and parameter gradients within tolerance, and the same loss curve over a
// few AdamW steps.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/fused_ops.h"
#include "model/gpt_model.h"
#include "testing.h"

namespace gale {
namespace {

using testing::random_vector;

// Relative to the reference: the loss of step 1, every parameter gradient of step 1 (per tensor,
// against its peak), and the losses of the following AdamW steps. Measured maxima over both
// configs and all ISAs in brackets.
constexpr double kLossTol = 1e-6;   // [1.1e-8]
constexpr double kGradTol = 5e-6;   // [8.2e-7]
constexpr double kCurveTol = 1e-6;  // [7.2e-9]

ModelConfig gpt_config() {
  ModelConfig c;
  c.num_layers = 2;
  c.hidden = 48;  // not a multiple of 16: vector tails everywhere
  c.ffn = 100;
  c.heads = 3;
  c.kv_heads = 3;
  c.head_dim = 16;
  c.vocab = 97;
  c.seq_length = 70;  // two flash-attention tiles, the second partial
  c.max_positions = 80;
  c.init_std = 0.1f;
  c.attention_dropout = 0.1f;
  c.hidden_dropout = 0.1f;
  return c;
}

ModelConfig llama_config() {
  ModelConfig c = gpt_config();
  use_llama_architecture(c);
  c.rotary_percent = 0.5;
  c.heads = 8;
  c.kv_heads = 2;
  c.head_dim = 12;  // rotary dims 6; HD not a multiple of any vector width
  c.attention_dropout = 0.0f;
  c.hidden_dropout = 0.0f;
  return c;
}

MicroBatch make_batch(const ModelConfig& c, int64_t B, uint64_t seed, bool documents) {
  MicroBatch mb;
  mb.B = B;
  mb.S = c.seq_length;
  const int64_t T = B * mb.S;
  auto r = random_vector(3 * T, seed);
  for (int64_t i = 0; i < T; ++i) {
    mb.tokens.push_back(static_cast<int32_t>((r[i] + 1.0f) * 0.5f * (c.vocab - 1)));
    mb.labels.push_back(static_cast<int32_t>((r[T + i] + 1.0f) * 0.5f * (c.vocab - 1)));
    mb.loss_mask.push_back(r[2 * T + i] > -0.8f ? 1.0f : 0.0f);
    const int64_t s = i % mb.S;
    const int64_t doc_start = documents ? (s >= 45 ? 45 : s >= 20 ? 20 : 0) : 0;
    mb.position_ids.push_back(static_cast<int32_t>(s - doc_start));
    if (documents) mb.document_ids.push_back(static_cast<int32_t>(doc_start));
  }
  for (int64_t b = 0; b < B; ++b) mb.sample_ids.push_back(seed * 10 + b);
  return mb;
}

struct TrainingRun {
  std::vector<double> losses;
  std::vector<float> first_grads;
};

// `steps` training steps (forward, backward, AdamW over the flat buffer) from the same initial weights.
TrainingRun train(const ModelConfig& config, const OpTable& ops, bool documents, int steps) {
  GPTModel model(config, single_process_partition(config), &ops);
  ParamBuffer& pb = model.params();
  pb.initialize(7);
  std::vector<float> m(pb.numel(), 0.0f), v(pb.numel(), 0.0f);
  TrainingRun run;
  for (int step = 1; step <= steps; ++step) {
    const MicroBatch mb = make_batch(config, 2, 100 + step, documents);
    GPTModel::LossSums sums;
    pb.zero_grads();
    model.forward(0, mb, Tensor(), /*training=*/true, &sums);
    model.backward(0, Tensor(), static_cast<float>(1.0 / sums.tokens));
    run.losses.push_back(sums.loss_sum / sums.tokens);
    if (step == 1) run.first_grads.assign(pb.flat_grads().data<float>(), pb.flat_grads().data<float>() + pb.numel());
    AdamWHyper h;
    h.lr = 1e-3f;
    h.step = step;
    ops.adamw_step(pb.flat_params().data<float>(), pb.flat_grads().data<float>(), m.data(), v.data(), pb.numel(), h);
  }
  return run;
}

struct ModelCase {
  const char* name;
  ModelConfig config;
  bool documents;
};

class FusedModel : public ::testing::TestWithParam<std::tuple<Isa, ModelCase>> {};

TEST_P(FusedModel, SameLossGradientsAndCurveAsReference) {
  const Isa isa = std::get<0>(GetParam());
  const ModelCase& mc = std::get<1>(GetParam());
  const OpTable ref_ops = reference_ops();
  OpTable fused_ops = reference_ops();
  ASSERT_TRUE(install_all_fused_kernels(fused_ops, isa).ok());
  if (isa > detected_isa()) GTEST_SKIP() << "GALE_MAX_ISA caps below " << isa_name(isa);
  for (const auto& [op, name] : fused_ops.impl) EXPECT_EQ(name, fused_kernel_name(op, isa)) << op;

  const int steps = 3;
  const TrainingRun ref = train(mc.config, ref_ops, mc.documents, steps);
  const TrainingRun fused = train(mc.config, fused_ops, mc.documents, steps);
  EXPECT_LE(std::fabs(fused.losses[0] - ref.losses[0]) / ref.losses[0], kLossTol);

  // Gradients of step 1, tensor by tensor.
  GPTModel layout(mc.config, single_process_partition(mc.config), &ref_ops);
  const ParamBuffer& pb = layout.params();
  for (int id = 0; id < pb.size(); ++id) {
    const ParamSpec& spec = pb.spec(id);
    double peak = 1e-30, err = 0.0;
    for (int64_t i = spec.offset; i < spec.offset + spec.local_numel(); ++i) {
      peak = std::max(peak, static_cast<double>(std::fabs(ref.first_grads[i])));
      err = std::max(err, static_cast<double>(std::fabs(fused.first_grads[i] - ref.first_grads[i])));
    }
    EXPECT_LE(err / peak, kGradTol) << spec.name;
  }
  for (int s = 1; s < steps; ++s)
    EXPECT_LE(std::fabs(fused.losses[s] - ref.losses[s]) / ref.losses[s], kCurveTol) << "step " << s + 1;
  // The steps really train (the curve is not flat), so the comparison above means something.
  EXPECT_NE(ref.losses[0], ref.losses[steps - 1]);
}

std::vector<Isa> isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512})
    if (isa <= hardware_isa()) out.push_back(isa);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Configs, FusedModel,
                         ::testing::Combine(::testing::ValuesIn(isas()),
                                            ::testing::Values(ModelCase{"gpt_dropout", gpt_config(), false},
                                                              ModelCase{"llama_gqa_rope_documents", llama_config(),
                                                                        true})),
                         [](const auto& info) {
                           return std::string(isa_name(std::get<0>(info.param))) + "_" + std::get<1>(info.param).name;
                         });

}  // namespace
}  // namespace gale
