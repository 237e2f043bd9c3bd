// `gale convert` as a user runs it: HF -> Gale, `gale generate` and a TP2·PP2 `gale pretrain` on the result, and back to HF.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <span>

#include "ckpt/safetensors.h"
#include "ckpt/temp_dir.h"
#include "data/indexed_dataset.h"
#include "cli/mpi_cli.h"
#include "subprocess.h"

#include <nlohmann/json.hpp>

namespace gale {
namespace {

using testing_util::TempDir;

using testing::kMpiEnv;

std::string fixture(const std::string& name) { return std::string(GALE_TEST_DATA_DIR) + "/hf/" + name; }

test::RunResult gale(std::vector<std::string> args) {
  args.insert(args.begin(), GALE_BINARY);
  return test::run_with_timeout(args, {"OMP_NUM_THREADS=1"}, 120);
}

test::RunResult convert_to_gale(const std::string& hf, const std::string& out, std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {"convert", "--load-model-type", "hf", "--save-model-type", "gale",
                                "--load-dir", hf, "--save-dir", out};
  a.insert(a.end(), extra.begin(), extra.end());
  return gale(a);
}

std::vector<int64_t> ints(const std::string& safetensors, const std::string& name) {
  Tensor t = SafetensorsFile::open(safetensors).value().read(name, DType::kI64).value();
  return std::vector<int64_t>(t.data<int64_t>(), t.data<int64_t>() + t.numel());
}

TEST(GaleConvert, ListedByHelp) {
  test::RunResult r = gale({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("  convert "), std::string::npos) << r.output;
  r = gale({"convert", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("--load-model-type"), std::string::npos) << r.output;
}

TEST(GaleConvert, UsageErrorsAreOneLine) {
  TempDir tmp;
  test::RunResult r = gale({"convert", "--load-model-type", "hf", "--save-model-type", "hf", "--load-dir", "a",
                            "--save-dir", "b"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "gale convert: error: --load-model-type hf --save-model-type hf: expected one side hf and the "
                      "other gale (or gale to gale with --lora-load)\n");
  r = convert_to_gale(tmp.file("missing"), tmp.file("out"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.output, "gale convert: error: --load-dir " + tmp.file("missing") + ": not a directory\n");
  r = convert_to_gale(fixture("llama"), tmp.file("out"), {"--model-type-hf", "qwen2"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--model-type-hf qwen2 does not match"), std::string::npos) << r.output;
  r = convert_to_gale(fixture("deepseek_v3"), tmp.file("out"), {"--mtp-num-layers", "-2"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "gale convert: error: --mtp-num-layers: expected a non-negative integer, found -2\n");
  r = convert_to_gale(fixture("deepseek_v3"), tmp.file("out"), {"--mtp-num-layers", "1"});  // the fixture has none
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.output, "gale convert: error: --mtp-num-layers 1: expected 0 to the 0 multi-token-prediction layers of " +
                          fixture("deepseek_v3") + "/config.json (num_nextn_predict_layers)\n");
  // MindSpeed-LLM's --num-layer-list: one count per target pipeline stage, summing to the model's
  // layers (the fixture has 2); only for a checkpoint written from hf.
  r = convert_to_gale(fixture("llama"), tmp.file("out"), {"--target-pipeline-parallel-size", "2", "--num-layer-list",
                                                          "1,2"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.output, "gale convert: error: --num-layer-list 1,2 places 3 layers: expected the 2 layers of " +
                          fixture("llama") + "/config.json\n");
  r = convert_to_gale(fixture("llama"), tmp.file("out"), {"--num-layer-list", "1,1"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.output, "gale convert: error: --num-layer-list 1,1: expected one count per target pipeline stage "
                      "(--target-pipeline-parallel-size 1), found 2\n");
  r = convert_to_gale(fixture("llama"), tmp.file("out"), {"--target-pipeline-parallel-size", "2", "--num-layer-list",
                                                          "3,-1"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.output, "gale convert: error: --num-layer-list 3,-1: expected layer counts >= 0, found -1\n");
  r = gale({"convert", "--load-model-type", "gale", "--save-model-type", "hf", "--load-dir", "a", "--save-dir", "b",
            "--num-layer-list", "1,1"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "gale convert: error: --num-layer-list describes the pipeline stages of a checkpoint written "
                      "from hf: expected --load-model-type hf, found gale (a Gale checkpoint holds whole tensors "
                      "whatever split it was trained with)\n");
  r = convert_to_gale(fixture("llama"), tmp.file("out"), {"--target-pipeline-parallel-size", "2", "--num-layer-list",
                                                          "0,2"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--num-layer-list 0,2: the layers of the 2 pipeline stages"), std::string::npos) << r.output;
}

// --use-ema (the parameter EMA of --optimizer-selection fused_ema_adamw): Gale -> HF only, and the
// checkpoint must hold the EMA (tests/train/ema_adamw_test.cc exports one).
TEST(GaleConvert, UseEmaErrors) {
  TempDir tmp;
  test::RunResult r = convert_to_gale(fixture("llama"), tmp.file("gale"), {"--use-ema"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "gale convert: error: --use-ema: exports a Gale checkpoint's parameter EMA, expected "
                      "--load-model-type gale --save-model-type hf, found hf -> gale\n");
  r = convert_to_gale(fixture("llama"), tmp.file("gale"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = gale({"convert", "--load-model-type", "gale", "--save-model-type", "hf", "--load-dir", tmp.file("gale"),
            "--save-dir", tmp.file("hf"), "--use-ema"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.output, "gale convert: error: --use-ema: checkpoint " + tmp.file("gale") +
                          "/iter_0000000 holds no parameter EMA (expected one saved by `gale pretrain "
                          "--optimizer-selection fused_ema_adamw` with its optimizer state)\n");
}

// HF -> Gale, then `gale generate --use-checkpoint-args` continues the fixture's tokens greedily
// exactly as transformers does (mistral_swa: as the plain-torch reference with its window of 4,
// tools/reference/sliding_window_fixture.py; the KV cache then holds keys older than the window).
TEST(GaleConvert, GenerateFromTheConvertedCheckpointMatchesTransformersGreedy) {
  TempDir tmp;
  for (const char* name :
       {"gpt2", "bloom", "llama", "mixtral", "qwen2_moe", "deepseek_v3", "qwen3", "mistral_swa", "qwen3_moe",
        "qwen3_next", "gpt_oss", "internlm2", "phi3", "baichuan2", "chatglm3"}) {
    const std::string out = tmp.file(name);
    test::RunResult r = convert_to_gale(fixture(name), out);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string golden = fixture(name) + "/golden.safetensors";
    std::string prompt, expected;
    for (int64_t t : ints(golden, "tokens")) prompt += (prompt.empty() ? "" : " ") + std::to_string(t);
    expected = prompt;
    for (int64_t t : ints(golden, "greedy")) expected += " " + std::to_string(t);
    r = gale({"generate", "--load", out, "--use-checkpoint-args", "--tokenizer-type", "NullTokenizer", "--vocab-size",
              "99", "--prompt", prompt, "--max-new-tokens", "5", "--temperature", "0"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(expected + "\n"), std::string::npos) << name << ": expected " << expected << "\n"
                                                                << r.output;
  }
}

// --add-eos-token: with the NullTokenizer a token is its id; greedy decoding of the converted
// LLaMA stops before the first golden token made a stop token (and beam search never keeps it).
TEST(GaleConvert, AddEosTokenStopsGeneration) {
  TempDir tmp;
  const std::string out = tmp.file("llama");
  test::RunResult r = convert_to_gale(fixture("llama"), out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string golden = fixture("llama") + "/golden.safetensors";
  std::string prompt;
  for (int64_t t : ints(golden, "tokens")) prompt += (prompt.empty() ? "" : " ") + std::to_string(t);
  const std::vector<int64_t> greedy = ints(golden, "greedy");
  const size_t cut = 2;
  ASSERT_EQ(std::find(greedy.begin(), greedy.begin() + cut, greedy[cut]), greedy.begin() + cut);
  std::string expected = prompt;
  for (size_t i = 0; i < cut; ++i) expected += " " + std::to_string(greedy[i]);
  for (const std::string beams : {"1", "2"}) {
    r = gale({"generate", "--load", out, "--use-checkpoint-args", "--tokenizer-type", "NullTokenizer", "--vocab-size",
              "99", "--prompt", prompt, "--max-new-tokens", "5", "--temperature", "0", "--num-beams", beams,
              "--add-eos-token", std::to_string(greedy[cut])});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    if (beams == "1") {
      EXPECT_NE(r.output.find(expected + "\n"), std::string::npos) << expected << "\n" << r.output;
    }
    const size_t line_end = r.output.find('\n');
    EXPECT_EQ(r.output.substr(0, line_end).find(" " + std::to_string(greedy[cut]) + " "), std::string::npos)
        << r.output;
  }
}

// `gale generate --num-beams N` from the converted GPT-2 and LLaMA continues the fixture's prompt
// with the tokens of tools/reference/beam_reference.py (Megatron's beam-search rules over
// transformers' logits; transformers' own beam search gives the same tokens there).
TEST(GaleConvert, BeamSearchFromTheConvertedCheckpointMatchesTheReference) {
  TempDir tmp;
  for (const char* name : {"gpt2", "llama"}) {
    const std::string out = tmp.file(name);
    test::RunResult r = convert_to_gale(fixture(name), out);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::ifstream in(fixture(name) + "/beam.json");
    const nlohmann::json ref = nlohmann::json::parse(in);
    std::string prompt;
    for (int64_t t : ref["prompt"]) prompt += (prompt.empty() ? "" : " ") + std::to_string(t);
    for (const nlohmann::json& c : ref["cases"]) {
      std::string expected = prompt;
      for (int64_t t : c["tokens"]) expected += " " + std::to_string(t);
      r = gale({"generate", "--load", out, "--use-checkpoint-args", "--tokenizer-type", "NullTokenizer", "--vocab-size",
                "99", "--prompt", prompt, "--num-beams", std::to_string(c["num_beams"].get<int>()), "--max-new-tokens",
                std::to_string(c["max_new_tokens"].get<int>()), "--length-penalty",
                std::to_string(c["length_penalty"].get<double>())});
      ASSERT_EQ(r.exit_code, 0) << r.output;
      EXPECT_NE(r.output.find(expected + "\n"), std::string::npos) << name << " " << c.dump() << "\n" << r.output;
      std::smatch m;
      ASSERT_TRUE(std::regex_search(r.output, m, std::regex(R"(beams, score (-?[0-9.]+)\])"))) << r.output;
      EXPECT_NEAR(std::stod(m[1]), c["score"].get<double>(), 1e-4) << name << " " << c.dump();
    }
  }
}

// The small training corpus of the --finetune tests below: 40 documents of 40 random ids below 99.
void write_random_documents(const std::string& prefix) {
  auto w = IndexedDatasetWriter::create(prefix, TokenDType::kUInt16).value();
  std::mt19937 rng(5);
  for (int d = 0; d < 40; ++d) {
    std::vector<int32_t> doc(40);
    for (int32_t& t : doc) t = static_cast<int32_t>(rng() % 99);
    const int32_t len = 40;
    ASSERT_TRUE(w->add_document(doc, std::span<const int32_t>(&len, 1)).ok());
  }
  ASSERT_TRUE(w->finalize().ok());
}

// gpt-oss at EP 2: the converted checkpoint (sinks, router bias, experts split over the expert-parallel
// ranks) loads into a 2-rank `gale pretrain --finetune --lr 0` given gpt-oss's flags, and the
// checkpoint it saves converts back (bf16) to the fixture's tensors bit for bit.
TEST(GaleConvert, GptOssAtEp2LoadsItAndItsCheckpointConvertsBack) {
  TempDir tmp;
  test::RunResult r = convert_to_gale(fixture("gpt_oss"), tmp.file("gale"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  write_random_documents(tmp.file("data_text_document"));
  const std::vector<std::string> argv = {
      GALE_MPIEXEC, "--oversubscribe", "--bind-to", "none", "-np", "2", GALE_BINARY, "pretrain", "--num-layers", "3",
      "--hidden-size", "64", "--ffn-hidden-size", "32", "--num-attention-heads", "4", "--group-query-attention",
      "--num-query-groups", "2", "--kv-channels", "24", "--normalization", "RMSNorm", "--norm-epsilon", "1e-5",
      "--quick-geglu", "--glu-linear-offset", "1.0", "--activation-func-clamp-value", "7.0", "--softmax-type",
      "learnable", "--position-embedding-type", "yarn", "--rotary-base", "10000", "--rotary-scaling-factor", "4",
      "--yarn-original-max-position-embeddings", "256", "--no-yarn-correction-range-round-to-int", "--sliding-window",
      "4", "--window-attn-skip-freq", "2", "--untie-embeddings-and-output-weights", "--max-position-embeddings", "1024",
      "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32", "--expert-model-parallel-size",
      "2", "--moe-token-dispatcher-type", "alltoall", "--seq-length", "16", "--micro-batch-size", "1",
      "--global-batch-size", "2", "--train-iters", "1", "--lr", "0", "--attention-dropout", "0", "--hidden-dropout", "0",
      "--tokenizer-type", "NullTokenizer", "--vocab-size", "99", "--data-path", tmp.file("data_text_document"),
      "--split", "100,0,0", "--eval-iters", "0", "--load", tmp.file("gale"), "--finetune", "--save", tmp.file("tuned"),
      "--save-interval", "1", "--num-threads", "1"};
  r = test::run_with_timeout(argv, kMpiEnv, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("successfully loaded checkpoint from " + tmp.file("gale")), std::string::npos) << r.output;
  r = gale({"convert", "--load-model-type", "gale", "--save-model-type", "hf", "--load-dir", tmp.file("tuned"),
            "--save-dir", tmp.file("hf"), "--save-dtype", "bf16", "--vocab-size", "100"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  SafetensorsFile original = SafetensorsFile::open(fixture("gpt_oss") + "/model.safetensors").value();
  SafetensorsFile back = SafetensorsFile::open(tmp.file("hf/model.safetensors")).value();
  EXPECT_EQ(back.entries().size(), original.entries().size());
  for (const SafetensorsEntry& e : original.entries()) {
    Tensor a = original.read(e.name, DType::kF32).value();
    auto b = back.read(e.name, DType::kF32);
    ASSERT_TRUE(b.ok()) << b.status().message();
    ASSERT_EQ(a.shape(), b->shape()) << e.name;
    EXPECT_EQ(0, std::memcmp(a.data<float>(), b->data<float>(), a.nbytes())) << e.name;
  }
}

// A converted LLaMA loads into `gale pretrain --finetune` at TP 2 x PP 2 (4 ranks); with --lr 0
// the checkpoint that run saves holds the same weights, and converting it back to HF returns the
// original tensors bit for bit (the reader assembles them from the TP/PP pieces).
TEST(GaleConvert, PretrainAtTp2Pp2LoadsItAndItsCheckpointConvertsBack) {
  TempDir tmp;
  test::RunResult r = convert_to_gale(fixture("llama"), tmp.file("gale"), {"--target-tensor-parallel-size", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("vocabulary 100 padded to 256"), std::string::npos) << r.output;
  write_random_documents(tmp.file("data_text_document"));
  std::vector<std::string> argv = {GALE_MPIEXEC, "--oversubscribe", "--bind-to", "none", "-np", "4", GALE_BINARY,
                                   "pretrain", "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128",
                                   "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2",
                                   "--swiglu", "--normalization", "RMSNorm", "--norm-epsilon", "1e-6",
                                   "--position-embedding-type", "rope", "--rotary-base", "1000",
                                   "--disable-bias-linear", "--untie-embeddings-and-output-weights",
                                   "--max-position-embeddings", "64", "--seq-length", "16", "--micro-batch-size", "1",
                                   "--global-batch-size", "2", "--train-iters", "1", "--lr", "0",
                                   "--attention-dropout", "0", "--hidden-dropout", "0", "--tokenizer-type",
                                   "NullTokenizer", "--vocab-size", "99", "--data-path",
                                   tmp.file("data_text_document"), "--split", "100,0,0", "--eval-iters", "0",
                                   "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                                   "--load", tmp.file("gale"), "--finetune", "--save", tmp.file("tuned"),
                                   "--save-interval", "1", "--num-threads", "1"};
  // Without --finetune / --no-load-optim the missing optimizer state is one clear error (one process).
  std::vector<std::string> one(argv.begin() + 6, argv.end());
  one.erase(std::find(one.begin(), one.end(), "--finetune"));
  for (const char* flag : {"--tensor-model-parallel-size", "--pipeline-model-parallel-size"})
    one.erase(std::find(one.begin(), one.end(), flag), std::find(one.begin(), one.end(), flag) + 2);
  one.insert(one.end(), {"--make-vocab-size-divisible-by", "256"});  // the 256 rows padded for TP 2
  r = test::run_with_timeout(one, {"OMP_NUM_THREADS=1"}, 300);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("holds no optimizer state (saved with --no-save-optim, or written by gale convert): load "
                          "it with --finetune or --no-load-optim"),
            std::string::npos)
      << r.output;
  r = test::run_with_timeout(argv, kMpiEnv, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("world 4 = TP 2 x CP 1 x DP 1 x PP 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("successfully loaded checkpoint from " + tmp.file("gale")), std::string::npos) << r.output;
  // Saved by 4 ranks: the TP-split tensors are pieces ("name@offsets") in several shards.
  EXPECT_TRUE(std::filesystem::exists(tmp.file("tuned/iter_0000001/shard_00003.safetensors")));
  EXPECT_TRUE(SafetensorsFile::open(tmp.file("tuned/iter_0000001/shard_00001.safetensors"))
                  .value()
                  .contains("embedding.word_embeddings.weight@128,0"));
  r = gale({"convert", "--load-model-type", "gale", "--save-model-type", "hf", "--load-dir", tmp.file("tuned"),
            "--save-dir", tmp.file("hf"), "--vocab-size", "100"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  test::RunResult padded = gale({"convert", "--load-model-type", "gale", "--save-model-type", "hf", "--load-dir",
                                 tmp.file("tuned"), "--save-dir", tmp.file("hf_padded")});
  ASSERT_EQ(padded.exit_code, 0) << padded.output;
  EXPECT_NE(padded.output.find("does not record the tokenizer's vocabulary size; keeping all 256 rows"),
            std::string::npos)
      << padded.output;
  EXPECT_EQ(SafetensorsFile::open(tmp.file("hf_padded/model.safetensors")).value().find("lm_head.weight")->shape,
            (Shape{256, 64}));
  size_t compared = 0;
  for (const char* shard : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
    SafetensorsFile original = SafetensorsFile::open(fixture("llama") + "/" + shard).value();
    SafetensorsFile back = SafetensorsFile::open(tmp.file("hf/model.safetensors")).value();
    for (const SafetensorsEntry& e : original.entries()) {
      Tensor a = original.read(e.name, DType::kF32).value();
      auto b = back.read(e.name, DType::kF32);
      ASSERT_TRUE(b.ok()) << b.status().message();
      ASSERT_EQ(a.shape(), b->shape()) << e.name;
      EXPECT_EQ(0, std::memcmp(a.raw(), b->raw(), a.nbytes())) << e.name;
      ++compared;
    }
  }
  EXPECT_EQ(compared, 21u);  // 9 per layer + embedding, final norm, output layer
}

}  // namespace
}  // namespace gale
