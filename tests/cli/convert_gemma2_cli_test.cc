// `gale convert` of the tiny Gemma-2 (tests/data/hf/gemma2) and Gemma-3 (gemma3) as a user runs it: HF -> Gale with
// --model-type-hf gemma2, then `gale generate` continues the fixture's tokens exactly as the reference's
// greedy decoding (tools/reference/hf_fixture_gemma2.py: sliding layers, soft-caps and all); and HF ->
// Megatron's torch format (MindSpeed-LLM's Gemma-2 args) -> HF, at TP 1 and 2, byte for byte.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "ckpt/safetensors.h"
#include "ckpt/temp_dir.h"
#include "subprocess.h"

namespace gale {
namespace {

using testing_util::TempDir;

std::string fixture(const std::string& name = "gemma2") { return std::string(GALE_TEST_DATA_DIR) + "/hf/" + name; }

test::RunResult gale(std::vector<std::string> args) {
  args.insert(args.begin(), GALE_BINARY);
  return test::run_with_timeout(args, {"OMP_NUM_THREADS=1"}, 120);
}

std::vector<int64_t> ints(const std::string& name, const std::string& model = "gemma2") {
  Tensor t = SafetensorsFile::open(fixture(model) + "/golden.safetensors").value().read(name, DType::kI64).value();
  return std::vector<int64_t>(t.data<int64_t>(), t.data<int64_t>() + t.numel());
}

std::string bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Gemma-3 (text, tests/data/hf/gemma3: q/k norms, sliding_window_pattern 3) too.
TEST(GaleConvertGemma2, GenerateFromTheConvertedCheckpointMatchesTheReferenceGreedy) {
  for (const std::string model : {"gemma2", "gemma3"}) {
  TempDir tmp;
  const std::string out = tmp.file(model);
  test::RunResult r = gale({"convert", "--load-model-type", "hf", "--save-model-type", "gale", "--load-dir",
                            fixture(model), "--save-dir", out, "--model-type-hf", model});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string prompt;
  for (int64_t t : ints("tokens", model)) prompt += (prompt.empty() ? "" : " ") + std::to_string(t);
  std::string expected = prompt;
  for (int64_t t : ints("greedy", model)) expected += " " + std::to_string(t);
  r = gale({"generate", "--load", out, "--use-checkpoint-args", "--tokenizer-type", "NullTokenizer", "--vocab-size",
            "99", "--prompt", prompt, "--max-new-tokens", "5", "--temperature", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(expected + "\n"), std::string::npos) << model << " expected " << expected << "\n" << r.output;
  }
}

// HF -> Megatron's torch format -> HF: model.safetensors comes back byte for byte (the Megatron args carry
// post_norm, query_pre_attn_scalar and the soft-caps; the window is window_size with the per-layer list).
// Gemma-3's q/k norms as Megatron's qk_layernorm.
TEST(GaleConvertGemma2, MegatronRoundTripIsByteIdentical) {
  for (const std::string model : {"gemma2", "gemma3"})
  for (const char* tp : {"1", "2"}) {
    TempDir tmp;
    test::RunResult r = gale({"convert", "--load-model-type", "hf", "--save-model-type", "mg", "--load-dir",
                              fixture(model), "--save-dir", tmp.file("mg"), "--target-tensor-parallel-size", tp});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = gale({"convert", "--load-model-type", "mg", "--save-model-type", "hf", "--load-dir", tmp.file("mg"),
              "--save-dir", tmp.file("hf")});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(bytes(tmp.file("hf/model.safetensors")) == bytes(fixture(model) + "/model.safetensors"))
        << model << " TP " << tp;
    std::ifstream in(tmp.file("hf/config.json"));
    const nlohmann::json j = nlohmann::json::parse(in);
    if (model == "gemma3") {
      EXPECT_EQ(j["architectures"], nlohmann::json({"Gemma3ForCausalLM"})) << "TP " << tp;
      EXPECT_EQ(j["layer_types"], nlohmann::json({"sliding_attention", "sliding_attention", "full_attention"}));
      continue;
    }
    EXPECT_EQ(j["architectures"], nlohmann::json({"Gemma2ForCausalLM"})) << "TP " << tp;
    EXPECT_EQ(j["attn_logit_softcapping"], 4.0);
    EXPECT_EQ(j["final_logit_softcapping"], 2.5);
    EXPECT_EQ(j["query_pre_attn_scalar"], 20);
    EXPECT_EQ(j["sliding_window"], 4);
    EXPECT_EQ(j["layer_types"], nlohmann::json({"sliding_attention", "full_attention", "sliding_attention"}));
  }
}

// --model-type-hf must name the architecture config.json describes: gemma is not gemma2.
TEST(GaleConvertGemma2, ModelTypeHfMustNameGemma2) {
  TempDir tmp;
  test::RunResult r = gale({"convert", "--load-model-type", "hf", "--save-model-type", "gale", "--load-dir", fixture(),
                            "--save-dir", tmp.file("x"), "--model-type-hf", "gemma"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--model-type-hf gemma does not match " + fixture() +
                          "/config.json, which describes a Gemma2ForCausalLM"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace gale
