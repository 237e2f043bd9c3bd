// --fim-data and its flags: Megatron's defaults, what reaches DataArgs, and whole one-line errors.
#include <gtest/gtest.h>

#include "pretrain_cli.h"
#include "train/arguments.h"

namespace gale {
namespace {

using Cli = testing::PretrainCli;

std::vector<std::string> fim_flags(std::vector<std::string> extra) {
  std::vector<std::string> f = {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                                "--seq-length", "16", "--max-position-embeddings", "32", "--micro-batch-size", "2",
                                "--train-iters", "10", "--lr", "1e-3", "--data-path", "corpus_text_document",
                                "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "tok"};
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

TEST(FimArguments, MegatronDefaults) {
  Cli cli;
  ASSERT_TRUE(cli.parse(fim_flags({"--fim-data"})).ok());
  const DataArgs& d = cli.args.data;
  EXPECT_TRUE(d.fim_data);
  EXPECT_EQ(d.fim_rate, 0.5);
  EXPECT_EQ(d.fim_spm_rate, 0.5);
  EXPECT_FALSE(d.has_fim_split_sample);
  EXPECT_FALSE(d.has_fim_fragment_rate);
  EXPECT_FALSE(d.has_fim_no_prefix);
  EXPECT_EQ(d.fim_prefix_token, "<fim_prefix>");
  EXPECT_EQ(d.fim_middle_token, "<fim_middle>");
  EXPECT_EQ(d.fim_suffix_token, "<fim_suffix>");
  EXPECT_EQ(d.fim_pad_token, "<fim_pad>");
  EXPECT_EQ(d.fim_eod_token, "<|endoftext|>");
}

TEST(FimArguments, EveryFlagIsRead) {
  Cli cli;
  ASSERT_TRUE(cli.parse(fim_flags({"--fim-data", "--fim-rate", "0.9", "--fim-spm-rate", "0.1", "--fim-split-sample",
                                   "<file_sep>", "--fim-fragment-rate", "0.25", "--fim-no-prefix", "<|",
                                   "--fim-prefix-token", "P", "--fim-middle-token", "M", "--fim-suffix-token", "S",
                                   "--fim-pad-token", "D", "--fim-eod-token", "E"}))
                  .ok());
  const DataArgs& d = cli.args.data;
  EXPECT_EQ(d.fim_rate, 0.9);
  EXPECT_EQ(d.fim_spm_rate, 0.1);
  EXPECT_TRUE(d.has_fim_split_sample);
  EXPECT_EQ(d.fim_split_sample, "<file_sep>");
  EXPECT_TRUE(d.has_fim_fragment_rate);
  EXPECT_EQ(d.fim_fragment_rate, 0.25);
  EXPECT_TRUE(d.has_fim_no_prefix);
  EXPECT_EQ(d.fim_no_prefix, "<|");
  EXPECT_EQ(d.fim_prefix_token + d.fim_middle_token + d.fim_suffix_token + d.fim_pad_token + d.fim_eod_token, "PMSDE");
}

struct FimError {
  std::vector<std::string> flags;
  std::string message;  // the whole message
  int64_t world = 1;
};

class FimArgumentErrors : public ::testing::TestWithParam<FimError> {};

TEST_P(FimArgumentErrors, WholeMessage) {
  Cli cli;
  std::vector<std::string> flags = GetParam().flags;
  const bool mock = !flags.empty() && flags.front() == "MOCK";
  if (mock) flags.erase(flags.begin());
  std::vector<std::string> argv = fim_flags(flags);
  if (mock) {  // --mock-data instead of --data-path
    auto it = std::find(argv.begin(), argv.end(), "--data-path");
    argv.erase(it, it + 2);
    argv.push_back("--mock-data");
  }
  const Status s = cli.parse(argv, GetParam().world);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), GetParam().message);
}

// Megatron's FIM dataset runs with virtual pipeline stages and with --iterations-to-skip
// (data/fim_dataset.h); the samples are checked in tests/cli/fim_cli_test.cc.
TEST(FimArguments, VirtualStagesAndSkippedIterationsAreAccepted) {
  Cli vpp;
  EXPECT_TRUE(vpp.parse(fim_flags({"--fim-data", "--num-layers", "4", "--pipeline-model-parallel-size", "2",
                                   "--num-layers-per-virtual-pipeline-stage", "1", "--global-batch-size", "4"}),
                        2)
                  .ok());
  Cli skip;
  const Status s = skip.parse(fim_flags({"--fim-data", "--iterations-to-skip", "2"}));
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(skip.args.training.iterations_to_skip, std::vector<int64_t>{2});
}

INSTANTIATE_TEST_SUITE_P(
    Cases, FimArgumentErrors,
    ::testing::Values(
        FimError{{"MOCK", "--fim-data"}, "--fim-data with --mock-data: Megatron's FIM dataset reads --data-path"},
        FimError{{"--fim-data", "--fim-rate", "0"},
                 "--fim-rate: expected a probability in (0, 1] (Megatron asserts it is non-zero), found 0"},
        FimError{{"--fim-data", "--fim-spm-rate", "1.5"},
                 "--fim-spm-rate: expected a probability in (0, 1] (Megatron asserts it is non-zero), found 1.5"},
        FimError{{"--fim-data", "--fim-split-sample", "<file_sep>"},
                 "--fim-split-sample needs --fim-fragment-rate (the probability of FIM per fragment)"},
        FimError{{"--fim-data", "--fim-split-sample", "<file_sep>", "--fim-fragment-rate", "-0.5"},
                 "--fim-fragment-rate: expected a probability in [0, 1], found -0.5"},
        FimError{{"--fim-data", "--tokenizer-type", "SentencePieceTokenizer"},
                 "--fim-data with --tokenizer-type SentencePieceTokenizer: expected HuggingFaceTokenizer (Megatron-LM "
                 "main's FIM dataset calls ids_to_text(ids, remove_special_tokens=True), which its SentencePiece "
                 "tokenizer does not take: the first sample turned into FIM raises a TypeError)"},
        FimError{{"--fim-data", "--tokenizer-type", "Llama2Tokenizer"},
                 "--fim-data with --tokenizer-type Llama2Tokenizer: expected HuggingFaceTokenizer (Megatron-LM "
                 "main's FIM dataset calls ids_to_text(ids, remove_special_tokens=True), which its SentencePiece "
                 "tokenizer does not take: the first sample turned into FIM raises a TypeError)"},
        FimError{{"--fim-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "100"},
                 "--fim-data with --tokenizer-type NullTokenizer: expected HuggingFaceTokenizer (the NullTokenizer "
                 "has no token names, so Megatron cannot look up the --fim-*-token ids)"},
        FimError{{"--fim-data", "--tokenizer-type", "GPT2BPETokenizer"},
                 "--fim-data with --tokenizer-type GPT2BPETokenizer: not supported yet (Megatron's FIM dataset "
                 "decodes and re-encodes text with a HuggingFaceTokenizer)"}));

}  // namespace
}  // namespace gale
