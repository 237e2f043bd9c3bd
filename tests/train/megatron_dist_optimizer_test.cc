// Megatron's optimizer state read from torch_dist checkpoints: every layout against the values torch recorded.
//
// tests/data/megatron/torch_dist_adam (the non-distributed optimizer: FP32Optimizer over torch AdamW,
// f32 weights) and torch_dist_adam_dp2 (the same state as the distributed optimizer's
// fully_sharded_model_space pieces at TP 2 x DP 2, bf16 weights with fp32 master copies) come from
// tools/reference/megatron_torch_dist_optim_reference.py (Megatron core_v0.12.1's dist_checkpointing,
// 7 AdamW steps; torch_dist_adam_reshardable the fully_reshardable layout; torch_dist_adam_buckets the bucket-space
// dp_reshardable layout of core_v0.15.3 at DP 2, torch_dist_adam_buckets_tp2pp2 the same at TP 2 x PP 2 (each
// model-parallel rank's buffers of its pieces), torch_dist_adam_dp_zero its dp_zero_gather_scatter layout, _v012
// the same written by core_v0.12.1, _tp2pp2 by core_v0.15.3 at TP 2 x PP 2);
// torch_dist_optim.json holds torch's step, scheduler state and, per tensor, its sum
// and first values. Every layout must give those values, and exactly the same tensors as each other.
// torch_dist_lion (tools/reference/megatron_lion_reference.py): Megatron main's --optimizer lion state, the
// non-distributed ChainedOptimizer [Lion, AdamW], against torch_dist_lion.json.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "ckpt/dcp_reader.h"
#include "ckpt/torch_file.h"
#include "train/megatron_checkpoint.h"
#include "train/megatron_dist_optimizer.h"
#include "train/megatron_fixture.h"

