// Gale's multi-latent attention model against Hugging Face's DeepseekV3ForCausalLM in float64
// (tools/reference/mla_reference.py, tests/data/golden/mla_deepseek{,_yarn}/fixture.json: plain RoPE
// and YaRN on the rotary part): the model is built from the fixture's Megatron flags, loads its
// weights by Megatron name, and must give its logits, mean token loss and every parameter gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <tuple>
#include <nlohmann/json.hpp>

#include "kernels/cpu/fused_ops.h"
#include "model/gpt_model.h"
#include "train/arguments.h"
#include "train/model_setup.h"

namespace gale {
namespace {

nlohmann::json load_fixture(const std::string& name) {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/golden/" + name + "/fixture.json");
  GALE_CHECK(in.good()) << "missing tests/data/golden/" << name << "/fixture.json (tools/reference/mla_reference.py)";
  return nlohmann::json::parse(in);
}

// max |a - b| over max |b| (b the float64 reference), for a whole tensor.
double relative_error(const float* a, const std::vector<double>& b) {
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < b.size(); ++i) {
    worst = std::max(worst, std::abs(double(a[i]) - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return worst / scale;
}

class MlaGolden : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(MlaGolden, LogitsLossAndEveryGradientMatchDeepseekV3) {
  const auto& [fixture, flash] = GetParam();
  const nlohmann::json f = load_fixture(fixture);
  ArgParser parser("gale pretrain", "mla golden");
  Arguments args;
  add_all_pretrain_args(parser, args);
  std::vector<std::string> argv = {"gale"};
  for (const auto& a : f["megatron_args"]) argv.push_back(a.get<std::string>());
  argv.push_back("--mock-data");
  std::vector<char*> ptrs;
  for (auto& a : argv) ptrs.push_back(a.data());
  const Status parsed = parser.parse(static_cast<int>(ptrs.size()), ptrs.data());
  ASSERT_TRUE(parsed.ok()) << parsed.message();
  const Status valid = validate_all_pretrain_args(args, parser, 1);
  ASSERT_TRUE(valid.ok()) << valid.message();
  args.model.padded_vocab_size = f["padded_vocab_size"].get<int64_t>();
  const ModelConfig c = model_config_from_args(args);
  ASSERT_TRUE(c.mla.enabled);
  OpTable ops = reference_ops();
  if (flash) {
    ASSERT_TRUE(install_fused_kernel(ops, "attention", detected_isa()).ok());
  }
  GPTModel model(c, single_process_partition(c), &ops);
  ParamBuffer& pb = model.params();
  ASSERT_EQ(static_cast<size_t>(pb.size()), f["weights"].size()) << "Gale's parameters and the fixture's differ";
  for (const auto& [name, w] : f["weights"].items()) {
    const int id = pb.find(name);
    ASSERT_GE(id, 0) << name << " is not in Gale's model";
    ASSERT_EQ(pb.spec(id).global_shape, w["shape"].get<Shape>()) << name;
    const auto data = w["data"].get<std::vector<double>>();
    for (size_t i = 0; i < data.size(); ++i) pb.param_data(id)[i] = static_cast<float>(data[i]);
  }

  const auto tokens = f["tokens"].get<std::vector<std::vector<int32_t>>>();
  const auto labels = f["labels"].get<std::vector<std::vector<int32_t>>>();
  MicroBatch mb;
  mb.B = static_cast<int64_t>(tokens.size());
  mb.S = static_cast<int64_t>(tokens[0].size());
  for (int64_t b = 0; b < mb.B; ++b)
    for (int64_t s = 0; s < mb.S; ++s) {
      mb.tokens.push_back(tokens[b][s]);
      mb.labels.push_back(labels[b][s]);
      mb.loss_mask.push_back(1.0f);
      mb.position_ids.push_back(static_cast<int32_t>(s));
    }

  const Tensor logits = model.forward_logits(mb, Tensor());  // [B, S, V]
  EXPECT_LT(relative_error(logits.data<float>(), f["logits"]["data"].get<std::vector<double>>()), 1e-5);

  GPTModel::LossSums sums;
  model.forward(0, mb, Tensor(), /*training=*/true, &sums);
  pb.zero_grads();
  model.backward(0, Tensor(), static_cast<float>(1.0 / sums.tokens));
  EXPECT_NEAR(sums.loss_sum / sums.tokens, f["loss"].get<double>(), 1e-5 * f["loss"].get<double>());
  // f32 against float64: every gradient within 1e-4 of its tensor's largest entry.
  for (const auto& [name, g] : f["grads"].items()) {
    const int id = pb.find(name);
    EXPECT_LT(relative_error(pb.grad_data(id), g["data"].get<std::vector<double>>()), 1e-4) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MlaGolden,
                         ::testing::Combine(::testing::Values("mla_deepseek", "mla_deepseek_yarn"), ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) ? "_flash" : "_reference");
                         });

}  // namespace
}  // namespace gale
