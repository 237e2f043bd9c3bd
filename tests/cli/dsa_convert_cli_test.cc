// `gale convert` and `gale generate` on the DeepSeek-V3.2 fixture (tests/data/hf/deepseek_v32, a
// DeepseekV32ForCausalLM with DSA's lightning indexer): the converted checkpoint generates the
// reference's 5 greedy tokens (incremental decoding with the indexer's key cache, alone, statically
// batched and dynamically batched); Hugging Face -> Megatron (TP 2) -> Hugging Face writes the files
// Gale -> Hugging Face writes (tests/train/hf_convert_dsa_test.cc: those hold the fixture's tensors bit
// for bit).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>

#include "checkpoint_inference.h"
#include "subprocess.h"

namespace gale {
namespace {

const std::string kFixture = std::string(GALE_TEST_DATA_DIR) + "/hf/deepseek_v32";
// The fixture's golden tokens and its reference greedy continuation (golden.safetensors).
const char* const kPrompt = "15 92 21 86 83 47 87 79 88 61 58 31";
const char* const kGreedy = "47 45 89 39 64";

test::RunResult gale(std::vector<std::string> args) {
  args.insert(args.begin(), GALE_BINARY);
  return test::run_with_timeout(args, {"OMP_NUM_THREADS=1"}, 300);
}

test::RunResult generate(const std::string& ckpt, std::vector<std::string> extra) {
  std::vector<std::string> argv = {"generate", "--load", ckpt, "--use-checkpoint-args", "--tokenizer-type",
                                   "NullTokenizer", "--vocab-size", "99", "--temperature", "0", "--max-new-tokens", "5"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return gale(argv);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(GaleConvertDsa, ConvertedDeepseekV32GeneratesTheReferenceGreedyTokens) {
  const std::string dir = "/tmp/gale_dsa_convert_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  test::RunResult r = gale({"convert", "--load-model-type", "hf", "--save-model-type", "gale", "--load-dir", kFixture,
                            "--save-dir", dir + "/gale"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("converting DeepseekV32ForCausalLM"), std::string::npos) << r.output;
  const std::string want = std::string(kPrompt) + " " + kGreedy + "\n";
  r = generate(dir + "/gale", {"--prompt", kPrompt});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(want), std::string::npos) << r.output;
  {
    std::ofstream out(dir + "/prompts.txt");
    out << kPrompt << "\n" << kPrompt << "\n";
  }
  for (const std::vector<std::string>& batching :
       {std::vector<std::string>{"--inference-max-requests", "2"},
        testing::small_dynamic_batching_flags("0.0075", "64")}) {
    std::vector<std::string> flags = {"--prompts-file", dir + "/prompts.txt"};
    flags.insert(flags.end(), batching.begin(), batching.end());
    r = generate(dir + "/gale", flags);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string twice = want + want;
    EXPECT_NE(std::regex_replace(r.output, std::regex(R"(\[[^\]\n]*tokens/s[^\]\n]*\]\n)"), "").find(twice),
              std::string::npos)
        << r.output;
  }

  r = gale({"convert", "--load-model-type", "hf", "--save-model-type", "mg", "--load-dir", kFixture, "--save-dir",
            dir + "/mg", "--target-tensor-parallel-size", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = gale({"convert", "--load-model-type", "mg", "--save-model-type", "hf", "--load-dir", dir + "/mg", "--save-dir",
            dir + "/hf"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = gale({"convert", "--load-model-type", "gale", "--save-model-type", "hf", "--load-dir", dir + "/gale",
            "--save-dir", dir + "/hf_direct"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(slurp(dir + "/hf/model.safetensors"), slurp(dir + "/hf_direct/model.safetensors"));
  EXPECT_EQ(slurp(dir + "/hf/config.json"), slurp(dir + "/hf_direct/config.json"));
  std::filesystem::remove_all(dir);
}

// Megatron's torch_dist of the fixture saved at TP 2 (tests/data/megatron/dsa/torch_dist_tp2,
// tools/reference/megatron_gdn_dsa_torch_dist_reference.py): `gale generate --load` on it gives the reference's
// greedy tokens, and `gale convert` mg -> hf writes the files the torch-format TP 2 files give, byte for byte.
TEST(GaleConvertDsa, MegatronTorchDistGeneratesAndConvertsAsTheTorchFormat) {
  const std::string megatron = std::string(GALE_TEST_DATA_DIR) + "/megatron/dsa/";
  const std::string dir = "/tmp/gale_dsa_torch_dist_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  test::RunResult r = generate(megatron + "torch_dist_tp2", {"--prompt", kPrompt});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(std::string(kPrompt) + " " + kGreedy + "\n"), std::string::npos) << r.output;
  for (const char* layout : {"tp2", "torch_dist_tp2"}) {
    r = gale({"convert", "--load-model-type", "mg", "--save-model-type", "hf", "--load-dir", megatron + layout,
              "--save-dir", dir + "/" + layout});
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  const std::string a = slurp(dir + "/tp2/model.safetensors");
  EXPECT_FALSE(a.empty());
  EXPECT_TRUE(a == slurp(dir + "/torch_dist_tp2/model.safetensors"));
  EXPECT_EQ(slurp(dir + "/tp2/config.json"), slurp(dir + "/torch_dist_tp2/config.json"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gale
