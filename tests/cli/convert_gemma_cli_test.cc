// `gale convert` of the tiny Gemma (tests/data/hf/gemma) as a user runs it: HF -> Gale with
// --model-type-hf gemma, then `gale generate` continues the fixture's tokens exactly as the reference's
// greedy decoding (tools/reference/hf_fixture_gemma.py); and through Megatron's format and back.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

#include "ckpt/safetensors.h"
#include "ckpt/temp_dir.h"
#include "subprocess.h"

namespace gale {
namespace {

using testing_util::TempDir;

std::string fixture() { return std::string(GALE_TEST_DATA_DIR) + "/hf/gemma"; }

test::RunResult gale(std::vector<std::string> args) {
  args.insert(args.begin(), GALE_BINARY);
  return test::run_with_timeout(args, {"OMP_NUM_THREADS=1"}, 120);
}

std::vector<int64_t> ints(const std::string& name) {
  Tensor t = SafetensorsFile::open(fixture() + "/golden.safetensors").value().read(name, DType::kI64).value();
  return std::vector<int64_t>(t.data<int64_t>(), t.data<int64_t>() + t.numel());
}

TEST(GaleConvertGemma, GenerateFromTheConvertedCheckpointMatchesTheReferenceGreedy) {
  TempDir tmp;
  const std::string out = tmp.file("gemma");
  test::RunResult r = gale({"convert", "--load-model-type", "hf", "--save-model-type", "gale", "--load-dir", fixture(),
                            "--save-dir", out, "--model-type-hf", "gemma"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string prompt;
  for (int64_t t : ints("tokens")) prompt += (prompt.empty() ? "" : " ") + std::to_string(t);
  std::string expected = prompt;
  for (int64_t t : ints("greedy")) expected += " " + std::to_string(t);
  r = gale({"generate", "--load", out, "--use-checkpoint-args", "--tokenizer-type", "NullTokenizer", "--vocab-size",
            "99", "--prompt", prompt, "--max-new-tokens", "5", "--temperature", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(expected + "\n"), std::string::npos) << "expected " << expected << "\n" << r.output;
}

std::string bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// HF -> Megatron's torch format -> HF: model.safetensors comes back byte for byte (the Megatron args
// carry MindSpeed-LLM's gelu_tanh / add_rmsnorm_offset / input_embeds_norm).
TEST(GaleConvertGemma, MegatronRoundTripIsByteIdentical) {
  TempDir tmp;
  test::RunResult r = gale({"convert", "--load-model-type", "hf", "--save-model-type", "mg", "--load-dir", fixture(),
                            "--save-dir", tmp.file("mg")});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = gale({"convert", "--load-model-type", "mg", "--save-model-type", "hf", "--load-dir", tmp.file("mg"),
            "--save-dir", tmp.file("hf")});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(bytes(tmp.file("hf/model.safetensors")) == bytes(fixture() + "/model.safetensors"));
}

// --model-type-hf must name the architecture config.json describes.
TEST(GaleConvertGemma, ModelTypeHfMustNameGemma) {
  TempDir tmp;
  test::RunResult r = gale({"convert", "--load-model-type", "hf", "--save-model-type", "gale", "--load-dir", fixture(),
                            "--save-dir", tmp.file("x"), "--model-type-hf", "llama"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--model-type-hf llama does not match " + fixture() +
                          "/config.json, which describes a GemmaForCausalLM"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace gale
