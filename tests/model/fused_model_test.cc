// The same tiny GPTModel with the reference op table and with every op group fused (each ISA this
// CPU has): equal losses and parameter gradients within tolerance, and the same loss curve over a
// few AdamW steps.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/fused_ops.h"
#include "tiny_model_training.h"

namespace gale {
namespace {

using testing::TinyTrainingRun;
using testing::train_tiny;

// Relative to the reference: the loss of step 1, every parameter gradient of step 1 (per tensor,
// against its peak), and the losses of the following AdamW steps. Measured maxima over both
// configs and all ISAs in brackets.
constexpr double kLossTol = 1e-6;   // [1.1e-8]
constexpr double kGradTol = 5e-6;   // [8.2e-7]
constexpr double kCurveTol = 1e-6;  // [7.2e-9]

ModelConfig gpt_config() { return testing::tiny_gpt_config(); }
ModelConfig llama_config() { return testing::tiny_llama_config(); }

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
  const TinyTrainingRun ref = train_tiny(mc.config, ref_ops, mc.documents, steps);
  const TinyTrainingRun fused = train_tiny(mc.config, fused_ops, mc.documents, steps);
  EXPECT_LE(std::fabs(fused.losses[0] - ref.losses[0]) / ref.losses[0], kLossTol);

  // Gradients of step 1, tensor by tensor.
  GPTModel layout(mc.config, single_process_partition(mc.config), &ref_ops);
  const ParamBuffer& pb = layout.params();
  for (int id = 0; id < pb.size(); ++id) {
    const ParamSpec& spec = pb.spec(id);
    double peak = 1e-30, err = 0.0;
    for (int64_t i = spec.offset; i < spec.offset + spec.local_numel(); ++i) {
      peak = std::max(peak, static_cast<double>(std::fabs(ref.grads[0][i])));
      err = std::max(err, static_cast<double>(std::fabs(fused.grads[0][i] - ref.grads[0][i])));
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
