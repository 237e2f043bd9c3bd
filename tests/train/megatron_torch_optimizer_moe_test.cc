// Megatron's legacy torch-format optimizer state of a MoE model at EP 1 and EP 2: the chained torch_dist state, element
// for element.
//
// tests/data/megatron/moe/torch_adam_{ep1,ep2,distopt_ep1,distopt_ep2,tp2ep2,distopt_tp2ep2,pp2ep2,distopt_pp2ep2} come from
// tools/reference/megatron_torch_moe_optim_reference.py: moe/torch_dist_adam_chained's AdamW state (its masters and
// moments) written by Megatron core_v0.12.1's own optimizer classes as a --bf16 run saves it in the torch format: at
// EP 1 one optimizer over every parameter, at EP 2 (and TP 2 x EP 2, the TP pieces cut as Megatron's layers split them;
// PP 2 x EP 2, a layer per stage, mp_rank_TT_PPP_EEE)
// ChainedOptimizer's [dense, expert] list in each expert rank's file (and in distrib_optim.pt). Every state tensor and master must equal what Gale reads from torch_dist_adam_chained (an
// independent reader); a swapped pair of experts is caught by the masters' check; what is not read is refused.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>

#include "ckpt/torch_file.h"
#include "train/megatron_checkpoint.h"
#include "train/megatron_fixture.h"

