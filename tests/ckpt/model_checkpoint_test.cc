// Model parameters and optimizer state through checkpoints, across tensor-parallel layouts.
#include "ckpt/model_checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "model/gpt_model.h"
#include "temp_dir.h"
#include "thread_communicator.h"

namespace gale {
namespace {

using testing_util::run_ranks;
using testing_util::TempDir;
using testing_util::ThreadCommunicator;

ModelConfig llama_like() {
  ModelConfig c;
  c.num_layers = 2;
  c.hidden = 16;
  c.ffn = 24;
  c.heads = 8;
  c.kv_heads = 4;  // GQA with one query group per rank at TP4
  c.head_dim = 2;
  c.vocab = 32;
  c.seq_length = 8;
  c.max_positions = 16;
  use_llama_architecture(c);
  return c;
}

ModelConfig gpt_like() {
  ModelConfig c = llama_like();
  c.rms_norm = false;
  c.swiglu = false;
  c.add_bias_linear = true;
  c.tied_embeddings = true;
  c.position = PositionEmbedding::kLearnedAbsolute;
  c.kv_heads = 8;
  return c;
}

// The model chunk of TP rank `comm.rank()` of `comm.size()`, initialised (layout-independently) with `seed`.
std::unique_ptr<GPTModel> make_model(const ModelConfig& c, Comm tp, const OpTable* ops, uint64_t seed) {
  ModelPartition part = single_process_partition(c);
  part.tp = std::move(tp);
  auto model = std::make_unique<GPTModel>(c, part, ops);
  model->params().initialize(seed);
  return model;
}

// A flat per-parameter state whose value at each element encodes (parameter, global index).
Tensor encoded_state(const ParamBuffer& pb) {
  Tensor flat = Tensor::zeros({pb.numel()});
  for (int id = 0; id < pb.size(); ++id)
    for (int64_t i = 0; i < pb.spec(id).local_numel(); ++i)
      flat.data<float>()[pb.spec(id).offset + i] = static_cast<float>(id * 100000 + pb.spec(id).global_index(i));
  return flat;
}

void expect_same_floats(const Tensor& a, const Tensor& b, const char* what) {
  ASSERT_EQ(a.numel(), b.numel()) << what;
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << what << " differ";
}

TEST(ModelCheckpoint, ShardBoxesFollowTheSplitBlocks) {
  ParamSpec fc1;
  fc1.name = "fc1";
  fc1.global_shape = {16, 4};
  fc1.split_dim = 0;
  fc1.split_blocks = 2;  // [gate; up]
  fc1.split_parts = 2;
  fc1.split_rank = 1;
  std::vector<ShardBox> boxes = shard_boxes(fc1);
  ASSERT_EQ(boxes.size(), 2u);
  EXPECT_EQ(boxes[0].global, (Box{{4, 0}, {4, 4}}));  // second half of the gate rows
  EXPECT_EQ(boxes[0].local, (Box{{0, 0}, {4, 4}}));
  EXPECT_EQ(boxes[1].global, (Box{{12, 0}, {4, 4}}));  // second half of the up rows
  EXPECT_EQ(boxes[1].local, (Box{{4, 0}, {4, 4}}));
  ParamSpec row;
  row.global_shape = {4, 8};
  row.split_dim = 1;
  row.split_parts = 4;
  row.split_rank = 3;
  EXPECT_EQ(shard_boxes(row)[0].global, (Box{{0, 6}, {4, 2}}));
  ParamSpec norm;
  norm.global_shape = {4};
  EXPECT_EQ(shard_boxes(norm)[0].global, whole_box({4}));
  // Every local element's global position agrees with ParamSpec::global_index.
  for (const ShardBox& b : boxes)
    for (int64_t r = 0; r < b.local.shape[0]; ++r)
      for (int64_t c = 0; c < 4; ++c)
        EXPECT_EQ(fc1.global_index((b.local.offsets[0] + r) * 4 + c), (b.global.offsets[0] + r) * 4 + c);
}

// A Mamba in_proj's unequal blocks z|x|B|C|dt (4, 4, 2, 2, 6 rows): TP rank 1 of 2 writes its half
// of each, and its local rows map to the same global rows as ParamSpec::global_index.
TEST(ModelCheckpoint, ShardBoxesFollowUnequalBlocks) {
  ParamSpec in_proj;
  in_proj.name = "in_proj";
  in_proj.global_shape = {18, 3};
  in_proj.split_dim = 0;
  in_proj.split_blocks = 5;
  in_proj.split_block_extents = {4, 4, 2, 2, 6};
  in_proj.split_parts = 2;
  in_proj.split_rank = 1;
  const std::vector<ShardBox> boxes = shard_boxes(in_proj);
  ASSERT_EQ(boxes.size(), 5u);
  const int64_t global_rows[] = {2, 6, 9, 11, 15}, local_rows[] = {0, 2, 4, 5, 6}, rows[] = {2, 2, 1, 1, 3};
  for (size_t b = 0; b < 5; ++b) {
    EXPECT_EQ(boxes[b].global, (Box{{global_rows[b], 0}, {rows[b], 3}})) << b;
    EXPECT_EQ(boxes[b].local, (Box{{local_rows[b], 0}, {rows[b], 3}})) << b;
    for (int64_t r = 0; r < rows[b]; ++r)
      EXPECT_EQ(in_proj.global_index((local_rows[b] + r) * 3 + 1), (global_rows[b] + r) * 3 + 1);
  }
}

// TP2 models save; TP1 and TP4 models load. Gale's initialisation does not depend on the layout,
// so the loaded values must equal a fresh initialisation at the loading layout, bit for bit.
TEST(ModelCheckpoint, SavedAtTp2LoadsAtTp1AndTp4) {
  for (const ModelConfig& c : {llama_like(), gpt_like()}) {
    TempDir tmp;
    OpTable ops = reference_ops();
    run_ranks(2, [&](Communicator& world) {
      // The ThreadCommunicator is only needed for the collective commit; the model takes a group handle.
      Comm tp(&world, [](Communicator*) {});
      auto model = make_model(c, tp, &ops, 11);
      Tensor state = encoded_state(model->params());
      CheckpointWriter w(tmp.path(), 3, world);
      EXPECT_TRUE(add_parameters(w, model->params()).ok());
      EXPECT_TRUE(add_parameter_state(w, model->params(), "exp_avg", state).ok());
      Status s = w.commit({{"optimizer", {{"steps", 3}}}});
      EXPECT_TRUE(s.ok()) << s.to_string();
    });
    StatusOr<CheckpointReader> r = CheckpointReader::open(tmp.path());
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->metadata()["shards"].size(), 2u);

    auto tp1 = make_model(c, make_self_communicator("tp"), &ops, 999);
    Status loaded = load_parameters(*r, tp1->params());
    ASSERT_TRUE(loaded.ok()) << loaded.to_string();
    auto fresh = make_model(c, make_self_communicator("tp"), &ops, 11);
    expect_same_floats(tp1->params().flat_params(), fresh->params().flat_params(), "TP1 parameters");
    Tensor state = Tensor::zeros({tp1->params().numel()});
    ASSERT_TRUE(load_parameter_state(*r, tp1->params(), "exp_avg", state).ok());
    expect_same_floats(state, encoded_state(tp1->params()), "TP1 optimizer state");

    run_ranks(4, [&](Communicator& world) {
      Comm tp(&world, [](Communicator*) {});
      auto model = make_model(c, tp, &ops, 999);
      Status st = load_parameters(*r, model->params());
      EXPECT_TRUE(st.ok()) << st.to_string();
      auto want = make_model(c, tp, &ops, 11);
      expect_same_floats(model->params().flat_params(), want->params().flat_params(), "TP4 parameters");
      Tensor s4 = Tensor::zeros({model->params().numel()});
      EXPECT_TRUE(load_parameter_state(*r, model->params(), "exp_avg", s4).ok());
      expect_same_floats(s4, encoded_state(model->params()), "TP4 optimizer state");
    });
  }
}

TEST(ModelCheckpoint, AModelOfAnotherShapeIsRefusedNamingTheTensor) {
  TempDir tmp;
  OpTable ops = reference_ops();
  Comm self = make_self_communicator();
  auto model = make_model(llama_like(), make_self_communicator("tp"), &ops, 1);
  CheckpointWriter w(tmp.path(), 1, *self);
  ASSERT_TRUE(add_parameters(w, model->params()).ok());
  ASSERT_TRUE(w.commit(nlohmann::json::object()).ok());
  ModelConfig wider = llama_like();
  wider.ffn = 32;
  auto other = make_model(wider, make_self_communicator("tp"), &ops, 1);
  StatusOr<CheckpointReader> r = CheckpointReader::open(tmp.path());
  ASSERT_TRUE(r.ok());
  Status s = load_parameters(*r, other->params());
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("tensor 'decoder.layers.0.mlp.linear_fc1.weight' was saved with shape [48, 16] but the "
                             "model expects [64, 16]"),
            std::string::npos)
      << s.message();
  Tensor state = Tensor::zeros({model->params().numel()});
  Status missing = load_parameter_state(*r, model->params(), "exp_avg", state);
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);  // saved without optimizer state
  Tensor wrong = Tensor::zeros({3});
  EXPECT_EQ(load_parameter_state(*r, model->params(), "exp_avg", wrong).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gale
