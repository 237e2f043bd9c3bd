// `gale pretrain --config-logger-dir`: Megatron's config-logger files, per rank and call; the
// initial state dict under Megatron's local names and TP pieces; input_and_logits whose embedding
// output is the state dict's embedding of the ids and whose logits give the logged loss.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ckpt/torch_file.h"
#include "cli/log_line.h"
#include "cli/mpi_cli.h"
#include "subprocess.h"

namespace gale {
namespace {

namespace fs = std::filesystem;
using testing::kMpiEnv;
using testing::tiny_gpt_pretrain;

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + name + "_" + std::to_string(getpid());
  fs::remove_all(dir);
  return dir;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

PyRef read_pth(const std::string& path) {
  StatusOr<PyRef> r = read_torch_file(path);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? r.value() : PyValue::dict();
}

const Tensor& tensor(const PyRef& d, const std::string& key) {
  static const Tensor none;
  const PyValue* v = d->get(key);
  EXPECT_TRUE(v && v->kind == PyValue::kTensor) << key;
  return v && v->kind == PyValue::kTensor ? v->data : none;
}

// The number of consecutive files <dir>/<prefix>.iter0.pth, iter1, ...
int count_calls(const std::string& dir, const std::string& stem) {
  int n = 0;
  while (fs::exists(dir + "/" + stem + ".iter" + std::to_string(n) + ".pth")) ++n;
  return n;
}

// One process: every start-up file, and the input_and_logits of each of the 3 x 2 micro-batches
// (2 samples each). A wide initialisation makes the logits far from uniform, so that they give the
// logged loss only when they and the ids are where Megatron puts them.
TEST(ConfigLoggerCli, WritesMegatronsFilesWithConsistentContents) {
  const std::string dir = fresh_dir("gale_config_logger_cli");
  const test::RunResult r = test::run_with_timeout(
      tiny_gpt_pretrain(1, 3,
                        {"--hidden-dropout", "0", "--attention-dropout", "0", "--log-interval", "1",
                         "--micro-batch-size", "2", "--init-method-std", "0.5"},
                        {"--config-logger-dir", dir}),
      kMpiEnv, 600);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string rank = ".rank_0_0_0_0_0";
  const nlohmann::json model = read_json(dir + "/GPTModel" + rank + ".iter0.json");
  ASSERT_FALSE(model.is_discarded());
  EXPECT_EQ(model["config"]["num_layers"], 2);
  EXPECT_EQ(model["config"]["hidden_size"], 64);
  EXPECT_EQ(model["config"]["num_query_groups"], 4);
  EXPECT_EQ(model["config"]["ffn_hidden_size"], 256);
  EXPECT_EQ(model["config"]["kv_channels"], 16);
  EXPECT_EQ(model["config"]["config_logger_dir"], dir);
  // --vocab-size 4096 and the end-of-document id, padded to a multiple of 128
  constexpr int64_t V = 4224;
  EXPECT_EQ(model["vocab_size"], V);
  EXPECT_EQ(model["pre_process"], true);
  EXPECT_EQ(model["share_embeddings_and_output_weights"], true);
  const nlohmann::json ddp = read_json(dir + "/DistributedDataParallel" + rank + ".iter0.json");
  EXPECT_EQ(ddp["ddp_config"]["overlap_grad_reduce"], false);
  EXPECT_TRUE(ddp["ddp_config"]["bucket_size"].is_null());
  const nlohmann::json opt = read_json(dir + "/FP32Optimizer" + rank + ".iter0.json");
  EXPECT_DOUBLE_EQ(opt["config"]["lr"].get<double>(), 3e-3);
  EXPECT_EQ(opt["config"]["optimizer"], "adam");
  EXPECT_FALSE(fs::exists(dir + "/GPTModel" + rank + ".iter1.json"));

  const PyRef sd = read_pth(dir + "/GPTModel_init_ckpt" + rank + ".iter0.pth");
  EXPECT_TRUE(sd->ordered);
  const Tensor& E = tensor(sd, "embedding.word_embeddings.weight");
  const Tensor& P = tensor(sd, "embedding.position_embeddings.weight");
  ASSERT_EQ(E.shape(), (Shape{V, 64}));
  ASSERT_EQ(P.shape(), (Shape{32, 64}));
  EXPECT_EQ(tensor(sd, "decoder.layers.1.self_attention.linear_qkv.weight").shape(), (Shape{192, 64}));
  ASSERT_NE(sd->get("decoder.layers.1.mlp.linear_fc2._extra_state"), nullptr);
  EXPECT_EQ(sd->get("decoder.layers.1.mlp.linear_fc2._extra_state")->kind, PyValue::kNone);
  EXPECT_EQ(sd->get("output_layer.weight"), nullptr);  // tied on one stage

  // 3 iterations of 2 micro-batches.
  ASSERT_EQ(count_calls(dir, "input_and_logits" + rank), 6);
  const PyRef first = read_pth(dir + "/input_and_logits" + rank + ".iter0.pth");
  const Tensor& ids = tensor(first, "input_ids");
  const Tensor& pos = tensor(first, "position_ids");
  const Tensor& emb = tensor(first, "decoder_input");
  ASSERT_EQ(ids.shape(), (Shape{2, 32}));
  ASSERT_EQ(emb.shape(), (Shape{32, 2, 64}));
  EXPECT_EQ(first->get("attention_mask")->kind, PyValue::kNone);
  // The embedding output is the initial embedding of the ids at their positions (no dropout).
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t s = 0; s < 32; ++s) {
      const int64_t id = ids.data<int64_t>()[b * 32 + s], p = pos.data<int64_t>()[b * 32 + s];
      for (int64_t h = 0; h < 64; ++h)
        ASSERT_NEAR(emb.data<float>()[(s * 2 + b) * 64 + h],
                    E.data<float>()[id * 64 + h] + P.data<float>()[p * 64 + h], 1e-5f)
            << b << " " << s << " " << h;
    }
  // Each iteration's logits give its logged loss (labels: the next id; a sample's last label is
  // not in the file, so 31 of its 32 tokens).
  const std::vector<double> loss = testing::logged_values(r.output, "lm loss");
  ASSERT_EQ(loss.size(), 3u);
  for (int it = 0; it < 3; ++it) {
    double sum = 0;
    for (int mb = 2 * it; mb < 2 * it + 2; ++mb) {
      const PyRef call = read_pth(dir + "/input_and_logits" + rank + ".iter" + std::to_string(mb) + ".pth");
      const Tensor& in = tensor(call, "input_ids");
      const Tensor& logits = tensor(call, "logits");
      ASSERT_EQ(logits.shape(), (Shape{32, 2, V}));
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t s = 0; s + 1 < 32; ++s) {
          const float* row = logits.data<float>() + (s * 2 + b) * V;
          double mx = row[0], z = 0;
          for (int64_t v = 0; v < V; ++v) mx = std::max<double>(mx, row[v]);
          for (int64_t v = 0; v < V; ++v) z += std::exp(row[v] - mx);
          sum += mx + std::log(z) - row[in.data<int64_t>()[b * 32 + s + 1]];
        }
    }
    EXPECT_NEAR(sum / (2 * 2 * 31), loss[it], 0.02 * loss[it]) << "iteration " << it + 1;
  }
  // Micro-batches of one sample: the first iteration's samples 0 and 1 are the two columns b of
  // the first micro-batch above, ids and logits alike.
  const std::string one = dir + "_mb1";
  const test::RunResult r1 = test::run_with_timeout(
      tiny_gpt_pretrain(1, 1, {"--hidden-dropout", "0", "--attention-dropout", "0", "--init-method-std", "0.5"},
                        {"--config-logger-dir", one}),
      kMpiEnv, 600);
  ASSERT_EQ(r1.exit_code, 0) << r1.output;
  const Tensor& both = tensor(first, "logits");
  for (int64_t b = 0; b < 2; ++b) {
    const PyRef alone = read_pth(one + "/input_and_logits" + rank + ".iter" + std::to_string(b) + ".pth");
    const Tensor& ids1 = tensor(alone, "input_ids");
    const Tensor& logits1 = tensor(alone, "logits");
    ASSERT_EQ(logits1.shape(), (Shape{32, 1, V}));
    for (int64_t s = 0; s < 32; ++s) {
      ASSERT_EQ(ids1.data<int64_t>()[s], ids.data<int64_t>()[b * 32 + s]) << b << " " << s;
      for (int64_t v = 0; v < V; ++v)
        ASSERT_NEAR(logits1.data<float>()[s * V + v], both.data<float>()[(s * 2 + b) * V + v], 1e-3f)
            << b << " " << s << " " << v;
    }
  }
  fs::remove_all(one);
  fs::remove_all(dir);
}