namespace gale {
namespace {

using namespace megatron_fixture;

nlohmann::json reference() {
  std::ifstream in(fixture("torch_dist_optim.json"));
  return nlohmann::json::parse(in);
}

void expect_values(const Tensor& t, const nlohmann::json& want, const std::string& what) {
  ASSERT_EQ(t.dtype(), DType::kF32) << what;
  EXPECT_EQ(nlohmann::json(t.shape()), want["shape"]) << what;
  const float* p = t.data<float>();
  double sum = 0;
  for (int64_t i = 0; i < t.numel(); ++i) sum += p[i];
  EXPECT_NEAR(sum, want["sum"].get<double>(), 1e-9 * (1 + std::abs(sum))) << what;
  for (size_t i = 0; i < want["first"].size(); ++i)
    EXPECT_EQ(p[i], want["first"][i].get<float>()) << what << " [" << i << "]";
}

StatusOr<MegatronCheckpoint> read_with_optimizer(const std::string& dir) {
  return read_megatron_checkpoint(fixture(dir), kUnset, /*with_optimizer=*/true);
}

TEST(MegatronDistOptimizer, BothLayoutsGiveTorchsAdamState) {
  const nlohmann::json ref = reference();
  const nlohmann::json& tensors = ref["torch_dist_adam"]["tensors"];
  const std::map<std::string, std::string> layouts = {{"torch_dist_adam", "non-distributed"},
                                                      {"torch_dist_adam_dp2", "fully_sharded_model_space"},
                                                      {"torch_dist_adam_reshardable", "fully_reshardable"},
                                                      {"torch_dist_adam_buckets", "dp_reshardable"},
                                                      {"torch_dist_adam_dp_zero", "dp_zero_gather_scatter"},
                                                      {"torch_dist_adam_dp_zero_v012", "dp_zero_gather_scatter"},
                                                      {"torch_dist_adam_buckets_tp2pp2", "dp_reshardable"},
                                                      {"torch_dist_adam_dp_zero_tp2pp2", "dp_zero_gather_scatter"}};
  for (const auto& [dir, layout] : layouts) {
    SCOPED_TRACE(dir);
    auto m = read_with_optimizer(dir);
    ASSERT_TRUE(m.ok()) << m.status().message();
    ASSERT_TRUE(m->optimizer.has_value());
    const MegatronOptimizerState& o = *m->optimizer;
    EXPECT_EQ(o.layout, layout);
    EXPECT_EQ(o.type, "adam");
    EXPECT_EQ(o.step, 7);
    EXPECT_EQ(o.fp32_masters, dir != "torch_dist_adam");  // bf16 weights: the masters replace them
    EXPECT_EQ(o.scheduler, ref[dir]["opt_param_scheduler"]);
    EXPECT_TRUE(o.grad_scaler.is_null());
    ASSERT_EQ(o.tensors.size(), 2u);  // exp_avg, exp_avg_sq (fp32_param went into the weights)
    for (const char* state : {"exp_avg", "exp_avg_sq"}) {
      ASSERT_EQ(o.tensors.at(state).size(), tensors[state].size()) << state;
      for (const auto& [name, want] : tensors[state].items()) {
        auto t = o.tensors.at(state).find(name);
        ASSERT_NE(t, o.tensors.at(state).end()) << state << " " << name;
        expect_values(t->second, want, str_cat(state, " ", name));
      }
    }
    for (const auto& [name, want] : tensors["fp32_param"].items()) {  // the weights Adam updates
      Tensor w = m->tensors.at(name);
      ASSERT_EQ(w.dtype(), DType::kF32) << name;
      expect_values(w, want, str_cat("weight ", name));
    }
  }
}

// Gale's DCP index of both fixtures is torch's: the flattened pieces' global shapes ([L, TP, 1, numel]
// for the stacked linear_qkv) and chunk counts included.
TEST(MegatronDistOptimizer, ListsWhatTorchReadsFromTheMetadata) {
  const nlohmann::json want = reference()["listing"];
  for (const char* dir :
       {"torch_dist_adam", "torch_dist_adam_dp2", "torch_dist_adam_reshardable", "torch_dist_adam_buckets",
        "torch_dist_adam_dp_zero", "torch_dist_adam_dp_zero_v012", "torch_dist_adam_buckets_tp2pp2",
        "torch_dist_adam_dp_zero_tp2pp2", "torch_dist_adam_buckets_tp2pp2_tied", "torch_dist_adam_dp_zero_tp2pp2_tied",
        "torch_dist_adam_buckets_pp2_uneven"}) {
    SCOPED_TRACE(dir);
    auto c = DcpCheckpoint::open(fixture(str_cat(dir, "/iter_0000007")));
    ASSERT_TRUE(c.ok()) << c.status().message();
    nlohmann::json got = nlohmann::json::object();
    for (const auto& [key, info] : c->tensors())
      got[key] = {
          {"kind", "tensor"}, {"shape", info.shape}, {"dtype", info.torch_dtype}, {"chunks", info.chunks.size()}};
    for (const auto& [key, chunk] : c->objects()) got[key] = {{"kind", "bytes"}};
    EXPECT_EQ(got, want[dir]);
  }
}

TEST(MegatronDistOptimizer, FlattenedPiecesReassembleAsTheModelTensor) {
  // global [4, 6] cut into 2 x 3 fragments of local shape [2, 2]: row f of the flattened form is the
  // block at (2 f0, 2 f1), row-major.
  Tensor flat = Tensor::empty({2, 3, 4}, DType::kF32);
  for (int64_t i = 0; i < flat.numel(); ++i) flat.data<float>()[i] = static_cast<float>(i);
  auto g = unflatten_model_space(flat, {4, 6}, "t");
  ASSERT_TRUE(g.ok()) << g.status().message();
  const float want[4][6] = {
      {0, 1, 4, 5, 8, 9}, {2, 3, 6, 7, 10, 11}, {12, 13, 16, 17, 20, 21}, {14, 15, 18, 19, 22, 23}};
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 6; ++c) EXPECT_EQ(g->data<float>()[r * 6 + c], want[r][c]) << r << "," << c;
  auto bad = unflatten_model_space(flat, {4, 5}, "optimizer tensor 'x'");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("optimizer tensor 'x': shape [2, 3, 4]: expected the model tensor's [4, 5] or "
                                        "its N-D flattened form"),
            std::string::npos)
      << bad.status().message();
}

