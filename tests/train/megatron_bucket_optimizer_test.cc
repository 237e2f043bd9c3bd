// Megatron's bucket-space distributed optimizer layouts (dp_reshardable, dp_zero_gather_scatter): the buffer layout
// against Megatron's own, and
// what a checkpoint that does not fit it is told.
//
// tests/data/megatron/torch_dist_adam_buckets comes from tools/reference/megatron_torch_dist_optim_reference.py
// --buckets (Megatron core_v0.15.3's _ParamAndGradBuffer and DistributedOptimizer.sharded_state_dict, DP 2 x TP 1,
// bf16 weights, --overlap-grad-reduce --ddp-bucket-size 1000: five buckets); its values are torch_dist_adam's
// (megatron_dist_optimizer_test.cc checks every tensor and the step).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "ckpt/dcp_reader.h"
#include "ckpt/temp_dir.h"
#include "ckpt/torch_file.h"
#include "train/megatron_bucket_optimizer.h"
#include "train/megatron_dist_optimizer.h"
#include "train/megatron_fixture.h"

namespace gale {
namespace {

using namespace megatron_fixture;

const std::string kDir = "torch_dist_adam_buckets/iter_0000007";

MegatronBucketParam param(const std::string& key, int64_t numel) { return MegatronBucketParam{key, -1, numel, 0, 0, {}}; }

// Reverse order, 64-element aligned starts, a bucket closing at the parameter that fills it.
TEST(MegatronBucketLayout, ReverseOrderAlignedStartsBucketsClosedAtSize) {
  const std::vector<MegatronBucketParam> model = {param("a", 100), param("b", 30), param("c", 64), param("d", 10)};
  MegatronBucketLayout l = megatron_bucket_layout(model, 120);
  ASSERT_EQ(l.params.size(), 4u);
  const std::vector<std::tuple<std::string, int, int64_t>> want = {{"d", 0, 0}, {"c", 0, 64}, {"b", 1, 0}, {"a", 1, 64}};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(l.params[i].key, std::get<0>(want[i]));
    EXPECT_EQ(l.params[i].bucket, std::get<1>(want[i])) << l.params[i].key;
    EXPECT_EQ(l.params[i].begin, std::get<2>(want[i])) << l.params[i].key;
  }
  EXPECT_EQ(l.bucket_numel_unpadded, (std::vector<int64_t>{128, 164}));
  l = megatron_bucket_layout(model, 0);  // without --overlap-grad-reduce: one bucket
  EXPECT_EQ(l.bucket_numel_unpadded, (std::vector<int64_t>{292}));
  EXPECT_EQ(l.params[3].begin, 192);
}

// The fixture's parameters where Megatron's _ParamAndGradBuffer put them (param_index_map, printed by the
// reference script): bucket starts 0, 1024, 2304, 3712, 5120.
TEST(MegatronBucketLayout, MatchesMegatronsParamIndexMap) {
  auto c = DcpCheckpoint::open(fixture(kDir));
  ASSERT_TRUE(c.ok()) << c.status().message();
  auto order = megatron_parameter_order(*c, "local", 2, "D");
  ASSERT_TRUE(order.ok()) << order.status().message();
  const MegatronBucketLayout l = megatron_bucket_layout(*order, 1000);
  EXPECT_EQ(l.bucket_numel_unpadded, (std::vector<int64_t>{1024, 1280, 1408, 1408, 1408}));
  const int64_t bucket_start[] = {0, 1024, 2304, 3712, 5120};
  const std::string L = "decoder.layers.";
  const std::vector<std::tuple<std::string, int64_t, int64_t>> megatron = {
      {"output_layer.weight", -1, 0},
      {"decoder.final_layernorm.bias", -1, 1024},
      {"decoder.final_layernorm.weight", -1, 1088},
      {L + "mlp.linear_fc2.weight", 1, 1152},
      {L + "mlp.linear_fc1.weight", 1, 1536},
      {L + "mlp.linear_fc1.layer_norm_bias", 1, 2304},  // pre_mlp_layernorm
      {L + "mlp.linear_fc1.layer_norm_weight", 1, 2368},
      {L + "self_attention.linear_qkv.weight", 1, 2432},
      {L + "self_attention.linear_proj.weight", 1, 2944},
      {L + "self_attention.linear_qkv.layer_norm_bias", 1, 3200},  // input_layernorm
      {L + "self_attention.linear_qkv.layer_norm_weight", 1, 3264},
      {L + "mlp.linear_fc2.weight", 0, 3328},
      {L + "mlp.linear_fc1.weight", 0, 3712},
      {L + "mlp.linear_fc1.layer_norm_bias", 0, 4480},
      {L + "mlp.linear_fc1.layer_norm_weight", 0, 4544},
      {L + "self_attention.linear_qkv.weight", 0, 4608},
      {L + "self_attention.linear_proj.weight", 0, 5120},
      {L + "self_attention.linear_qkv.layer_norm_bias", 0, 5376},
      {L + "self_attention.linear_qkv.layer_norm_weight", 0, 5440},
      {"embedding.word_embeddings.weight", -1, 5504}};
  ASSERT_EQ(l.params.size(), megatron.size());
  for (size_t i = 0; i < megatron.size(); ++i) {
    const MegatronBucketParam& p = l.params[i];
    EXPECT_EQ(p.key, std::get<0>(megatron[i])) << i;
    EXPECT_EQ(p.layer, std::get<1>(megatron[i])) << p.key;
    EXPECT_EQ(bucket_start[p.bucket] + p.begin, std::get<2>(megatron[i])) << p.key << " layer " << p.layer;
  }
}

// The fixture's common.pt and args, to be edited.
struct Saved {
  StatusOr<DcpCheckpoint> c;
  PyRef common, args;
  explicit Saved(const std::string& dir = kDir) : c(DcpCheckpoint::open(fixture(dir))) {
    auto r = read_torch_file(fixture(dir) + "/common.pt");
    EXPECT_TRUE(r.ok() && c.ok());
    common = *r;
    for (auto& [k, v] : common->entries)
      if (k->s == "args") args = v;
  }
  StatusOr<MegatronOptimizerState> read() { return read_megatron_dist_optimizer(*c, *common, args.get(), "D"); }
};

const std::string kOutWay = "; pass --no-load-optim (or --finetune) to load the model weights and iteration only";

// The whole message.
void expect_message(const StatusOr<MegatronOptimizerState>& o, StatusCode code, const std::string& message) {
  ASSERT_FALSE(o.ok()) << message;
  EXPECT_EQ(o.status().code(), code) << o.status().message();
  EXPECT_EQ(o.status().message(), message + kOutWay);
}

void expect_error(const StatusOr<MegatronOptimizerState>& o, StatusCode code, const std::string& text) {
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), code) << o.status().message();
  EXPECT_NE(o.status().message().find(text), std::string::npos) << o.status().message();
  EXPECT_NE(o.status().message().find("pass --no-load-optim (or --finetune)"), std::string::npos)
      << o.status().message();
}

