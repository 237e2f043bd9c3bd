// `gale pretrain --load <Megatron MoE checkpoint>` at Gale's EP 1 and EP 2 (tests/data/megatron/moe/, Megatron core_v0.12.1).
//
// The fixtures' logits are checked against Megatron's in tests/train/megatron_moe_test.cc; here the
// user's path: the run continues at Megatron's iteration 7, and every layout of the same weights
// (EP 1 files, EP 2 GroupedMLP files, TP 2 x EP 2 files, torch_dist), loaded at Gale's EP 1, EP 2 or
// TP 2, logs the same first loss; torch_dist's SGD momentum resumes at EP 2; a run whose MoE flags
// differ from the checkpoint's is refused naming the flag; --use-checkpoint-args takes the MoE shape
// from Megatron's args; --ckpt-convert-format torch writes a MoE run's layout (EP 2).
// `gale convert` writes MoE models in Megatron's torch format at TP x PP x EP: an HF Mixtral round
// trips bit for bit, the fixture round trips to the same Gale tensor file (Megatron's own model
// loading what Gale writes: tools/reference/megatron_moe_reference.py --check-gale-written).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "ckpt/safetensors.h"
#include "ckpt/temp_dir.h"
#include "cli/log_line.h"
#include "cli/megatron_adamw_step.h"
#include "cli/mpi_cli.h"
#include "data/data_test_util.h"
#include "subprocess.h"
#include "train/hf_files.h"