namespace gale {
namespace {

using namespace megatron_fixture;
namespace fs = std::filesystem;

std::string moe(const std::string& name) { return fixture("moe/" + name); }

StatusOr<MegatronCheckpoint> read_with_optimizer(const std::string& dir) {
  return read_megatron_checkpoint(dir, kUnset, /*with_optimizer=*/true);
}

// The number of elements where `a` differs from `b` (-1 when dtype or shape differ).
int64_t differing(const Tensor& a, const Tensor& b) {
  if (a.dtype() != DType::kF32 || b.dtype() != DType::kF32 || a.shape() != b.shape()) return -1;
  int64_t differ = 0;
  for (int64_t i = 0; i < a.numel(); ++i) differ += a.data<float>()[i] != b.data<float>()[i];
  return differ;
}

TEST(MegatronTorchOptimizerMoe, EveryLayoutGivesTheChainedState) {
  auto base = read_with_optimizer(moe("torch_dist_adam_chained"));
  ASSERT_TRUE(base.ok()) << base.status().message();
  ASSERT_TRUE(base->optimizer.has_value());
  const std::pair<const char*, const char*> fixtures[] = {{"torch_adam_ep1", "non-distributed"},
                                                          {"torch_adam_ep2", "non-distributed"},
                                                          {"torch_adam_distopt_ep1", "dp_zero_gather_scatter"},
                                                          {"torch_adam_distopt_ep2", "dp_zero_gather_scatter"},
                                                          {"torch_adam_tp2ep2", "non-distributed"},
                                                          {"torch_adam_distopt_tp2ep2", "dp_zero_gather_scatter"},
                                                          {"torch_adam_pp2ep2", "non-distributed"},
                                                          {"torch_adam_distopt_pp2ep2", "dp_zero_gather_scatter"}};
  for (const auto& [name, layout] : fixtures) {
    SCOPED_TRACE(name);
    auto m = read_with_optimizer(moe(name));
    ASSERT_TRUE(m.ok()) << m.status().message();
    ASSERT_TRUE(m->optimizer.has_value());
    const MegatronOptimizerState& o = *m->optimizer;
    EXPECT_EQ(o.layout, layout);
    EXPECT_EQ(o.type, "adam");
    EXPECT_EQ(o.step, 7);
    EXPECT_TRUE(o.fp32_masters);
    EXPECT_EQ(o.scheduler, base->optimizer->scheduler);
    for (const char* state : {"exp_avg", "exp_avg_sq"}) {
      const auto& want = base->optimizer->tensors.at(state);
      ASSERT_EQ(o.tensors.at(state).size(), want.size()) << state;
      int experts = 0;
      for (const auto& [key, w] : want) {
        auto it = o.tensors.at(state).find(key);
        ASSERT_NE(it, o.tensors.at(state).end()) << state << " " << key;
        EXPECT_EQ(differing(it->second, w), 0) << state << " " << key;
        experts += key.find(".mlp.experts.local_experts.") != std::string::npos;
      }
      EXPECT_EQ(experts, 2 * 4 * 2) << state;  // 2 layers x 4 experts x fc1, fc2
    }
    // The masters, loaded as the weights (the router's expert_bias, a buffer, as saved).
    ASSERT_EQ(m->tensors.size(), base->tensors.size());
    for (const auto& [key, w] : base->tensors) {
      ASSERT_TRUE(m->tensors.count(key)) << key;
      EXPECT_EQ(differing(m->tensors.at(key), w), 0) << key;
    }
  }
}

// A copy of fixture `name` with `edit` applied to the root of rank file `rank` (or to its distrib_optim.pt).
std::string edited(TempDir& tmp, const std::string& name, const std::string& rank, const std::string& file,
                   const std::function<void(PyValue&)>& edit) {
  static int copies = 0;
  const std::string dir = tmp.file(name + "_" + rank + "_" + std::to_string(copies++));
  fs::copy(moe(name), dir, fs::copy_options::recursive);
  const std::string path = dir + "/iter_0000007/" + rank + "/" + file;
  auto root = read_torch_file(path);
  EXPECT_TRUE(root.ok()) << root.status().message();
  edit(**root);
  EXPECT_TRUE(write_torch_file(path, **root).ok());
  return dir;
}

PyValue* entry(PyValue& d, const std::string& key) {
  for (auto& [k, v] : d.entries)
    if (k->kind == PyValue::kString && k->s == key) return v.get();
  return nullptr;
}

// Two local experts of expert rank 1 swapped in its model (weights and names no longer those its expert optimizer's
// state was saved for): the masters' check names the file.
TEST(MegatronTorchOptimizerMoeErrors, SwappedExpertsAreCaught) {
  TempDir tmp;
  for (const char* name : {"torch_adam_ep2", "torch_adam_distopt_ep2"}) {
    const std::string dir = edited(tmp, name, "mp_rank_00_001", "model_optim_rng.pt", [](PyValue& root) {
      PyValue* model = entry(root, "model");
      ASSERT_NE(model, nullptr);
      PyValue* a = entry(*model, "decoder.layers.1.mlp.experts.local_experts.0.linear_fc1.weight");
      PyValue* b = entry(*model, "decoder.layers.1.mlp.experts.local_experts.1.linear_fc1.weight");
      ASSERT_TRUE(a && b);
      std::swap(a->data, b->data);
    });
    auto m = read_with_optimizer(dir);
    ASSERT_FALSE(m.ok()) << name;
    EXPECT_EQ(m.status().code(), StatusCode::kDataLoss) << m.status().message();
    EXPECT_NE(m.status().message().find("mp_rank_00_001/model_optim_rng.pt: the fp32 master copies Gale places at "
                                        "'decoder.layers.1.mlp.experts.local_experts.0.linear_fc1.weight' are not its "
                                        "saved weights"),
              std::string::npos)
        << m.status().message();
  }
}

TEST(MegatronTorchOptimizerMoeErrors, WhatIsNotReadIsNamed) {
  TempDir tmp;
  // EP 2 files whose 'optimizer' is one optimizer's dict (not ChainedOptimizer's list).
  auto m = read_with_optimizer(edited(tmp, "torch_adam_ep2", "mp_rank_00_000", "model_optim_rng.pt", [](PyValue& root) {
    for (auto& [k, v] : root.entries)
      if (k->kind == PyValue::kString && k->s == "optimizer") v = v->items[0];
  }));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kDataLoss) << m.status().message();
  EXPECT_NE(m.status().message().find("'optimizer' is one optimizer's state dict: expected Megatron's "
                                      "ChainedOptimizer list [dense, expert] of a run with 2 expert-parallel ranks"),
            std::string::npos)
      << m.status().message();
  // distrib_optim.pt of expert rank 0 without the dense optimizer's state.
  m = read_with_optimizer(edited(tmp, "torch_adam_distopt_ep2", "mp_rank_00_000", "distrib_optim.pt", [](PyValue& root) {
    root.items[0] = PyValue::none();
  }));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kDataLoss) << m.status().message();
  EXPECT_NE(m.status().message().find("distrib_optim.pt: holds no parameter state of the dense optimizer"),
            std::string::npos)
      << m.status().message();
  // The expert optimizer's param groups not marked is_expert_parallel.
  m = read_with_optimizer(edited(tmp, "torch_adam_ep2", "mp_rank_00_001", "model_optim_rng.pt", [](PyValue& root) {
    PyValue* opt = entry(root, "optimizer");
    PyValue* groups = entry(*entry(*opt->items[1], "optimizer"), "param_groups");
    groups->items[0]->set("is_expert_parallel", PyValue::boolean(false));
  }));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kDataLoss) << m.status().message();
  EXPECT_NE(m.status().message().find("param group 0 of the expert optimizer (the second of Megatron's "
                                      "ChainedOptimizer) is not marked is_expert_parallel"),
            std::string::npos)
      << m.status().message();
  // Expert TP 2 recorded with TP 1 (experts not split as the dense layers): refused.
  m = read_with_optimizer(edited(tmp, "torch_adam_ep2", "mp_rank_00_000", "model_optim_rng.pt", [](PyValue& root) {
    for (auto& [k, v] : root.entries)
      if (k->kind == PyValue::kString && k->s == "args") v->state->set("expert_tensor_parallel_size", PyValue::integer(2));
  }));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kUnimplemented) << m.status().message();
  EXPECT_NE(m.status().message().find("optimizer state of a MoE model in the torch format saved at TP 1 with expert "
                                      "TP 2: not supported yet"),
            std::string::npos)
      << m.status().message();
  EXPECT_NE(m.status().message().find("pass --no-load-optim (or --finetune)"), std::string::npos)
      << m.status().message();
  // Tied embeddings at PP 2 (args without untie_embeddings_and_output_weights on the PP 2 x EP 2 files).
  m = read_with_optimizer(edited(tmp, "torch_adam_pp2ep2", "mp_rank_00_000_000", "model_optim_rng.pt", [](PyValue& root) {
    for (auto& [k, v] : root.entries)
      if (k->kind == PyValue::kString && k->s == "args")
        v->state->set("untie_embeddings_and_output_weights", PyValue::boolean(false));
  }));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("optimizer state of a MoE model with tied embeddings at PP 2 in the torch "
                                      "format: not supported yet"),
            std::string::npos)
      << m.status().message();
  // torch_dcp (moe/torch_dcp): a MoE model's optimizer state is read from the legacy format's rank files only.
  m = read_with_optimizer(moe("torch_dcp"));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kUnimplemented) << m.status().message();
  EXPECT_NE(m.status().message().find("optimizer state of a MoE model (args.num_experts 4) in this format: not "
                                      "supported yet"),
            std::string::npos)
      << m.status().message();
}

}  // namespace
}  // namespace gale