TEST(MegatronBucketLayoutErrors, ArgsThatDoNotFitTheBucketsAreNamed) {
  {
    Saved s;
    ASSERT_TRUE(s.read().ok()) << s.read().status().message();
  }
  {
    Saved s;  // another bucket size: the saved per-bucket sizes disagree
    s.args->state->set("ddp_bucket_size", PyValue::integer(2000));
    expect_error(s.read(), StatusCode::kDataLoss,
                 "D: Megatron's distributed optimizer state in the 'dp_reshardable' layout: the saved bucket sizes "
                 "[1024, 1280, 1408, 1408, 1408] (optimizer.distributed.dp_group_idx_0.per_bucket_numel_unpadded/"
                 "shard_0_1) differ from the [2304, 2176, 2048] of the buffer layout Gale rebuilt from the saved args "
                 "(bucket size 2000, transformer_impl 'local')");
  }
  {
    Saved s;  // without --overlap-grad-reduce Megatron keeps one bucket
    s.args->state->set("overlap_grad_reduce", PyValue::boolean(false));
    expect_error(s.read(), StatusCode::kDataLoss,
                 "differ from the [6528] of the buffer layout Gale rebuilt from the saved args (one bucket, "
                 "transformer_impl 'local')");
  }
  {
    Saved s;  // Transformer Engine's parameter order: other buckets
    s.args->state->set("transformer_impl", PyValue::str("transformer_engine"));
    expect_error(s.read(), StatusCode::kDataLoss,
                 "differ from the [1024, 1280, 1024, 1152, 1024, 1024] of the buffer layout Gale rebuilt from the "
                 "saved args (bucket size 1000, transformer_impl 'transformer_engine')");
  }
  {
    Saved s;
    s.args->state->set("transformer_impl", PyValue::none());
    expect_error(s.read(), StatusCode::kUnimplemented, "Megatron's args record no transformer_impl");
  }
  {
    Saved s;  // a TP 1 run's buckets read as TP 2: rank 0's pieces give other buckets
    s.args->state->set("tensor_model_parallel_size", PyValue::integer(2));
    expect_message(s.read(), StatusCode::kDataLoss,
                   "D: Megatron's distributed optimizer state in the 'dp_reshardable' layout, tensor-parallel rank 0 "
                   "of 2, pipeline rank 0 of 1: the saved bucket sizes [1024, 1280, 1408, 1408, 1408] (optimizer."
                   "distributed.dp_group_idx_0.per_bucket_numel_unpadded/shard_0_1) differ from the [1216, 1216, 1152] "
                   "of the buffer layout Gale rebuilt from the saved args (bucket size 1000, transformer_impl 'local')");
  }
  {
    Saved s;  // MoE args over a checkpoint without the chained optimizers' buffers
    s.args->state->set("num_experts", PyValue::integer(4));
    expect_message(s.read(), StatusCode::kDataLoss,
                   "D: Megatron's distributed optimizer state in the 'dp_reshardable' layout: Megatron's args record "
                   "args.num_experts 4, whose chained dense and expert optimizers save their buffers under chained_0."
                   "optimizer.distributed.* and chained_1.optimizer.distributed.*: found no chained_0. and no "
                   "chained_1. entries");
  }
}

// tests/data/megatron/torch_dist_adam_buckets_tp2pp2: the same state saved by Megatron core_v0.15.3 at TP 2 x PP 2
// (four gloo processes, DP 1): each model-parallel rank's buffers under its own dp_group_idx_<t + 2 p>
// (DistributedOptimizer's data_parallel_group_idx), holding its TP pieces of its stage's parameters.
const std::string kTp2Pp2 = "torch_dist_adam_buckets_tp2pp2/iter_0000007";

