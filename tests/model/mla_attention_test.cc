// Multi-latent attention in one process: finite-difference gradients of every parameter (with and
// without --q-lora-rank, with and without the latent norms, V narrower and wider than Q/K, document
// masks, with a MoE layer), Megatron's names and shapes, flash attention against the reference kernel, and
// incremental decoding with the KV cache against the whole-sequence forward.
#include "model/mla_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/fused_ops.h"
#include "model/decoding_check.h"
#include "model/gpt_model.h"
#include "model/kv_cache.h"
#include "mla_test_config.h"
#include "model_test_batches.h"
#include "testing.h"
#include "tiny_model_training.h"

namespace gale {
namespace {

using testing::directional_derivative;
using testing::dot;
using testing::random_vector;
using testing::rel_diff;

using testing::mla_config;

// DeepSeek's layer shape: MLA attention with a MoE MLP (4 SwiGLU experts, top-2) in layer 1.
ModelConfig mla_moe_config() {
  ModelConfig c = mla_config(true, 6, true, 3);
  c.moe.num_experts = 4;
  c.moe.topk = 2;
  c.moe.ffn = 6;
  c.moe.pattern = {0, 1};
  return c;
}

struct MlaCase {
  const char* name;
  ModelConfig config;
  bool documents;
};

class MlaGrad : public ::testing::TestWithParam<MlaCase> {};

TEST_P(MlaGrad, EveryParameterMatchesFiniteDifferences) {
  const MlaCase& mc = GetParam();
  OpTable ops = reference_ops();
  GPTModel model(mc.config, single_process_partition(mc.config), &ops);
  model.params().initialize(42);
  MicroBatch mb = testing::masked_batch(mc.config, 2, 7, mc.documents);
  testing::mean_loss(model, mb, true);
  ParamBuffer& pb = model.params();
  std::vector<float> grads(pb.flat_grads().data<float>(), pb.flat_grads().data<float>() + pb.numel());
  auto loss = [&] { return testing::mean_loss(model, mb, false); };
  // Central differences in fp32, eps 1e-3. Sweeping eps over 3e-4 .. 3e-3 moves the numeric
  // derivatives of this model by up to ~2e-4 (fp32 rounding of the loss, curvature), so the bound
  // is 1% of max(|derivative|, 1e-2): at least 1e-4 absolute for the smallest directions.
  for (int id = 0; id < pb.size(); ++id) {
    const int64_t n = pb.spec(id).local_numel();
    auto dir = random_vector(n, 100 + id);
    const double analytic = dot(grads.data() + pb.spec(id).offset, dir.data(), n);
    const double numeric = directional_derivative(loss, pb.param_data(id), dir.data(), n, 1e-3);
    EXPECT_LT(rel_diff(analytic, numeric, 1e-2), 1e-2) << pb.spec(id).name << ": " << analytic << " vs " << numeric;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Configs, MlaGrad,
    ::testing::Values(MlaCase{"llama_q_lora_norms_v_narrow", mla_config(true, 6, true, 3), false},
                      MlaCase{"llama_direct_q_v_wide", mla_config(true, 0, false, 10), false},
                      MlaCase{"gpt_layernorm_latents_documents", mla_config(false, 6, true, 8), true},
                      MlaCase{"gpt_q_lora_no_norms", mla_config(false, 7, false, 5), false},
                      MlaCase{"llama_direct_q_norms", mla_config(true, 0, true, 3), false},
                      MlaCase{"gpt_direct_q_layernorms_documents", mla_config(false, 0, true, 9), true},
                      MlaCase{"llama_with_moe_layer", mla_moe_config(), false}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Mla, MegatronParameterNamesAndShapes) {
  const ModelConfig c = mla_config(false, 6, true, 3);  // LayerNorm: the latent norms have biases
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  const ParamBuffer& pb = model.params();
  auto shape = [&](const std::string& name) {
    const int id = pb.find("decoder.layers.1.self_attention." + name);
    EXPECT_GE(id, 0) << name;
    return id >= 0 ? pb.spec(id).global_shape : Shape{};
  };
  EXPECT_EQ(shape("linear_q_down_proj.weight"), (Shape{6, 16}));
  EXPECT_EQ(shape("linear_q_up_proj.layer_norm_weight"), (Shape{6}));
  EXPECT_EQ(shape("linear_q_up_proj.layer_norm_bias"), (Shape{6}));
  EXPECT_EQ(shape("linear_q_up_proj.weight"), (Shape{2 * 8, 6}));
  EXPECT_EQ(shape("linear_kv_down_proj.weight"), (Shape{5 + 4, 16}));
  EXPECT_EQ(shape("linear_kv_up_proj.layer_norm_weight"), (Shape{5}));
  EXPECT_EQ(shape("linear_kv_up_proj.layer_norm_bias"), (Shape{5}));
  EXPECT_EQ(shape("linear_kv_up_proj.weight"), (Shape{2 * (4 + 3), 5}));
  EXPECT_EQ(shape("linear_proj.weight"), (Shape{16, 2 * 3}));
  EXPECT_EQ(pb.find("decoder.layers.1.self_attention.linear_qkv.weight"), -1);
  EXPECT_EQ(pb.find("decoder.layers.1.self_attention.linear_q_proj.weight"), -1);
  const ModelConfig direct = mla_config(true, 0, false, 3);
  GPTModel direct_model(direct, single_process_partition(direct), &ops);
  const int q = direct_model.params().find("decoder.layers.0.self_attention.linear_q_proj.weight");
  ASSERT_GE(q, 0);
  EXPECT_EQ(direct_model.params().spec(q).global_shape, (Shape{2 * 8, 16}));
  EXPECT_EQ(direct_model.params().find("decoder.layers.0.self_attention.linear_kv_up_proj.layer_norm_weight"), -1);
  // --qk-layernorm without a query latent: Megatron's norm fused into linear_q_proj, over x.
  const ModelConfig direct_norm = mla_config(false, 0, true, 3);
  GPTModel direct_norm_model(direct_norm, single_process_partition(direct_norm), &ops);
  const int qn = direct_norm_model.params().find("decoder.layers.0.self_attention.linear_q_proj.layer_norm_weight");
  ASSERT_GE(qn, 0);
  EXPECT_EQ(direct_norm_model.params().spec(qn).global_shape, (Shape{16}));
  EXPECT_GE(direct_norm_model.params().find("decoder.layers.0.self_attention.linear_q_proj.layer_norm_bias"), 0);
}

// A larger MLA model: S 70 (two flash tiles, the second partial), padded head width 13.
ModelConfig tiny_mla_config() {
  ModelConfig c = testing::tiny_llama_config();
  c.kv_heads = c.heads;
  c.mla.enabled = true;
  c.mla.q_lora_rank = 10;
  c.mla.kv_lora_rank = 9;
  c.mla.qk_head_dim = 7;
  c.mla.qk_pos_emb_head_dim = 6;
  c.mla.v_head_dim = 5;
  c.mla.qk_layernorm = true;
  return c;
}

// Flash attention (level 2's kernel) against the reference kernel on the padded MLA heads: loss,
// and every gradient within 1e-4 of the largest gradient entry of its parameter.
TEST(Mla, FlashAttentionMatchesReference) {
  const ModelConfig c = tiny_mla_config();
  const ModelPartition part = single_process_partition(c);
  OpTable ref_ops = reference_ops(), flash_ops = reference_ops();
  GALE_CHECK_OK(install_fused_kernel(flash_ops, "attention", detected_isa()));
  GPTModel ref(c, part, &ref_ops), flash(c, part, &flash_ops);
  ref.params().initialize(3);
  flash.params().initialize(3);
  const MicroBatch mb = testing::tiny_batch(c, 2, 11, /*documents=*/true);
  const double l_ref = testing::mean_loss(ref, mb, true), l_flash = testing::mean_loss(flash, mb, true);
  EXPECT_NEAR(l_ref, l_flash, 1e-5 * std::abs(l_ref));
  testing::expect_close_grads(ref.params(), flash.params(), 1e-4, 1e-7);
}

class MlaKvCache : public ::testing::TestWithParam<bool> {};

// The cache holds every head's expanded, padded keys and values; decoding in chunks gives the
// logits of the whole-sequence forward.
TEST_P(MlaKvCache, DecodingEqualsTheWholeSequenceForward) {
  ModelConfig c = tiny_mla_config();
  c.mla.q_lora_rank = 0;
  OpTable ops = reference_ops();
  if (GetParam()) GALE_CHECK_OK(install_fused_kernel(ops, "attention", detected_isa()));
  const ModelPartition part = single_process_partition(c);
  GPTModel model(c, part, &ops);
  model.params().initialize(5);
  const int64_t B = 2, S = 23;
  KvCache cache = make_kv_cache(c, part, B, S);
  testing::expect_chunked_decoding_equals_whole_forward(model, cache, model, testing::test_tokens(B * S, c.vocab), B,
                                                        S, {7, 1, 1, 5, 1, 8}, 2e-5);
}

// Greedy decoding through the cache picks the tokens that rerunning the whole sequence (no cache)
// picks at every step.
TEST(Mla, GreedyDecodingWithTheCacheEqualsTheNoCacheForward) {
  const ModelConfig c = tiny_mla_config();
  OpTable ops = reference_ops();
  const ModelPartition part = single_process_partition(c);
  GPTModel model(c, part, &ops);
  model.params().initialize(9);
  auto argmax_last = [&](const Tensor& logits, int64_t S) {
    const float* row = logits.data<float>() + (S - 1) * c.vocab;
    return static_cast<int32_t>(std::max_element(row, row + c.vocab) - row);
  };
  std::vector<int32_t> no_cache = {3, 14, 15, 92, 65}, cached = no_cache;
  const int64_t steps = 12, total = static_cast<int64_t>(no_cache.size()) + steps;
  for (int64_t i = 0; i < steps; ++i) {
    const int64_t S = static_cast<int64_t>(no_cache.size());
    no_cache.push_back(argmax_last(model.forward_logits(testing::position_slice(no_cache, 1, S, 0, S), Tensor()), S));
  }
  KvCache cache = make_kv_cache(c, part, 1, total);
  int64_t done = 0;
  while (static_cast<int64_t>(cached.size()) < total) {
    const int64_t S = static_cast<int64_t>(cached.size());
    const Tensor logits = model.forward_logits(testing::position_slice(cached, 1, S, done, S - done), Tensor(), &cache);
    cached.push_back(argmax_last(logits, S - done));
    done = S;
  }
  EXPECT_EQ(cached, no_cache);
}

// --sliding-window on MLA (the same kernels and masks as standard attention): the window changes
// the loss, flash attention matches the reference with it (documents too), and decoding through
// the cache past the window equals the whole-sequence forward.
TEST(Mla, SlidingWindow) {
  ModelConfig c = tiny_mla_config();
  c.sliding_window = 6;
  const ModelPartition part = single_process_partition(c);
  OpTable ref_ops = reference_ops(), flash_ops = reference_ops();
  GALE_CHECK_OK(install_fused_kernel(flash_ops, "attention", detected_isa()));
  ModelConfig plain_c = c;
  plain_c.sliding_window = 0;
  GPTModel ref(c, part, &ref_ops), flash(c, part, &flash_ops), plain(plain_c, part, &ref_ops);
  ref.params().initialize(3);
  flash.params().initialize(3);
  plain.params().initialize(3);
  const MicroBatch mb = testing::tiny_batch(c, 2, 11, /*documents=*/true);
  const double l_ref = testing::mean_loss(ref, mb, false), l_flash = testing::mean_loss(flash, mb, false);
  EXPECT_NEAR(l_ref, l_flash, 1e-5 * std::abs(l_ref));
  EXPECT_GT(std::abs(l_ref - testing::mean_loss(plain, mb, false)), 1e-4);
  const int64_t B = 2, S = 23;
  KvCache cache = make_kv_cache(c, part, B, S);
  testing::expect_chunked_decoding_equals_whole_forward(flash, cache, ref, testing::test_tokens(B * S, c.vocab), B, S,
                                                        {7, 1, 1, 5, 1, 8}, 2e-5);
}

INSTANTIATE_TEST_SUITE_P(Kernels, MlaKvCache, ::testing::Values(false, true),
                         [](const auto& info) { return std::string(info.param ? "flash" : "reference"); });

}  // namespace
}  // namespace gale
