// Megatron's optimizer state read from legacy torch-format checkpoints: every layout gives the same state as torch.
//
// tests/data/megatron/torch_adam* come from tools/reference/megatron_torch_optim_reference.py (Megatron
// core_v0.12.1's own optimizer classes, 7 AdamW steps): torch_adam the FP32Optimizer's state dict (f32 weights, TP 1),
// torch_adam_bf16_tp2pp2 the Float16OptimizerWithFloat16Params's of each rank at TP 2 x PP 2 (bf16 weights, fp32
// masters; the second stage's param groups in core_v0.12's order, the no-weight-decay group first),
// torch_adam_distopt / _tp2pp2 the distributed optimizer's DistributedOptimizer.state_dict() and distrib_optim.pt
// (get_parameter_state_dp_zero over Megatron's own _ParamAndGradBuffer, five buckets at DP 2; TP 2 x PP 2).
// torch_optim.json holds torch's step, scheduler state and, per tensor, its sum and first values. torch_adam must give
// those values; every other fixture exactly torch_adam's tensors (the bf16 ones' masters as the weights).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ckpt/torch_file.h"
#include "train/megatron_checkpoint.h"
#include "train/megatron_fixture.h"

namespace gale {
namespace {

using namespace megatron_fixture;
namespace fs = std::filesystem;

nlohmann::json reference() {
  std::ifstream in(fixture("torch_optim.json"));
  return nlohmann::json::parse(in);
}

StatusOr<MegatronCheckpoint> read_with_optimizer(const std::string& dir) {
  return read_megatron_checkpoint(dir, kUnset, /*with_optimizer=*/true);
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

void expect_same(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.dtype(), DType::kF32) << what;
  ASSERT_EQ(b.dtype(), DType::kF32) << what;
  ASSERT_EQ(a.shape(), b.shape()) << what;
  int64_t differ = 0;
  for (int64_t i = 0; i < a.numel(); ++i) differ += a.data<float>()[i] != b.data<float>()[i];
  EXPECT_EQ(differ, 0) << what;
}

TEST(MegatronTorchOptimizer, NonDistributedGivesTorchsAdamState) {
  const nlohmann::json ref = reference();
  auto m = read_with_optimizer(fixture("torch_adam"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  ASSERT_TRUE(m->optimizer.has_value());
  const MegatronOptimizerState& o = *m->optimizer;
  EXPECT_EQ(o.layout, "non-distributed");
  EXPECT_EQ(o.type, "adam");
  EXPECT_EQ(o.step, 7);
  EXPECT_FALSE(o.fp32_masters);
  EXPECT_EQ(o.scheduler, ref["opt_param_scheduler"]);
  EXPECT_TRUE(o.grad_scaler.is_null());
  ASSERT_EQ(o.tensors.size(), 2u);
  for (const char* state : {"exp_avg", "exp_avg_sq"}) {
    ASSERT_EQ(o.tensors.at(state).size(), ref["tensors"][state].size()) << state;
    for (const auto& [name, want] : ref["tensors"][state].items()) {
      auto t = o.tensors.at(state).find(name);
      ASSERT_NE(t, o.tensors.at(state).end()) << state << " " << name;
      expect_values(t->second, want, str_cat(state, " ", name));
    }
  }
  for (const auto& [name, want] : ref["tensors"]["fp32_param"].items())
    expect_values(m->tensors.at(name), want, "weight " + name);
}

// The same state from Float16OptimizerWithFloat16Params at TP 2 x PP 2 and from the distributed optimizer's
// distrib_optim.pt (DP 2; TP 2 x PP 2): element for element torch_adam's, the masters as the weights.
TEST(MegatronTorchOptimizer, EveryLayoutGivesTheSameState) {
  auto base = read_with_optimizer(fixture("torch_adam"));
  ASSERT_TRUE(base.ok()) << base.status().message();
  const std::pair<const char*, const char*> cases[] = {{"torch_adam_bf16_tp2pp2", "non-distributed"},
                                                       {"torch_adam_distopt", "dp_zero_gather_scatter"},
                                                       {"torch_adam_distopt_tp2pp2", "dp_zero_gather_scatter"}};
  for (const auto& [dir, layout] : cases) {
    SCOPED_TRACE(dir);
    auto m = read_with_optimizer(fixture(dir));
    ASSERT_TRUE(m.ok()) << m.status().message();
    ASSERT_TRUE(m->optimizer.has_value());
    const MegatronOptimizerState& o = *m->optimizer;
    EXPECT_EQ(o.layout, layout);
    EXPECT_EQ(o.type, "adam");
    EXPECT_EQ(o.step, 7);
    EXPECT_TRUE(o.fp32_masters);
    EXPECT_EQ(o.scheduler, base->optimizer->scheduler);
    ASSERT_EQ(o.tensors.size(), 2u);
    for (const char* state : {"exp_avg", "exp_avg_sq"}) {
      ASSERT_EQ(o.tensors.at(state).size(), base->optimizer->tensors.at(state).size()) << state;
      for (const auto& [name, want] : base->optimizer->tensors.at(state))
        expect_same(o.tensors.at(state).at(name), want, str_cat(state, " ", name));
    }
    ASSERT_EQ(m->tensors.size(), base->tensors.size());
    for (const auto& [name, want] : base->tensors) expect_same(m->tensors.at(name), want, "weight " + name);
  }
}

// Tied embeddings at PP 2 (torch_adam_{bf16,distopt}_tp2pp2_tied: the last stage's output_layer.weight copy holds the
// embedding's state, in the distributed optimizer's buffer a bucket of its own): the embedding's state and every
// other tensor's are torch_adam's; no output layer; a copy whose state differs from the embedding's is refused.
TEST(MegatronTorchOptimizer, TiedEmbeddingsAtPp2) {
  auto base = read_with_optimizer(fixture("torch_adam"));
  ASSERT_TRUE(base.ok()) << base.status().message();
  const std::pair<const char*, const char*> cases[] = {{"torch_adam_bf16_tp2pp2_tied", "non-distributed"},
                                                       {"torch_adam_distopt_tp2pp2_tied", "dp_zero_gather_scatter"}};
  for (const auto& [dir, layout] : cases) {
    SCOPED_TRACE(dir);
    auto m = read_with_optimizer(fixture(dir));
    ASSERT_TRUE(m.ok()) << m.status().message();
    const MegatronOptimizerState& o = *m->optimizer;
    EXPECT_EQ(o.layout, layout);
    EXPECT_EQ(o.step, 7);
    for (const char* state : {"exp_avg", "exp_avg_sq"}) {
      EXPECT_EQ(o.tensors.at(state).count("output_layer.weight"), 0u);
      EXPECT_EQ(o.tensors.at(state).size() + 1, base->optimizer->tensors.at(state).size()) << state;
      for (const auto& [name, t] : o.tensors.at(state))
        expect_same(t, base->optimizer->tensors.at(state).at(name), str_cat(state, " ", name));
    }
    EXPECT_EQ(m->tensors.count("output_layer.weight"), 0u);
    for (const auto& [name, t] : m->tensors) expect_same(t, base->tensors.at(name), "weight " + name);
  }
  TempDir tmp;
  const std::string dir = tmp.file("tied");
  fs::copy(fixture("torch_adam_bf16_tp2pp2_tied"), dir, fs::copy_options::recursive);
  const std::string file = dir + "/iter_0000007/mp_rank_00_001/model_optim_rng.pt";
  auto root = read_torch_file(file);
  ASSERT_TRUE(root.ok());
  // The last stage's param groups (core_v0.12's order: the norms' group first, the output layer copy last of the
  // other): its exp_avg scaled.
  const PyValue* inner = (*root)->get("optimizer")->get("optimizer");
  const PyValue* groups = inner->get("param_groups");
  const int64_t last = groups->items[1]->get("params")->items.back()->i;
  for (const auto& [k, v] : inner->get("state")->entries)
    if (k->i == last) {
      Tensor t = v->get("exp_avg")->data;
      t.data<float>()[0] *= 2;
    }
  ASSERT_TRUE(write_torch_file(file, **root).ok());
  auto m = read_with_optimizer(dir);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(m.status().message().find("copy of the tied word embedding (its output_layer.weight) holds another "
                                      "'exp_avg' state than the first stage's embedding"),
            std::string::npos)
      << m.status().message();
}

// A copy of fixture `name` in `tmp` whose rank file `rank` (and its distrib_optim.pt) `edit` changes.
std::string edited_copy(const TempDir& tmp, const std::string& name, const std::string& rank,
                        const std::function<void(PyValue& root, PyValue* distrib)>& edit) {
  const std::string dir = tmp.file(name);
  fs::copy(fixture(name), dir, fs::copy_options::recursive);
  const std::string file = dir + "/iter_0000007/" + rank + "/model_optim_rng.pt";
  const std::string distrib = dir + "/iter_0000007/" + rank + "/distrib_optim.pt";
  auto root = read_torch_file(file);
  EXPECT_TRUE(root.ok()) << root.status().message();
  PyRef d;
  if (fs::exists(distrib)) {
    auto r = read_torch_file(distrib);
    EXPECT_TRUE(r.ok()) << r.status().message();
    d = *r;
  }
  edit(**root, d.get());
  EXPECT_TRUE(write_torch_file(file, **root).ok());
  if (d) EXPECT_TRUE(write_torch_file(distrib, *d).ok());
  return dir;
}

PyValue& mutable_get(PyValue& d, const std::string& key) {
  for (auto& [k, v] : d.entries)
    if (k->kind == PyValue::kString && k->s == key) return *v;
  ADD_FAILURE() << "no key " << key;
  return d;
}

void expect_refused(const std::string& dir, StatusCode code, const std::string& text) {
  auto m = read_with_optimizer(dir);
  ASSERT_FALSE(m.ok()) << dir;
  EXPECT_EQ(m.status().code(), code) << m.status().message();
  EXPECT_NE(m.status().message().find(text), std::string::npos) << m.status().message();
  EXPECT_NE(m.status().message().find("pass --no-load-optim (or --finetune)"), std::string::npos)
      << m.status().message();
}

TEST(MegatronTorchOptimizerErrors, WrongLayoutsAreCaught) {
  TempDir tmp;
  // The weight-decay classes swapped: the states no longer fit the parameters' shapes.
  std::string dir = edited_copy(tmp, "torch_adam", "mp_rank_00", [](PyValue& root, PyValue*) {
    PyValue& groups = mutable_get(mutable_get(root, "optimizer"), "param_groups");
    std::swap(groups.items[0], groups.items[1]);
    for (const PyRef& g : groups.items) {
      PyValue& wd = mutable_get(*g, "wd_mult");
      wd.f = wd.f == 0 ? 1.0 : 0.0;
    }
  });
  expect_refused(dir, StatusCode::kDataLoss, ": expected the parameter's");
  // A third param group (e.g. --decoupled-lr): refused.
  dir = edited_copy(tmp, "torch_adam_bf16_tp2pp2", "mp_rank_01_001", [](PyValue& root, PyValue*) {
    PyValue& inner = mutable_get(mutable_get(root, "optimizer"), "optimizer");
    mutable_get(*mutable_get(inner, "param_groups").items[0], "is_decoupled_lr").b = true;
  });
  expect_refused(dir, StatusCode::kUnimplemented, "has is_decoupled_lr set");
}

TEST(MegatronTorchOptimizerErrors, MastersThatAreNotTheWeightsAreCaught) {
  TempDir tmp;
  // Two masters of equal shape swapped (the order of the second stage's layer 0 norms): the masters, rounded to
  // bf16, are no longer the saved weights.
  const std::string dir = edited_copy(tmp, "torch_adam_bf16_tp2pp2", "mp_rank_00_001", [](PyValue& root, PyValue*) {
    PyValue& masters = mutable_get(mutable_get(root, "optimizer"), "fp32_from_fp16_params");
    auto& group = masters.items[0]->items;  // the second stage's no-weight-decay group (core_v0.12's order)
    std::swap(group[0], group[1]);
  });
  expect_refused(dir, StatusCode::kDataLoss, "are not its saved weights");
}

TEST(MegatronTorchOptimizerErrors, DistributedOptimizerFilesAreChecked) {
  TempDir tmp;
  // No distrib_optim.pt.
  std::string dir = tmp.file("nofile");
  fs::copy(fixture("torch_adam_distopt"), dir, fs::copy_options::recursive);
  fs::remove(dir + "/iter_0000007/mp_rank_00/distrib_optim.pt");
  expect_refused(dir, StatusCode::kNotFound, "distrib_optim.pt: Megatron's args record use_distributed_optimizer");
  // The older per-bucket format.
  dir = edited_copy(tmp, "torch_adam_distopt", "mp_rank_00", [](PyValue&, PyValue* d) {
    mutable_get(*d, "buckets_coalesced").b = false;
  });
  expect_refused(dir, StatusCode::kUnimplemented, "older per-bucket parameter state");
  // Another bucket size than the saving run's (one parameter per bucket: no padding between the 16-element norms and
  // the next parameter): the buffer layout differs from the saved one (DataLoss, never loaded).
  TempDir tmp2;
  dir = edited_copy(tmp2, "torch_adam_distopt", "mp_rank_00", [](PyValue& root, PyValue*) {
    mutable_get(*mutable_get(root, "args").state, "ddp_bucket_size").i = 1;
  });
  auto m = read_with_optimizer(dir);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kDataLoss) << m.status().message();
  EXPECT_NE(m.status().message().find("of the buffer layout Gale rebuilt from the saved args"), std::string::npos)
      << m.status().message();
}

// Apex / Transformer Engine's FusedAdam keeps the step in each param group, not per parameter: read from there.
// Steps that differ between parameters are refused.
TEST(MegatronTorchOptimizer, FusedAdamStepInTheParamGroups) {
  TempDir tmp;
  std::string dir = edited_copy(tmp, "torch_adam", "mp_rank_00", [](PyValue& root, PyValue*) {
    PyValue& opt = mutable_get(root, "optimizer");
    for (auto& [k, s] : mutable_get(opt, "state").entries)
      s->entries.erase(std::remove_if(s->entries.begin(), s->entries.end(),
                                      [](const auto& e) { return e.first->s == "step"; }),
                       s->entries.end());
    for (const PyRef& g : mutable_get(opt, "param_groups").items) g->set("step", PyValue::integer(7));
  });
  auto m = read_with_optimizer(dir);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->optimizer->step, 7);
  TempDir tmp2;
  dir = edited_copy(tmp2, "torch_adam", "mp_rank_00", [](PyValue& root, PyValue*) {
    PyValue& state = mutable_get(mutable_get(root, "optimizer"), "state");
    mutable_get(*state.entries[3].second, "step").data.data<float>()[0] = 6;
  });
  expect_refused(dir, StatusCode::kUnimplemented, "record different steps (6 and 7)");
}

TEST(MegatronTorchOptimizerErrors, CheckpointWithoutOptimizerState) {
  expect_refused(fixture("tp1"), StatusCode::kFailedPrecondition,
                 "holds no optimizer state (saved with --no-save-optim, or not by a training run)");
  expect_refused(fixture("pp2vp2"), StatusCode::kFailedPrecondition, "holds no optimizer state");
}

}  // namespace
}  // namespace gale