// Rank (t, p)'s parameters as Megatron's model.parameters() gives them on that rank: the second stage's layer (global
// layer 1), the final norm and the output layer; its TP pieces (SwiGLU fc1 [12 gate; 12 up] rows of 48, linear_proj
// and linear_fc2 cut by columns, the vocabulary's half of the output layer, norms whole).
TEST(MegatronBucketLayout, Tp2Pp2RankHoldsItsStagesPieces) {
  auto c = DcpCheckpoint::open(fixture(kTp2Pp2));
  ASSERT_TRUE(c.ok()) << c.status().message();
  MegatronModelRank rank;
  rank.tp_size = 2;
  rank.tp_rank = 1;
  rank.first_layer = 1;
  rank.num_layers = 1;
  rank.first_stage = false;
  rank.swiglu = true;
  auto order = megatron_parameter_order(*c, "local", 2, "D", rank);
  ASSERT_TRUE(order.ok()) << order.status().message();
  const std::string L = "decoder.layers.";
  const std::vector<std::tuple<std::string, int64_t, Shape>> want = {
      {L + "self_attention.linear_qkv.layer_norm_weight", 1, {16}},
      {L + "self_attention.linear_qkv.layer_norm_bias", 1, {16}},
      {L + "self_attention.linear_proj.weight", 1, {16, 8}},
      {L + "self_attention.linear_qkv.weight", 1, {16, 16}},
      {L + "mlp.linear_fc1.layer_norm_weight", 1, {16}},
      {L + "mlp.linear_fc1.layer_norm_bias", 1, {16}},
      {L + "mlp.linear_fc1.weight", 1, {24, 16}},
      {L + "mlp.linear_fc2.weight", 1, {16, 12}},
      {"decoder.final_layernorm.weight", -1, {16}},
      {"decoder.final_layernorm.bias", -1, {16}},
      {"output_layer.weight", -1, {32, 16}}};
  ASSERT_EQ(order->size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const MegatronBucketParam& p = (*order)[i];
    EXPECT_EQ(p.key, std::get<0>(want[i])) << i;
    EXPECT_EQ(p.layer, std::get<1>(want[i])) << p.key;
    EXPECT_EQ(p.shape, std::get<2>(want[i])) << p.key;
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    EXPECT_EQ(p.numel, n) << p.key;
  }
  rank.first_layer = 0;  // the first stage: the embedding's half of the vocabulary and layer 0
  rank.first_stage = true;
  rank.last_stage = false;
  order = megatron_parameter_order(*c, "local", 2, "D", rank);
  ASSERT_TRUE(order.ok()) << order.status().message();
  ASSERT_EQ(order->size(), 9u);
  EXPECT_EQ(order->front().key, "embedding.word_embeddings.weight");
  EXPECT_EQ(order->front().shape, (Shape{32, 16}));
  EXPECT_EQ(order->back().layer, 0);
}

// Every state of the run saved in `dir` (read in `layout`) is the TP 1 run's bit for bit, but the
// tensor `absent` (empty: none), which `dir` must not hold; `elements`: the elements compared.
void expect_same_state_as_tp1(const std::string& dir, const std::string& layout, const std::string& absent = "",
                              int64_t elements = 3 * 6048) {
  Saved tp1, other(dir);
  auto a = tp1.read();
  auto b = other.read();
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(b->step, 7);
  EXPECT_EQ(b->layout, layout);
  ASSERT_EQ(b->tensors.size(), 3u);
  int64_t compared = 0;
  for (const auto& [state, by_key] : a->tensors) {
    ASSERT_TRUE(b->tensors.count(state)) << state;
    ASSERT_EQ(b->tensors.at(state).size() + (absent.empty() ? 0 : 1), by_key.size()) << state;
    for (const auto& [key, want] : by_key) {
      if (key == absent) continue;
      ASSERT_TRUE(b->tensors.at(state).count(key)) << state << " " << key;
      const Tensor& got = b->tensors.at(state).at(key);
      ASSERT_EQ(got.shape(), want.shape()) << state << " " << key;
      for (int64_t i = 0; i < want.numel(); ++i, ++compared)
        ASSERT_EQ(got.data<float>()[i], want.data<float>()[i]) << state << " " << key << " [" << i << "]";
    }
  }
  EXPECT_EQ(compared, elements);
}

// Every state (masters, exp_avg, exp_avg_sq) of the TP 2 x PP 2 runs (dp_reshardable; dp_zero_gather_scatter, from
// the same script: each rank's buffers gathered into dp_group_idx_<rank>.param_state), their pieces merged, is the
// TP 1 run's bit for bit; the step is 7 (megatron_dist_optimizer_test.cc checks the values against torch's).
TEST(MegatronBucketLayout, Tp2Pp2RunReadsAsTheTp1Run) {
  for (const auto& [dir, layout] : std::vector<std::pair<std::string, std::string>>{
           {kTp2Pp2, "dp_reshardable"}, {"torch_dist_adam_dp_zero_tp2pp2/iter_0000007", "dp_zero_gather_scatter"}}) {
    SCOPED_TRACE(dir);
    expect_same_state_as_tp1(dir, layout);
  }
}


// tests/data/megatron/torch_dist_adam_{buckets,dp_zero}_tp2pp2_tied: the same state with the word embedding tied to the
// output layer (GPTModel's share_embeddings_and_output_weights), saved by Megatron core_v0.15.3 at TP 2 x PP 2: the
// last stage keeps its own copy of the embedding (output_layer.weight, first in its buffer) with the embedding's state,
// the checkpoint saves the embedding alone. Every state reads as the TP 1 run's but the output layer, bit for bit.
const std::string kTied = "torch_dist_adam_buckets_tp2pp2_tied/iter_0000007";

TEST(MegatronBucketLayout, TiedEmbeddingAtPp2ReadsAsTheTp1Run) {
  for (const auto& [dir, layout] : std::vector<std::pair<std::string, std::string>>{
           {kTied, "dp_reshardable"}, {"torch_dist_adam_dp_zero_tp2pp2_tied/iter_0000007", "dp_zero_gather_scatter"}}) {
    SCOPED_TRACE(dir);
    expect_same_state_as_tp1(dir, layout, "output_layer.weight", 3 * (6048 - 64 * 16));  // the 19 other tensors
  }
}

