// Megatron's optimizer state read from torch_dcp checkpoints: the same state as the legacy torch format's.
//
// tests/data/megatron/torch_dcp_adam{,_bf16} come from tools/reference/megatron_torch_dcp_optim_reference.py: the
// torch_adam fixture's state (Megatron core_v0.12.1's own FP32Optimizer.state_dict(), and its
// Float16OptimizerWithFloat16Params.state_dict() at TP 1 with bf16 weights) saved with torch.distributed.checkpoint as
// Megatron's --ckpt-format torch_dcp saves generate_state_dict's dict. Both must give torch_adam's tensors element for
// element; the bf16 one's fp32 masters must be its weights, which catches a wrong rebuilt order.
#include <gtest/gtest.h>

#include <algorithm>

#include "ckpt/dcp_reader.h"
#include "train/megatron_checkpoint.h"
#include "train/megatron_dcp_optimizer.h"
#include "train/megatron_dist_checkpoint.h"
#include "train/megatron_fixture.h"
#include "train/megatron_torch_optimizer.h"

namespace gale {
namespace {

using namespace megatron_fixture;

StatusOr<MegatronCheckpoint> read_with_optimizer(const std::string& dir) {
  return read_megatron_checkpoint(dir, kUnset, /*with_optimizer=*/true);
}

int64_t differing(const Tensor& a, const Tensor& b) {
  if (a.dtype() != DType::kF32 || b.dtype() != DType::kF32 || a.shape() != b.shape()) return -1;
  int64_t differ = 0;
  for (int64_t i = 0; i < a.numel(); ++i) differ += a.data<float>()[i] != b.data<float>()[i];
  return differ;
}

PyValue& mutable_get(PyValue& d, const std::string& key) {
  for (auto& [k, v] : d.entries)
    if (k->kind == PyValue::kString && k->s == key) return *v;
  ADD_FAILURE() << "no key " << key;
  return d;
}

TEST(MegatronDcpOptimizer, GivesTheTorchFormatsState) {
  auto base = read_with_optimizer(fixture("torch_adam"));
  ASSERT_TRUE(base.ok()) << base.status().message();
  for (const char* dir : {"torch_dcp_adam", "torch_dcp_adam_bf16"}) {
    SCOPED_TRACE(dir);
    const bool bf16 = std::string(dir) == "torch_dcp_adam_bf16";
    auto m = read_with_optimizer(fixture(dir));
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_EQ(m->format, CheckpointFormat::kMegatronTorchDcp);
    EXPECT_EQ(m->iteration, 7);
    ASSERT_TRUE(m->optimizer.has_value());
    const MegatronOptimizerState& o = *m->optimizer;
    EXPECT_EQ(o.layout, "non-distributed");
    EXPECT_EQ(o.type, "adam");
    EXPECT_EQ(o.step, 7);
    EXPECT_EQ(o.fp32_masters, bf16);
    EXPECT_EQ(o.scheduler, base->optimizer->scheduler);
    EXPECT_EQ(o.scheduler.value("num_steps", 0), 14);
    EXPECT_TRUE(o.grad_scaler.is_null());
    ASSERT_EQ(o.tensors.size(), 2u);
    for (const char* state : {"exp_avg", "exp_avg_sq"}) {
      ASSERT_EQ(o.tensors.at(state).size(), base->optimizer->tensors.at(state).size()) << state;
      for (const auto& [name, want] : base->optimizer->tensors.at(state))
        EXPECT_EQ(differing(o.tensors.at(state).at(name), want), 0) << state << " " << name;
    }
    ASSERT_EQ(m->tensors.size(), base->tensors.size());
    for (const auto& [name, want] : base->tensors) EXPECT_EQ(differing(m->tensors.at(name), want), 0) << name;
  }
}

// DCP's dotted keys back in torch.save's structure: torch's {param index: state} dict with int keys, the param groups
// and the masters (one list per group) as lists in index order.
TEST(MegatronDcpOptimizer, UnflattensTheStateDict) {
  const std::string dir = fixture("torch_dcp_adam_bf16/iter_0000007");
  auto c = DcpCheckpoint::open(dir);
  ASSERT_TRUE(c.ok()) << c.status().message();
  auto opt = megatron_dcp_unflatten(*c, "optimizer", dir);
  ASSERT_TRUE(opt.ok()) << opt.status().message();
  ASSERT_TRUE(*opt);
  const PyValue* inner = (*opt)->get("optimizer");
  ASSERT_NE(inner, nullptr);
  const PyValue* state = inner->get("state");
  ASSERT_NE(state, nullptr);
  ASSERT_EQ(state->kind, PyValue::kDict);
  ASSERT_EQ(state->entries.size(), 20u);
  for (const auto& [k, v] : state->entries) {
    ASSERT_EQ(k->kind, PyValue::kInt);
    ASSERT_NE(v->get("exp_avg"), nullptr);
    EXPECT_EQ(v->get("exp_avg")->kind, PyValue::kTensor);
  }
  const PyValue* groups = inner->get("param_groups");
  ASSERT_NE(groups, nullptr);
  ASSERT_EQ(groups->kind, PyValue::kList);
  ASSERT_EQ(groups->items.size(), 2u);
  const PyValue* params = groups->items[0]->get("params");  // a list of ints: one saved object
  ASSERT_NE(params, nullptr);
  EXPECT_EQ(params->kind, PyValue::kList);
  const PyValue* masters = (*opt)->get("fp32_from_fp16_params");
  ASSERT_NE(masters, nullptr);
  ASSERT_EQ(masters->kind, PyValue::kList);
  ASSERT_EQ(masters->items.size(), 2u);
  size_t count = 0;
  for (const PyRef& g : masters->items) {
    ASSERT_EQ(g->kind, PyValue::kList);
    count += g->items.size();
    // Each master in the group's order: its shape is that of the state at the group's parameter index.
    const PyValue& ids = *groups->items[&g - &masters->items[0]]->get("params");
    for (size_t j = 0; j < g->items.size(); ++j) {
      const PyValue* s = nullptr;
      for (const auto& [k, v] : state->entries)
        if (k->i == ids.items[j]->i) s = v->get("exp_avg");
      ASSERT_NE(s, nullptr);
      EXPECT_EQ(g->items[j]->data.shape(), s->data.shape()) << j;
    }
  }
  EXPECT_EQ(count, 20u);
  auto none = megatron_dcp_unflatten(*c, "rng_state", dir);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(*none);
}

// A wrong order of the masters (two of one shape swapped) is caught element by element: the masters rounded to bf16
// are no longer the saved weights.
TEST(MegatronDcpOptimizerErrors, MastersThatAreNotTheWeightsAreCaught) {
  const std::string dir = fixture("torch_dcp_adam_bf16/iter_0000007");
  auto s = read_megatron_dist_state(dir, CheckpointFormat::kMegatronTorchDcp, /*with_optimizer=*/true);
  ASSERT_TRUE(s.ok()) << s.status().message();
  PyValue& masters = mutable_get(mutable_get(*s->root, "optimizer"), "fp32_from_fp16_params");
  auto& group = masters.items[1]->items;  // the no-weight-decay group: norms of one shape
  auto same_shape = std::adjacent_find(group.begin(), group.end(), [](const PyRef& a, const PyRef& b) {
    return a->data.shape() == b->data.shape();
  });
  ASSERT_NE(same_shape, group.end());
  std::iter_swap(same_shape, same_shape + 1);
  auto identity = [](const std::string& name, int64_t) { return name; };
  auto o = read_megatron_torch_optimizer({{{0, 0}, dir}}, {{{0, 0}, s->root}}, identity, true);
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), StatusCode::kDataLoss) << o.status().message();
  EXPECT_NE(o.status().message().find("are not its saved weights"), std::string::npos) << o.status().message();
  // Unswapped, the same call reads it.
  std::iter_swap(same_shape, same_shape + 1);
  EXPECT_TRUE(read_megatron_torch_optimizer({{{0, 0}, dir}}, {{{0, 0}, s->root}}, identity, true).ok());
}

TEST(MegatronDcpOptimizerErrors, DistributedOptimizerIsRefused) {
  const std::string dir = fixture("torch_dcp_adam/iter_0000007");
  auto s = read_megatron_dist_state(dir, CheckpointFormat::kMegatronTorchDcp, /*with_optimizer=*/false);
  ASSERT_TRUE(s.ok()) << s.status().message();
  auto c = DcpCheckpoint::open(dir);
  ASSERT_TRUE(c.ok());
  PyValue& args = mutable_get(*s->root, "args");
  ASSERT_TRUE(args.state);
  args.state->set("use_distributed_optimizer", PyValue::boolean(true));
  const Status st = add_megatron_dcp_optimizer(*c, dir, *s->root);
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented) << st.message();
  EXPECT_NE(st.message().find("whose args record use_distributed_optimizer: not supported"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("pass --no-load-optim (or --finetune)"), std::string::npos) << st.message();
  EXPECT_EQ(s->root->get("optimizer"), nullptr);
}

}  // namespace
}  // namespace gale
