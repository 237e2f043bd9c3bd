// `gale pretrain --fim-data` / `gale data-samples --fim-data`: the samples are Megatron's
// GPTFIMDataset's (tests/data/fim/golden.json), and training reads them: the first loss equals the
// loss of a run without FIM on a dataset that holds exactly the golden FIM sample.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/cli_test_util.h"
#include "cli/log_line.h"
#include "cli/mpi_cli.h"
#include "data/data_test_util.h"
#include "subprocess.h"

namespace gale {
namespace {

namespace fs = std::filesystem;
const std::string kData = std::string(GALE_TEST_DATA_DIR);

std::string quoted(const std::vector<std::string>& flags) {
  std::string s;
  for (const std::string& f : flags) {
    std::string q = "'";
    for (char c : f) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    s += " " + q + "'";
  }
  return s;
}

const nlohmann::json& golden() {
  static nlohmann::json j = testing::load_json(kData + "/fim/golden.json");
  return j;
}

// The golden flags, with the fixture paths made absolute.
std::vector<std::string> case_flags(const nlohmann::json& c) {
  std::vector<std::string> f = c["flags"].get<std::vector<std::string>>();
  for (std::string& x : f) {
    if (x == "tests/data/fim") x = kData + "/fim";
    if (x == "tests/data/fim/corpus_text_document") x = kData + "/fim/corpus_text_document";
  }
  return f;
}

std::string scratch(const std::string& name) {
  const std::string dir = ::testing::TempDir() + name + "_" + std::to_string(getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// `gale data-samples` for a golden case, with or without --fim-data: the ids of each sample.
std::vector<nlohmann::json> data_samples(const nlohmann::json& c, const std::string& extra, const std::string& dir) {
  const testing::CommandResult r = testing::run_gale("data-samples" + quoted(case_flags(c)) + extra +
                                                         " --sample-split train --sample-index 0 --sample-count " +
                                                         std::to_string(c["raw"].size()),
                                                     dir);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::vector<nlohmann::json> ids;
  std::istringstream lines(r.out);
  std::string line;
  while (std::getline(lines, line))
    if (!line.empty()) ids.push_back(nlohmann::json::parse(line)["ids"]);
  return ids;
}

TEST(FimCli, DataSamplesAreMegatronsFimSamples) {
  const std::string dir = scratch("gale_fim_samples");
  for (const auto& c : golden()["cases"]) {
    // The raw samples the golden FIM samples were made from are still Gale's GPT samples.
    EXPECT_EQ(data_samples(c, "", dir), c["raw"].get<std::vector<nlohmann::json>>()) << c["name"];
    if (c["data_parallel_size"] != 1) continue;  // one loader reads them all
    EXPECT_EQ(data_samples(c, " --fim-data", dir), c["fim"].get<std::vector<nlohmann::json>>()) << c["name"];
  }
}

TEST(FimCli, AMissingFimTokenIsAnErrorNamingTheFlag) {
  const std::string dir = scratch("gale_fim_missing");
  const testing::CommandResult r = testing::run_gale(
      "data-samples" + quoted(case_flags(golden()["cases"][0])) +
          " --fim-data --fim-pad-token '<pad>' --sample-split train --sample-index 0",
      dir);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--fim-pad-token: expected a token of the tokenizer's vocabulary, found '<pad>', which the "
                       "tokenizer does not have"),
            std::string::npos)
      << r.err;
}

TEST(FimCli, FirstLossIsTheLossOfTheGoldenFimSample) {
  const std::string dir = scratch("gale_fim_pretrain");
  const nlohmann::json& c = golden()["cases"][0];  // psm_spm: --micro-batch-size 1, no workers
  ASSERT_EQ(c["name"], "psm_spm");
  // The golden flags' --train-iters (the sample count shapes the GPT sample order), one logged loss
  // per iteration: the first is compared.
  const std::vector<std::string> model = {"--lr", "1e-3", "--log-interval", "1", "--hidden-dropout", "0",
                                          "--attention-dropout", "0", "--init-method-std", "0.2", "--num-threads",
                                          "1"};
  std::vector<std::string> fim = case_flags(c);
  fim.insert(fim.end(), model.begin(), model.end());
  const testing::CommandResult a = testing::run_gale("pretrain" + quoted(fim) + " --fim-data", dir);
  ASSERT_EQ(a.exit_code, 0) << a.err << a.out;
  const testing::CommandResult raw = testing::run_gale("pretrain" + quoted(fim), dir);
  ASSERT_EQ(raw.exit_code, 0) << raw.err << raw.out;

  // One document holding the golden FIM sample 0: its only sample is those S + 1 ids.
  const std::string prefix = dir + "/golden_sample";
  testing::write_dataset(prefix, {c["fim"][0].get<std::vector<int32_t>>()});
  std::vector<std::string> plain = fim;
  for (size_t i = 0; i + 1 < plain.size(); ++i) {
    if (plain[i] == "--data-path") plain[i + 1] = prefix;
    if (plain[i] == "--train-iters") plain[i + 1] = "1";
  }
  const testing::CommandResult b = testing::run_gale("pretrain" + quoted(plain), dir);
  ASSERT_EQ(b.exit_code, 0) << b.err << b.out;

  const std::vector<double> la = testing::logged_values(a.out, "lm loss");
  const std::vector<double> lb = testing::logged_values(b.out, "lm loss");
  const std::vector<double> lraw = testing::logged_values(raw.out, "lm loss");
  ASSERT_FALSE(la.empty()) << a.out;
  ASSERT_EQ(lb.size(), 1u) << b.out;
  ASSERT_FALSE(lraw.empty()) << raw.out;
  EXPECT_EQ(la[0], lb[0]);
  EXPECT_NE(la[0], lraw[0]);  // the FIM sample, not the raw one
}

// Each data-parallel rank reads its own samples with its own stream: at DP 2 rank 1's first sample
// comes from a fresh RandomState (golden case dp2), so the loss is the mean of the single-process
// losses of the two golden samples.
TEST(FimCli, DataParallelRanksHaveTheirOwnStreams) {
  const std::string dir = scratch("gale_fim_dp2");
  const nlohmann::json& c = golden()["cases"][4];
  ASSERT_EQ(c["name"], "dp2");
  const std::vector<std::string> model = {"--lr", "1e-3", "--log-interval", "1", "--hidden-dropout", "0",
                                          "--attention-dropout", "0", "--init-method-std", "0.2", "--num-threads",
                                          "1", "--exit-interval", "1"};
  std::vector<std::string> fim = case_flags(c);  // --micro-batch-size 1 --global-batch-size 2
  fim.insert(fim.end(), model.begin(), model.end());
  std::vector<std::string> argv = {GALE_BINARY, "pretrain"};
  argv.insert(argv.end(), fim.begin(), fim.end());
  argv.push_back("--fim-data");
  const test::RunResult dp2 = test::run_with_timeout(testing::launch_argv(2, argv, {}), testing::kMpiEnv, 600);
  ASSERT_EQ(dp2.exit_code, 0) << dp2.output;
  const std::vector<double> l2 = testing::logged_values(dp2.output, "lm loss");
  ASSERT_EQ(l2.size(), 1u) << dp2.output;

  std::vector<double> single;
  for (int k = 0; k < 2; ++k) {  // one document holding golden sample k, one process
    const std::string prefix = dir + "/golden_sample_" + std::to_string(k);
    testing::write_dataset(prefix, {c["fim"][k].get<std::vector<int32_t>>()});
    std::vector<std::string> plain = fim;
    for (size_t i = 0; i + 1 < plain.size(); ++i) {
      if (plain[i] == "--data-path") plain[i + 1] = prefix;
      if (plain[i] == "--global-batch-size") plain[i + 1] = "1";
      if (plain[i] == "--train-iters") plain[i + 1] = "1";
    }
    const testing::CommandResult r = testing::run_gale("pretrain" + quoted(plain), dir);
    ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
    const std::vector<double> l = testing::logged_values(r.out, "lm loss");
    ASSERT_EQ(l.size(), 1u) << r.out;
    single.push_back(l[0]);
  }
  EXPECT_NE(single[0], single[1]);
  EXPECT_NEAR(l2[0], (single[0] + single[1]) / 2, 2e-5 * l2[0]);
}

// The model flags of the pretrain tests: no dropout, one logged loss per iteration.
std::vector<std::string> train_flags(const nlohmann::json& c, std::vector<std::string> extra) {
  std::vector<std::string> f = case_flags(c);
  const std::vector<std::string> model = {"--lr", "1e-3", "--log-interval", "1", "--hidden-dropout", "0",
                                          "--attention-dropout", "0", "--init-method-std", "0.2", "--num-threads",
                                          "1"};
  f.insert(f.end(), model.begin(), model.end());
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

// `flags` with `flag`'s value replaced (the flag must be there).
std::vector<std::string> with(std::vector<std::string> flags, const std::string& flag, const std::string& value) {
  auto it = std::find(flags.begin(), flags.end(), flag);
  EXPECT_NE(it, flags.end()) << flag;
  if (it != flags.end()) *(it + 1) = value;
  return flags;
}

// The first logged loss of `gale pretrain` (under mpirun when np > 1).
double first_loss(int np, const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {GALE_BINARY, "pretrain"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  const test::RunResult r = test::run_with_timeout(testing::launch_argv(np, argv, {}), testing::kMpiEnv, 600);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> l = testing::logged_values(r.output, "lm loss");
  EXPECT_FALSE(l.empty()) << r.output;
  return l.empty() ? 0.0 : l[0];
}

// --iterations-to-skip: Megatron's dummy_train_step reads the skipped iterations' samples through
// the data loader, so the FIM stream moves past them; after skipping iterations 0 and 1 (samples 0
// and 1 at --global-batch-size 1) the first trained iteration reads golden sample 2, Megatron's
// third FIM sample of the one stream.
TEST(FimCli, SkippedIterationsAdvanceTheStream) {
  const std::string dir = scratch("gale_fim_skip");
  const nlohmann::json& c = golden()["cases"][0];  // psm_spm: one sample per iteration, no workers
  ASSERT_EQ(c["name"], "psm_spm");
  const std::vector<std::string> fim = train_flags(c, {"--fim-data", "--iterations-to-skip", "0", "1"});
  const double skipped = first_loss(1, fim);

  std::vector<double> golden_loss;
  for (int k : {0, 2}) {  // one document holding golden sample k, its only sample, without --fim-data
    const std::string prefix = dir + "/golden_sample_" + std::to_string(k);
    testing::write_dataset(prefix, {c["fim"][k].get<std::vector<int32_t>>()});
    golden_loss.push_back(first_loss(1, with(with(train_flags(c, {}), "--data-path", prefix), "--train-iters", "1")));
  }
  EXPECT_NE(golden_loss[0], golden_loss[1]);
  EXPECT_EQ(skipped, golden_loss[1]);
}

// Virtual pipeline stages: Megatron's first-stage chunk 0 and last-stage chunk V-1 each have a
// FIM dataset with a fresh stream and read micro-batches 0, 1, ... in order, so the FIM samples are
// those of one stream (golden samples 0 and 1 for the two micro-batches of the first iteration).
// At PP 2 with 2 chunks per stage the first loss is the mean of the one-process losses of golden
// samples 0 and 1 (Gale's initialisation does not depend on the layout).
TEST(FimCli, VirtualPipelineStagesReadOneStream) {
  const std::string dir = scratch("gale_fim_vpp");
  const nlohmann::json& c = golden()["cases"][0];  // psm_spm: 16 samples
  ASSERT_EQ(c["name"], "psm_spm");
  // 8 iterations of 2 micro-batches read the same 16 GPT samples as the golden 16 of 1.
  std::vector<std::string> flags = with(with(with(train_flags(c, {"--pipeline-model-parallel-size", "2",
                                                                  "--num-layers-per-virtual-pipeline-stage", "1",
                                                                  "--exit-interval", "1", "--fim-data"}),
                                                   "--num-layers", "4"),
                                              "--global-batch-size", "2"),
                                         "--train-iters", "8");
  const double vpp = first_loss(2, flags);

  std::vector<double> golden_loss;
  for (int k = 0; k < 2; ++k) {  // one document holding golden sample k, its only sample, one process
    const std::string prefix = dir + "/golden_sample_" + std::to_string(k);
    testing::write_dataset(prefix, {c["fim"][k].get<std::vector<int32_t>>()});
    golden_loss.push_back(first_loss(
        1, with(with(with(train_flags(c, {}), "--num-layers", "4"), "--train-iters", "1"), "--data-path", prefix)));
  }
  EXPECT_NE(golden_loss[0], golden_loss[1]);
  EXPECT_NEAR(vpp, (golden_loss[0] + golden_loss[1]) / 2, 2e-6 * vpp);
}

// --dataloader-inter-document-masking: Megatron's GPTFIMDataset gives the whole sample as one
// document ([sample_len]), so the FIM sample trains as one causal sequence with positions 0, 1, ...
// although its raw sample spans three documents (EODs at 6 and 45) and the FIM sample has an EOD
// at 10: the first loss is that of golden sample 0 trained plainly.
TEST(FimCli, InterDocumentMaskingTakesTheFimSampleAsOneDocument) {
  const std::string dir = scratch("gale_fim_idm");
  const nlohmann::json& c = golden()["cases"][0];
  ASSERT_EQ(c["name"], "psm_spm");
  const double masked = first_loss(1, train_flags(c, {"--fim-data", "--dataloader-inter-document-masking"}));
  const std::string prefix = dir + "/golden_sample_0";
  testing::write_dataset(prefix, {c["fim"][0].get<std::vector<int32_t>>()});
  const std::vector<std::string> plain = with(with(train_flags(c, {}), "--data-path", prefix), "--train-iters", "1");
  std::vector<std::string> by_eods = plain;
  by_eods.insert(by_eods.end(), {"--reset-attention-mask", "--reset-position-ids"});
  EXPECT_EQ(masked, first_loss(1, plain));
  EXPECT_NE(masked, first_loss(1, by_eods));  // the EOD at 10 would matter
}

}  // namespace
}  // namespace gale