// Megatron's shared embedding has a bucket of its own: the first stage's embedding (last in its buffer, the bucket
// before it closing at the embedding's aligned start: [1088, 128, 512]) and the last stage's copy (first in its
// buffer: [512, 1088, 208]). Read as untied, the first stage's rebuilt buckets are the untied run's.
TEST(MegatronBucketLayout, TiedEmbeddingHasABucketOfItsOwn) {
  auto c = DcpCheckpoint::open(fixture(kTied));
  ASSERT_TRUE(c.ok()) << c.status().message();
  MegatronModelRank rank;
  rank.tp_size = 2;
  rank.num_layers = 1;
  rank.swiglu = true;
  rank.tied_embeddings = true;
  rank.last_stage = false;
  auto order = megatron_parameter_order(*c, "local", 2, "D", rank);
  ASSERT_TRUE(order.ok()) << order.status().message();
  EXPECT_TRUE(order->front().own_bucket);
  MegatronBucketLayout l = megatron_bucket_layout(*order, 1000);
  EXPECT_EQ(l.bucket_numel_unpadded, (std::vector<int64_t>{1088, 128, 512}));
  EXPECT_EQ(l.params.back().key, "embedding.word_embeddings.weight");
  EXPECT_EQ(l.params.back().bucket, 2);
  EXPECT_EQ(l.params.back().begin, 0);
  rank.first_stage = false;  // the last stage: its copy of the embedding first, under the embedding's key
  rank.last_stage = true;
  rank.first_layer = 1;
  order = megatron_parameter_order(*c, "local", 2, "D", rank);
  ASSERT_TRUE(order.ok()) << order.status().message();
  l = megatron_bucket_layout(*order, 1000);
  EXPECT_EQ(l.bucket_numel_unpadded, (std::vector<int64_t>{512, 1088, 208}));
  EXPECT_EQ(l.params.front().key, "embedding.word_embeddings.weight");
  EXPECT_EQ(l.params.front().shape, (Shape{32, 16}));
  EXPECT_EQ(l.params.front().bucket, 0);
  l = megatron_bucket_layout(*order, 0);  // one bucket configured: the copy still has its own
  EXPECT_EQ(l.bucket_numel_unpadded, (std::vector<int64_t>{512, 1296}));
}

// Args that do not say tied, and a last stage's copy whose state is not the first stage's, are refused.
TEST(MegatronBucketLayoutErrors, TiedEmbeddingCopyIsPlacedAndChecked) {
  {
    Saved s(kTied);
    s.args->state->set("untie_embeddings_and_output_weights", PyValue::boolean(true));
    expect_message(s.read(), StatusCode::kDataLoss,
                   "D: Megatron's distributed optimizer state in the 'dp_reshardable' layout, tensor-parallel rank 0 "
                   "of 2, pipeline rank 0 of 2: the saved bucket sizes [1088, 128, 512] (optimizer.distributed."
                   "dp_group_idx_0.per_bucket_numel_unpadded/shard_0_1) differ from the [1088, 640] of the buffer "
                   "layout Gale rebuilt from the saved args (bucket size 1000, transformer_impl 'local')");
  }
  // One element of the last stage's copy of the embedding's exp_avg changed in the file: the copies differ.
  testing_util::TempDir tmp;
  const std::string dir = tmp.file("iter_0000007");
  std::filesystem::copy(fixture(kTied), dir);
  const std::string key =
      "optimizer.distributed.dp_group_idx_2.gbuf_idx_0.dtype_(torch.bfloat16, torch.float32).bucket_idx_0.exp_avg";
  {
    auto c = DcpCheckpoint::open(dir);
    ASSERT_TRUE(c.ok()) << c.status().message();
    ASSERT_TRUE(c->tensors().count(key));
    auto t = c->read_tensor(key);
    ASSERT_TRUE(t.ok()) << t.status().message();
    ASSERT_EQ(t->dtype(), DType::kF32);
    const DcpChunk& chunk = c->tensors().at(key).chunks.at(0);
    std::fstream f(dir + "/" + chunk.file, std::ios::in | std::ios::out | std::ios::binary);
    std::string bytes(static_cast<size_t>(chunk.length), '\0');
    f.seekg(chunk.offset);
    f.read(bytes.data(), chunk.length);
    const std::string head(static_cast<const char*>(t->raw()), 64);  // the copy's first 16 values (offset 0)
    const size_t at = bytes.find(head);
    ASSERT_NE(at, std::string::npos);
    ASSERT_EQ(bytes.find(head, at + 1), std::string::npos);
    const float changed = t->data<float>()[0] + 1.0f;
    f.seekp(chunk.offset + static_cast<int64_t>(at));
    f.write(reinterpret_cast<const char*>(&changed), sizeof(float));
  }
  auto c = DcpCheckpoint::open(dir);
  ASSERT_TRUE(c.ok()) << c.status().message();
  auto common = read_torch_file(dir + "/common.pt");
  ASSERT_TRUE(common.ok());
  expect_message(read_megatron_dist_optimizer(*c, **common, (*common)->get("args"), "D"), StatusCode::kDataLoss,
                 "D: Megatron's distributed optimizer state in the 'dp_reshardable' layout: the last pipeline stage's "
                 "copy of the tied word embedding (its output_layer.weight) holds another 'exp_avg' state than the "
                 "first stage's embedding (1 of 1024 elements differ): expected equal copies, as Megatron keeps them");
}