namespace gale {
namespace {

using testing_util::TempDir;

std::string fixture(const std::string& name) { return std::string(GALE_TEST_DATA_DIR) + "/megatron/moe/" + name; }
std::string hf(const std::string& name) { return std::string(GALE_TEST_DATA_DIR) + "/hf/" + name; }

test::RunResult convert(const std::string& from, const std::string& to, const std::string& load, const std::string& save,
                        std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {GALE_BINARY, "convert", "--load-model-type", from, "--save-model-type", to,
                                "--load-dir", load, "--save-dir", save};
  a.insert(a.end(), extra.begin(), extra.end());
  return test::run_with_timeout(a, {"OMP_NUM_THREADS=1"}, 300);
}

std::string file_bytes(const std::string& path) { return testing::read_file(path); }

// 50 documents of 20 random ids below 50.
void write_small_dataset(const std::string& prefix) {
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> docs(50, std::vector<int32_t>(20));
  for (auto& d : docs)
    for (int32_t& t : d) t = static_cast<int32_t>(rng() % 50);
  testing::write_dataset(prefix, docs);
}

// The fixture's model (tools/reference/megatron_moe_reference.py) and one iteration after Megatron's 7.
std::vector<std::string> moe_model(const TempDir& tmp) {
  return {"--num-layers", "2", "--hidden-size", "16", "--ffn-hidden-size", "32", "--num-attention-heads", "2",
          "--swiglu", "--position-embedding-type", "rope", "--disable-bias-linear",
          "--untie-embeddings-and-output-weights", "--max-position-embeddings", "16", "--num-experts", "4",
          "--moe-router-topk", "2", "--moe-ffn-hidden-size", "8", "--moe-shared-expert-intermediate-size", "8"};
}

std::vector<std::string> training(const TempDir& tmp) {
  return {"--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias", "--seq-length", "8",
          "--micro-batch-size", "1", "--global-batch-size", "2", "--lr", "1e-4", "--attention-dropout", "0",
          "--hidden-dropout", "0", "--tokenizer-type", "NullTokenizer", "--vocab-size", "50",
          "--make-vocab-size-divisible-by", "32", "--data-path", tmp.file("data_text_document"), "--split", "100,0,0",
          "--eval-iters", "0", "--num-threads", "1", "--log-interval", "1", "--train-iters", "8", "--no-load-optim"};
}

test::RunResult pretrain(int np, std::vector<std::string> flags, const std::vector<std::string>& extra) {
  flags.insert(flags.begin(), {GALE_BINARY, "pretrain"});
  return test::run_with_timeout(testing::launch_argv(np, flags, extra),
                                np > 1 ? testing::kMpiEnv : std::vector<std::string>{"OMP_NUM_THREADS=1"}, 300);
}

TEST(MegatronMoeCli, PretrainContinuesEveryLayoutAtEp1AndEp2WithOneLoss) {
  TempDir tmp;
  write_small_dataset(tmp.file("data_text_document"));
  std::vector<std::string> flags = moe_model(tmp);
  const std::vector<std::string> t = training(tmp);
  flags.insert(flags.end(), t.begin(), t.end());
  test::RunResult r = pretrain(1, flags, {"--load", fixture("torch_ep1")});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("successfully loaded checkpoint from " + fixture("torch_ep1") + " at iteration 7"),
            std::string::npos)
      << r.output;
  const std::vector<double> ep1 = testing::logged_values(r.output, "lm loss");
  ASSERT_EQ(ep1.size(), 1u) << r.output;  // iteration 8 only
  struct Case {
    const char* fixture;
    std::vector<std::string> layout;
  };
  const Case cases[] = {{"torch_grouped_ep2", {"--expert-model-parallel-size", "2"}},
                        {"torch_dist", {"--expert-model-parallel-size", "2"}},
                        {"torch_tp2ep2", {"--tensor-model-parallel-size", "2", "--sequence-parallel"}}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.fixture);
    std::vector<std::string> extra = {"--load", fixture(c.fixture)};
    extra.insert(extra.end(), c.layout.begin(), c.layout.end());
    r = pretrain(2, flags, extra);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<double> loss = testing::logged_values(r.output, "lm loss");
    ASSERT_EQ(loss.size(), 1u) << r.output;
    EXPECT_NEAR(loss[0], ep1[0], 1e-5 * ep1[0]);  // the same weights; only the reduction order differs
  }
  // torch_dist's SGD momentum of every expert resumes at Gale's EP 2 (the first loss is before the step).
  flags.erase(std::find(flags.begin(), flags.end(), "--no-load-optim"));
  r = pretrain(2, flags, {"--load", fixture("torch_dist"), "--expert-model-parallel-size", "2", "--optimizer", "sgd",
                          "--sgd-momentum", "0.9"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NEAR(testing::logged_values(r.output, "lm loss").at(0), ep1[0], 1e-5 * ep1[0]) << r.output;
  // A run whose MoE flags Megatron's strict load would refuse: named before any tensor is read.
  std::vector<std::string> no_bias = flags;
  no_bias.erase(std::find(no_bias.begin(), no_bias.end(), "--moe-router-enable-expert-bias"));
  r = pretrain(1, no_bias, {"--load", fixture("torch_ep1"), "--no-load-optim"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("Megatron's checkpoint was saved with --moe-router-enable-expert-bias on, this run has off"),
            std::string::npos)
      << r.output;
  // --use-checkpoint-args: the MoE shape from Megatron's args (moe_layer_freq an int there).
  r = pretrain(1, t, {"--use-checkpoint-args", "--load", fixture("torch_dist")});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Setting num_experts to 4 from checkpoint"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Setting moe_shared_expert_intermediate_size to 8 from checkpoint"), std::string::npos)
      << r.output;
  EXPECT_EQ(testing::logged_values(r.output, "lm loss"), ep1) << r.output;
  // Megatron's --ckpt-convert-format torch in a run at EP 2: a Gale checkpoint written in Megatron's
  // format at the run's layout (mp_rank_00_EEE), which reads back to the same tensors.
  ASSERT_EQ(convert("mg", "gale", fixture("torch_ep1"), tmp.file("g")).exit_code, 0);
  r = pretrain(2, flags, {"--load", tmp.file("g"), "--expert-model-parallel-size", "2", "--ckpt-convert-format",
                          "torch", "--ckpt-convert-save", tmp.file("out")});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(tmp.file("out/torch/iter_0000007/mp_rank_00_001/model_optim_rng.pt")));
  ASSERT_EQ(convert("mg", "gale", tmp.file("out/torch"), tmp.file("g2")).exit_code, 0);
  EXPECT_EQ(file_bytes(tmp.file("g2/iter_0000007/shard_00000.safetensors")),
            file_bytes(tmp.file("g/iter_0000007/shard_00000.safetensors")));
}