// Megatron's SGD (the torch_dist_tp1 fixture: FP32Optimizer over torch SGD with momentum, saved without a
// scheduler): refused as Megatron's own load would fail on it; with a scheduler added, its momentum
// buffers read as tensors of the model keys' shapes.
TEST(MegatronDistOptimizer, SgdMomentum) {
  auto m = read_with_optimizer("torch_dist_tp1");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("common.pt: expected Megatron's 'opt_param_scheduler' state dict next to the "
                                      "optimizer state (Megatron's own load needs it too), found none; pass "
                                      "--no-load-optim (or --finetune)"),
            std::string::npos)
      << m.status().message();
  const std::string dir = fixture("torch_dist_tp1/iter_0000007");
  auto c = DcpCheckpoint::open(dir);
  auto common = read_torch_file(dir + "/common.pt");
  ASSERT_TRUE(c.ok() && common.ok());
  (*common)->set("opt_param_scheduler", PyValue::dict());
  auto o = read_megatron_dist_optimizer(*c, **common, nullptr, dir);
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->type, "sgd");  // the fixture's args record no optimizer: SGD's momentum says it
  EXPECT_EQ(o->step, 0);      // torch's SGD keeps none
  ASSERT_EQ(o->tensors.size(), 1u);
  for (const auto& [key, t] : o->tensors.at("momentum_buffer")) EXPECT_EQ(t.shape(), c->tensors().at(key).shape) << key;
  EXPECT_EQ(o->tensors.at("momentum_buffer").size(), 12u);  // Megatron's keys: stacked layers count once
}

// --fp16: the loss scaler's state next to the optimizer's (Megatron's DynamicGradScaler.state_dict: the
// scale a one-element tensor, the trackers ints).
TEST(MegatronDistOptimizer, GradScalerState) {
  const std::string dir = fixture("torch_dist_adam_dp2/iter_0000007");
  auto c = DcpCheckpoint::open(dir);
  auto common = read_torch_file(dir + "/common.pt");
  ASSERT_TRUE(c.ok() && common.ok());
  PyValue* opt = nullptr;
  for (auto& [k, v] : (*common)->entries)
    if (k->s == "optimizer") opt = v.get();
  ASSERT_NE(opt, nullptr);
  Tensor scale = Tensor::empty({1}, DType::kF32);
  scale.data<float>()[0] = 1024.0f;
  PyRef g = PyValue::dict();
  g->set("scale", PyValue::tensor(scale));
  g->set("growth_tracker", PyValue::integer(3));
  g->set("hysteresis_tracker", PyValue::integer(2));
  opt->set("grad_scaler", g);
  auto o = read_megatron_dist_optimizer(*c, **common, nullptr, dir);
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->grad_scaler, nlohmann::json({{"scale", 1024.0}, {"growth_tracker", 3}, {"hysteresis_tracker", 2}}));
}

