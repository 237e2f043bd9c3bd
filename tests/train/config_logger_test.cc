// --config-logger-dir's pieces: the per-prefix file numbering, Python's JSON text, the
// TransformerConfig Megatron builds from its args, and the input_and_logits payload's layout.
#include "train/config_logger.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "ckpt/torch_file.h"
#include "core/tensor.h"
#include "model/micro_batch.h"
#include "train/pretrain_cli.h"

namespace gale {
namespace {

namespace fs = std::filesystem;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ConfigLogger, NumbersEachPrefixsCallsFromZero) {
  const std::string dir = ::testing::TempDir() + "gale_config_logger_" + std::to_string(getpid());
  fs::remove_all(dir);
  ConfigLogger logger(dir + "/sub", "1_0_0_2_0");  // the directory is created
  ASSERT_TRUE(logger.write_json("GPTModel", {{"a", 1}}).ok());
  ASSERT_TRUE(logger.write_json("GPTModel", {{"a", 2}}).ok());
  ASSERT_TRUE(logger.write_json("FP32Optimizer", {{"b", true}}).ok());
  EXPECT_EQ(slurp(dir + "/sub/GPTModel.rank_1_0_0_2_0.iter0.json"), "{\"a\": 1}");
  EXPECT_EQ(slurp(dir + "/sub/GPTModel.rank_1_0_0_2_0.iter1.json"), "{\"a\": 2}");
  EXPECT_EQ(slurp(dir + "/sub/FP32Optimizer.rank_1_0_0_2_0.iter0.json"), "{\"b\": true}");
  PyRef sd = PyValue::ordered_dict();
  sd->set("w", PyValue::tensor(Tensor::zeros({2})));
  ASSERT_TRUE(logger.write_torch("GPTModel_init_ckpt", *sd).ok());
  StatusOr<PyRef> back = read_torch_file(dir + "/sub/GPTModel_init_ckpt.rank_1_0_0_2_0.iter0.pth");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_TRUE((*back)->ordered);
  fs::remove_all(dir);
}

TEST(ConfigLogger, WritesJsonAsPythonsJsonDumps) {
  nlohmann::ordered_json j;
  j["z"] = 1;  // insertion order, not sorted
  j["lr"] = 0.003;
  j["eps"] = 1e-05;
  j["std"] = 1.0;
  j["none"] = nullptr;
  j["list"] = {1, "a", false};
  j["nested"] = {{"k", "v"}};
  EXPECT_EQ(python_json_dumps(j),
            "{\"z\": 1, \"lr\": 0.003, \"eps\": 1e-05, \"std\": 1.0, \"none\": null, \"list\": [1, \"a\", false], "
            "\"nested\": {\"k\": \"v\"}}");
}

TEST(ConfigLogger, TransformerConfigAsMegatronFillsItFromArgs) {
  const std::vector<std::string> argv = {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                                         "--seq-length", "16", "--max-position-embeddings", "32",
                                         "--micro-batch-size", "2", "--train-iters", "10", "--lr", "1e-3",
                                         "--mock-data", "--swiglu", "--group-query-attention", "--num-query-groups",
                                         "2", "--norm-epsilon", "1e-6", "--hidden-dropout", "0.0",
                                         "--config-logger-dir", "logs"};
  testing::PretrainCli cli;
  ASSERT_TRUE(cli.parse(argv).ok());
  const nlohmann::ordered_json c = megatron_transformer_config(cli.args, argv);
  EXPECT_EQ(c["num_layers"], 2);
  EXPECT_EQ(c["num_query_groups"], 2);
  EXPECT_EQ(c["kv_channels"], 16);
  EXPECT_EQ(c["ffn_hidden_size"], cli.args.model.ffn_hidden_size);  // derived: SwiGLU's 2/3 of 4h, rounded
  EXPECT_EQ(c["gated_linear_unit"], true);
  EXPECT_EQ(c["activation_func"], "<function silu>");
  EXPECT_DOUBLE_EQ(c["layernorm_epsilon"].get<double>(), 1e-6);  // from --norm-epsilon
  EXPECT_DOUBLE_EQ(c["hidden_dropout"].get<double>(), 0.0);      // the command line's value
  EXPECT_DOUBLE_EQ(c["attention_dropout"].get<double>(), 0.1);   // Megatron's default
  EXPECT_TRUE(c["num_moe_experts"].is_null());
  EXPECT_EQ(c["params_dtype"], "torch.float32");
  EXPECT_EQ(c["config_logger_dir"], "logs");
  EXPECT_FALSE(c.contains("init_method"));  // callables are left out
  // The dataclass's field order.
  std::vector<std::string> keys;
  for (auto it = c.begin(); it != c.end(); ++it) keys.push_back(it.key());
  EXPECT_EQ(keys.front(), "tensor_model_parallel_size");
  EXPECT_LT(std::find(keys.begin(), keys.end(), "num_layers"), std::find(keys.begin(), keys.end(), "hidden_size"));
}

TEST(ConfigLogger, InputAndLogitsPayloadIsMegatronsLayout) {
  MicroBatch mb;
  mb.B = 2;
  mb.S = 3;
  mb.tokens = {10, 11, 12, 20, 21, 22};  // [B, S]
  Tensor emb = Tensor::empty({6, 4});    // [S, B] rows: row s·B + b
  for (int64_t i = 0; i < 24; ++i) emb.data<float>()[i] = static_cast<float>(i);
  Tensor logits = Tensor::empty({6, 5});
  for (int64_t i = 0; i < 30; ++i) logits.data<float>()[i] = static_cast<float>(-i);
  PyRef p = input_and_logits_payload(mb, emb, logits, /*first_stage=*/true);
  std::vector<std::string> keys;
  for (const auto& [k, v] : p->entries) keys.push_back(k->s);
  EXPECT_EQ(keys, (std::vector<std::string>{"input_ids", "position_ids", "attention_mask", "decoder_input", "logits"}));
  const PyValue* ids = p->get("input_ids");
  ASSERT_EQ(ids->kind, PyValue::kTensor);
  EXPECT_EQ(ids->data.shape(), (Shape{2, 3}));
  EXPECT_EQ(ids->data.data<int64_t>()[4], 21);
  const PyValue* pos = p->get("position_ids");
  EXPECT_EQ(pos->data.data<int64_t>()[5], 2);  // no position ids given: 0..S-1 per sample
  EXPECT_EQ(p->get("attention_mask")->kind, PyValue::kNone);
  EXPECT_EQ(p->get("decoder_input")->data.shape(), (Shape{3, 2, 4}));
  EXPECT_EQ(p->get("logits")->data.shape(), (Shape{3, 2, 5}));
  EXPECT_EQ(p->get("logits")->data.data<float>()[7], -7.0f);
  // A last stage that is not the first: no ids (Megatron's get_batch), no embedding.
  PyRef last = input_and_logits_payload(mb, Tensor(), logits, /*first_stage=*/false);
  EXPECT_EQ(last->get("input_ids")->kind, PyValue::kNone);
  EXPECT_EQ(last->get("position_ids")->kind, PyValue::kNone);
  EXPECT_EQ(last->get("decoder_input")->kind, PyValue::kNone);
}

}  // namespace
}  // namespace gale