// tests/data/megatron/torch_dist_adam_buckets_pp2_uneven: Megatron core_v0.15.3 at PP 2 x TP 1 with 3 layers and
// --decoder-first-pipeline-num-layers 1 (the first stage layer 0 and the embedding, the last layers 1 and 2, the final
// norm and the output layer): layers 0 and 1 hold the TP 1 run's state, layer 2 layer 0's with the masters and first
// moment negated. Read with the stages' layers of Megatron's uneven split, every element lands where it belongs.
TEST(MegatronBucketLayout, UnevenPipelineSplitReadsAtItsGlobalLayers) {
  Saved tp1, uneven("torch_dist_adam_buckets_pp2_uneven/iter_0000007");
  auto a = tp1.read();
  auto b = uneven.read();
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(b->step, 7);
  ASSERT_EQ(b->tensors.size(), 3u);
  int64_t compared = 0;
  for (const auto& [state, by_key] : a->tensors) {
    ASSERT_EQ(b->tensors.at(state).size(), by_key.size()) << state;
    for (const auto& [key, want] : by_key) {
      ASSERT_TRUE(b->tensors.at(state).count(key)) << state << " " << key;
      const Tensor& got = b->tensors.at(state).at(key);
      const bool stacked = key.rfind("decoder.layers.", 0) == 0;
      const int64_t per_layer = stacked ? want.numel() / 2 : want.numel();
      ASSERT_EQ(got.numel(), stacked ? 3 * per_layer : want.numel()) << state << " " << key;
      for (int64_t i = 0; i < want.numel(); ++i, ++compared)  // layers 0 and 1 (or the whole tensor)
        ASSERT_EQ(got.data<float>()[i], want.data<float>()[i]) << state << " " << key << " [" << i << "]";
      if (!stacked) continue;
      const float sign = state == "exp_avg_sq" ? 1.0f : -1.0f;
      for (int64_t i = 0; i < per_layer; ++i, ++compared)  // layer 2: layer 0's, negated but the second moment
        ASSERT_EQ(got.data<float>()[2 * per_layer + i], sign * want.data<float>()[i]) << state << " " << key << " [" << i << "]";
    }
  }
  EXPECT_GT(compared, 3 * 6048);
  // Read with the even split's stages (args without the first stage's size), the buckets do not fit.
  uneven.args->state->set("decoder_first_pipeline_num_layers", PyValue::none());
  expect_message(uneven.read(), StatusCode::kDataLoss,
                 "D: Megatron's distributed optimizer state in the 'dp_reshardable' layout: Megatron's args.num_layers "
                 "3, pipeline_model_parallel_size 2: expected num_layers divisible by PP (Megatron's own pipeline "
                 "split refuses them)");
  uneven.args->state->set("decoder_last_pipeline_num_layers", PyValue::integer(1));  // layers 0, 1 first: refused
  expect_error(uneven.read(), StatusCode::kDataLoss, "pipeline rank 0 of 2: the saved bucket sizes [1152, 2048]");
}

