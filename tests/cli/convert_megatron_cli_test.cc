// Megatron-LM checkpoints as a user meets them: `gale convert` mg <-> gale / hf and `gale pretrain --load <Megatron dir>`.
//
// The fixtures tests/data/megatron/{tp1,tp2pp2} are Megatron core_v0.12.1 GPT checkpoints in the
// legacy torch format (tools/reference/megatron_ckpt_reference.py; their logits are checked in
// tests/train/megatron_checkpoint_test.cc). Here: the CLI paths, the round trip of an HF LLaMA
// through Megatron's format (bit for bit), the refusals, and a pretrain run that continues a
// Megatron checkpoint at its iteration.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <span>

#include "ckpt/checkpoint_reader.h"
#include "ckpt/safetensors.h"
#include "ckpt/temp_dir.h"
#include "data/indexed_dataset.h"
#include "cli/log_line.h"
#include "cli/megatron_adamw_step.h"
#include "cli/mpi_cli.h"
#include "subprocess.h"
#include "train/hf_files.h"
#include "train/megatron_checkpoint.h"

namespace gale {
namespace {

using testing_util::TempDir;
using testing::logged_values;
using megatron_adamw::expect_adamw_elements;
using megatron_adamw::expect_adamw_step;

std::string megatron(const std::string& name) { return std::string(GALE_TEST_DATA_DIR) + "/megatron/" + name; }
std::string hf(const std::string& name) { return std::string(GALE_TEST_DATA_DIR) + "/hf/" + name; }

test::RunResult gale(std::vector<std::string> args) {
  args.insert(args.begin(), GALE_BINARY);
  return test::run_with_timeout(args, {"OMP_NUM_THREADS=1"}, 300);
}

test::RunResult convert(const std::string& from, const std::string& to, const std::string& load, const std::string& save,
                        std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {"convert", "--load-model-type", from, "--save-model-type", to,
                                "--load-dir", load, "--save-dir", save};
  a.insert(a.end(), extra.begin(), extra.end());
  return gale(a);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

TEST(ConvertMegatron, MegatronToGaleAndBackAtTp2Pp2) {
  TempDir tmp;
  test::RunResult r = convert("mg", "gale", megatron("tp2pp2"), tmp.file("gale"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("(iteration 7, checkpoint_version 3, TP 2 x PP 2): 4 layers, hidden 32, vocabulary 50 "
                          "padded to 64, 36 tensors"),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(std::filesystem::exists(tmp.file("gale/iter_0000007/metadata.json")));
  r = convert("gale", "megatron", tmp.file("gale"), tmp.file("mg"),
              {"--target-tensor-parallel-size", "2", "--target-pipeline-parallel-size", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("load it in Megatron with --no-load-optim --no-load-rng (or --finetune)"), std::string::npos)
      << r.output;
  EXPECT_EQ(read_text(tmp.file("mg/latest_checkpointed_iteration.txt")), "7");
  for (const char* rank : {"mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001"})
    EXPECT_TRUE(std::filesystem::exists(tmp.file(std::string("mg/iter_0000007/") + rank + "/model_optim_rng.pt"))) << rank;
  // mg -> hf: LayerNorm with RoPE is no HF architecture, which is said.
  r = convert("mg", "hf", megatron("tp1"), tmp.file("hf"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("LayerNorm"), std::string::npos) << r.output;
}

// HF -> Megatron (TP 2 x PP 2, Megatron's "release" checkpoint) -> HF returns every tensor bit for
// bit: LLaMA (GQA, SwiGLU, RMSNorm, untied), GPT-2 (biases, learned positions, tied embeddings: the
// last stage's copy), Qwen2 (q/k/v biases), Qwen3 (q/k norms), each as the architecture it was.
TEST(ConvertMegatron, HfModelsRoundTripThroughMegatronsFormat) {
  for (const char* arch : {"llama", "gpt2", "qwen2", "qwen3"}) {
    TempDir tmp;
    test::RunResult r = convert("hf", "mg", hf(arch), tmp.file("mg"),
                                {"--target-tensor-parallel-size", "2", "--target-pipeline-parallel-size", "2",
                                 "--tokenizer-type", "HuggingFaceTokenizer"});
    ASSERT_EQ(r.exit_code, 0) << arch << r.output;
    EXPECT_EQ(read_text(tmp.file("mg/latest_checkpointed_iteration.txt")), "release");
    EXPECT_TRUE(std::filesystem::exists(tmp.file("mg/release/mp_rank_01_001/model_optim_rng.pt")));
    r = convert("megatron", "hf", tmp.file("mg"), tmp.file("hf"));
    ASSERT_EQ(r.exit_code, 0) << arch << r.output;
    auto a = HfFiles::open(hf(arch));
    auto b = SafetensorsFile::open(tmp.file("hf/model.safetensors"));
    ASSERT_TRUE(a.ok() && b.ok()) << arch;
    int compared = 0;
    for (const SafetensorsEntry& e : b->entries()) {
      Tensor y = b->read(e.name, DType::kF32).value();
      auto x = a->read(e.name, y.shape());
      ASSERT_TRUE(x.ok()) << arch << " " << x.status().message();
      EXPECT_EQ(std::memcmp(x->raw(), y.raw(), y.nbytes()), 0) << arch << " " << e.name;
      ++compared;
    }
    EXPECT_GT(compared, 10) << arch;
    // The same architecture back (Qwen3's q/k norms: Megatron's qk_layernorm arg), so no tensor was left out.
    auto architectures = [](const std::string& dir) {
      std::ifstream in(dir + "/config.json");
      return nlohmann::json::parse(in)["architectures"];
    };
    EXPECT_EQ(architectures(tmp.file("hf")), architectures(hf(arch))) << arch;
  }
}

// A gpt-oss-activation model (--quick-geglu --glu-linear-offset 1 --activation-func-clamp-value 7)
// through Megatron's format at TP 2: Megatron's args record the three options, each rank's fc1 holds
// its slice of the gate rows and of the linear rows, and Megatron -> Gale returns every tensor bit for
// bit with the flags.
TEST(ConvertMegatron, QuickGegluModelRoundTripsAtTp2) {
  TempDir tmp;
  test::RunResult r =
      gale({"pretrain", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "8",
            "--max-position-embeddings", "16", "--micro-batch-size", "1", "--global-batch-size", "1", "--lr", "1e-3",
            "--train-iters", "1", "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "4096",
            "--eval-iters", "0", "--num-threads", "1", "--normalization",
            "RMSNorm", "--position-embedding-type", "rope", "--disable-bias-linear", "--quick-geglu",
            "--glu-linear-offset", "1.0", "--activation-func-clamp-value", "7.0", "--save", tmp.file("gale"),
            "--save-interval", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = convert("gale", "megatron", tmp.file("gale"), tmp.file("mg"), {"--target-tensor-parallel-size", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string where;
  auto mg = read_megatron_args(tmp.file("mg"), kUnset, &where);
  ASSERT_TRUE(mg.ok()) << mg.status().message();
  EXPECT_EQ((*mg)["quick_geglu"], true);
  EXPECT_EQ((*mg)["glu_linear_offset"], 1.0);
  EXPECT_EQ((*mg)["activation_func_clamp_value"], 7.0);
  r = convert("mg", "gale", tmp.file("mg"), tmp.file("back"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto a = CheckpointReader::open(tmp.file("gale"));
  auto b = CheckpointReader::open(tmp.file("back"));
  ASSERT_TRUE(a.ok() && b.ok());
  const nlohmann::json args = b->section("args").value();
  EXPECT_EQ(args["quick_geglu"], true);
  EXPECT_EQ(args["glu_linear_offset"], 1.0);
  EXPECT_EQ(args["activation_func_clamp_value"], 7.0);
  int compared = 0;
  for (const std::string& name : b->tensor_names()) {
    if (name.find("linear_fc1") == std::string::npos && name.find("linear_fc2") == std::string::npos) continue;
    const Shape shape = b->global_shape(name).value();
    Tensor x = a->read(name, shape).value(), y = b->read(name, shape).value();
    EXPECT_EQ(std::memcmp(x.raw(), y.raw(), y.nbytes()), 0) << name;
    ++compared;
  }
  EXPECT_EQ(compared, 4);
}

// `gale generate --load <Megatron dir> --use-checkpoint-args`: greedy decoding picks the token
// Megatron's logits rank first after the reference prompt (21; tests/data/megatron/reference.json).
TEST(ConvertMegatron, GenerateReadsAMegatronCheckpoint) {
  for (const char* dir : {"tp1", "tp2pp2", "torch_dist_tp2pp2", "torch_dcp_tp1"}) {
    test::RunResult r = gale({"generate", "--load", megatron(dir), "--use-checkpoint-args", "--tokenizer-type",
                              "NullTokenizer", "--vocab-size", "49", "--prompt", "3 17 42 8 0 49 25 11",
                              "--max-new-tokens", "1", "--temperature", "0"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("3 17 42 8 0 49 25 11 21\n"), std::string::npos) << dir << "\n" << r.output;
  }
}

TEST(ConvertMegatron, Refusals) {
  TempDir tmp;
  test::RunResult r = convert("mg", "mg", megatron("tp1"), tmp.file("x"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--load-model-type mg --save-model-type mg: expected one side hf or gale"), std::string::npos)
      << r.output;
  // Megatron's torch_dist format without its common.pt: refused naming the file.
  std::filesystem::create_directories(tmp.file("dist/iter_0000002"));
  std::ofstream(tmp.file("dist/latest_checkpointed_iteration.txt")) << "2";
  std::ofstream(tmp.file("dist/iter_0000002/.metadata")) << "x";
  std::ofstream(tmp.file("dist/iter_0000002/metadata.json")) << R"({"sharded_backend": "torch_dist"})";
  r = convert("mg", "gale", tmp.file("dist"), tmp.file("x"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find(tmp.file("dist/iter_0000002") + "/common.pt: missing; Megatron's torch_dist checkpoint "
                                                            "keeps args and iteration there"),
            std::string::npos)
      << r.output;
  // A Gale checkpoint given as mg.
  ASSERT_EQ(convert("mg", "gale", megatron("tp1"), tmp.file("g")).exit_code, 0);
  r = convert("mg", "hf", tmp.file("g"), tmp.file("x"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("expected Megatron's torch, torch_dist or torch_dcp format (mp_rank_* directories or "
                          ".metadata), found a Gale checkpoint"),
            std::string::npos)
      << r.output;
}

// `gale pretrain --load <Megatron dir>` continues at Megatron's iteration (7) with its weights;
// a torch-format checkpoint without optimizer state needs --no-load-optim; two ranks at TP 2 log the
// same loss as one process; --pretrained-checkpoint
// fine-tunes from iteration 0; --use-checkpoint-args reads the model flags from Megatron's args.
// 100 documents of 20 random ids below 49, and the flags of a small LLaMA-style model trained on them.
void write_small_dataset(const std::string& prefix) {
  auto w = IndexedDatasetWriter::create(prefix, TokenDType::kUInt16).value();
  std::mt19937 rng(5);
  for (int d = 0; d < 100; ++d) {
    std::vector<int32_t> doc(20);
    for (int32_t& t : doc) t = static_cast<int32_t>(rng() % 49);
    const int32_t len = 20;
    ASSERT_TRUE(w->add_document(doc, std::span<const int32_t>(&len, 1)).ok());
  }
  ASSERT_TRUE(w->finalize().ok());
}

std::vector<std::string> small_model(const TempDir& tmp) {
  return {
      "pretrain", "--num-layers", "4", "--hidden-size", "32", "--ffn-hidden-size", "48", "--num-attention-heads", "4",
      "--group-query-attention", "--num-query-groups", "2", "--swiglu", "--position-embedding-type", "rope",
      "--disable-bias-linear", "--untie-embeddings-and-output-weights", "--max-position-embeddings", "16",
      "--seq-length", "8", "--micro-batch-size", "1", "--global-batch-size", "2", "--lr", "1e-4",
      "--attention-dropout", "0", "--hidden-dropout", "0", "--tokenizer-type", "NullTokenizer", "--vocab-size", "49",
      "--make-vocab-size-divisible-by", "32", "--data-path", tmp.file("data_text_document"), "--split", "100,0,0",
      "--eval-iters", "0", "--num-threads", "1", "--save-interval", "1", "--log-interval", "1"};
}

TEST(ConvertMegatron, PretrainLoadsAMegatronCheckpointAndContinuesAtItsIteration) {
  TempDir tmp;
  write_small_dataset(tmp.file("data_text_document"));
  const std::vector<std::string> model = small_model(tmp);
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = model;
    a.insert(a.end(), extra.begin(), extra.end());
    return gale(a);
  };
  test::RunResult r = run({"--train-iters", "8", "--load", megatron("tp2pp2"), "--save", tmp.file("a")});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("holds no optimizer state (saved with --no-save-optim, or not by a training run): pass "
                          "--no-load-optim (or --finetune)"),
            std::string::npos)
      << r.output;
  r = run({"--train-iters", "8", "--load", megatron("tp1"), "--no-load-optim", "--lora-target-modules", "linear_qkv",
           "--save", tmp.file("lora")});
  // LoRA on the Megatron base (MindSpeed-LLM's flow): its weights are the frozen base, the adapters
  // train and are all the checkpoint holds (tests/cli/lora_cli_test.cc compares the losses).
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("reading Megatron's torch checkpoint"), std::string::npos) << r.output;
  {
    auto saved = CheckpointReader::open(tmp.file("lora"));
    ASSERT_TRUE(saved.ok()) << saved.status().to_string();
    for (const std::string& name : saved.value().tensor_names())
      EXPECT_NE(name.find(".lora_"), std::string::npos) << name << " is not an adapter";
  }
  r = run({"--train-iters", "8", "--load", megatron("tp2pp2"), "--no-load-optim", "--save", tmp.file("b")});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("successfully loaded checkpoint from " + megatron("tp2pp2") + " at iteration 7"),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(std::filesystem::exists(tmp.file("b/iter_0000008/metadata.json")));
  EXPECT_FALSE(std::filesystem::exists(tmp.file("b/iter_0000001")));
  const std::vector<double> one_process = testing::logged_values(r.output, "lm loss");
  ASSERT_EQ(one_process.size(), 1u) << r.output;  // iteration 8 only
  // Two ranks at TP 2 (each converts the Megatron files in its own temporary directory) see the
  // same loss: the weights are the same, only the reduction order differs (1e-5 relative).
  std::vector<std::string> mpi = {GALE_MPIEXEC, "--oversubscribe", "--bind-to", "none", "-np", "2", GALE_BINARY};
  mpi.insert(mpi.end(), model.begin(), model.end());
  mpi.insert(mpi.end(), {"--train-iters", "8", "--load", megatron("tp1"), "--no-load-optim", "--save", tmp.file("d"),
                         "--tensor-model-parallel-size", "2"});
  r = test::run_with_timeout(mpi, testing::kMpiEnv, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> two_ranks = testing::logged_values(r.output, "lm loss");
  ASSERT_EQ(two_ranks.size(), 1u) << r.output;
  EXPECT_NEAR(two_ranks[0], one_process[0], 1e-5 * one_process[0]);
  r = run({"--train-iters", "1", "--pretrained-checkpoint", megatron("tp1"), "--save", tmp.file("c")});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("successfully loaded checkpoint from " + megatron("tp1") + " at iteration 0"),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(std::filesystem::exists(tmp.file("c/iter_0000001/metadata.json")));
  // --use-checkpoint-args takes the model flags from Megatron's args Namespace.
  r = gale({"pretrain", "--use-checkpoint-args", "--load", megatron("tp1"), "--no-load-optim", "--micro-batch-size", "1",
            "--global-batch-size", "2", "--lr", "1e-4", "--train-iters", "8", "--vocab-size", "49",
            "--make-vocab-size-divisible-by", "128", "--data-path", tmp.file("data_text_document"), "--split", "100,0,0", "--eval-iters", "0",
            "--num-threads", "1"});
  EXPECT_EQ(r.exit_code, 1);  // Megatron does not take the vocabulary padding from the checkpoint either
  EXPECT_NE(r.output.find("checkpoint " + megatron("tp1") + "/iter_0000007 does not match this model: it was saved "
                          "with padded_vocab_size = 64, this run has 128"),
            std::string::npos)
      << r.output;
  r.output.clear();
  r = gale({"pretrain", "--use-checkpoint-args", "--load", megatron("tp1"), "--no-load-optim", "--micro-batch-size", "1",
            "--global-batch-size", "2", "--lr", "1e-4", "--train-iters", "8", "--vocab-size", "49",
            "--make-vocab-size-divisible-by", "32", "--data-path", tmp.file("data_text_document"), "--split",
            "100,0,0", "--eval-iters", "0", "--num-threads", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Setting num_query_groups to 2 from checkpoint"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("successfully loaded checkpoint from " + megatron("tp1") + " at iteration 7"),
            std::string::npos)
      << r.output;
}

// Megatron's torch_dist checkpoints (tests/data/megatron/torch_dist_*, the tp1 weights saved by
// Megatron's dist_checkpointing at TP 1 and at TP 2 x PP 2): `gale convert` to Gale writes the same
// tensor files as from the torch-format fixture, and `gale pretrain --load` continues them at any layout
// with the loss the torch-format fixture gives.
TEST(ConvertMegatron, TorchDistToGaleEqualsTheTorchFormatsConversion) {
  // (The fixture model, LayerNorm with SwiGLU, has no HF architecture: `--save-model-type hf` refuses
  // it for either format; the HF writer is tested from the torch format.)
  TempDir tmp;
  test::RunResult r = convert("mg", "gale", megatron("torch_dist_tp2pp2"), tmp.file("from_dist"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("read Megatron's torch_dist checkpoint " + megatron("torch_dist_tp2pp2") +
                          "/iter_0000007 (iteration 7, checkpoint_version 3, TP 2 x PP 2): 4 layers, hidden 32, "
                          "vocabulary 50 padded to 64, 36 tensors"),
            std::string::npos)
      << r.output;
  r = convert("mg", "gale", megatron("tp1"), tmp.file("from_torch"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  size_t files = 0;  // the tensor files, byte for byte (metadata.json names the source directory and format)
  for (const auto& e : std::filesystem::directory_iterator(tmp.file("from_torch/iter_0000007"))) {
    const std::string name = e.path().filename().string();
    if (name == "metadata.json") continue;
    EXPECT_EQ(testing_util::read_bytes(tmp.file("from_dist/iter_0000007/" + name)),
              testing_util::read_bytes(e.path().string()))
        << name;
    ++files;
  }
  EXPECT_GE(files, 1u);
  r = convert("mg", "hf", megatron("torch_dist_tp1"), tmp.file("hf"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("no Hugging Face architecture Gale writes matches this model"), std::string::npos) << r.output;
}

TEST(ConvertMegatron, PretrainLoadsTorchDistAtAnyLayout) {
  TempDir tmp;
  write_small_dataset(tmp.file("data_text_document"));
  const std::vector<std::string> model = small_model(tmp);
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = model;
    a.insert(a.end(), extra.begin(), extra.end());
    return gale(a);
  };
  test::RunResult r = run({"--train-iters", "8", "--load", megatron("tp1"), "--no-load-optim", "--save", tmp.file("a")});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> torch_format = testing::logged_values(r.output, "lm loss");
  ASSERT_EQ(torch_format.size(), 1u) << r.output;
  r = run({"--train-iters", "8", "--load", megatron("torch_dist_tp2pp2"), "--no-load-optim", "--ckpt-format",
           "torch_dist", "--save", tmp.file("b")});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("reading Megatron's torch_dist checkpoint " + megatron("torch_dist_tp2pp2") +
                          "/iter_0000007 (checkpoint_version 3, saved at TP 2 x PP 2): model weights only, Megatron's "
                          "optimizer and RNG state are not read"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("successfully loaded checkpoint from " + megatron("torch_dist_tp2pp2") + " at iteration 7"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(testing::logged_values(r.output, "lm loss"), torch_format) << r.output;  // the same weights
  // Two ranks at TP 2, and at PP 2: the same loss up to the reduction order.
  for (const char* layout : {"--tensor-model-parallel-size", "--pipeline-model-parallel-size"}) {
    std::vector<std::string> mpi = {GALE_MPIEXEC, "--oversubscribe", "--bind-to", "none", "-np", "2", GALE_BINARY};
    mpi.insert(mpi.end(), model.begin(), model.end());
    mpi.insert(mpi.end(), {"--train-iters", "8", "--load", megatron("torch_dist_tp1"), "--no-load-optim", "--save",
                           tmp.file(str_cat("c", layout)), layout, "2"});
    r = test::run_with_timeout(mpi, testing::kMpiEnv, 300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<double> two_ranks = testing::logged_values(r.output, "lm loss");
    ASSERT_EQ(two_ranks.size(), 1u) << layout << r.output;
    EXPECT_NEAR(two_ranks[0], torch_format[0], 1e-5 * torch_format[0]) << layout;
  }
  // Without --no-load-optim Megatron's optimizer state is read: this one (SGD's) lacks the scheduler.
  r = run({"--train-iters", "8", "--load", megatron("torch_dist_tp1"), "--save", tmp.file("d")});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("expected Megatron's 'opt_param_scheduler' state dict next to the optimizer state"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("pass --no-load-optim (or --finetune)"), std::string::npos) << r.output;
  // A model flag that disagrees with the checkpoint is named.
  std::vector<std::string> wrong = model;
  *(std::find(wrong.begin(), wrong.end(), "--ffn-hidden-size") + 1) = "64";
  wrong.insert(wrong.end(), {"--train-iters", "8", "--load", megatron("torch_dist_tp1"), "--no-load-optim", "--save",
                             tmp.file("e")});
  r = gale(wrong);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("checkpoint " + megatron("torch_dist_tp1") + "/iter_0000007 does not match this model: it "
                          "was saved with ffn_hidden_size = 48, this run has 64"),
            std::string::npos)
      << r.output;
  // --use-checkpoint-args reads Megatron's args from common.pt.
  r = gale({"pretrain", "--use-checkpoint-args", "--load", megatron("torch_dist_tp1"), "--no-load-optim",
            "--micro-batch-size", "1", "--global-batch-size", "2", "--lr", "1e-4", "--train-iters", "8",
            "--vocab-size", "49", "--make-vocab-size-divisible-by", "32", "--data-path",
            tmp.file("data_text_document"), "--split", "100,0,0", "--eval-iters", "0", "--num-threads", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Setting num_query_groups to 2 from checkpoint"), std::string::npos) << r.output;
}

// Megatron's --ckpt-convert-format torch in `gale pretrain`: a Gale checkpoint rewritten in Megatron's
// torch format, which continues training exactly like the Gale checkpoint it came from.
TEST(ConvertMegatron, PretrainCkptConvertFormatWritesMegatronsTorchFormat) {
  TempDir tmp;
  write_small_dataset(tmp.file("data_text_document"));
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = small_model(tmp);
    auto interval = std::find(a.begin(), a.end(), "--save-interval");  // only the first run saves
    a.erase(interval, interval + 2);
    a.insert(a.end(), extra.begin(), extra.end());
    return gale(a);
  };
  test::RunResult r = run({"--train-iters", "2", "--save", tmp.file("gale"), "--save-interval", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run({"--train-iters", "2", "--load", tmp.file("gale"), "--ckpt-convert-format", "torch", "--ckpt-convert-save",
           tmp.file("converted")});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("> converted checkpoint: gale -> torch (" + tmp.file("converted") + "/torch)."),
            std::string::npos)
      << r.output;
  EXPECT_EQ(logged_values(r.output, "lm loss").size(), 0u) << r.output;  // no training
  EXPECT_EQ(read_text(tmp.file("converted/torch/latest_checkpointed_iteration.txt")), "2");
  EXPECT_TRUE(std::filesystem::exists(tmp.file("converted/torch/iter_0000002/mp_rank_00/model_optim_rng.pt")));
  // Both continue with a fresh optimizer from the same weights and iteration: the same losses.
  test::RunResult from_gale = run({"--train-iters", "4", "--load", tmp.file("gale"), "--no-load-optim", "--no-load-rng"});
  test::RunResult from_torch = run({"--train-iters", "4", "--load", tmp.file("converted/torch"), "--no-load-optim"});
  ASSERT_EQ(from_gale.exit_code, 0) << from_gale.output;
  ASSERT_EQ(from_torch.exit_code, 0) << from_torch.output;
  const std::vector<double> losses = logged_values(from_gale.output, "lm loss");
  EXPECT_EQ(losses.size(), 2u) << from_gale.output;
  EXPECT_EQ(logged_values(from_torch.output, "lm loss"), losses) << from_torch.output;
  // Refusals: other formats, a missing directory, a Megatron --load.
  r = run({"--train-iters", "2", "--load", tmp.file("gale"), "--ckpt-convert-format", "torch_dist",
           "--ckpt-convert-save", tmp.file("x")});
  EXPECT_NE(r.output.find("--ckpt-convert-format torch_dist: not supported yet"), std::string::npos) << r.output;
  r = run({"--train-iters", "2", "--load", tmp.file("gale"), "--ckpt-convert-format", "torch"});
  EXPECT_NE(r.output.find("--ckpt-convert-format torch needs --ckpt-convert-save DIR"), std::string::npos) << r.output;
  r = run({"--train-iters", "2", "--load", tmp.file("converted/torch"), "--ckpt-convert-format", "torch",
           "--ckpt-convert-save", tmp.file("again")});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("holds a Megatron torch checkpoint; Gale converts its own checkpoints here"),
            std::string::npos)
      << r.output;
}

// Megatron's optimizer state from torch_dist (tests/data/megatron/torch_dist_adam: the non-distributed
// optimizer's layout, f32; torch_dist_adam_dp2: the distributed optimizer's fully_sharded_model_space
// pieces at TP 2 x DP 2 with bf16 weights and fp32 master copies; torch_dist_adam_reshardable: its
// fully_reshardable layout; all Megatron core_v0.12.1 after 7 AdamW steps,
// tools/reference/megatron_torch_dist_optim_reference.py; torch_dist_adam_buckets: the same state in the
// bucket-space dp_reshardable layout of core_v0.15.3 at DP 2, five buckets, and (torch_dist_adam_buckets_tp2pp2)
// at TP 2 x PP 2, each model-parallel rank's buffers of its pieces; torch_dist_adam_dp_zero: the same
// buffers gathered as dp_zero_gather_scatter saves them, by core_v0.15.3 and by core_v0.12.1, and _tp2pp2 by
// core_v0.15.3 at TP 2 x PP 2). Iteration 8 in
// Gale, in one
// process and on two ranks (TP 2, or DP 2 with the distributed optimizer), must be AdamW's update from
// that state: with the gradient g that the saved first moment implies, g = (m8 - b1 m7) / (1 - b1),
// the second moment is v8 = b2 v7 + (1 - b2) g^2 (v7 loaded) and the weights are
// p8 = p7 - lr (m8 / (1 - b1^8) / (sqrt(v8 / (1 - b2^8)) + eps) + wd p7) (the fp32 masters p7, step 8:
// the step restored; lr 7.5e-4: the linear schedule at Megatron's num_steps 14, restored; the log line
// shows 7e-4, the rate after the scheduler's step), checked on every element of every tensor.
std::vector<std::string> adam_model(const TempDir& tmp) {
  std::vector<std::string> a = small_model(tmp);
  const std::pair<const char*, const char*> edits[] = {
      {"--num-layers", "2"}, {"--hidden-size", "16"}, {"--ffn-hidden-size", "24"},
      {"--lr", "1e-3"},       {"--save-interval", "8"}};
  for (const auto& [flag, value] : edits) *(std::find(a.begin(), a.end(), flag) + 1) = value;
  a.insert(a.end(), {"--optimizer", "adam", "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--adam-eps", "1e-8",
                     "--weight-decay", "0.1", "--min-lr", "1e-4", "--lr-decay-style", "linear", "--lr-warmup-iters",
                     "2", "--lr-decay-iters", "20", "--train-iters", "8"});
  return a;
}

// One resume of a Megatron checkpoint saved after 7 AdamW steps: `gale pretrain` with `model` and `extra` on `np`
// ranks loads `dir` and saves iteration 8 to `save`. The start-up line holds `reading`, the loaded iteration is 7,
// the one logged learning rate is the schedule's 7e-4 (after the scheduler's step, as Megatron logs it; num_steps 16)
// and iteration 8 is AdamW's update from the loaded state on every element (expect_adamw_step, at least
// `at_least` elements). `*loss` gets the one logged loss.
void resume_megatron_adam(const std::vector<std::string>& model, int np, std::vector<std::string> extra,
                          const std::string& dir, const std::string& save, const std::string& reading, double* loss,
                          int64_t at_least = 6000) {
  std::vector<std::string> program = {GALE_BINARY};
  program.insert(program.end(), model.begin(), model.end());
  extra.insert(extra.end(), {"--load", dir, "--save", save});
  test::RunResult r = test::run_with_timeout(testing::launch_argv(np, program, extra), testing::kMpiEnv, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(reading), std::string::npos) << reading << "\n" << r.output;
  EXPECT_NE(r.output.find("successfully loaded checkpoint from " + dir + " at iteration 7"), std::string::npos)
      << r.output;
  const std::vector<double> lr = logged_values(r.output, "learning rate");
  ASSERT_EQ(lr.size(), 1u) << r.output;  // iteration 8 only
  EXPECT_NEAR(lr[0], 7e-4, 1e-12);
  const std::vector<double> losses = logged_values(r.output, "lm loss");
  ASSERT_EQ(losses.size(), 1u) << r.output;
  *loss = losses[0];
  auto from = read_megatron_checkpoint(dir, kUnset, /*with_optimizer=*/true);
  ASSERT_TRUE(from.ok()) << from.status().message();
  expect_adamw_step(*from, save, dir, at_least);
}

TEST(ConvertMegatron, PretrainResumesMegatronsAdamState) {
  TempDir tmp;
  write_small_dataset(tmp.file("data_text_document"));
  const std::vector<std::string> model = adam_model(tmp);
  struct Case {
    const char* fixture;
    int np;
    std::vector<std::string> extra;
    const char* layout;
  };
  const Case cases[] = {
      {"torch_dist_adam", 1, {}, "non-distributed"},
      {"torch_dist_adam", 2, {"--use-distributed-optimizer"}, "non-distributed"},
      {"torch_dist_adam_dp2", 1, {"--bf16"}, "fully_sharded_model_space"},
      {"torch_dist_adam_dp2", 2, {"--bf16", "--tensor-model-parallel-size", "2"}, "fully_sharded_model_space"},
      {"torch_dist_adam_dp2", 2, {"--bf16", "--pipeline-model-parallel-size", "2"}, "fully_sharded_model_space"},
      {"torch_dist_adam_reshardable", 1, {"--bf16"}, "fully_reshardable"},
      {"torch_dist_adam_buckets", 1, {"--bf16"}, "dp_reshardable"},
      {"torch_dist_adam_buckets", 2, {"--bf16", "--use-distributed-optimizer"}, "dp_reshardable"},
      {"torch_dist_adam_buckets", 2, {"--bf16", "--tensor-model-parallel-size", "2"}, "dp_reshardable"},
      {"torch_dist_adam_buckets_tp2pp2", 1, {"--bf16"}, "dp_reshardable"},
      {"torch_dist_adam_buckets_tp2pp2", 2, {"--bf16", "--pipeline-model-parallel-size", "2"}, "dp_reshardable"},
      {"torch_dist_adam_dp_zero", 1, {"--bf16"}, "dp_zero_gather_scatter"},
      {"torch_dist_adam_dp_zero", 2, {"--bf16", "--use-distributed-optimizer"}, "dp_zero_gather_scatter"},
      {"torch_dist_adam_dp_zero_v012", 1, {"--bf16"}, "dp_zero_gather_scatter"},
      {"torch_dist_adam_dp_zero_v012", 2, {"--bf16", "--use-distributed-optimizer"}, "dp_zero_gather_scatter"},
      {"torch_dist_adam_dp_zero_tp2pp2", 1, {"--bf16"}, "dp_zero_gather_scatter"},
      {"torch_dist_adam_dp_zero_tp2pp2", 2, {"--bf16", "--tensor-model-parallel-size", "2"}, "dp_zero_gather_scatter"},
  };
  std::map<std::string, double> one_process_loss;
  int k = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(str_cat(c.fixture, " on ", c.np, " ranks"));
    const bool bf16 = std::string(c.fixture) != "torch_dist_adam";
    const bool pp2 = std::string(c.fixture).find("_tp2pp2") != std::string::npos;
    const bool tp2 = std::string(c.fixture) == "torch_dist_adam_dp2" || pp2;
    double loss = 0.0;
    ASSERT_NO_FATAL_FAILURE(resume_megatron_adam(
        model, c.np, c.extra, megatron(c.fixture), tmp.file(str_cat("out", k++)),
        str_cat("reading Megatron's torch_dist checkpoint ", megatron(c.fixture), "/iter_0000007 (checkpoint_version 3, "
                "saved at TP ", tp2 ? 2 : 1, " x PP ", pp2 ? 2 : 1, "): model weights",
                bf16 ? " (its fp32 master copies)" : "", ", adam optimizer state (", c.layout,
                ": exp_avg, exp_avg_sq; step 7), scheduler and iteration; Megatron's RNG state is not read"),
        &loss));
    if (c.np == 1) one_process_loss[c.fixture] = loss;
    else EXPECT_NEAR(loss, one_process_loss.at(c.fixture), 1e-5 * loss);  // the reduction order differs
  }
  // The TP 2 x PP 2 runs' buffers hold the TP 1 run's state: the same first loss, to the bit.
  EXPECT_EQ(one_process_loss.at("torch_dist_adam_buckets_tp2pp2"), one_process_loss.at("torch_dist_adam_buckets"));
  EXPECT_EQ(one_process_loss.at("torch_dist_adam_dp_zero_tp2pp2"), one_process_loss.at("torch_dist_adam_buckets"));
}

// Megatron's optimizer state from legacy torch-format checkpoints (tests/data/megatron/torch_adam*,
// tools/reference/megatron_torch_optim_reference.py: FP32Optimizer's state dict at TP 1, Float16OptimizerWithFloat16Params'
// at TP 2 x PP 2 with bf16 weights, the distributed optimizer's distrib_optim.pt at DP 2 and at TP 2 x PP 2; the same
// 7 AdamW steps): iteration 8 in Gale, at other layouts than the saving run's (DP 1 or 2 for the DP 2 one), must be
// AdamW's update from the loaded state on every element (expect_adamw_step), with the restored step and schedule; the
// bf16 fixtures hold one state, so their first losses in one process are equal to the bit; the same with tied
// embeddings at TP 2 x PP 2 (_tied), continued in one process and at PP 2.
TEST(ConvertMegatron, PretrainResumesMegatronsLegacyAdamState) {
  TempDir tmp;
  write_small_dataset(tmp.file("data_text_document"));
  const std::vector<std::string> model = adam_model(tmp);
  struct Case {
    const char* fixture;
    int np;
    std::vector<std::string> extra;
    const char* layout;
  };
  const Case cases[] = {
      {"torch_adam", 1, {}, "non-distributed"},
      {"torch_adam", 2, {"--use-distributed-optimizer"}, "non-distributed"},
      {"torch_adam_bf16_tp2pp2", 1, {"--bf16"}, "non-distributed"},
      {"torch_adam_bf16_tp2pp2", 2, {"--bf16", "--pipeline-model-parallel-size", "2"}, "non-distributed"},
      {"torch_adam_distopt", 1, {"--bf16"}, "dp_zero_gather_scatter"},
      {"torch_adam_distopt", 2, {"--bf16", "--use-distributed-optimizer"}, "dp_zero_gather_scatter"},
      {"torch_adam_distopt_tp2pp2", 1, {"--bf16"}, "dp_zero_gather_scatter"},
      {"torch_adam_distopt_tp2pp2", 2, {"--bf16", "--tensor-model-parallel-size", "2"}, "dp_zero_gather_scatter"},
  };
  std::map<std::string, double> one_process_loss;
  int k = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(str_cat(c.fixture, " on ", c.np, " ranks"));
    const bool bf16 = std::string(c.fixture) != "torch_adam";
    const bool tp2pp2 = std::string(c.fixture).find("_tp2pp2") != std::string::npos;
    double loss = 0.0;
    ASSERT_NO_FATAL_FAILURE(resume_megatron_adam(
        model, c.np, c.extra, megatron(c.fixture), tmp.file(str_cat("out", k++)),
        str_cat("reading Megatron's torch checkpoint ", megatron(c.fixture), "/iter_0000007 (checkpoint_version 3, "
                "saved at TP ", tp2pp2 ? 2 : 1, " x PP ", tp2pp2 ? 2 : 1, "): model weights",
                bf16 ? " (its fp32 master copies)" : "", ", adam optimizer state (", c.layout,
                ": exp_avg, exp_avg_sq; step 7), scheduler and iteration; Megatron's RNG state is not read"),
        &loss));
    if (c.np == 1) one_process_loss[c.fixture] = loss;
    else EXPECT_NEAR(loss, one_process_loss.at(c.fixture), 1e-5 * loss);
  }
  EXPECT_EQ(one_process_loss.at("torch_adam_distopt"), one_process_loss.at("torch_adam_bf16_tp2pp2"));
  EXPECT_EQ(one_process_loss.at("torch_adam_distopt_tp2pp2"), one_process_loss.at("torch_adam_bf16_tp2pp2"));
  // Tied embeddings (torch_adam_{bf16,distopt}_tp2pp2_tied): without --untie-embeddings-and-output-weights, in one
  // process and at PP 2, AdamW's update from the loaded state; both layouts the same first loss.
  std::vector<std::string> tied = model;
  tied.erase(std::find(tied.begin(), tied.end(), "--untie-embeddings-and-output-weights"));
  std::vector<double> tied_loss;
  for (const char* fixture : {"torch_adam_bf16_tp2pp2_tied", "torch_adam_distopt_tp2pp2_tied"})
    for (int np : {1, 2}) {
      SCOPED_TRACE(str_cat(fixture, " on ", np, " ranks"));
      const std::string save = tmp.file(str_cat("out", k++));
      std::vector<std::string> program = {GALE_BINARY};
      program.insert(program.end(), tied.begin(), tied.end());
      std::vector<std::string> extra = {"--bf16", "--load", megatron(fixture), "--save", save};
      if (np == 2) extra.insert(extra.end(), {"--pipeline-model-parallel-size", "2"});
      test::RunResult r = test::run_with_timeout(testing::launch_argv(np, program, extra), testing::kMpiEnv, 300);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      const std::vector<double> loss = logged_values(r.output, "lm loss");
      ASSERT_EQ(loss.size(), 1u) << r.output;
      tied_loss.push_back(loss[0]);
      auto from = read_megatron_checkpoint(megatron(fixture), kUnset, /*with_optimizer=*/true);
      ASSERT_TRUE(from.ok()) << from.status().message();
      expect_adamw_step(*from, save, fixture, 5000);  // no output layer: 5024 elements
    }
  ASSERT_EQ(tied_loss.size(), 4u);
  EXPECT_EQ(tied_loss[2], tied_loss[0]);
  EXPECT_NEAR(tied_loss[1], tied_loss[0], 1e-5 * tied_loss[0]);
  EXPECT_NEAR(tied_loss[3], tied_loss[0], 1e-5 * tied_loss[0]);
}

// Megatron's optimizer state from torch_dcp checkpoints (tests/data/megatron/torch_dcp_adam{,_bf16},
// tools/reference/megatron_torch_dcp_optim_reference.py: torch_adam's FP32Optimizer state dict, and that state as
// Float16OptimizerWithFloat16Params' at TP 1 with bf16 weights, saved as --ckpt-format torch_dcp saves them): iteration
// 8 in Gale, in one process and on two ranks, must be AdamW's update from the loaded state on every element, with the
// restored step and schedule; torch_dcp_adam's first loss is torch_adam's to the bit (the same state in one process).
TEST(ConvertMegatron, PretrainResumesMegatronsTorchDcpAdamState) {
  TempDir tmp;
  write_small_dataset(tmp.file("data_text_document"));
  const std::vector<std::string> model = adam_model(tmp);
  struct Case {
    const char* fixture;
    int np;
    std::vector<std::string> extra;
  };
  const Case cases[] = {
      {"torch_adam", 1, {}},
      {"torch_dcp_adam", 1, {}},
      {"torch_dcp_adam", 2, {"--use-distributed-optimizer"}},
      {"torch_dcp_adam_bf16", 1, {"--bf16"}},
      {"torch_dcp_adam_bf16", 2, {"--bf16", "--tensor-model-parallel-size", "2"}},
  };
  std::map<std::string, double> one_process_loss;
  int k = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(str_cat(c.fixture, " on ", c.np, " ranks"));
    const bool dcp = std::string(c.fixture) != "torch_adam", bf16 = std::string(c.fixture) == "torch_dcp_adam_bf16";
    double loss = 0.0;
    ASSERT_NO_FATAL_FAILURE(resume_megatron_adam(
        model, c.np, c.extra, megatron(c.fixture), tmp.file(str_cat("out", k++)),
        str_cat("reading Megatron's ", dcp ? "torch_dcp" : "torch", " checkpoint ", megatron(c.fixture),
                "/iter_0000007 (checkpoint_version 3, saved at TP 1 x PP 1): model weights",
                bf16 ? " (its fp32 master copies)" : "", ", adam optimizer state (non-distributed: exp_avg, exp_avg_sq; "
                "step 7), scheduler and iteration; Megatron's RNG state is not read"),
        &loss));
    if (c.np == 1) one_process_loss[c.fixture] = loss;
    else EXPECT_NEAR(loss, one_process_loss.at(c.fixture), 1e-5 * loss);
  }
  EXPECT_EQ(one_process_loss.at("torch_dcp_adam"), one_process_loss.at("torch_adam"));
}

// Virtual pipeline chunks (tests/data/megatron/torch_dist_adam_{buckets,dp_zero}_vpp: a 4-layer model's dp_reshardable and
// dp_zero_gather_scatter state at PP 2 with two chunks per rank, a buffer per chunk;
// tools/reference/megatron_vpp_buckets_optim_reference.py): gale pretrain continues each at iteration 8 in one process
// and at PP 2 with virtual stages, with AdamW's update from the loaded state on every element, and the same first loss.
TEST(ConvertMegatron, PretrainResumesMegatronsVirtualPipelineAdamState) {
  TempDir tmp;
  write_small_dataset(tmp.file("data_text_document"));
  std::vector<std::string> model = adam_model(tmp);
  *(std::find(model.begin(), model.end(), "--num-layers") + 1) = "4";
  std::vector<double> first_loss;
  int k = 0;
  for (const char* layout_name : {"dp_reshardable", "dp_zero_gather_scatter"}) {
    const std::string dir = megatron(std::string(layout_name) == "dp_reshardable" ? "torch_dist_adam_buckets_vpp"
                                                                                   : "torch_dist_adam_dp_zero_vpp");
    for (const std::vector<std::string>& layout :
         {std::vector<std::string>{}, std::vector<std::string>{"--pipeline-model-parallel-size", "2",
                                                               "--num-layers-per-virtual-pipeline-stage", "1"}}) {
      SCOPED_TRACE(layout.empty() ? "one process" : "PP 2 with virtual stages");
      std::vector<std::string> extra = layout;
      extra.push_back("--bf16");
      double loss = 0.0;
      ASSERT_NO_FATAL_FAILURE(resume_megatron_adam(
          model, layout.empty() ? 1 : 2, extra, dir, tmp.file(str_cat("out", k++)),
          str_cat("adam optimizer state (", layout_name, ": exp_avg, exp_avg_sq; step 7)"), &loss, 10000));
      first_loss.push_back(loss);
    }
  }
  EXPECT_EQ(first_loss[2], first_loss[0]);  // the same state in both layouts
  for (double l : first_loss) EXPECT_NEAR(l, first_loss[0], 1e-5 * first_loss[0]);
}

// Virtual pipeline chunks in the legacy torch format (tests/data/megatron/torch_adam_bf16_vpp: a 4-layer model's
// Float16OptimizerWithFloat16Params state at PP 2 with two chunks per rank, 'model0' / 'model1' in each rank file;
// torch_adam_distopt_vpp: the same state in the distributed optimizer's distrib_optim.pt, a buffer per chunk;
// tools/reference/megatron_torch_vpp_optim_reference.py): gale pretrain continues each at iteration 8 in one process and
// at PP 2 with virtual stages, with AdamW's update from the loaded state on every element, and the same first loss.
TEST(ConvertMegatron, PretrainResumesMegatronsLegacyVirtualPipelineAdamState) {
  TempDir tmp;
  write_small_dataset(tmp.file("data_text_document"));
  std::vector<std::string> model = adam_model(tmp);
  *(std::find(model.begin(), model.end(), "--num-layers") + 1) = "4";
  std::vector<double> first_loss;
  int k = 0;
  for (const char* fixture : {"torch_adam_bf16_vpp", "torch_adam_distopt_vpp"})
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{}, std::vector<std::string>{"--pipeline-model-parallel-size", "2",
                                                             "--num-layers-per-virtual-pipeline-stage", "1"}}) {
    SCOPED_TRACE(str_cat(fixture, layout.empty() ? " in one process" : " at PP 2 with virtual stages"));
    const std::string dir = megatron(fixture);
    const bool distributed = std::string(fixture) == "torch_adam_distopt_vpp";
    std::vector<std::string> extra = layout;
    extra.push_back("--bf16");
    double loss = 0.0;
    ASSERT_NO_FATAL_FAILURE(resume_megatron_adam(
        model, layout.empty() ? 1 : 2, extra, dir, tmp.file(str_cat("out", k++)),
        str_cat("reading Megatron's torch checkpoint ", dir, "/iter_0000007 (checkpoint_version 3, saved at TP 1 x PP "
                "2): model weights (its fp32 master copies), adam optimizer state (",
                distributed ? "dp_zero_gather_scatter" : "non-distributed", ": exp_avg, exp_avg_sq; step 7), scheduler "
                "and iteration"),
        &loss, 10000));
    if (!first_loss.empty()) {
      EXPECT_NEAR(loss, first_loss[0], 1e-5 * loss);
    }
    first_loss.push_back(loss);
  }
  ASSERT_EQ(first_loss.size(), 4u);
  EXPECT_EQ(first_loss[2], first_loss[0]);  // the same state in both optimizers' files, one process: to the bit
}

// Multi-latent attention in the legacy torch format (tests/data/megatron/torch_adam_mla: Megatron core_v0.12.1's MLA
// model with q LoRA after 7 AdamW steps, Float16OptimizerWithFloat16Params' state at TP 1;
// tools/reference/megatron_torch_mla_optim_reference.py; the same state at TP 2 and in the distributed optimizer's files):
// gale pretrain with its MLA flags continues each at iteration 8 in one process and at 2 ranks (DP 2 with the distributed
// optimizer, TP 2), with AdamW's update from the loaded state on every element, and the same first loss.
TEST(ConvertMegatron, PretrainResumesMegatronsLegacyMlaAdamState) {
  TempDir tmp;
  write_small_dataset(tmp.file("data_text_document"));
  std::vector<std::string> model = adam_model(tmp);
  *(std::find(model.begin(), model.end(), "--hidden-size") + 1) = "32";  // the MLA model's sizes
  *(std::find(model.begin(), model.end(), "--ffn-hidden-size") + 1) = "48";
  *(std::find(model.begin(), model.end(), "--max-position-embeddings") + 1) = "4096";  // YaRN's original length
  model.erase(std::find(model.begin(), model.end(), "--group-query-attention"));
  model.erase(std::find(model.begin(), model.end(), "--num-query-groups"), std::find(model.begin(), model.end(),
                                                                                  "--num-query-groups") + 2);
  model.insert(model.end(), {"--bf16", "--multi-latent-attention", "--kv-lora-rank", "12", "--qk-head-dim", "8",
                             "--qk-pos-emb-head-dim", "4", "--v-head-dim", "6", "--q-lora-rank", "16", "--qk-layernorm",
                             "--normalization", "RMSNorm", "--rotary-scaling-factor", "4", "--mscale", "0.8",
                             "--mscale-all-dim", "0.8"});
  // torch_adam_mla and the same state saved at TP 2, with the distributed optimizer at DP 2 and at TP 2
  // (tools/reference/megatron_torch_mla_tp_optim_reference.py), each resumed in one process and at 2 ranks.
  struct Case {
    const char* fixture;
    const char* saved;  // the layout the log line names
    std::vector<std::string> layout;
  };
  const Case cases[] = {
      {"torch_adam_mla", "TP 1 x PP 1): model weights (its fp32 master copies), adam optimizer state (non-distributed", {}},
      {"torch_adam_mla", "TP 1 x PP 1): model weights (its fp32 master copies), adam optimizer state (non-distributed",
       {"--use-distributed-optimizer"}},
      {"torch_adam_mla_tp2", "TP 2 x PP 1): model weights (its fp32 master copies), adam optimizer state "
       "(non-distributed", {}},
      {"torch_adam_mla_tp2", "TP 2 x PP 1): model weights (its fp32 master copies), adam optimizer state "
       "(non-distributed", {"--tensor-model-parallel-size", "2"}},
      {"torch_adam_mla_distopt", "TP 1 x PP 1): model weights (its fp32 master copies), adam optimizer state "
       "(dp_zero_gather_scatter", {"--use-distributed-optimizer"}},
      {"torch_adam_mla_distopt_tp2", "TP 2 x PP 1): model weights (its fp32 master copies), adam optimizer state "
       "(dp_zero_gather_scatter", {}},
      {"torch_adam_mla_distopt_tp2", "TP 2 x PP 1): model weights (its fp32 master copies), adam optimizer state "
       "(dp_zero_gather_scatter", {"--tensor-model-parallel-size", "2", "--use-distributed-optimizer"}}};
  std::vector<double> first_loss;
  int k = 0;
  for (const Case& c : cases) {
    const std::string dir = megatron(c.fixture);
    auto from = read_megatron_checkpoint(dir, kUnset, /*with_optimizer=*/true);
    ASSERT_TRUE(from.ok()) << from.status().message();
    const bool two = !c.layout.empty();
    SCOPED_TRACE(str_cat(c.fixture, two ? str_cat(" ", c.layout[0]) : std::string(" one process")));
    double loss = 0.0;
    ASSERT_NO_FATAL_FAILURE(resume_megatron_adam(
        model, two ? 2 : 1, c.layout, dir, tmp.file(str_cat("out", k++)),
        str_cat("reading Megatron's torch checkpoint ", dir, "/iter_0000007 (checkpoint_version 3, saved at ", c.saved,
                ": exp_avg, exp_avg_sq; step 7), scheduler and iteration"),
        &loss, 10000));
    if (!first_loss.empty()) {
      EXPECT_NEAR(loss, first_loss[0], 1e-5 * loss);
      if (!two) EXPECT_EQ(loss, first_loss[0]);  // the same state, one process: to the bit
    }
    first_loss.push_back(loss);
  }
}

// Tied embeddings at PP > 1 (tests/data/megatron/torch_dist_adam_{buckets,dp_zero}_tp2pp2_tied: the same state with the
// word embedding tied to the output layer, whose last-stage copy Megatron keeps in its own bucket): gale pretrain
// without --untie-embeddings-and-output-weights continues it at iteration 8 with AdamW's update from the loaded state
// on every element, in one process, at PP 2 and at TP 2, the same first loss from both layouts.
TEST(ConvertMegatron, PretrainResumesMegatronsTiedEmbeddingAdamState) {
  TempDir tmp;
  write_small_dataset(tmp.file("data_text_document"));
  std::vector<std::string> model = adam_model(tmp);
  model.erase(std::find(model.begin(), model.end(), "--untie-embeddings-and-output-weights"));
  const std::pair<const char*, std::vector<std::string>> cases[] = {
      {"torch_dist_adam_buckets_tp2pp2_tied", {}},
      {"torch_dist_adam_buckets_tp2pp2_tied", {"--pipeline-model-parallel-size", "2"}},
      {"torch_dist_adam_dp_zero_tp2pp2_tied", {}},
      {"torch_dist_adam_dp_zero_tp2pp2_tied", {"--tensor-model-parallel-size", "2"}}};
  std::vector<double> first_loss;
  int k = 0;
  for (const auto& [fixture, layout] : cases) {
    SCOPED_TRACE(str_cat(fixture, " ", layout.empty() ? "one process" : layout[0]));
    const std::string save = tmp.file(str_cat("out", k++));
    std::vector<std::string> program = {GALE_BINARY};
    program.insert(program.end(), model.begin(), model.end());
    std::vector<std::string> extra = layout;
    extra.insert(extra.end(), {"--bf16", "--load", megatron(fixture), "--save", save});
    test::RunResult r =
        test::run_with_timeout(testing::launch_argv(layout.empty() ? 1 : 2, program, extra), testing::kMpiEnv, 300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("successfully loaded checkpoint from " + megatron(fixture) + " at iteration 7"),
              std::string::npos)
        << r.output;
    const std::vector<double> lr = logged_values(r.output, "learning rate");
    ASSERT_EQ(lr.size(), 1u) << r.output;
    EXPECT_NEAR(lr[0], 7e-4, 1e-12);
    const std::vector<double> loss = logged_values(r.output, "lm loss");
    ASSERT_EQ(loss.size(), 1u) << r.output;
    if (!first_loss.empty()) EXPECT_NEAR(loss[0], first_loss[0], 1e-5 * loss[0]);
    first_loss.push_back(loss[0]);
    auto from = read_megatron_checkpoint(megatron(fixture), kUnset, /*with_optimizer=*/true);
    ASSERT_TRUE(from.ok()) << from.status().message();
    EXPECT_EQ(from->tensors.count("output_layer.weight"), 0u);
    expect_adamw_step(*from, save, fixture, 5000);  // 6048 elements less the output layer's 1024
  }
  ASSERT_EQ(first_loss.size(), 4u);
  EXPECT_EQ(first_loss[2], first_loss[0]);  // both layouts hold the same state: the same one-process loss, to the bit
}

// An uneven pipeline split (tests/data/megatron/torch_dist_adam_buckets_pp2_uneven: 3 layers saved at PP 2 with
// --decoder-first-pipeline-num-layers 1): gale pretrain --num-layers 3 continues it with AdamW's update from the loaded
// state on every element, in one process and at PP 2 with the same split (the same loss).
TEST(ConvertMegatron, PretrainResumesMegatronsUnevenPipelineAdamState) {
  TempDir tmp;
  write_small_dataset(tmp.file("data_text_document"));
  std::vector<std::string> model = adam_model(tmp);
  *(std::find(model.begin(), model.end(), "--num-layers") + 1) = "3";
  const std::string fixture = "torch_dist_adam_buckets_pp2_uneven";
  const std::vector<std::string> layouts[] = {
      {}, {"--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "1"}};
  std::vector<double> first_loss;
  int k = 0;
  for (const std::vector<std::string>& layout : layouts) {
    SCOPED_TRACE(layout.empty() ? "one process" : "PP 2");
    const std::string save = tmp.file(str_cat("out", k++));
    std::vector<std::string> program = {GALE_BINARY};
    program.insert(program.end(), model.begin(), model.end());
    std::vector<std::string> extra = layout;
    extra.insert(extra.end(), {"--bf16", "--load", megatron(fixture), "--save", save});
    test::RunResult r =
        test::run_with_timeout(testing::launch_argv(layout.empty() ? 1 : 2, program, extra), testing::kMpiEnv, 300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("successfully loaded checkpoint from " + megatron(fixture) + " at iteration 7"),
              std::string::npos)
        << r.output;
    const std::vector<double> loss = logged_values(r.output, "lm loss");
    ASSERT_EQ(loss.size(), 1u) << r.output;
    if (!first_loss.empty()) EXPECT_NEAR(loss[0], first_loss[0], 1e-5 * loss[0]);
    first_loss.push_back(loss[0]);
    auto from = read_megatron_checkpoint(megatron(fixture), kUnset, /*with_optimizer=*/true);
    ASSERT_TRUE(from.ok()) << from.status().message();
    expect_adamw_step(*from, save, fixture, 7000);  // 6048 + layer 2's 1728 elements
  }
}

// Megatron main's --optimizer lion state (tests/data/megatron/torch_dist_lion, tools/reference/megatron_lion_reference.py:
// the non-distributed ChainedOptimizer [Lion, AdamW] after 7 steps, f32). Iteration 8 in Gale (--optimizer lion,
// one process and TP 2) must continue it on every element: for Lion's parameters (the 2-D ones but the
// embedding and output layer), with the gradient g the saved moment implies, g = (m8 - b2 m7) / (1 - b2), the
// weights are p8 = p7 (1 - lr wd) - lr sign(b1 m7 + (1 - b1) g) (b1, b2 = --adam-beta1/2, as Megatron builds
// the emerging optimizer); for the others AdamW's update at step 8, as above.
void expect_lion_step(const MegatronCheckpoint& from, const std::string& saved, const std::string& what) {
  constexpr double b1 = 0.9, b2 = 0.95, wd = 0.1, lr = 7.5e-4;
  auto r = CheckpointReader::open(saved);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_TRUE(from.optimizer.has_value());
  const auto& second = from.optimizer->tensors.at("exp_avg_sq");
  int64_t lion = 0, adam = 0, ambiguous = 0;
  for (const auto& [name, m7t] : from.optimizer->tensors.at("exp_avg")) {
    const Tensor& p7t = from.tensors.at(name);
    auto p8t = r->read(name, p7t.shape());
    auto m8t = r->read("optimizer.exp_avg." + name, p7t.shape());
    ASSERT_TRUE(p8t.ok() && m8t.ok()) << name;
    const float *m7 = m7t.data<float>(), *p7 = p7t.data<float>(), *m8 = m8t->data<float>(), *p8 = p8t->data<float>();
    if (!second.count(name)) {  // Lion's parameter: exp_avg only
      ASSERT_EQ(p7t.ndim(), 2u) << name;
      ASSERT_FALSE(r->read("optimizer.exp_avg_sq." + name, p7t.shape()).ok()) << name << ": Lion keeps no exp_avg_sq";
      for (int64_t i = 0; i < p7t.numel(); ++i, ++lion) {
        const double g = (m8[i] - b2 * m7[i]) / (1 - b2);
        const double c = b1 * m7[i] + (1 - b1) * g;
        if (std::abs(c) < 1e-4 * (std::abs(m7[i]) + std::abs(g))) {  // the sign is within rounding of zero
          ++ambiguous;
          continue;
        }
        ASSERT_NEAR(p8[i], p7[i] * (1 - lr * wd) - lr * (c > 0 ? 1.0 : -1.0), 1e-6 * std::abs(p7[i]) + 1e-8)
            << what << " " << name << " [" << i << "]";
      }
      continue;
    }
    auto v8t = r->read("optimizer.exp_avg_sq." + name, p7t.shape());
    ASSERT_TRUE(v8t.ok()) << name;
    const float *v7 = second.at(name).data<float>(), *v8 = v8t->data<float>();
    expect_adamw_elements(p7t, m7, v7, m8, v8, p8, what + " " + name, adam);
  }
  EXPECT_GT(lion, 3000) << what;
  EXPECT_GT(adam, 2000) << what;
  EXPECT_LT(ambiguous * 100, lion) << what;
}

TEST(ConvertMegatron, PretrainResumesMegatronsLionState) {
  TempDir tmp;
  write_small_dataset(tmp.file("data_text_document"));
  std::vector<std::string> model = adam_model(tmp);
  *(std::find(model.begin(), model.end(), "--optimizer") + 1) = "lion";
  double one_process_loss = 0;
  int k = 0;
  for (const auto& [np, extra] : std::vector<std::pair<int, std::vector<std::string>>>{
           {1, {}}, {2, {"--tensor-model-parallel-size", "2"}}}) {
    SCOPED_TRACE(str_cat(np, " ranks"));
    const std::string save = tmp.file(str_cat("lion", k++));
    std::vector<std::string> program = {GALE_BINARY};
    program.insert(program.end(), model.begin(), model.end());
    std::vector<std::string> flags = extra;
    flags.insert(flags.end(), {"--load", megatron("torch_dist_lion"), "--save", save});
    test::RunResult r = test::run_with_timeout(testing::launch_argv(np, program, flags), testing::kMpiEnv, 300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("model weights, lion optimizer state (non-distributed: exp_avg, exp_avg_sq; step 7), "
                            "scheduler and iteration"),
              std::string::npos)
        << r.output;
    const std::vector<double> lr = logged_values(r.output, "learning rate");
    ASSERT_EQ(lr.size(), 1u) << r.output;
    EXPECT_NEAR(lr[0], 7e-4, 1e-12);
    const std::vector<double> loss = logged_values(r.output, "lm loss");
    ASSERT_EQ(loss.size(), 1u) << r.output;
    if (np == 1) one_process_loss = loss[0];
    else EXPECT_NEAR(loss[0], one_process_loss, 1e-5 * loss[0]);
    auto from = read_megatron_checkpoint(megatron("torch_dist_lion"), kUnset, /*with_optimizer=*/true);
    ASSERT_TRUE(from.ok()) << from.status().message();
    expect_lion_step(*from, save, "torch_dist_lion");
  }
}

}  // namespace
}  // namespace gale
