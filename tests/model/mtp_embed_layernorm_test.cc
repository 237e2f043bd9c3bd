// --embed-layernorm with multi-token prediction (model/gpt_model.h): the MTP layers' embedding of the rolled
// ids goes through the same embedding norm as the decoder's (MindSpeed-LLM's norm is part of the embedding
// module its MTP block calls). Finite-difference gradients of every parameter (embedding.norm's included, now
// reached through the decoder and both MTP depths) of main + factor/D·Σ L_k, LayerNorm (GPT) and RMSNorm
// (LLaMA); and the MTP losses equal those of the model without the norm whose word embedding rows are the
// normalised rows (RoPE, so the norm acts on each row alone).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "model/gpt_model.h"
#include "model_test_batches.h"
#include "mtp_gradcheck.h"
#include "testing.h"

namespace gale {
namespace {

using testing::expect_mtp_gradients_match;
using testing::mtp_objective;

ModelConfig config(bool llama, bool embed_layernorm) {
  ModelConfig c = testing::gradcheck_gpt_config();
  if (llama) {
    use_llama_architecture(c);
    c.heads = 4;
    c.kv_heads = 2;
    c.head_dim = 4;
  }
  c.mtp_num_layers = 2;
  c.mtp_loss_scaling_factor = 0.3;
  c.embed_layernorm = embed_layernorm;
  return c;
}

class MtpEmbedLayernorm : public ::testing::TestWithParam<bool> {};  // GPT or LLaMA

TEST_P(MtpEmbedLayernorm, EveryParameterMatchesFiniteDifferences) {
  const ModelConfig c = config(GetParam(), true);
  const OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(42);
  ParamBuffer& pb = model.params();
  const int w = pb.find("embedding.norm.weight");
  ASSERT_GE(w, 0);
  for (int64_t i = 0; i < c.hidden; ++i) pb.param_data(w)[i] = 1.0f + 0.05f * static_cast<float>(i % 7);  // not ones
  const MicroBatch mb = testing::masked_batch(c, 2, 7, /*documents=*/false);
  std::vector<double> mtp;
  const std::vector<std::string> names = expect_mtp_gradients_match(model, mb, 5e-3, &mtp);
  ASSERT_EQ(mtp.size(), 2u);
  EXPECT_GT(testing::count_names(names, "embedding.norm."), 0);
  EXPECT_GT(testing::count_names(names, "mtp.layers."), 10);
}

// With RoPE (no position table) the embedding norm acts on each word-embedding row alone, so a model with
// --embed-layernorm (norm weights and bias not trivial) equals the model without it whose word embedding
// rows are the normalised rows, computed here (untied output layer, copied): the same LM loss and the same
// MTP losses. An MTP path that skipped the norm would give other MTP losses (the LM loss would still agree).
TEST_P(MtpEmbedLayernorm, EqualsTheModelWithNormalisedEmbeddingRows) {
  ModelConfig c = config(GetParam(), true);
  c.position = PositionEmbedding::kRope;
  c.tied_embeddings = false;
  ModelConfig plain = c;
  plain.embed_layernorm = false;
  const OpTable ops = reference_ops();
  GPTModel a(c, single_process_partition(c), &ops), b(plain, single_process_partition(plain), &ops);
  a.params().initialize(7);
  b.params().initialize(7);
  ParamBuffer &pa = a.params(), &pb = b.params();
  const int64_t H = c.hidden;
  std::vector<float> w(static_cast<size_t>(H)), bias(static_cast<size_t>(H), 0.0f);
  for (int64_t i = 0; i < H; ++i) {
    w[i] = 0.6f + 0.1f * static_cast<float>(i % 9);
    if (!c.rms_norm) bias[i] = 0.05f * static_cast<float>(i % 5) - 0.1f;
  }
  std::copy(w.begin(), w.end(), pa.param_data(pa.find("embedding.norm.weight")));
  if (!c.rms_norm) std::copy(bias.begin(), bias.end(), pa.param_data(pa.find("embedding.norm.bias")));
  for (int id = 0; id < pb.size(); ++id) {  // b: a's parameters, the word embedding rows normalised
    const ParamSpec& s = pb.spec(id);
    const float* from = pa.param_data(pa.find(s.name));
    float* to = pb.param_data(id);
    std::copy(from, from + s.local_numel(), to);
    if (s.name != "embedding.word_embeddings.weight") continue;
    for (int64_t v = 0; v < c.vocab; ++v) {
      float* row = to + v * H;
      double mean = 0.0, sq = 0.0;
      for (int64_t i = 0; i < H; ++i) mean += row[i];
      mean = c.rms_norm ? 0.0 : mean / static_cast<double>(H);
      for (int64_t i = 0; i < H; ++i) sq += (row[i] - mean) * (row[i] - mean);
      const double inv = 1.0 / std::sqrt(sq / static_cast<double>(H) + c.norm_eps);
      for (int64_t i = 0; i < H; ++i) row[i] = static_cast<float>((row[i] - mean) * inv * w[i] + bias[i]);
    }
  }
  const MicroBatch mb = testing::masked_batch(c, 2, 7, /*documents=*/false);
  std::vector<double> la, lb;
  const double ja = mtp_objective(a, mb, true, &la), jb = mtp_objective(b, mb, true, &lb);
  ASSERT_EQ(la.size(), 2u);
  ASSERT_EQ(lb.size(), 2u);
  for (size_t k = 0; k < 2; ++k) EXPECT_NEAR(la[k], lb[k], 1e-5 * lb[k]) << "depth " << k + 1;
  EXPECT_NEAR(ja, jb, 1e-5 * jb);
}

INSTANTIATE_TEST_SUITE_P(Models, MtpEmbedLayernorm, ::testing::Values(false, true),
                         [](const auto& info) { return std::string(info.param ? "llama" : "gpt"); });

}  // namespace
}  // namespace gale