// Megatron main's --optimizer lion without the distributed optimizer (tests/data/megatron/torch_dist_lion,
// tools/reference/megatron_lion_reference.py): a ChainedOptimizer [Lion, AdamW] whose common.pt 'optimizer' is
// {0: Lion's, 1: AdamW's} and whose tensors keep the plain names: Lion's exp_avg for the 2-D parameters but the
// embedding and output layer, AdamW's exp_avg and exp_avg_sq for the rest, AdamW's step 7; the values are the
// reference's. Saved by the distributed optimizer (chained_<i>. keys, a param_state_sharding_type) it is refused.
TEST(MegatronDistOptimizer, LionChainGivesTheReferencesState) {
  std::ifstream in(fixture("torch_dist_lion.json"));
  const nlohmann::json ref = nlohmann::json::parse(in);
  const std::string dir = fixture("torch_dist_lion/iter_0000007");
  auto c = DcpCheckpoint::open(dir);
  ASSERT_TRUE(c.ok()) << c.status().message();
  auto common = read_torch_file(dir + "/common.pt");
  ASSERT_TRUE(common.ok()) << common.status().message();
  auto o = read_megatron_dist_optimizer(*c, **common, (*common)->get("args"), dir);
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->type, "lion");
  EXPECT_EQ(o->layout, "non-distributed");
  EXPECT_EQ(o->step, ref["step"].get<int64_t>());
  EXPECT_EQ(o->scheduler.value("num_steps", 0), 14);
  ASSERT_EQ(o->tensors.size(), 2u);
  std::set<std::string> lion, adam, first, second;
  for (const auto& k : ref["lion"]) lion.insert(k.get<std::string>());
  for (const auto& k : ref["adam"]) adam.insert(k.get<std::string>());
  for (const auto& [key, t] : o->tensors.at("exp_avg")) first.insert(key);
  for (const auto& [key, t] : o->tensors.at("exp_avg_sq")) second.insert(key);
  EXPECT_EQ(second, adam);
  std::set<std::string> all = lion;
  all.insert(adam.begin(), adam.end());
  EXPECT_EQ(first, all);
  for (const auto& [state, by_key] : o->tensors)
    for (const auto& [key, t] : by_key) expect_values(t, ref["tensors"][str_cat("optimizer.state.", state, ".", key)], key);
  // The distributed optimizer's chained layouts.
  PyValue* opt = const_cast<PyValue*>((*common)->get("optimizer"));
  PyValue* sub = const_cast<PyValue*>(opt->entries[1].second.get());
  sub->set("param_state_sharding_type", PyValue::str("dp_reshardable"));
  o = read_megatron_dist_optimizer(*c, **common, (*common)->get("args"), "D");
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), StatusCode::kUnimplemented);
  EXPECT_EQ(o.status().message(),
            "D: Megatron's --optimizer lion state saved with a distributed optimizer (optimizer[1] has a "
            "param_state_sharding_type): not supported (Megatron main never saves Lion through its "
            "DistributedOptimizer: with --optimizer lion, --use-distributed-optimizer becomes the layer-wise "
            "distributed optimizer, whose state Gale does not read yet; Gale reads Lion's state of the "
            "non-distributed optimizer); pass --no-load-optim (or --finetune) to load the model weights and "
            "iteration only");
  // Without args.optimizer 'lion' the chain reads as Megatron's dense + expert chain, whose steps must agree: Lion
  // records none.
  sub->entries.pop_back();
  o = read_megatron_dist_optimizer(*c, **common, nullptr, "D");
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("D/common.pt: the chained optimizers record different steps (0 and 7)"),
            std::string::npos)
      << o.status().message();
}

// tests/data/megatron/moe/torch_dist_adam_chained (tools/reference/megatron_moe_chained_optim_reference.py): the MoE
// model after 7 AdamW steps, saved as Megatron main's ChainedOptimizer [dense, experts] of two distributed optimizers
// saves it in the fully_reshardable layout: common.pt's optimizer {0: ..., 1: ...}, the tensors under plain names.
// Every state of every parameter (the stacked global experts' included) must be torch's, from the right optimizer.
TEST(MegatronDistOptimizer, ChainedDenseAndExpertOptimizersGiveTorchsAdamState) {
  std::ifstream in(fixture("moe/torch_dist_adam_chained.json"));
  const nlohmann::json ref = nlohmann::json::parse(in);
  const std::string dir = fixture("moe/torch_dist_adam_chained/iter_0000007");
  auto c = DcpCheckpoint::open(dir);
  ASSERT_TRUE(c.ok()) << c.status().message();
  auto common = read_torch_file(dir + "/common.pt");
  ASSERT_TRUE(common.ok()) << common.status().message();
  auto o = read_megatron_dist_optimizer(*c, **common, (*common)->get("args"), dir);
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->type, "adam");
  EXPECT_EQ(o->layout, "fully_reshardable");
  EXPECT_EQ(o->step, 7);
  EXPECT_EQ(o->scheduler.value("num_steps", 0), 14);
  std::set<std::string> want, expert;
  for (const char* part : {"dense", "expert"})
    for (const auto& k : ref[part]) want.insert(k.get<std::string>());
  for (const auto& k : ref["expert"]) expert.insert(k.get<std::string>());
  EXPECT_EQ(expert.size(), 2u);  // the experts' fc1 and fc2: the second optimizer's parameters
  ASSERT_EQ(o->tensors.size(), 3u);
  int64_t checked = 0;
  for (const auto& [state, by_key] : o->tensors) {
    std::set<std::string> keys;
    for (const auto& [key, t] : by_key) {
      keys.insert(key);
      expect_values(t, ref["tensors"][str_cat("optimizer.state.", state == "fp32_param" ? "param" : state, ".", key)],
                    state + " " + key);
      ++checked;
    }
    EXPECT_EQ(keys, want) << state;
  }
  EXPECT_EQ(checked, 3 * static_cast<int64_t>(want.size()));
  // Through the checkpoint reader: per-expert Gale names, the masters as the weights.
  auto m = read_megatron_checkpoint(fixture("moe/torch_dist_adam_chained"), kUnset, /*with_optimizer=*/true);
  ASSERT_TRUE(m.ok()) << m.status().message();
  ASSERT_TRUE(m->optimizer.has_value());
  EXPECT_TRUE(m->optimizer->fp32_masters);
  const auto& exp_avg = m->optimizer->tensors.at("exp_avg");
  ASSERT_TRUE(exp_avg.count("decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.weight"));
  // Global expert 3 of layer 1: the stacked tensor's [1][3] block.
  const nlohmann::json& fc2 = ref["tensors"]["optimizer.state.exp_avg.decoder.layers.mlp.experts.experts.linear_fc2.weight"];
  const Tensor& e13 = exp_avg.at("decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.weight");
  auto whole = c->read_tensor("optimizer.state.exp_avg.decoder.layers.mlp.experts.experts.linear_fc2.weight");
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(nlohmann::json(whole->shape()), fc2["shape"]);
  ASSERT_EQ(e13.numel() * 8, whole->numel());
  EXPECT_EQ(std::memcmp(e13.data<float>(), whole->data<float>() + 7 * e13.numel(), e13.numel() * sizeof(float)), 0);
}

