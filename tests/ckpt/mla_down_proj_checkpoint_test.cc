// --mla-down-proj-fusion and Gale's checkpoints: the fused model keeps the unfused names (as
// Megatron's fused module saves linear_q_down_proj / linear_kv_down_proj and input_layernorm), so a
// checkpoint saved by the fused model loads into the unfused one and the other way round, with
// every tensor equal and the same loss on a batch.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "../model/mla_test_config.h"
#include "ckpt/model_checkpoint.h"
#include "comm/communicator.h"
#include "model/gpt_model.h"
#include "temp_dir.h"

namespace gale {
namespace {

using testing_util::TempDir;

OpTable ops_for(bool fused) {
  OpTable ops = reference_ops();
  ops.mla_down_proj_fusion = fused;
  return ops;
}

ModelConfig config_for(bool fused) {
  ModelConfig c = testing::mla_config(true, 6, true, 3);
  c.mla.down_proj_fusion = fused;
  return c;
}

class MlaDownProjCheckpoint : public ::testing::TestWithParam<bool> {};

// GetParam(): the saving model is the fused one (else the unfused one saves, the fused one loads).
TEST_P(MlaDownProjCheckpoint, LoadsIntoTheOtherLayout) {
  const bool save_fused = GetParam();
  TempDir tmp;
  Comm self = make_self_communicator();
  OpTable save_ops = ops_for(save_fused), load_ops = ops_for(!save_fused);
  const ModelConfig cs = config_for(save_fused), cl = config_for(!save_fused);
  GPTModel saver(cs, single_process_partition(cs), &save_ops);
  saver.params().initialize(21);
  CheckpointWriter w(tmp.path(), 1, *self);
  ASSERT_TRUE(add_parameters(w, saver.params()).ok());
  ASSERT_TRUE(w.commit(nlohmann::json::object()).ok());

  GPTModel loader(cl, single_process_partition(cl), &load_ops);
  loader.params().initialize(99);  // other values, overwritten by the load
  StatusOr<CheckpointReader> r = CheckpointReader::open(tmp.path());
  ASSERT_TRUE(r.ok()) << r.status().message();
  const Status s = load_parameters(*r, loader.params());
  ASSERT_TRUE(s.ok()) << s.message();
  const ParamBuffer &a = saver.params(), &b = loader.params();
  ASSERT_EQ(a.size(), b.size());
  for (int id = 0; id < a.size(); ++id) {
    const int other = b.find(a.spec(id).name);
    ASSERT_GE(other, 0) << a.spec(id).name;
    EXPECT_EQ(std::memcmp(a.param_data(id), b.param_data(other), a.spec(id).local_numel() * sizeof(float)), 0)
        << a.spec(id).name;
  }
  const MicroBatch mb = testing::masked_batch(cs, 2, 7, false);
  const double la = testing::mean_loss(saver, mb, false), lb = testing::mean_loss(loader, mb, false);
  EXPECT_NEAR(la, lb, 1e-6 * std::abs(la));
}

INSTANTIATE_TEST_SUITE_P(Direction, MlaDownProjCheckpoint, ::testing::Bool(),
                         [](const auto& info) { return std::string(info.param ? "fused_to_unfused" : "unfused_to_fused"); });

}  // namespace
}  // namespace gale