// What is still refused at TP or PP > 1, and args that do not fit the saved ranks.
TEST(MegatronBucketLayoutErrors, Tp2Pp2RunsGaleCannotRead) {
  const std::string what = "D: Megatron's distributed optimizer state in the 'dp_reshardable' layout";
  {
    Saved s(kTp2Pp2);  // args that say tied over a checkpoint with its own output layer
    s.args->state->set("untie_embeddings_and_output_weights", PyValue::boolean(false));
    expect_message(s.read(), StatusCode::kDataLoss,
                   "D: Megatron's args record tied embeddings (no untie_embeddings_and_output_weights) at PP > 1, but the "
                   "checkpoint holds an output_layer.weight: expected the embedding alone (the last stage's output "
                   "layer saved as its replica)");
  }
  {
    Saved s(kTp2Pp2);  // virtual pipeline chunks of a model whose layers do not split into them
    s.args->state->set("virtual_pipeline_model_parallel_size", PyValue::integer(2));
    expect_message(s.read(), StatusCode::kUnimplemented,
                   what + " saved at PP 2 with 2 virtual pipeline chunks and args.num_layers 2 not divisible by PP x "
                   "chunks: not supported yet (Gale rebuilds the buffers of even virtual pipeline chunks of a dense "
                   "model with untied embeddings)");
  }
  {
    Saved s(kTp2Pp2);  // the even split spelt out: read as saved
    s.args->state->set("decoder_first_pipeline_num_layers", PyValue::integer(1));
    EXPECT_TRUE(s.read().ok());
    s.args->state->set("decoder_first_pipeline_num_layers", PyValue::none());
    s.args->state->set("account_for_embedding_in_pipeline_split", PyValue::boolean(true));
    s.args->state->set("account_for_loss_in_pipeline_split", PyValue::boolean(true));
    EXPECT_TRUE(s.read().ok());
  }
  {
    Saved s(kTp2Pp2);  // both layers on the first stage: its buffers are not those of its saved buckets
    s.args->state->set("decoder_first_pipeline_num_layers", PyValue::integer(2));
    expect_message(s.read(), StatusCode::kDataLoss,
                   what + ", tensor-parallel rank 0 of 2, pipeline rank 0 of 2: the saved bucket sizes [1088, 640] "
                   "(optimizer.distributed.dp_group_idx_0.per_bucket_numel_unpadded/shard_0_1) differ from the "
                   "[1088, 1088, 768] of the buffer layout Gale rebuilt from the saved args (bucket size 1000, "
                   "transformer_impl 'local')");
  }
  {
    Saved s(kTp2Pp2);
    s.args->state->set("num_layers", PyValue::integer(3));
    expect_message(s.read(), StatusCode::kDataLoss,
                   what + ": Megatron's args.num_layers 3, pipeline_model_parallel_size 2: expected num_layers "
                   "divisible by PP (Megatron's own pipeline split refuses them)");
    s.args->state->set("account_for_embedding_in_pipeline_split", PyValue::boolean(true));
    s.args->state->set("decoder_last_pipeline_num_layers", PyValue::integer(1));
    expect_message(s.read(), StatusCode::kDataLoss,
                   what + ": Megatron's args.num_layers 3, pipeline_model_parallel_size 2, "
                   "decoder_last_pipeline_num_layers 1, account_for_embedding_in_pipeline_split: expected the "
                   "first/last stage sizes or the account_for flags, not both (Megatron's own pipeline split refuses "
                   "them)");
  }
  {
    Saved s(kTp2Pp2);  // TP 3: linear_proj's 16 columns have no TP 3 pieces
    s.args->state->set("tensor_model_parallel_size", PyValue::integer(3));
    expect_message(s.read(), StatusCode::kDataLoss,
                   "D: model tensor 'decoder.layers.self_attention.linear_proj.weight' (one layer's shape [16, 16]): "
                   "expected its dimension 1 to split into 3 equal tensor-parallel pieces "
                   "(args.tensor_model_parallel_size 3)");
  }
  {
    Saved s(kTp2Pp2);  // PP 2 alone: dp_group_idx_2 and _3 belong to no rank
    s.args->state->set("tensor_model_parallel_size", PyValue::integer(1));
    expect_message(s.read(), StatusCode::kDataLoss,
                   what + ": optimizer tensor 'optimizer.distributed.dp_group_idx_2.gbuf_idx_0.dtype_(torch.bfloat16, "
                   "torch.float32).bucket_idx_0.exp_avg': expected dp_group_idx_0 to 1 (one per model-parallel rank of "
                   "the saved args' TP 1 x PP 2)");
  }
  {
    Saved s(kTp2Pp2);  // without SwiGLU the fc1 pieces are plain row blocks: rank 0's masters are not its weights
    s.args->state->set("swiglu", PyValue::boolean(false));
    expect_message(s.read(), StatusCode::kDataLoss,
                   what + ", tensor-parallel rank 0 of 2, pipeline rank 0 of 2: the fp32 master copies that the buffer "
                   "layout rebuilt from the saved args (bucket size 1000, transformer_impl 'local') places at "
                   "'decoder.layers.mlp.linear_fc1.weight' (layer 0) are not its saved weights (192 of 384 elements "
                   "differ, the first at flat index 192): the layout is not the saving run's");
  }
  {
    Saved s("torch_dist_adam_dp_zero_tp2pp2/iter_0000007");  // the gathered buffers read as one TP 1 run's
    s.args->state->set("tensor_model_parallel_size", PyValue::integer(1));
    s.args->state->set("pipeline_model_parallel_size", PyValue::integer(1));
    expect_message(s.read(), StatusCode::kDataLoss,
                   "D: Megatron's distributed optimizer state in the 'dp_zero_gather_scatter' layout: the gathered "
                   "'param' holds 1728 elements: expected the 6528 of the buffer layout Gale rebuilt from the saved "
                   "args (bucket sizes [1024, 1280, 1408, 1408, 1408])");
  }
}

// dp_zero_gather_scatter records no per-bucket sizes: with Transformer Engine's parameter order (the same total
// here) the masters land on other weights, which the weights check refuses; a total that differs is named.
TEST(MegatronBucketLayoutErrors, GatheredBuffersInAnotherOrder) {
  const std::string dir = fixture("torch_dist_adam_dp_zero/iter_0000007");
  auto c = DcpCheckpoint::open(dir);
  auto common = read_torch_file(dir + "/common.pt");
  ASSERT_TRUE(c.ok() && common.ok());
  PyRef args;
  for (auto& [k, v] : (*common)->entries)
    if (k->s == "args") args = v;
  ASSERT_TRUE(read_megatron_dist_optimizer(*c, **common, args.get(), "D").ok());
  args->state->set("transformer_impl", PyValue::str("transformer_engine"));
  expect_error(read_megatron_dist_optimizer(*c, **common, args.get(), "D"), StatusCode::kDataLoss,
               "D: Megatron's distributed optimizer state in the 'dp_zero_gather_scatter' layout: the fp32 master "
               "copies that the buffer layout rebuilt from the saved args (bucket size 1000, transformer_impl "
               "'transformer_engine') places at '");
  args->state->set("transformer_impl", PyValue::str("local"));
  args->state->set("ddp_bucket_size", PyValue::integer(1100));
  expect_error(read_megatron_dist_optimizer(*c, **common, args.get(), "D"), StatusCode::kDataLoss,
               "the gathered 'param' holds 6528 elements: expected the ");
}

// tests/data/megatron/moe/torch_dist_adam_chained_buckets (tools/reference/megatron_moe_chained_optim_reference.py):
// the state of moe/torch_dist_adam_chained as Megatron main's chained [dense, experts] distributed optimizers save it in
// the dp_reshardable layout at EP 2 (DP 2, --ddp-bucket-size 300): the dense buffer under chained_0.…dp_group_idx_0
// (router and shared experts included, eight buckets), each EP rank's buffer of its two local experts under
// chained_1.…dp_group_idx_<EP rank> (four buckets). Read, it must be the fully_reshardable fixture's state bit for bit:
// every expert's at its global expert.
const std::string kMoeBuckets = "moe/torch_dist_adam_chained_buckets/iter_0000007";

