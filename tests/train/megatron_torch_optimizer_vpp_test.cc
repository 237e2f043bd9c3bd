// Megatron's legacy torch-format optimizer state with virtual pipeline chunks: every chunk's state at its global layers.
//
// tests/data/megatron/torch_adam_bf16_vpp comes from tools/reference/megatron_torch_vpp_optim_reference.py: a 4-layer
// model at PP 2 with two chunks per rank (Megatron core_v0.12.1's own GPTModel chunks, _get_param_groups over both
// and Float16OptimizerWithFloat16Params.state_dict()), layers 0 and 1 holding torch_adam's AdamW state and layers 2
// and 3 the same with the masters and the first moment negated. The state must be torch_adam's element for element
// (layers 2 and 3 as stated), the masters the weights; a wrong chunk order is caught by the masters' check.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <regex>

#include "ckpt/torch_file.h"
#include "train/megatron_checkpoint.h"
#include "train/megatron_fixture.h"

namespace gale {
namespace {

using namespace megatron_fixture;
namespace fs = std::filesystem;

StatusOr<MegatronCheckpoint> read_with_optimizer(const std::string& dir) {
  return read_megatron_checkpoint(dir, kUnset, /*with_optimizer=*/true);
}

// The number of elements where `a` differs from `sign` * `b` (-1 when dtype or shape differ).
int64_t differing(const Tensor& a, const Tensor& b, float sign = 1.0f) {
  if (a.dtype() != DType::kF32 || b.dtype() != DType::kF32 || a.shape() != b.shape()) return -1;
  int64_t differ = 0;
  for (int64_t i = 0; i < a.numel(); ++i) differ += a.data<float>()[i] != sign * b.data<float>()[i];
  return differ;
}

// Layer 2 and 3 names -> the layer 0 and 1 names they copy; others as they are.
std::string source_of(const std::string& name, bool* copied) {
  static const std::regex kLayer(R"(^decoder\.layers\.(\d+)\.(.*)$)");
  std::smatch m;
  *copied = false;
  if (!std::regex_match(name, m, kLayer)) return name;
  const int layer = std::stoi(m[1]);
  *copied = layer >= 2;
  return str_cat("decoder.layers.", layer % 2, ".", m[2].str());
}

TEST(MegatronTorchOptimizerVpp, ChunksGiveTheirLayersState) {
  auto base = read_with_optimizer(fixture("torch_adam"));
  ASSERT_TRUE(base.ok()) << base.status().message();
  auto m = read_with_optimizer(fixture("torch_adam_bf16_vpp"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->virtual_chunks, 2);
  EXPECT_EQ(m->model.num_layers, 4);
  ASSERT_TRUE(m->optimizer.has_value());
  const MegatronOptimizerState& o = *m->optimizer;
  EXPECT_EQ(o.layout, "non-distributed");
  EXPECT_EQ(o.step, 7);
  EXPECT_TRUE(o.fp32_masters);
  EXPECT_EQ(o.scheduler, base->optimizer->scheduler);
  ASSERT_EQ(o.tensors.size(), 2u);
  int64_t copies = 0;
  for (const char* state : {"exp_avg", "exp_avg_sq"}) {
    const auto& got = o.tensors.at(state);
    EXPECT_EQ(got.size(), base->optimizer->tensors.at(state).size() + 16) << state;  // 8 more per layer
    for (const auto& [name, t] : got) {
      bool copied = false;
      const std::string from = source_of(name, &copied);
      auto want = base->optimizer->tensors.at(state).find(from);
      ASSERT_NE(want, base->optimizer->tensors.at(state).end()) << name;
      const float sign = copied && std::string(state) == "exp_avg" ? -1.0f : 1.0f;
      EXPECT_EQ(differing(t, want->second, sign), 0) << state << " " << name;
      copies += copied;
    }
  }
  EXPECT_EQ(copies, 32);
  ASSERT_EQ(m->tensors.size(), base->tensors.size() + 16);
  for (const auto& [name, t] : m->tensors) {  // the masters, loaded as the weights
    bool copied = false;
    const Tensor& want = base->tensors.at(source_of(name, &copied));
    EXPECT_EQ(differing(t, want, copied ? -1.0f : 1.0f), 0) << name;
  }
}

// The distributed optimizer's distrib_optim.pt with chunks (torch_adam_distopt_vpp: one buffer per chunk, Megatron's
// own _ParamAndGradBuffer and get_parameter_state_dp_zero, the first chunk in two buckets): element for element the
// state of torch_adam_bf16_vpp.
TEST(MegatronTorchOptimizerVpp, DistributedOptimizerBuffersPerChunk) {
  auto base = read_with_optimizer(fixture("torch_adam_bf16_vpp"));
  ASSERT_TRUE(base.ok()) << base.status().message();
  auto m = read_with_optimizer(fixture("torch_adam_distopt_vpp"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  ASSERT_TRUE(m->optimizer.has_value());
  EXPECT_EQ(m->optimizer->layout, "dp_zero_gather_scatter");
  EXPECT_EQ(m->optimizer->step, 7);
  EXPECT_TRUE(m->optimizer->fp32_masters);
  for (const char* state : {"exp_avg", "exp_avg_sq"}) {
    ASSERT_EQ(m->optimizer->tensors.at(state).size(), base->optimizer->tensors.at(state).size()) << state;
    for (const auto& [name, want] : base->optimizer->tensors.at(state))
      EXPECT_EQ(differing(m->optimizer->tensors.at(state).at(name), want), 0) << state << " " << name;
  }
  ASSERT_EQ(m->tensors.size(), base->tensors.size());
  for (const auto& [name, want] : base->tensors) EXPECT_EQ(differing(m->tensors.at(name), want), 0) << name;
}

// The chunks of pipeline rank 1 swapped in its file ('model0' <-> 'model1'): the parameter order Gale rebuilds no longer
// matches the saved groups, which the shapes or the masters' check catch.
TEST(MegatronTorchOptimizerVppErrors, SwappedChunksAreCaught) {
  TempDir tmp;
  const std::string dir = tmp.file("vpp");
  fs::copy(fixture("torch_adam_bf16_vpp"), dir, fs::copy_options::recursive);
  const std::string file = dir + "/iter_0000007/mp_rank_00_001/model_optim_rng.pt";
  auto root = read_torch_file(file);
  ASSERT_TRUE(root.ok()) << root.status().message();
  PyRef a, b;
  for (auto& [k, v] : (*root)->entries) {
    if (k->kind == PyValue::kString && k->s == "model0") a = k;
    if (k->kind == PyValue::kString && k->s == "model1") b = k;
  }
  ASSERT_TRUE(a && b);
  std::swap(a->s, b->s);
  ASSERT_TRUE(write_torch_file(file, **root).ok());
  auto m = read_with_optimizer(dir);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kDataLoss) << m.status().message();
  EXPECT_NE(m.status().message().find("pass --no-load-optim (or --finetune)"), std::string::npos)
      << m.status().message();
}

// A missing distrib_optim.pt is named; rank files with different chunk counts are refused.
TEST(MegatronTorchOptimizerVppErrors, WhatIsNotReadIsNamed) {
  TempDir tmp;
  auto edited = [&](const std::string& name, const std::function<void(PyValue&)>& edit) {
    const std::string dir = tmp.file(name);
    fs::copy(fixture("torch_adam_bf16_vpp"), dir, fs::copy_options::recursive);
    for (const char* rank : {"mp_rank_00_000", "mp_rank_00_001"}) {
      const std::string file = dir + "/iter_0000007/" + rank + "/model_optim_rng.pt";
      auto root = read_torch_file(file);
      EXPECT_TRUE(root.ok()) << root.status().message();
      if (std::string(rank) == "mp_rank_00_001" || name == "distributed") edit(**root);
      EXPECT_TRUE(write_torch_file(file, **root).ok());
    }
    return dir;
  };
  auto m = read_with_optimizer(edited("distributed", [](PyValue& root) {
    for (auto& [k, v] : root.entries)
      if (k->s == "args") v->state->set("use_distributed_optimizer", PyValue::boolean(true));
  }));
  ASSERT_FALSE(m.ok());  // args that record the distributed optimizer, without its distrib_optim.pt
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound) << m.status().message();
  EXPECT_NE(m.status().message().find("distrib_optim.pt: Megatron's args record use_distributed_optimizer"),
            std::string::npos)
      << m.status().message();
  m = read_with_optimizer(edited("one_chunk", [](PyValue& root) {
    std::erase_if(root.entries, [](const auto& e) { return e.first->kind == PyValue::kString && e.first->s == "model1"; });
  }));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kDataLoss) << m.status().message();
}

}  // namespace
}  // namespace gale
