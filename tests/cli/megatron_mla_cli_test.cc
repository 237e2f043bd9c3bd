// `gale pretrain --load <Megatron MLA checkpoint>` at TP 1, TP 2 and PP 2: the first iteration's loss is Megatron's.
//
// The fixtures tests/data/megatron/mla_{qlora,noq}/ (tools/reference/megatron_mla_reference.py) are
// tiny Megatron core_v0.12.1 MLA GPT models with the logits Megatron computed for the tokens
// [3 17 42 8 0 49 25 11] (mla_reference.json). Every document of the data set here is those 8 tokens,
// so every sample is them with labels [17 42 8 0 49 25 11 3]: the loss of the first iteration after
// loading (iteration 8, before any update) is the mean cross entropy of Megatron's logits at those
// labels, whatever sample the run starts at and whatever layout reads the checkpoint.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <span>

#include "ckpt/temp_dir.h"
#include "cli/log_line.h"
#include "cli/mpi_cli.h"
#include "data/indexed_dataset.h"
#include "subprocess.h"

namespace gale {
namespace {

using testing_util::TempDir;

std::string megatron(const std::string& name) { return std::string(GALE_TEST_DATA_DIR) + "/megatron/" + name; }

const std::vector<int32_t> kTokens = {3, 17, 42, 8, 0, 49, 25, 11};

// Megatron's logits of `variant` at the labels the data set gives (the next document's first token last).
double megatron_loss(const std::string& variant) {
  std::ifstream in(megatron("mla_reference.json"));
  const nlohmann::json j = nlohmann::json::parse(in).at(variant);
  EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), kTokens);
  const auto logits = j["logits"].get<std::vector<std::vector<double>>>();
  double sum = 0;
  for (size_t s = 0; s < kTokens.size(); ++s) {
    const int32_t label = s + 1 < kTokens.size() ? kTokens[s + 1] : kTokens[0];
    const std::vector<double>& row = logits[s];
    const double mx = *std::max_element(row.begin(), row.end());
    double z = 0;
    for (double x : row) z += std::exp(x - mx);
    sum += mx + std::log(z) - row[label];
  }
  return sum / kTokens.size();
}

void write_dataset(const std::string& prefix) {
  auto w = IndexedDatasetWriter::create(prefix, TokenDType::kUInt16).value();
  const int32_t len = static_cast<int32_t>(kTokens.size());
  for (int d = 0; d < 64; ++d) ASSERT_TRUE(w->add_document(kTokens, std::span<const int32_t>(&len, 1)).ok());
  ASSERT_TRUE(w->finalize().ok());
}

std::vector<std::string> model_flags(const std::string& variant) {
  std::vector<std::string> a = {
      "pretrain", "--num-layers", "2", "--hidden-size", "32", "--ffn-hidden-size", "48", "--num-attention-heads", "4",
      "--swiglu", "--position-embedding-type", "rope", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
      "--seq-length", "8", "--micro-batch-size", "1", "--global-batch-size", "1", "--lr", "1e-4",
      "--attention-dropout", "0", "--hidden-dropout", "0", "--tokenizer-type", "NullTokenizer", "--vocab-size", "49",
      "--make-vocab-size-divisible-by", "32", "--split", "100,0,0", "--eval-iters", "0", "--num-threads", "1",
      "--log-interval", "1", "--train-iters", "8", "--no-load-optim", "--multi-latent-attention", "--kv-lora-rank", "12",
      "--qk-head-dim", "8", "--qk-pos-emb-head-dim", "4", "--v-head-dim", "6"};
  const std::vector<std::string> qlora = {"--q-lora-rank", "16", "--qk-layernorm", "--normalization", "RMSNorm",
                                          "--max-position-embeddings", "4096", "--rotary-scaling-factor", "4",
                                          "--mscale", "0.8", "--mscale-all-dim", "0.8"};
  const std::vector<std::string> noq = {"--normalization", "LayerNorm", "--max-position-embeddings", "16",
                                        "--rope-type", "rope"};
  const auto& v = variant == "qlora" ? qlora : noq;
  a.insert(a.end(), v.begin(), v.end());
  return a;
}

// The first iteration's lm loss of `gale pretrain --load <fixture>` in `np` processes, `np` the size of
// `parallel` (tensor or pipeline parallelism).
double first_loss(const TempDir& tmp, const std::string& variant, const std::string& layout, int np,
                  const std::string& parallel = "--tensor-model-parallel-size") {
  std::vector<std::string> flags = model_flags(variant);
  flags.insert(flags.end(), {"--data-path", tmp.file("data_text_document"), "--load", megatron("mla_" + variant + "/" + layout),
                             parallel, std::to_string(np)});
  std::vector<std::string> argv = {GALE_BINARY};
  if (np > 1) argv = testing::mpirun_argv(np), argv.push_back(GALE_BINARY);
  argv.insert(argv.end(), flags.begin(), flags.end());
  test::RunResult r = test::run_with_timeout(argv, testing::kMpiEnv, 300);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("successfully loaded checkpoint from " + megatron("mla_" + variant + "/" + layout) +
                          " at iteration 7"),
            std::string::npos)
      << r.output;
  const std::vector<double> losses = testing::logged_values(r.output, "lm loss");
  EXPECT_EQ(losses.size(), 1u) << r.output;  // iteration 8 only
  return losses.empty() ? NAN : losses[0];
}

TEST(MegatronMlaCli, PretrainContinuesMegatronsMlaCheckpointsWithMegatronsLoss) {
  TempDir tmp;
  write_dataset(tmp.file("data_text_document"));
  const double qlora = megatron_loss("qlora"), noq = megatron_loss("noq");
  // Gale's forward against Megatron's: fp32 both sides (1e-6 measured on the logits), the log line's 7 digits.
  EXPECT_NEAR(first_loss(tmp, "qlora", "tp1", 1), qlora, 1e-4);
  EXPECT_NEAR(first_loss(tmp, "qlora", "tp2", 2), qlora, 1e-4);
  EXPECT_NEAR(first_loss(tmp, "noq", "torch_dist", 2), noq, 1e-4);
  EXPECT_NEAR(first_loss(tmp, "noq", "tp2", 2, "--pipeline-model-parallel-size"), noq, 1e-4);
}

}  // namespace
}  // namespace gale