TEST(MegatronMoeCli, ConvertWritesMoeModelsAtTpPpEp) {
  TempDir tmp;
  // An HF Mixtral -> Megatron at TP 2 x PP 2 x EP 2 -> HF: every tensor bit for bit.
  test::RunResult r = convert("hf", "mg", hf("mixtral"), tmp.file("mg"),
                              {"--target-tensor-parallel-size", "2", "--target-pipeline-parallel-size", "2",
                               "--target-expert-parallel-size", "2", "--tokenizer-type", "HuggingFaceTokenizer"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("TP 2 x PP 2 x EP 2"), std::string::npos) << r.output;
  EXPECT_TRUE(std::filesystem::exists(tmp.file("mg/release/mp_rank_01_001_001/model_optim_rng.pt")));
  r = convert("mg", "hf", tmp.file("mg"), tmp.file("hf"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto a = HfFiles::open(hf("mixtral"));
  auto b = SafetensorsFile::open(tmp.file("hf/model.safetensors"));
  ASSERT_TRUE(a.ok() && b.ok());
  int experts = 0;
  for (const SafetensorsEntry& e : b->entries()) {
    Tensor y = b->read(e.name, DType::kF32).value();
    auto x = a->read(e.name, y.shape());
    ASSERT_TRUE(x.ok()) << x.status().message();
    EXPECT_EQ(std::memcmp(x->raw(), y.raw(), y.nbytes()), 0) << e.name;
    experts += e.name.find(".experts.") != std::string::npos;
  }
  EXPECT_EQ(experts, 2 * 4 * 3);  // layers x experts x (w1, w2, w3)
  // Megatron's fixture -> Gale -> Megatron at TP 2 x EP 2 -> Gale: the same tensor file.
  ASSERT_EQ(convert("mg", "gale", fixture("torch_ep1"), tmp.file("g1")).exit_code, 0);
  r = convert("gale", "mg", tmp.file("g1"), tmp.file("mg2"),
              {"--target-tensor-parallel-size", "2", "--target-expert-parallel-size", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(tmp.file("mg2/iter_0000007/mp_rank_01_001/model_optim_rng.pt")));
  ASSERT_EQ(convert("mg", "gale", tmp.file("mg2"), tmp.file("g2")).exit_code, 0);
  EXPECT_EQ(file_bytes(tmp.file("g2/iter_0000007/shard_00000.safetensors")),
            file_bytes(tmp.file("g1/iter_0000007/shard_00000.safetensors")));
  // Bad target sizes and what Megatron has no place for.
  r = convert("gale", "mg", tmp.file("g1"), tmp.file("x"), {"--target-expert-parallel-size", "3"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--target-expert-parallel-size 3: expected it to divide the 4 experts"), std::string::npos)
      << r.output;
  r = convert("hf", "gale", hf("mixtral"), tmp.file("x"), {"--target-expert-parallel-size", "2"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--target-expert-parallel-size 2: only for --save-model-type mg"), std::string::npos)
      << r.output;
  r = convert("hf", "mg", hf("qwen2_moe"), tmp.file("x"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("a shared expert gate (--moe-shared-expert-gate, Qwen2-MoE's shared_expert_gate): writing "
                          "it to Megatron's format is not supported"),
            std::string::npos)
      << r.output;
}

// The MoE model's flags that continue the AdamW fixtures below (7 steps saved) at iteration 8, with the data.
std::vector<std::string> adam_resume_flags(const TempDir& tmp) {
  write_small_dataset(tmp.file("data_text_document"));
  std::vector<std::string> flags = moe_model(tmp);
  std::vector<std::string> t = training(tmp);
  t.erase(std::find(t.begin(), t.end(), "--no-load-optim"));
  *(std::find(t.begin(), t.end(), "--lr") + 1) = "1e-3";
  flags.insert(flags.end(), t.begin(), t.end());
  flags.insert(flags.end(), {"--optimizer", "adam", "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--adam-eps",
                             "1e-8", "--weight-decay", "0.1", "--min-lr", "1e-4", "--lr-decay-style", "linear",
                             "--lr-warmup-iters", "2", "--lr-decay-iters", "20", "--bf16", "--save-interval", "8"});
  return flags;
}

// gale pretrain continues the Megatron checkpoint `dir` (read as `from`) for one iteration on `layout` (none: one
// process; else EP 2 on two), saving to out<k>: it names the optimizer state's `layout_name`, loads iteration 7,
// logs the learning rate 7e-4 and applies AdamW's update from the loaded state to every element. Returns the
// logged loss (NaN after a failed check).
double resume_moe_adam(const TempDir& tmp, const std::vector<std::string>& flags, const std::string& dir,
                       const MegatronCheckpoint& from, const std::string& layout_name,
                       const std::vector<std::string>& layout, int k) {
  const double failed = std::nan("");
  const std::string save = tmp.file(str_cat("out", k));
  std::vector<std::string> extra = layout;
  extra.insert(extra.end(), {"--load", dir, "--save", save});
  test::RunResult r = pretrain(layout.empty() ? 1 : 2, flags, extra);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (r.exit_code != 0) return failed;
  EXPECT_NE(r.output.find(str_cat("adam optimizer state (", layout_name, ": exp_avg, exp_avg_sq; step 7)")),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("successfully loaded checkpoint from " + dir + " at iteration 7"), std::string::npos)
      << r.output;
  const std::vector<double> lr = testing::logged_values(r.output, "learning rate");
  EXPECT_EQ(lr.size(), 1u) << r.output;
  if (lr.size() == 1) {
    EXPECT_NEAR(lr[0], 7e-4, 1e-12);
  }
  const std::vector<double> loss = testing::logged_values(r.output, "lm loss");
  EXPECT_EQ(loss.size(), 1u) << r.output;
  megatron_adamw::expect_adamw_step(from, save, dir, 5000);
  return loss.size() == 1 ? loss[0] : failed;
}

// tests/data/megatron/moe/torch_dist_adam_chained{,_buckets} (tools/reference/megatron_moe_chained_optim_reference.py):
// the MoE model after 7 AdamW steps as Megatron main's ChainedOptimizer [dense, experts] of distributed optimizers
// saves it (bf16 weights with fp32 masters) in the fully_reshardable layout and in the dp_reshardable and
// dp_zero_gather_scatter ones at EP 2.
// gale pretrain continues each at iteration 8 in one process and at EP 2 (each rank's two experts from the global
// experts), with AdamW's update from the loaded state on every element of every parameter (the experts' included), and
// the same first loss everywhere.
TEST(MegatronMoeCli, PretrainResumesMegatronsChainedExpertAdamState) {
  TempDir tmp;
  const std::vector<std::string> flags = adam_resume_flags(tmp);
  std::vector<double> first_loss;
  int k = 0;
  const std::pair<const char*, const char*> fixtures[] = {{"fully_reshardable", "torch_dist_adam_chained"},
                                                          {"dp_reshardable", "torch_dist_adam_chained_buckets"},
                                                          {"dp_zero_gather_scatter", "torch_dist_adam_chained_dp_zero"}};
  for (const auto& [layout_name, name] : fixtures) {
    const std::string dir = fixture(name);
    auto from = read_megatron_checkpoint(dir, kUnset, /*with_optimizer=*/true);
    ASSERT_TRUE(from.ok()) << from.status().message();
    for (const std::vector<std::string>& layout :
         {std::vector<std::string>{}, std::vector<std::string>{"--expert-model-parallel-size", "2"}}) {
      SCOPED_TRACE(str_cat(layout_name, layout.empty() ? " one process" : " EP 2"));
      first_loss.push_back(resume_moe_adam(tmp, flags, dir, *from, layout_name, layout, k++));
    }
  }
  // The same state in both layouts: the same first loss, to the bit in one process.
  EXPECT_EQ(first_loss[2], first_loss[0]);
  EXPECT_EQ(first_loss[4], first_loss[0]);
  for (double l : first_loss) EXPECT_NEAR(l, first_loss[0], 1e-5 * first_loss[0]);
}

// tests/data/megatron/moe/torch_adam_{ep1,ep2,distopt_ep1,distopt_ep2} (tools/reference/megatron_torch_moe_optim_reference.py):
// the same AdamW state in Megatron's legacy torch format, written by core_v0.12.1's optimizer classes: one optimizer at
// EP 1, ChainedOptimizer's [dense, expert] list in each expert rank's file at EP 2, TP 2 x EP 2 and PP 2 x EP 2,
// non-distributed and with distrib_optim.pt. gale pretrain continues each in one process and at EP 2 with AdamW's update from the loaded state
// on every element of every parameter, and the same first loss as the torch_dist chain's.
TEST(MegatronMoeCli, PretrainResumesMegatronsTorchFormatExpertAdamState) {
  TempDir tmp;
  const std::vector<std::string> flags = adam_resume_flags(tmp);
  std::vector<double> first_loss;
  int k = 0;
  const std::pair<const char*, const char*> fixtures[] = {{"non-distributed", "torch_adam_ep1"},
                                                          {"non-distributed", "torch_adam_ep2"},
                                                          {"dp_zero_gather_scatter", "torch_adam_distopt_ep1"},
                                                          {"dp_zero_gather_scatter", "torch_adam_distopt_ep2"},
                                                          {"non-distributed", "torch_adam_tp2ep2"},
                                                          {"dp_zero_gather_scatter", "torch_adam_distopt_tp2ep2"},
                                                          {"non-distributed", "torch_adam_pp2ep2"},
                                                          {"dp_zero_gather_scatter", "torch_adam_distopt_pp2ep2"},
                                                          {"fully_reshardable", "torch_dist_adam_chained"}};
  for (const auto& [layout_name, name] : fixtures) {
    const std::string dir = fixture(name);
    auto from = read_megatron_checkpoint(dir, kUnset, /*with_optimizer=*/true);
    ASSERT_TRUE(from.ok()) << from.status().message();
    for (const std::vector<std::string>& layout :
         {std::vector<std::string>{}, std::vector<std::string>{"--expert-model-parallel-size", "2"}}) {
      if (std::string(name) == "torch_dist_adam_chained" && !layout.empty()) continue;  // the baseline: one process
      SCOPED_TRACE(str_cat(name, layout.empty() ? " one process" : " EP 2"));
      first_loss.push_back(resume_moe_adam(tmp, flags, dir, *from, layout_name, layout, k++));
    }
  }
  // The same state in every file layout: in one process the torch_dist chain's first loss to the bit.
  ASSERT_EQ(first_loss.size(), 17u);
  for (size_t i = 0; i < 16; i += 2) EXPECT_EQ(first_loss[i], first_loss[16]) << i;
  for (double l : first_loss) EXPECT_NEAR(l, first_loss[16], 1e-5 * first_loss[16]);
}

}  // namespace
}  // namespace gale
