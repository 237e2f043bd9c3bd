// `gale convert` of DeepSeek-V3.2 (DeepseekV32ForCausalLM, tests/data/hf/deepseek_v32 from
// tools/reference/hf_fixture_deepseek_v32.py, an independent torch restatement of transformers'
// DeepseekV32) to and from Gale's DeepSeek sparse attention: the checkpoint records the indexer's
// flags, Gale's logits and greedy tokens match the reference (the top-k selection included: swapping
// the indexer's RoPE halves or dropping the sparse selection breaks them), decoding with a KV cache
// gives the whole-sequence forward's tokens, the round trip returns every tensor bit for bit, and what
// does not map exactly is refused naming the key or flag.
#include <cstring>

#include "hf_test_fixtures.h"
#include "model/kv_cache.h"
#include "model/decoding_check.h"
#include "train/hf_deepseek_v32.h"

namespace gale {
namespace {

using namespace testing_hf;

const char* const kFixture = "deepseek_v32";

std::vector<int32_t> golden_greedy() {
  auto f = SafetensorsFile::open(fixture(kFixture) + "/golden.safetensors");
  EXPECT_TRUE(f.ok());
  Tensor t = f->read("greedy", DType::kI64).value();
  std::vector<int32_t> out;
  for (int64_t i = 0; i < t.numel(); ++i) out.push_back(static_cast<int32_t>(t.data<int64_t>()[i]));
  return out;
}

nlohmann::json fixture_config() {
  std::ifstream in(fixture(kFixture) + "/config.json");
  return nlohmann::json::parse(in);
}

TEST(HfConvertDsa, DeepseekV32RecordsTheIndexerAndMatchesTheReferenceLogits) {
  TempDir tmp;
  Status s = convert_hf_to_gale(to_gale(fixture(kFixture), tmp.file("gale")), quiet);
  ASSERT_TRUE(s.ok()) << s.message();
  auto r = CheckpointReader::open(tmp.file("gale"));
  ASSERT_TRUE(r.ok());
  nlohmann::json args = r->section("args").value();
  EXPECT_EQ(args["experimental_attention_variant"], "dsa");
  EXPECT_EQ(args["dsa_indexer_n_heads"], 4);
  EXPECT_EQ(args["dsa_indexer_head_dim"], 8);
  EXPECT_EQ(args["dsa_indexer_topk"], 5);
  EXPECT_EQ(args["dsa_indexer_loss_coeff"], 0.0);
  EXPECT_EQ(args["multi_latent_attention"], true);

  const Golden g = read_golden(kFixture);
  auto lm = load_model(tmp.file("gale"));
  const Comparison c = compare(logits_of(*lm->model, g.tokens), g);
  EXPECT_LT(c.max_diff, kLogitTolerance);
  EXPECT_NEAR(c.loss, g.loss, 1e-4);

  // Greedy decoding with a KV cache (the indexer's keys cached too): the reference's 5 tokens, each
  // step's logits those of rerunning the whole sequence.
  KvCache cache = make_kv_cache(lm->config, lm->model->partition(), 1, 32);
  std::vector<std::vector<int32_t>> seqs;
  const double worst = testing::greedy_against_full_forward(*lm->model, cache, {g.tokens}, 4, &seqs);
  EXPECT_LT(worst, 1e-4);
  const std::vector<int32_t> want = golden_greedy();
  EXPECT_EQ(std::vector<int32_t>(seqs[0].begin() + static_cast<int64_t>(g.tokens.size()), seqs[0].end()), want);

  // The selection matters: with every key selected (top-k 12) the logits leave the reference.
  auto dense = load_model(tmp.file("gale"), [](nlohmann::json& a) { a["dsa_indexer_topk"] = 12; });
  EXPECT_GT(compare(logits_of(*dense->model, g.tokens), g).max_diff, 100 * kLogitTolerance);
  // The indexer's RoPE is rotate-half on each head's first dims: swapping wk's rotary halves of
  // layer 1 (what an interleaved reading would do to the pairs) changes the selected keys.
  ParamBuffer& pb = lm->model->params();
  const int wk = pb.find("decoder.layers.1.self_attention.indexer.linear_wk.weight");
  ASSERT_GE(wk, 0);
  float* w = pb.param_data(wk);
  const int64_t H = 32;  // rows 0-1 and 2-3 are the rotary halves (qk_rope_head_dim 4)
  std::swap_ranges(w, w + 2 * H, w + 2 * H);
  EXPECT_GT(compare(logits_of(*lm->model, g.tokens), g).max_diff, 10 * kLogitTolerance);
}

TEST(HfConvertDsa, RoundTripReturnsEveryTensorBitForBitAndTheConfigKeys) {
  TempDir tmp;
  Status s = convert_hf_to_gale(to_gale(fixture(kFixture), tmp.file("gale")), quiet);
  ASSERT_TRUE(s.ok()) << s.message();
  s = convert_gale_to_hf(to_hf(tmp.file("gale"), tmp.file("back")), quiet);
  ASSERT_TRUE(s.ok()) << s.message();
  const auto before = tensors_of(fixture(kFixture) + "/model.safetensors");
  const auto after = tensors_of(tmp.file("back/model.safetensors"));
  EXPECT_EQ(after.size(), before.size());
  for (const auto& [name, a] : before) {
    ASSERT_TRUE(after.count(name)) << name;
    const Tensor& b = after.at(name);
    ASSERT_EQ(a.shape(), b.shape()) << name;
    EXPECT_EQ(0, std::memcmp(a.data<float>(), b.data<float>(), a.nbytes())) << name;
  }
  std::ifstream in(tmp.file("back/config.json"));
  const nlohmann::json back = nlohmann::json::parse(in);
  EXPECT_EQ(back["architectures"], nlohmann::json::array({"DeepseekV32ForCausalLM"}));
  EXPECT_EQ(back["model_type"], "deepseek_v32");
  EXPECT_EQ(back["index_n_heads"], 4);
  EXPECT_EQ(back["index_head_dim"], 8);
  EXPECT_EQ(back["index_topk"], 5);
  EXPECT_EQ(back["num_nextn_predict_layers"], 0);
  EXPECT_EQ(back["rope_interleave"], true);  // MLA's q_pe / k_pe; the indexer's are rotate-half
}

// What does not map exactly is refused, naming the file and key (import) or the flag (export).
TEST(HfConvertDsa, RefusesWhatDoesNotMapExactly) {
  nlohmann::json c = fixture_config();
  c["rms_norm_eps"] = 1e-5;
  auto eps = hf_model_from_config(c, "d/config.json", 128, 1);
  ASSERT_FALSE(eps.ok());
  EXPECT_EQ(eps.status().message(),
            "d/config.json: 'rms_norm_eps' = 1e-05 with the DeepSeek-V3.2 indexer is not supported yet (DeepSeek's "
            "indexer k_norm is a LayerNorm with eps 1e-6; Gale's uses the model's --norm-epsilon for both)");
  c = fixture_config();
  c["index_head_dim"] = 2;
  auto narrow = hf_model_from_config(c, "d/config.json", 128, 1);
  ASSERT_FALSE(narrow.ok());
  EXPECT_EQ(narrow.status().message(), "d/config.json: 'index_head_dim' = 2: expected at least qk_rope_head_dim (4): "
                                       "the indexer rotates its first qk_rope_head_dim dims");
  c = fixture_config();
  c["quantization_config"] = {{"quant_method", "fp8"}};
  auto fp8 = hf_model_from_config(c, "d/config.json", 128, 1);
  ASSERT_FALSE(fp8.ok());
  EXPECT_NE(fp8.status().message().find("'quantization_config'"), std::string::npos) << fp8.status().message();
  // Defaults as transformers' DeepseekV32Config when the keys are absent.
  c = fixture_config();
  c.erase("index_n_heads");
  c.erase("index_head_dim");
  c.erase("index_topk");
  auto defaults = hf_model_from_config(c, "d/config.json", 128, 1);
  ASSERT_TRUE(defaults.ok()) << defaults.status().message();
  EXPECT_EQ(defaults->model.dsa_indexer_n_heads, 64);
  EXPECT_EQ(defaults->model.dsa_indexer_head_dim, 128);
  EXPECT_EQ(defaults->model.dsa_indexer_topk, 2048);

  // MTP layers of a DSA model (each with an indexer in DeepSeek's files): refused both ways, naming
  // --mtp-num-layers (a dense DeepSeek-V3 refuses MTP layers before, so called directly here).
  auto m0 = hf_model_from_config(fixture_config(), "d/config.json", 128, 1);
  ASSERT_TRUE(m0.ok());
  const Status mtp = refuse_deepseek_v32_mtp(m0->model, 1, "d/config.json");
  EXPECT_EQ(mtp.message(), "d/config.json: 1 multi-token-prediction layer(s) of a DeepSeek sparse attention model "
                           "(--experimental-attention-variant dsa): converting them is not supported yet (pass "
                           "--mtp-num-layers 0 to leave them out)");
  EXPECT_TRUE(refuse_deepseek_v32_mtp(m0->model, 0, "d/config.json").ok());

  // Export: the same rules from the flags.
  auto m = hf_model_from_config(fixture_config(), "d/config.json", 128, 1);
  ASSERT_TRUE(m.ok());
  ModelArgs other_eps = m->model;
  other_eps.norm_epsilon = 1e-5;
  auto e1 = hf_model_from_args(other_eps, m->moe, 100, "ckpt");
  ASSERT_FALSE(e1.ok());
  EXPECT_EQ(e1.status().message(), "ckpt: a DeepSeek sparse attention model is written as DeepseekV32ForCausalLM only "
                                   "with --norm-epsilon 1e-06 (DeepSeek's indexer k_norm is a LayerNorm with eps 1e-6), "
                                   "found 1e-05");
  ModelArgs with_mtp = m->model;
  with_mtp.mtp_num_layers = 1;
  EXPECT_FALSE(hf_model_from_args(with_mtp, m->moe, 100, "ckpt").ok());
}

}  // namespace
}  // namespace gale