// Two ranks: tensor parallelism writes each rank's vocabulary slice and TP pieces, which put
// together are the one-process initial state; pipeline parallelism numbers each stage's layers
// from 0 and only the last stage logs the forwards, without ids.
TEST(ConfigLoggerCli, TensorAndPipelineParallelRanks) {
  const std::string one = fresh_dir("gale_config_logger_tp1");
  const std::string tp2 = fresh_dir("gale_config_logger_tp2");
  const std::string pp2 = fresh_dir("gale_config_logger_pp2");
  // Both pad the vocabulary (4096 ids and the end of document) to 4352: a multiple of 256 x TP 1
  // and of 128 x TP 2.
  test::RunResult r = test::run_with_timeout(
      tiny_gpt_pretrain(1, 1, {"--make-vocab-size-divisible-by", "256"}, {"--config-logger-dir", one}), kMpiEnv, 600);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = test::run_with_timeout(
      tiny_gpt_pretrain(2, 1, {"--tensor-model-parallel-size", "2"}, {"--config-logger-dir", tp2}), kMpiEnv, 600);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = test::run_with_timeout(
      tiny_gpt_pretrain(2, 1, {"--pipeline-model-parallel-size", "2"}, {"--config-logger-dir", pp2}), kMpiEnv, 600);
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const PyRef whole = read_pth(one + "/GPTModel_init_ckpt.rank_0_0_0_0_0.iter0.pth");
  const PyRef t0 = read_pth(tp2 + "/GPTModel_init_ckpt.rank_0_0_0_0_0.iter0.pth");
  const PyRef t1 = read_pth(tp2 + "/GPTModel_init_ckpt.rank_1_0_0_0_0.iter0.pth");
  // Megatron's splits: rows of the column-parallel layers (and their biases), columns of the
  // row-parallel weights; the rest replicated.
  auto check = [&](const std::string& name, bool rows, bool split) {
    const Tensor& w = tensor(whole, name);
    const Tensor& a = tensor(t0, name);
    const Tensor& b = tensor(t1, name);
    ASSERT_EQ(a.shape(), b.shape()) << name;
    const int64_t R = w.shape()[0], C = w.ndim() > 1 ? w.shape()[1] : 1;
    for (int64_t i = 0; i < R; ++i)
      for (int64_t j = 0; j < C; ++j) {
        float piece;
        if (!split) {
          piece = a.data<float>()[i * C + j];
          ASSERT_EQ(b.data<float>()[i * C + j], piece) << name;
        } else if (rows) {
          piece = (i < R / 2 ? a : b).data<float>()[(i % (R / 2)) * C + j];
        } else {
          piece = (j < C / 2 ? a : b).data<float>()[i * (C / 2) + j % (C / 2)];
        }
        ASSERT_EQ(piece, w.data<float>()[i * C + j]) << name << " " << i << " " << j;
      }
  };
  check("embedding.word_embeddings.weight", true, true);
  check("embedding.position_embeddings.weight", true, false);
  for (const std::string l : {"decoder.layers.0.", "decoder.layers.1."}) {
    check(l + "self_attention.linear_qkv.weight", true, true);
    check(l + "self_attention.linear_qkv.bias", true, true);
    check(l + "self_attention.linear_proj.weight", false, true);
    check(l + "self_attention.linear_proj.bias", true, false);
    check(l + "mlp.linear_fc1.weight", true, true);
    check(l + "mlp.linear_fc2.weight", false, true);
    check(l + "input_layernorm.weight", true, false);
  }
  const PyRef logits_t1 = read_pth(tp2 + "/input_and_logits.rank_1_0_0_0_0.iter0.pth");
  EXPECT_EQ(tensor(logits_t1, "logits").shape(), (Shape{32, 1, 2176}));

  const nlohmann::json stage0 = read_json(pp2 + "/GPTModel.rank_0_0_0_0_0.iter0.json");
  const nlohmann::json stage1 = read_json(pp2 + "/GPTModel.rank_0_0_0_1_0.iter0.json");
  EXPECT_EQ(stage0["post_process"], false);
  EXPECT_EQ(stage1["pre_process"], false);
  EXPECT_EQ(stage1["post_process"], true);
  const PyRef last = read_pth(pp2 + "/GPTModel_init_ckpt.rank_0_0_0_1_0.iter0.pth");
  EXPECT_NE(last->get("decoder.layers.0.mlp.linear_fc1.weight"), nullptr);  // the stage's own numbering
  EXPECT_EQ(last->get("decoder.layers.1.mlp.linear_fc1.weight"), nullptr);
  EXPECT_NE(last->get("output_layer.weight"), nullptr);  // the tied embedding's copy
  EXPECT_EQ(last->get("embedding.word_embeddings.weight"), nullptr);
  EXPECT_EQ(count_calls(pp2, "input_and_logits.rank_0_0_0_0_0"), 0);
  ASSERT_EQ(count_calls(pp2, "input_and_logits.rank_0_0_0_1_0"), 4);
  const PyRef call = read_pth(pp2 + "/input_and_logits.rank_0_0_0_1_0.iter0.pth");
  EXPECT_EQ(call->get("input_ids")->kind, PyValue::kNone);
  EXPECT_EQ(call->get("decoder_input")->kind, PyValue::kNone);
  EXPECT_EQ(tensor(call, "logits").shape(), (Shape{32, 1, 4224}));
  for (const std::string& d : {one, tp2, pp2}) fs::remove_all(d);
}

}  // namespace
}  // namespace gale
