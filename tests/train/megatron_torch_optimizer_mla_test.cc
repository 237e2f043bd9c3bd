// Megatron's legacy torch-format optimizer state of a multi-latent-attention model: the reference's AdamW state.
//
// tests/data/megatron/torch_adam_mla comes from tools/reference/megatron_torch_mla_optim_reference.py: Megatron
// core_v0.12.1's MLA GPTModel (q LoRA, q/kv layernorms, RMSNorm) after 7 torch AdamW steps, saved as a --bf16 run
// saves it at TP 1 (Float16OptimizerWithFloat16Params.state_dict(), param groups from core_v0.12.1's _get_param_groups);
// torch_adam_mla.json holds, per Megatron name, each state's shape, sum and first values. Every one must be found in
// Gale's state (under Gale's MLA names), the masters must be the weights, and TP > 1 is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ckpt/torch_file.h"
#include "train/megatron_checkpoint.h"
#include "train/megatron_fixture.h"

namespace gale {
namespace {

using namespace megatron_fixture;

bool matches(const Tensor& t, const nlohmann::json& want) {
  if (t.dtype() != DType::kF32 || t.numel() == 0) return false;
  const float* p = t.data<float>();
  double sum = 0;
  for (int64_t i = 0; i < t.numel(); ++i) sum += p[i];
  int64_t numel = 1;
  for (const auto& d : want["shape"]) numel *= d.get<int64_t>();
  if (numel != t.numel() || std::abs(sum - want["sum"].get<double>()) > 1e-6 * (1 + std::abs(sum))) return false;
  for (size_t i = 0; i < want["first"].size(); ++i)
    if (p[i] != want["first"][i].get<float>()) return false;
  return true;
}

TEST(MegatronTorchOptimizerMla, GivesTheReferencesAdamState) {
  std::ifstream in(fixture("torch_adam_mla.json"));
  const nlohmann::json ref = nlohmann::json::parse(in);
  auto m = read_megatron_checkpoint(fixture("torch_adam_mla"), kUnset, /*with_optimizer=*/true);
  ASSERT_TRUE(m.ok()) << m.status().message();
  ASSERT_TRUE(m->optimizer.has_value());
  const MegatronOptimizerState& o = *m->optimizer;
  EXPECT_EQ(o.layout, "non-distributed");
  EXPECT_EQ(o.type, "adam");
  EXPECT_EQ(o.step, 7);
  EXPECT_TRUE(o.fp32_masters);
  EXPECT_EQ(o.scheduler, ref["opt_param_scheduler"]);
  ASSERT_EQ(o.tensors.size(), 2u);
  for (const char* state : {"exp_avg", "exp_avg_sq"}) {
    ASSERT_EQ(o.tensors.at(state).size(), ref["tensors"].size()) << state;
    for (const auto& [name, want] : ref["tensors"].items()) {
      int found = 0;
      for (const auto& [gale_name, t] : o.tensors.at(state)) found += matches(t, want[state]);
      EXPECT_EQ(found, 1) << state << " of " << name;
    }
  }
  ASSERT_EQ(m->tensors.size(), ref["tensors"].size());
  for (const auto& [name, want] : ref["tensors"].items()) {  // the masters, loaded as the weights
    int found = 0;
    for (const auto& [gale_name, t] : m->tensors) found += matches(t, want["fp32_param"]);
    EXPECT_EQ(found, 1) << "master of " << name;
  }
  // Each state sits at its parameter: the same shape as the weight of that name.
  for (const auto& [name, t] : o.tensors.at("exp_avg")) EXPECT_EQ(t.shape(), m->tensors.at(name).shape()) << name;
}

TEST(MegatronTorchOptimizerMlaErrors, TensorParallelIsRefused) {
  auto m = read_megatron_checkpoint(fixture("mla_qlora/tp2"), kUnset, /*with_optimizer=*/true);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kUnimplemented) << m.status().message();
  EXPECT_NE(m.status().message().find("multi-latent-attention model in the torch format saved at TP 2: not supported "
                                      "yet"),
            std::string::npos)
      << m.status().message();
  EXPECT_NE(m.status().message().find("pass --no-load-optim (or --finetune)"), std::string::npos)
      << m.status().message();
}

TEST(MegatronTorchOptimizerMlaErrors, DistributedOptimizerIsRefused) {
  TempDir tmp;
  const std::string dir = tmp.file("mla");
  std::filesystem::copy(fixture("torch_adam_mla"), dir, std::filesystem::copy_options::recursive);
  const std::string file = dir + "/iter_0000007/mp_rank_00/model_optim_rng.pt";
  auto root = read_torch_file(file);
  ASSERT_TRUE(root.ok()) << root.status().message();
  for (auto& [k, v] : (*root)->entries)
    if (k->kind == PyValue::kString && k->s == "args") v->state->set("use_distributed_optimizer", PyValue::boolean(true));
  ASSERT_TRUE(write_torch_file(file, **root).ok());
  auto m = read_megatron_checkpoint(dir, kUnset, /*with_optimizer=*/true);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kUnimplemented) << m.status().message();
  EXPECT_NE(m.status().message().find("saved at TP 1 with the distributed optimizer: not supported yet"),
            std::string::npos)
      << m.status().message();
}

}  // namespace
}  // namespace gale