// The chained optimizers' layouts Gale does not read, and chains that disagree.
TEST(MegatronDistOptimizerErrors, ChainedOptimizersGaleCannotRead) {
  const std::string dir = fixture("moe/torch_dist_adam_chained/iter_0000007");
  auto c = DcpCheckpoint::open(dir);
  ASSERT_TRUE(c.ok()) << c.status().message();
  auto fresh = [&]() {
    auto common = read_torch_file(dir + "/common.pt");
    EXPECT_TRUE(common.ok());
    return *common;
  };
  auto sub = [](const PyRef& common, size_t i) {
    return const_cast<PyValue*>(common->get("optimizer")->entries[i].second.get());
  };
  const std::string out_way = "; pass --no-load-optim (or --finetune) to load the model weights and iteration only";
  {
    PyRef common = fresh();  // the bucket-space layouts name each optimizer's objects and buffers chained_<i>.
    for (size_t i : {0, 1}) sub(common, i)->set("param_state_sharding_type", PyValue::str("dp_reshardable"));
    auto o = read_megatron_dist_optimizer(*c, *common, common->get("args"), "D");
    ASSERT_FALSE(o.ok());
    EXPECT_EQ(o.status().code(), StatusCode::kDataLoss);
    EXPECT_EQ(o.status().message(),
              "D: Megatron's 'dp_reshardable' optimizer layout of a chained optimizer: expected the object "
              "'chained_0.optimizer.distributed.dp_group_idx_0.optimizer/shard_0_1' (the param groups and step), found "
              "none" + out_way);
    // Without args.num_experts (a chain other than Megatron's MoE one): refused.
    o = read_megatron_dist_optimizer(*c, *common, nullptr, "D");
    ASSERT_FALSE(o.ok());
    EXPECT_EQ(o.status().code(), StatusCode::kUnimplemented);
    EXPECT_EQ(o.status().message(),
              "D: the state of 2 chained optimizers in the distributed optimizer's 'dp_reshardable' layout (each "
              "optimizer's buffers under chained_<i>.optimizer.distributed.*) without args.num_experts: not supported "
              "yet (Gale reads the bucket-space layouts of Megatron's MoE chain [dense, experts] only)" + out_way);
  }
  {
    PyRef common = fresh();
    sub(common, 1)->set("param_state_sharding_type", PyValue::str("fully_sharded_model_space"));
    auto o = read_megatron_dist_optimizer(*c, *common, common->get("args"), "D");
    ASSERT_FALSE(o.ok());
    EXPECT_EQ(o.status().code(), StatusCode::kDataLoss);
    EXPECT_EQ(o.status().message(),
              "D/common.pt: the chained optimizers saved their state in different layouts ('fully_reshardable' and "
              "'fully_sharded_model_space'): expected one (Megatron passes one sharding type to all)" + out_way);
  }
  {
    PyRef common = fresh();  // the expert optimizer one step behind
    PyValue* groups = const_cast<PyValue*>(sub(common, 1)->get("optimizer")->get("param_groups"));
    groups->items[0]->set("step", PyValue::integer(6));
    auto o = read_megatron_dist_optimizer(*c, *common, common->get("args"), "D");
    ASSERT_FALSE(o.ok());
    EXPECT_EQ(o.status().code(), StatusCode::kUnimplemented);
    EXPECT_EQ(o.status().message(), "D/common.pt: the chained optimizers record different steps (6 and 7): not "
                                    "supported (Megatron synchronises them)" + out_way);
  }
  {
    PyRef common = fresh();
    common->get("optimizer");
    const_cast<PyValue*>(common->get("optimizer"))->entries[1].second = PyValue::list();
    auto o = read_megatron_dist_optimizer(*c, *common, common->get("args"), "D");
    ASSERT_FALSE(o.ok());
    EXPECT_EQ(o.status().code(), StatusCode::kDataLoss);
    EXPECT_EQ(o.status().message(), "D/common.pt (optimizer[1]): expected a chained optimizer's state dict, found list");
  }
}