TEST(MegatronBucketLayout, MoeChainedBuffersReadAsTheModelSpaceLayout) {
  Saved buckets(kMoeBuckets), whole("moe/torch_dist_adam_chained/iter_0000007");
  auto b = whole.read();
  ASSERT_TRUE(b.ok()) << b.status().message();
  // dp_reshardable, and (torch_dist_adam_chained_dp_zero) the same buffers gathered as dp_zero_gather_scatter saves them.
  for (const char* layout : {"dp_reshardable", "dp_zero_gather_scatter"}) {
    SCOPED_TRACE(layout);
    Saved saved(std::string(layout) == "dp_reshardable" ? kMoeBuckets : "moe/torch_dist_adam_chained_dp_zero/iter_0000007");
    auto a = saved.read();
    ASSERT_TRUE(a.ok()) << a.status().message();
    EXPECT_EQ(a->layout, layout);
    EXPECT_EQ(a->step, 7);
    EXPECT_EQ(a->type, "adam");
    ASSERT_EQ(a->tensors.size(), 3u);
    int64_t compared = 0;
    for (const auto& [state, by_key] : b->tensors) {
      ASSERT_TRUE(a->tensors.count(state)) << state;
      ASSERT_EQ(a->tensors.at(state).size(), by_key.size()) << state;
      for (const auto& [key, t] : by_key) {
        const Tensor& x = a->tensors.at(state).at(key);
        ASSERT_EQ(x.shape(), t.shape()) << key;
        EXPECT_EQ(std::memcmp(x.raw(), t.raw(), static_cast<size_t>(t.numel()) * sizeof(float)), 0) << state << " " << key;
        compared += t.numel();
      }
  }
  EXPECT_GT(compared, 3 * 6000);
  }
  // EP rank 1's buffer holds global experts 2 and 3: its first parameter in buffer order (the model order reversed)
  // is layer 1's expert 3 fc2.
  MegatronModelRank rank;
  rank.experts = true;
  rank.ep_size = 2;
  rank.ep_rank = 1;
  auto order = megatron_parameter_order(*buckets.c, "local", 2, "D", rank);
  ASSERT_TRUE(order.ok()) << order.status().message();
  ASSERT_EQ(order->size(), 8u);
  EXPECT_EQ(order->back().key, "decoder.layers.mlp.experts.experts.linear_fc2.weight");
  EXPECT_EQ(order->back().layer, 1);
  EXPECT_EQ(order->back().expert, 3);
  EXPECT_EQ(order->front().expert, 2);
  EXPECT_EQ(megatron_bucket_layout(*order, 300).bucket_numel_unpadded, (std::vector<int64_t>{384, 384, 384, 384}));
}

TEST(MegatronBucketLayoutErrors, MoeChainedBuffersThatDoNotFitTheArgs) {
  const std::string what = "D: Megatron's distributed optimizer state in the 'dp_reshardable' layout";
  {
    Saved s(kMoeBuckets);  // EP 1: the second EP rank's buffer belongs to no rank
    s.args->state->set("expert_model_parallel_size", PyValue::integer(1));
    expect_message(s.read(), StatusCode::kDataLoss,
                   what + ": optimizer tensor 'chained_1.optimizer.distributed.dp_group_idx_1.gbuf_idx_0.dtype_(torch."
                   "bfloat16, torch.float32).bucket_idx_0.exp_avg': expected dp_group_idx_0 to 0 (one per expert "
                   "model-parallel rank of the saved args' EP 1 x PP 1)");
  }
  {
    Saved s(kMoeBuckets);  // EP rank 0's buffer read as EP 4's: one expert per layer, other buckets
    s.args->state->set("expert_model_parallel_size", PyValue::integer(4));
    expect_message(s.read(), StatusCode::kDataLoss,
                   what + ", expert optimizer (chained_1), expert-parallel rank 0 of 4, pipeline rank 0 of 1: the saved "
                   "bucket sizes [384, 384, 384, 384] (chained_1.optimizer.distributed.dp_group_idx_0.per_bucket_numel_"
                   "unpadded/shard_0_1) differ from the [384, 384] of the buffer layout Gale rebuilt from the saved "
                   "args (bucket size 300, transformer_impl 'local')");
  }
  {
    Saved s(kMoeBuckets);  // another bucket size: the dense buffer's buckets differ
    s.args->state->set("ddp_bucket_size", PyValue::integer(2000));
    expect_error(s.read(), StatusCode::kDataLoss,
                 what + ", dense optimizer (chained_0): the saved bucket sizes [1024, 512, 960, 336, 384, 960, 336, "
                 "1024] (chained_0.optimizer.distributed.dp_group_idx_0.per_bucket_numel_unpadded/shard_0_1) differ");
  }
  {
    Saved s(kMoeBuckets);
    s.args->state->set("expert_tensor_parallel_size", PyValue::integer(2));
    expect_message(s.read(), StatusCode::kUnimplemented,
                   what + " with args.expert_tensor_parallel_size 2: not supported yet (Gale rebuilds the expert "
                   "buffers of whole experts, expert TP 1)");
  }
  {
    Saved s(kMoeBuckets);  // Transformer Engine's MoE layer order is not known
    s.args->state->set("transformer_impl", PyValue::str("transformer_engine"));
    expect_error(s.read(), StatusCode::kUnimplemented, "its place in Megatron's parameter order with transformer_impl "
                                                       "'transformer_engine'");
  }
}

// tests/data/megatron/torch_dist_adam_buckets_vpp (tools/reference/megatron_vpp_buckets_optim_reference.py): a 4-layer
// model's dp_reshardable state at PP 2 with two virtual pipeline chunks per rank (a buffer per chunk, gbuf_idx_<chunk>;
// only the first chunk bucketed at 1000 elements): layers 0 and 1 hold torch_dist_adam's AdamW state, layers 2 and 3
// the same with the masters and first moment negated. Read, every state must be that, at its global layer.
const std::string kVpp = "torch_dist_adam_buckets_vpp/iter_0000007";

