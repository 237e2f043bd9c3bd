// --sft, --sft-tokenizer-prompt-format and --dataloader-inter-document-masking: Megatron's
// defaults, what reaches DataArgs, and whole one-line errors.
#include <gtest/gtest.h>

#include <algorithm>

#include "pretrain_cli.h"
#include "train/arguments.h"

namespace gale {
namespace {

using Cli = testing::PretrainCli;

std::vector<std::string> sft_flags(std::vector<std::string> extra) {
  std::vector<std::string> f = {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                                "--seq-length", "16", "--max-position-embeddings", "32", "--micro-batch-size", "2",
                                "--train-iters", "10", "--lr", "1e-3", "--data-path", "chat.jsonl",
                                "--tokenizer-type", "SFTTokenizer", "--tokenizer-model", "tok"};
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

TEST(SftArguments, MegatronDefaults) {
  Cli cli;
  ASSERT_TRUE(cli.parse(sft_flags({"--sft"})).ok());
  const DataArgs& d = cli.args.data;
  EXPECT_TRUE(d.sft);
  EXPECT_EQ(d.sft_tokenizer_prompt_format, "nemotron-h-aligned");
  EXPECT_FALSE(d.dataloader_inter_document_masking);
  EXPECT_TRUE(d.document_attention());
  Cli plain;
  ASSERT_TRUE(plain.parse(sft_flags({"--tokenizer-type", "HuggingFaceTokenizer"})).ok());
  EXPECT_FALSE(plain.args.data.sft);
  EXPECT_FALSE(plain.args.data.document_attention());
}

TEST(SftArguments, EveryFlagIsRead) {
  Cli cli;
  ASSERT_TRUE(cli.parse(sft_flags({"--sft", "--sft-tokenizer-prompt-format", "nemotron-nano-v2"})).ok());
  EXPECT_EQ(cli.args.data.sft_tokenizer_prompt_format, "nemotron-nano-v2");
  Cli masking;
  ASSERT_TRUE(
      masking.parse(sft_flags({"--tokenizer-type", "HuggingFaceTokenizer", "--dataloader-inter-document-masking"}))
          .ok());
  EXPECT_TRUE(masking.args.data.dataloader_inter_document_masking);
  EXPECT_TRUE(masking.args.data.document_attention());
}

struct SftError {
  std::vector<std::string> flags;
  std::string message;  // the whole message
};

class SftArgumentErrors : public ::testing::TestWithParam<SftError> {};

TEST_P(SftArgumentErrors, WholeMessage) {
  Cli cli;
  const Status s = cli.parse(sft_flags(GetParam().flags));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), GetParam().message);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, SftArgumentErrors,
    ::testing::Values(
        SftError{{"--sft", "--tokenizer-type", "HuggingFaceTokenizer"},
                 "--sft: expected --tokenizer-type SFTTokenizer (Megatron's SFT dataset tokenizes conversations with "
                 "it), found HuggingFaceTokenizer"},
        SftError{{}, "--tokenizer-type SFTTokenizer without --sft: not supported yet (Gale reads it for Megatron's SFT "
                     "dataset only)"},
        SftError{{"--sft", "--sft-tokenizer-prompt-format", "default"},
                 "--sft-tokenizer-prompt-format default: not supported yet (it renders the tokenizer's own Jinja "
                 "chat_template); Gale has nemotron-h-aligned, nemotron-nano-v2 and identity"},
        SftError{{"--sft", "--sft-tokenizer-prompt-format", "chatml"},
                 "--sft-tokenizer-prompt-format: expected nemotron-h-aligned, nemotron-nano-v2, identity or default, "
                 "found 'chatml'"},
        SftError{{"--sft", "--reset-attention-mask"},
                 "--sft with --reset-position-ids or --reset-attention-mask: expected neither (Megatron's SFT dataset "
                 "asserts both are off: positions and attention follow the conversations)"},
        SftError{{"--sft", "--fim-data"},
                 "--sft with --fim-data, --is-instruction-dataset or --is-pairwise-dataset: expected one kind of "
                 "dataset, found two"},
        SftError{{"--tokenizer-type", "HuggingFaceTokenizer", "--dataloader-inter-document-masking",
                  "--is-instruction-dataset"},
                 "--dataloader-inter-document-masking with --is-instruction-dataset: expected GPT pretraining data "
                 "(Megatron-LM applies it in GPTDataset, to its GPT and FIM samples; the instruction and pairwise "
                 "datasets are MindSpeed-LLM's, which has no such flag)"},
        SftError{{"--tokenizer-type", "HuggingFaceTokenizer", "--dataloader-inter-document-masking",
                  "--is-pairwise-dataset"},
                 "--dataloader-inter-document-masking with --is-pairwise-dataset: expected GPT pretraining data "
                 "(Megatron-LM applies it in GPTDataset, to its GPT and FIM samples; the instruction and pairwise "
                 "datasets are MindSpeed-LLM's, which has no such flag)"}));

// `flags` with --data-path FILE replaced by `replacement`.
std::vector<std::string> without_data_path(std::vector<std::string> flags, const std::vector<std::string>& replacement) {
  auto it = std::find(flags.begin(), flags.end(), "--data-path");
  it = flags.erase(it, it + 2);
  flags.insert(it, replacement.begin(), replacement.end());
  return flags;
}

// Megatron-LM main has no mock SFT dataset (SFTDataset fails to build as a mock data generator).
TEST(SftArguments, MockDataIsRefusedAsMegatronFails) {
  Cli cli;
  const Status s = cli.parse(without_data_path(sft_flags({"--sft"}), {"--mock-data"}));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(),
            "--sft with --mock-data: expected --data-path FILE.jsonl (Megatron-LM main has no mock SFT dataset: its "
            "builder hands SFTDataset the dataset path None, which SFTLowLevelDataset cannot load, and fails with "
            "'SFTDataset failed to build as a mock data generator')");
}

// The files may come through --data-args-path / --per-split-data-args-path (read when the data is
// built: tests/cli/sft_pretrain_cli_test.cc).
TEST(SftArguments, DataArgsPathsAreAccepted) {
  Cli one;
  Status s = one.parse(without_data_path(sft_flags({"--sft"}), {"--data-args-path", "files.txt"}));
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(one.args.data.data_args_path, "files.txt");
  Cli per_split;
  s = per_split.parse(without_data_path(sft_flags({"--sft"}), {"--per-split-data-args-path", "splits.json"}));
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(per_split.args.data.per_split_data_args_path, "splits.json");
}

// Megatron's FIM samples take inter-document masking as one document each (data/fim_dataset.h).
TEST(SftArguments, InterDocumentMaskingWithFimIsAccepted) {
  Cli cli;
  const Status s = cli.parse(
      sft_flags({"--tokenizer-type", "HuggingFaceTokenizer", "--dataloader-inter-document-masking", "--fim-data"}));
  EXPECT_TRUE(s.ok()) << s.message();
}

}  // namespace
}  // namespace gale
