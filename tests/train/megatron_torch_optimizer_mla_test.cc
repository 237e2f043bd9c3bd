// Megatron's legacy torch-format optimizer state of a multi-latent-attention model: the reference's AdamW state.
//
// tests/data/megatron/torch_adam_mla comes from tools/reference/megatron_torch_mla_optim_reference.py: Megatron
// core_v0.12.1's MLA GPTModel (q LoRA, q/kv layernorms, RMSNorm) after 7 torch AdamW steps, saved as a --bf16 run
// saves it at TP 1 (Float16OptimizerWithFloat16Params.state_dict(), param groups from core_v0.12.1's _get_param_groups);
// torch_adam_mla.json holds, per Megatron name, each state's shape, sum and first values. Every one must be found in
// Gale's state (under Gale's MLA names) and the masters must be the weights; the same state saved at TP 2 and with the
// distributed optimizer (megatron_torch_mla_tp_optim_reference.py) reads to it element for element.
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

// The number of elements where `a` differs from `b` (-1 when dtype or shape differ).
int64_t differing(const Tensor& a, const Tensor& b) {
  if (a.dtype() != DType::kF32 || b.dtype() != DType::kF32 || a.shape() != b.shape()) return -1;
  int64_t differ = 0;
  for (int64_t i = 0; i < a.numel(); ++i) differ += a.data<float>()[i] != b.data<float>()[i];
  return differ;
}

// torch_adam_mla's state saved at TP 2 (Float16OptimizerWithFloat16Params per rank), with the distributed optimizer at
// DP 2 and at TP 2 (tools/reference/megatron_torch_mla_tp_optim_reference.py: core_v0.12.1's optimizer classes over the
// TP pieces of Megatron's local MLA spec): each reads to torch_adam_mla's state and masters element for element.
TEST(MegatronTorchOptimizerMla, TensorParallelAndDistributedGiveTheSameState) {
  auto base = read_megatron_checkpoint(fixture("torch_adam_mla"), kUnset, /*with_optimizer=*/true);
  ASSERT_TRUE(base.ok()) << base.status().message();
  const std::pair<const char*, const char*> fixtures[] = {{"torch_adam_mla_tp2", "non-distributed"},
                                                          {"torch_adam_mla_distopt", "dp_zero_gather_scatter"},
                                                          {"torch_adam_mla_distopt_tp2", "dp_zero_gather_scatter"}};
  for (const auto& [name, layout] : fixtures) {
    SCOPED_TRACE(name);
    auto m = read_megatron_checkpoint(fixture(name), kUnset, /*with_optimizer=*/true);
    ASSERT_TRUE(m.ok()) << m.status().message();
    ASSERT_TRUE(m->optimizer.has_value());
    EXPECT_EQ(m->optimizer->layout, layout);
    EXPECT_EQ(m->optimizer->step, 7);
    EXPECT_EQ(m->optimizer->scheduler, base->optimizer->scheduler);
    for (const char* state : {"exp_avg", "exp_avg_sq"}) {
      const auto& want = base->optimizer->tensors.at(state);
      ASSERT_EQ(m->optimizer->tensors.at(state).size(), want.size()) << state;
      for (const auto& [key, w] : want) {
        auto it = m->optimizer->tensors.at(state).find(key);
        ASSERT_NE(it, m->optimizer->tensors.at(state).end()) << state << " " << key;
        EXPECT_EQ(differing(it->second, w), 0) << state << " " << key;
      }
    }
    ASSERT_EQ(m->tensors.size(), base->tensors.size());
    for (const auto& [key, w] : base->tensors) EXPECT_EQ(differing(m->tensors.at(key), w), 0) << key;
  }
}

// Two equally shaped pieces of TP rank 1 swapped in its model (layer 0's q and kv down projections): the masters' check
// names the file, for the non-distributed and the distributed optimizer.
TEST(MegatronTorchOptimizerMlaErrors, SwappedPiecesAreCaught) {
  TempDir tmp;
  for (const char* name : {"torch_adam_mla_tp2", "torch_adam_mla_distopt_tp2"}) {
    const std::string dir = tmp.file(name);
    std::filesystem::copy(fixture(name), dir, std::filesystem::copy_options::recursive);
    const std::string file = dir + "/iter_0000007/mp_rank_01/model_optim_rng.pt";
    auto root = read_torch_file(file);
    ASSERT_TRUE(root.ok()) << root.status().message();
    PyValue* a = nullptr;
    PyValue* b = nullptr;
    for (auto& [k, v] : (*root)->entries)
      if (k->kind == PyValue::kString && k->s == "model")
        for (auto& [n, x] : v->entries) {
          if (n->s == "decoder.layers.0.self_attention.linear_q_down_proj.weight") a = x.get();
          if (n->s == "decoder.layers.0.self_attention.linear_kv_down_proj.weight") b = x.get();
        }
    ASSERT_TRUE(a && b);
    std::swap(a->data, b->data);
    ASSERT_TRUE(write_torch_file(file, **root).ok());
    auto m = read_megatron_checkpoint(dir, kUnset, /*with_optimizer=*/true);
    ASSERT_FALSE(m.ok()) << name;
    EXPECT_EQ(m.status().code(), StatusCode::kDataLoss) << m.status().message();
    EXPECT_NE(m.status().message().find("mp_rank_01/model_optim_rng.pt: the fp32 master copies Gale places at "
                                        "'decoder.layers.0.self_attention.linear_"),
              std::string::npos)
        << m.status().message();
  }
}

// Args that record the distributed optimizer without its distrib_optim.pt: the missing file is named.
TEST(MegatronTorchOptimizerMlaErrors, MissingDistributedOptimizerFileIsNamed) {
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
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound) << m.status().message();
  EXPECT_NE(m.status().message().find("distrib_optim.pt: Megatron's args record use_distributed_optimizer"),
            std::string::npos)
      << m.status().message();
}

}  // namespace
}  // namespace gale