TEST(MegatronBucketLayout, VirtualPipelineChunksReadAtTheirGlobalLayers) {
  Saved vpp(kVpp), plain("torch_dist_adam/iter_0000007");
  auto b = plain.read();
  ASSERT_TRUE(b.ok()) << b.status().message();
  // dp_reshardable, and (torch_dist_adam_dp_zero_vpp) dp_zero_gather_scatter's gathered buffers, one per chunk.
  for (const char* layout : {"dp_reshardable", "dp_zero_gather_scatter"}) {
    SCOPED_TRACE(layout);
    Saved saved(std::string(layout) == "dp_reshardable" ? kVpp : "torch_dist_adam_dp_zero_vpp/iter_0000007");
    auto a = saved.read();
    ASSERT_TRUE(a.ok()) << a.status().message();
    EXPECT_EQ(a->step, 7);
    EXPECT_EQ(a->layout, layout);
    ASSERT_EQ(a->tensors.size(), 3u);
    int64_t compared = 0;
    for (const auto& [state, by_key] : a->tensors)
      for (const auto& [key, t] : by_key) {
        Tensor want;
        if (state == "fp32_param") {
          auto w = plain.c->read_tensor(key);  // the f32 run's weights are its masters
          ASSERT_TRUE(w.ok()) << key;
          want = *w;
        } else {
          want = b->tensors.at(state).at(key);
        }
        const bool stacked = key.rfind("decoder.layers.", 0) == 0;
        ASSERT_EQ(t.numel(), want.numel() * (stacked ? 2 : 1)) << key;
        const float sign = state == "exp_avg_sq" ? 1.0f : -1.0f;
        for (int64_t i = 0; i < t.numel(); ++i) {
          const int64_t j = i % want.numel();
          ASSERT_EQ(t.data<float>()[i], (i < want.numel() ? 1.0f : sign) * want.data<float>()[j])
              << state << " " << key << " [" << i << "]";
        }
        compared += t.numel();
      }
    EXPECT_GT(compared, 3 * 10000);
  }
  // Pipeline rank 1's chunks: layer 1 (bucketed), then layer 3 with the final norm and output layer (one bucket).
  MegatronModelRank rank;
  rank.first_layer = 3;
  rank.num_layers = 1;
  rank.first_stage = false;
  auto order = megatron_parameter_order(*vpp.c, "local", 4, "D", rank);
  ASSERT_TRUE(order.ok()) << order.status().message();
  EXPECT_EQ(megatron_bucket_layout(*order, 0).bucket_numel_unpadded, (std::vector<int64_t>{3280}));
}

TEST(MegatronBucketLayoutErrors, VirtualPipelineChunksThatDoNotFitTheArgs) {
  const std::string what = "D: Megatron's distributed optimizer state in the 'dp_reshardable' layout";
  {
    Saved s(kVpp);  // the chunks after the first bucketed too: not Megatron's rule
    s.args->state->set("virtual_pipeline_model_parallel_size", PyValue::integer(1));
    s.args->state->set("num_layers_per_virtual_pipeline_stage", PyValue::none());
    expect_error(s.read(), StatusCode::kDataLoss, "expected a list with 1 {(param dtype, grad dtype): [bucket sizes]} "
                                                  "(one buffer per model chunk), found list");
  }
  {
    Saved s(kVpp);  // four chunks of one layer: 4 layers do not split into PP 2 x 4
    s.args->state->set("virtual_pipeline_model_parallel_size", PyValue::integer(4));
    expect_message(s.read(), StatusCode::kUnimplemented,
                   what + " saved at PP 2 with 4 virtual pipeline chunks and args.num_layers 4 not divisible by PP x "
                   "chunks: not supported yet (Gale rebuilds the buffers of even virtual pipeline chunks of a dense "
                   "model with untied embeddings)");
  }
  {
    Saved s(kVpp);
    s.args->state->set("untie_embeddings_and_output_weights", PyValue::boolean(false));
    expect_message(s.read(), StatusCode::kUnimplemented,
                   what + " saved at PP 2 with 2 virtual pipeline chunks and tied embeddings: not supported yet (Gale "
                   "rebuilds the buffers of even virtual pipeline chunks of a dense model with untied embeddings)");
  }
  {
    Saved s(kVpp);  // another bucket size: chunk 0's buckets differ
    s.args->state->set("ddp_bucket_size", PyValue::integer(2000));
    expect_message(s.read(), StatusCode::kDataLoss,
                   what + ", tensor-parallel rank 0 of 1, pipeline rank 0 of 2, model chunk 0: the saved bucket sizes "
                   "[1152, 2048] (optimizer.distributed.dp_group_idx_0.per_bucket_numel_unpadded/shard_0_1, buffer 0) "
                   "differ from the [2048, 1152] of the buffer layout Gale rebuilt from the saved args (bucket size 2000, "
                   "transformer_impl 'local')");
  }
}

// A checkpoint cut short: the file that holds a bucket is named.
TEST(MegatronBucketLayoutErrors, TruncatedCheckpoint) {
  testing_util::TempDir tmp;
  const std::string dir = tmp.file("iter_0000007");
  std::filesystem::copy(fixture(kDir), dir);
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".distcp") std::filesystem::resize_file(e.path(), 100);
  auto c = DcpCheckpoint::open(dir);
  ASSERT_TRUE(c.ok()) << c.status().message();
  auto common = read_torch_file(dir + "/common.pt");
  ASSERT_TRUE(common.ok());
  auto o = read_megatron_dist_optimizer(*c, **common, (*common)->get("args"), dir);
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find(".distcp"), std::string::npos) << o.status().message();
}

}  // namespace
}  // namespace gale