TEST(MegatronDistOptimizerErrors, WhatIsNotReadIsNamedWithTheWayOut) {
  // A torch_dcp checkpoint without optimizer state (its state: megatron_dcp_optimizer_test.cc).
  auto m = read_with_optimizer("torch_dcp_tp1");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(m.status().message().find("holds no optimizer state (saved with --no-save-optim, or not by a training "
                                      "run): pass --no-load-optim (or --finetune)"),
            std::string::npos)
      << m.status().message();
  // A torch_dist checkpoint without optimizer state.
  m = read_with_optimizer("torch_dist_tp2pp2");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(m.status().message().find("holds no optimizer state (saved with --no-save-optim, or not by a training "
                                      "run): pass --no-load-optim (or --finetune)"),
            std::string::npos)
      << m.status().message();
  // The bucket-space layouts of the distributed optimizer, and several optimizers.
  auto c = DcpCheckpoint::open(fixture("torch_dist_adam_dp2/iter_0000007"));
  ASSERT_TRUE(c.ok());
  PyRef common = PyValue::dict(), opt = PyValue::dict();
  common->set("optimizer", opt);
  common->set("opt_param_scheduler", PyValue::dict());
  StatusOr<MegatronOptimizerState> o = Internal("unset");
  for (const char* older : {"fully_sharded_bucket_space"}) {
    opt->set("param_state_sharding_type", PyValue::str(older));
    o = read_megatron_dist_optimizer(*c, *common, nullptr, "D");
    ASSERT_FALSE(o.ok());
    EXPECT_EQ(o.status().code(), StatusCode::kUnimplemented);
    EXPECT_NE(o.status().message().find(str_cat("D: Megatron's distributed optimizer state in the '", older,
                                                "' layout: not supported yet (Gale reads fully_sharded_model_space, "
                                                "fully_reshardable, dp_reshardable and dp_zero_gather_scatter)")),
              std::string::npos)
        << o.status().message();
    EXPECT_NE(o.status().message().find("pass --no-load-optim (or --finetune)"), std::string::npos);
  }
  PyRef chained = PyValue::dict(), sub = PyValue::dict();  // a chained optimizer in a layout Gale does not read
  sub->set("param_state_sharding_type", PyValue::str("fully_sharded_bucket_space"));
  chained->entries.emplace_back(PyValue::integer(0), sub);
  common->set("optimizer", chained);
  o = read_megatron_dist_optimizer(*c, *common, nullptr, "D");
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(o.status().message().find("D: Megatron's distributed optimizer state in the 'fully_sharded_bucket_space' "
                                      "layout: not supported yet"),
            std::string::npos)
      << o.status().message();
  // Steps that differ between param groups.
  PyRef inner = PyValue::dict(), groups = PyValue::list();
  for (int64_t step : {7, 6}) {
    PyRef g = PyValue::dict();
    g->set("step", PyValue::integer(step));
    groups->items.push_back(g);
  }
  inner->set("param_groups", groups);
  opt = PyValue::dict();
  opt->set("optimizer", inner);
  opt->set("param_state_sharding_type", PyValue::str("fully_sharded_model_space"));
  common->set("optimizer", opt);
  o = read_megatron_dist_optimizer(*c, *common, nullptr, "D");
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("record different steps (6 and 7)"), std::string::npos) << o.status().message();
}

}  // namespace
}  // namespace gale
