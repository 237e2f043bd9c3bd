// --qk-layernorm on standard (MHA/GQA) attention in one process: finite-difference gradients of every
// parameter (RMSNorm and LayerNorm, head_dim unlike hidden/heads), Megatron's names and shapes, the
// norm before RoPE (a document's logits independent of where it starts), flash against the reference
// kernel, and decoding with the KV cache against the whole-sequence forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/fused_ops.h"
#include "model/decoding_check.h"
#include "model/gpt_model.h"
#include "model/kv_cache.h"
#include "testing.h"
#include "model_test_batches.h"
#include "tiny_model_training.h"

namespace gale {
namespace {

using testing::directional_derivative;
using testing::dot;
using testing::random_vector;
using testing::rel_diff;

// testing::small_gqa_rope_config with --qk-layernorm.
ModelConfig qk_config(bool llama) {
  ModelConfig c = testing::small_gqa_rope_config(llama);
  c.qk_layernorm = true;
  return c;
}

// Random q/k norm weights and biases (initialisation leaves them 1 and 0, which hides mistakes).
void perturb_qk_norms(ParamBuffer& pb, uint64_t seed) {
  for (int id = 0; id < pb.size(); ++id) {
    const std::string& name = pb.spec(id).name;
    if (name.find("q_layernorm") == std::string::npos && name.find("k_layernorm") == std::string::npos) continue;
    const int64_t n = pb.spec(id).local_numel();
    auto r = random_vector(n, seed + id);
    const bool weight = name.find(".weight") != std::string::npos;
    for (int64_t i = 0; i < n; ++i) pb.param_data(id)[i] = (weight ? 1.0f : 0.0f) + 0.5f * r[i];
  }
}

MicroBatch make_batch(const ModelConfig& c, int64_t B, uint64_t seed, int32_t position_shift) {
  MicroBatch mb;
  mb.B = B;
  mb.S = c.seq_length;
  const int64_t T = B * mb.S;
  auto r = random_vector(3 * T, seed);
  for (int64_t i = 0; i < T; ++i) {
    mb.tokens.push_back(static_cast<int32_t>((r[i] + 1.0f) * 0.5f * (c.vocab - 1)));
    mb.labels.push_back(static_cast<int32_t>((r[T + i] + 1.0f) * 0.5f * (c.vocab - 1)));
    mb.loss_mask.push_back(r[2 * T + i] > -0.6f ? 1.0f : 0.0f);
    mb.position_ids.push_back(static_cast<int32_t>(i % mb.S) + position_shift);
  }
  return mb;
}

class QkLayerNormGrad : public ::testing::TestWithParam<bool> {};

TEST_P(QkLayerNormGrad, EveryParameterMatchesFiniteDifferences) {
  const ModelConfig c = qk_config(GetParam());
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(42);
  perturb_qk_norms(model.params(), 5);
  MicroBatch mb = make_batch(c, 2, 7, 0);
  testing::mean_loss(model, mb, true);
  ParamBuffer& pb = model.params();
  std::vector<float> grads(pb.flat_grads().data<float>(), pb.flat_grads().data<float>() + pb.numel());
  auto loss = [&] { return testing::mean_loss(model, mb, false); };
  // Central differences in fp32, eps 1e-3, bound 1% of max(|derivative|, 1e-2) (as the MLA test).
  // The embedding's directions check the gradient of the layers' input.
  int norms = 0;
  for (int id = 0; id < pb.size(); ++id) {
    const int64_t n = pb.spec(id).local_numel();
    auto dir = random_vector(n, 100 + id);
    const double analytic = dot(grads.data() + pb.spec(id).offset, dir.data(), n);
    const double numeric = directional_derivative(loss, pb.param_data(id), dir.data(), n, 1e-3);
    EXPECT_LT(rel_diff(analytic, numeric, 1e-2), 1e-2) << pb.spec(id).name << ": " << analytic << " vs " << numeric;
    if (pb.spec(id).name.find("_layernorm.") != std::string::npos && pb.spec(id).name.find("self_attention") != std::string::npos)
      ++norms;
  }
  EXPECT_EQ(norms, GetParam() ? 4 : 8);  // q and k weights per layer (and biases with LayerNorm)
}

INSTANTIATE_TEST_SUITE_P(Norms, QkLayerNormGrad, ::testing::Values(true, false),
                         [](const auto& info) { return std::string(info.param ? "rmsnorm" : "layernorm"); });

TEST(QkLayerNorm, MegatronParameterNamesAndShapes) {
  const ModelConfig c = qk_config(false);
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  const ParamBuffer& pb = model.params();
  for (const char* name : {"q_layernorm.weight", "q_layernorm.bias", "k_layernorm.weight", "k_layernorm.bias"}) {
    const int id = pb.find(std::string("decoder.layers.1.self_attention.") + name);
    ASSERT_GE(id, 0) << name;
    EXPECT_EQ(pb.spec(id).global_shape, (Shape{6})) << name;
    EXPECT_FALSE(pb.spec(id).weight_decay) << name;
  }
  const ModelConfig r = qk_config(true);
  GPTModel rms(r, single_process_partition(r), &ops);
  EXPECT_GE(rms.params().find("decoder.layers.0.self_attention.q_layernorm.weight"), 0);
  EXPECT_EQ(rms.params().find("decoder.layers.0.self_attention.q_layernorm.bias"), -1);
  ModelConfig off = qk_config(true);
  off.qk_layernorm = false;
  GPTModel plain(off, single_process_partition(off), &ops);
  EXPECT_EQ(plain.params().find("decoder.layers.0.self_attention.k_layernorm.weight"), -1);
}

// RoPE applied after the norms keeps attention a function of position differences, so a document
// (--reset-attention-mask's ids) gives the same logits wherever it starts in the sequence; a norm
// after RoPE (its weight not a rotation) would not. (RoPE's positions are the indices in the
// sequence, not position_ids.)
TEST(QkLayerNorm, NormsComeBeforeRope) {
  for (bool llama : {true, false}) {
    ModelConfig c = qk_config(llama);
    OpTable ops = reference_ops();
    GPTModel model(c, single_process_partition(c), &ops);
    model.params().initialize(11);
    perturb_qk_norms(model.params(), 3);
    const int64_t S = c.seq_length, first = 3, n = S - first;  // document 1 at [3, S) in a, at [0, n) in b
    MicroBatch a = make_batch(c, 1, 9, 0), b = a;
    for (int64_t s = 0; s < S; ++s) {
      a.document_ids.push_back(s < first ? 0 : 1);
      b.tokens[s] = a.tokens[(s + first) % S];
      b.document_ids.push_back(s < n ? 0 : 1);
    }
    const Tensor la = model.forward_logits(a, Tensor()), lb = model.forward_logits(b, Tensor());
    double worst = 0.0, scale = 0.0;
    for (int64_t i = 0; i < n * c.vocab; ++i) {
      const double x = la.data<float>()[first * c.vocab + i], y = lb.data<float>()[i];
      worst = std::max(worst, std::abs(x - y));
      scale = std::max(scale, std::abs(x));
    }
    EXPECT_LT(worst, 1e-5 * scale) << (llama ? "RMSNorm" : "LayerNorm");
  }
}

// The tiny Llama (S 70: two flash tiles, GQA 8/2, HD 12) with the q/k norms.
ModelConfig tiny_qk_config() {
  ModelConfig c = testing::tiny_llama_config();
  c.qk_layernorm = true;
  return c;
}

TEST(QkLayerNorm, FlashAttentionMatchesReference) {
  const ModelConfig c = tiny_qk_config();
  const ModelPartition part = single_process_partition(c);
  OpTable ref_ops = reference_ops(), flash_ops = reference_ops();
  GALE_CHECK_OK(install_fused_kernel(flash_ops, "attention", detected_isa()));
  GPTModel ref(c, part, &ref_ops), flash(c, part, &flash_ops);
  ref.params().initialize(3);
  flash.params().initialize(3);
  perturb_qk_norms(ref.params(), 4);
  perturb_qk_norms(flash.params(), 4);
  const MicroBatch mb = testing::tiny_batch(c, 2, 11, /*documents=*/true);
  const double l_ref = testing::mean_loss(ref, mb, true), l_flash = testing::mean_loss(flash, mb, true);
  EXPECT_NEAR(l_ref, l_flash, 1e-5 * std::abs(l_ref));
  testing::expect_close_grads(ref.params(), flash.params(), 1e-4, 1e-7);
}

// The cache holds the keys after norm and RoPE; decoding in chunks gives the whole-sequence logits.
TEST(QkLayerNorm, KvCacheDecodingEqualsTheWholeSequenceForward) {
  const ModelConfig c = tiny_qk_config();
  OpTable ops = reference_ops();
  const ModelPartition part = single_process_partition(c);
  GPTModel model(c, part, &ops);
  model.params().initialize(5);
  perturb_qk_norms(model.params(), 6);
  const int64_t B = 2, S = 23;
  KvCache cache = make_kv_cache(c, part, B, S);
  testing::expect_chunked_decoding_equals_whole_forward(model, cache, model, testing::test_tokens(B * S, c.vocab), B,
                                                        S, {7, 1, 1, 5, 1, 8}, 2e-5);
}

}  // namespace
}  // namespace gale
