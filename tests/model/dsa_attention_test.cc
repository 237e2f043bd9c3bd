// DeepSeek sparse attention in the model (--experimental-attention-variant dsa, model/dsa_indexer.h):
// with top-k ≥ S it is dense causal MLA (loss and every gradient); finite differences of every
// parameter under a real top-k; the indexer loss and its gradient (the indexer's parameters only);
// Megatron's parameter names; fused sparse attention against the reference; a training run whose lm
// loss and indexer loss fall.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "model/gpt_model.h"
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

// A 2-layer MLA model (Dn 4, R 4, Dv 3, q latent 6, latent norms) with a DSA indexer of 2 heads of 6.
ModelConfig dsa_config(int64_t topk, double coeff, bool llama = true) {
  ModelConfig c = testing::mla_config(llama, /*q_lora_rank=*/6, /*qk_layernorm=*/true, /*v_head_dim=*/3);
  c.dsa.enabled = true;
  c.dsa.n_heads = 2;
  c.dsa.head_dim = 6;
  c.dsa.topk = topk;
  c.dsa.loss_coeff = coeff;
  return c;
}

bool is_indexer(const std::string& name) { return name.find(".indexer.") != std::string::npos; }

TEST(Dsa, MegatronParameterNamesAndShapes) {
  const ModelConfig c = dsa_config(3, 0.0, false);
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  const ParamBuffer& pb = model.params();
  auto shape = [&](const std::string& name) {
    const int id = pb.find("decoder.layers.1.self_attention.indexer." + name);
    EXPECT_GE(id, 0) << name;
    return id >= 0 ? pb.spec(id).global_shape : Shape{};
  };
  EXPECT_EQ(shape("linear_wq_b.weight"), (Shape{2 * 6, 6}));
  EXPECT_EQ(shape("linear_wk.weight"), (Shape{6, 16}));
  EXPECT_EQ(shape("k_norm.weight"), (Shape{6}));
  EXPECT_EQ(shape("k_norm.bias"), (Shape{6}));
  EXPECT_EQ(shape("linear_weights_proj.weight"), (Shape{2, 16}));
}

// DSA with top-k ≥ S against the same MLA model without it (weights copied by name): the same loss
// and the same gradient of every MLA parameter; the indexer gets none without its loss.
TEST(Dsa, TopkAtLeastSequenceLengthEqualsDenseMla) {
  for (bool documents : {false, true})
    for (bool fused : {false, true}) {
      ModelConfig dsa = dsa_config(/*topk=*/8, 0.0);
      ModelConfig mla = dsa;
      mla.dsa = DsaConfig{};
      OpTable ops = reference_ops(), dsa_ops = reference_ops();
      if (fused) {
        dsa_ops.dsa_sparse_attention_forward = dsa_sparse_attention_forward_fused;
        dsa_ops.dsa_sparse_attention_backward = dsa_sparse_attention_backward_fused;
      }
      GPTModel a(mla, single_process_partition(mla), &ops), b(dsa, single_process_partition(dsa), &dsa_ops);
      a.params().initialize(42);
      b.params().initialize(43);
      ParamBuffer &pa = a.params(), &pbb = b.params();
      for (int id = 0; id < pa.size(); ++id) {
        const int j = pbb.find(pa.spec(id).name);
        ASSERT_GE(j, 0) << pa.spec(id).name;
        std::copy_n(pa.param_data(id), pa.spec(id).local_numel(), pbb.param_data(j));
      }
      const MicroBatch mb = testing::masked_batch(mla, 2, 7, documents);
      const double la = testing::mean_loss(a, mb, true), lb = testing::mean_loss(b, mb, true);
      EXPECT_NEAR(la, lb, 1e-6 * std::abs(la)) << documents << fused;
      for (int id = 0; id < pa.size(); ++id) {
        const int j = pbb.find(pa.spec(id).name);
        const int64_t n = pa.spec(id).local_numel();
        double worst = 0.0, scale = 1e-6;
        for (int64_t e = 0; e < n; ++e) {
          worst = std::max(worst, double(std::abs(pa.grad_data(id)[e] - pbb.grad_data(j)[e])));
          scale = std::max(scale, double(std::abs(pa.grad_data(id)[e])));
        }
        EXPECT_LT(worst / scale, 1e-4) << pa.spec(id).name << (documents ? " documents" : "") << (fused ? " fused" : "");
      }
      for (int j = 0; j < pbb.size(); ++j)
        if (is_indexer(pbb.spec(j).name))
          for (int64_t e = 0; e < pbb.spec(j).local_numel(); ++e) ASSERT_EQ(pbb.grad_data(j)[e], 0.0f);
    }
}

// A real top-k (3 of up to 8 keys): every non-indexer parameter against central differences of the
// lm loss (the selection is piecewise constant; the perturbations keep it).
TEST(Dsa, EveryModelParameterMatchesFiniteDifferences) {
  for (bool documents : {false, true}) {
    const ModelConfig c = dsa_config(3, 0.0);
    OpTable ops = reference_ops();
    GPTModel model(c, single_process_partition(c), &ops);
    model.params().initialize(42);
    const MicroBatch mb = testing::masked_batch(c, 2, 7, documents);
    testing::mean_loss(model, mb, true);
    ParamBuffer& pb = model.params();
    std::vector<float> grads(pb.flat_grads().data<float>(), pb.flat_grads().data<float>() + pb.numel());
    auto loss = [&] { return testing::mean_loss(model, mb, false); };
    for (int id = 0; id < pb.size(); ++id) {
      if (is_indexer(pb.spec(id).name)) continue;
      const int64_t n = pb.spec(id).local_numel();
      auto dir = random_vector(n, 100 + id);
      const double analytic = dot(grads.data() + pb.spec(id).offset, dir.data(), n);
      const double numeric = directional_derivative(loss, pb.param_data(id), dir.data(), n, 1e-3);
      EXPECT_LT(rel_diff(analytic, numeric, 1e-2), 1e-2) << pb.spec(id).name << ": " << analytic << " vs " << numeric;
    }
  }
}

// The indexer loss (collected by the model, coefficient included) and the gradient backward gives
// the indexer's parameters: central differences of that loss (dense KL: independent of the selection).
TEST(Dsa, IndexerParametersMatchFiniteDifferencesOfTheIndexerLoss) {
  const ModelConfig c = dsa_config(3, 0.5);
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(42);
  const MicroBatch mb = testing::masked_batch(c, 2, 7, false);
  model.take_dsa_indexer_loss();
  testing::mean_loss(model, mb, true);
  const double first = model.take_dsa_indexer_loss();
  EXPECT_GT(first, 0.0);
  ParamBuffer& pb = model.params();
  std::vector<float> grads(pb.flat_grads().data<float>(), pb.flat_grads().data<float>() + pb.numel());
  auto loss = [&] {
    testing::mean_loss(model, mb, false);
    return model.take_dsa_indexer_loss();
  };
  EXPECT_NEAR(loss(), first, 1e-12 * first);
  int checked = 0;
  for (int id = 0; id < pb.size(); ++id) {
    if (!is_indexer(pb.spec(id).name)) continue;
    const int64_t n = pb.spec(id).local_numel();
    auto dir = random_vector(n, 200 + id);
    const double analytic = dot(grads.data() + pb.spec(id).offset, dir.data(), n);
    const double numeric = directional_derivative(loss, pb.param_data(id), dir.data(), n, 1e-3);
    EXPECT_LT(rel_diff(analytic, numeric, 1e-3), 1e-2) << pb.spec(id).name << ": " << analytic << " vs " << numeric;
    ++checked;
  }
  EXPECT_EQ(checked, 2 * 5);
}

// The indexer's inputs are detached: its loss changes no gradient of the rest of the model.
TEST(Dsa, IndexerLossLeavesTheModelGradientsUnchanged) {
  const ModelConfig with = dsa_config(3, 0.7), without = dsa_config(3, 0.0);
  OpTable ops = reference_ops();
  GPTModel a(with, single_process_partition(with), &ops), b(without, single_process_partition(without), &ops);
  a.params().initialize(5);
  b.params().initialize(5);
  const MicroBatch mb = testing::masked_batch(with, 2, 9, true);
  EXPECT_EQ(testing::mean_loss(a, mb, true), testing::mean_loss(b, mb, true));
  for (int id = 0; id < a.params().size(); ++id) {
    if (is_indexer(a.params().spec(id).name)) continue;
    const int64_t n = a.params().spec(id).local_numel();
    for (int64_t e = 0; e < n; ++e) ASSERT_EQ(a.params().grad_data(id)[e], b.params().grad_data(id)[e]) << a.params().spec(id).name;
  }
}

// Training: tiny LLaMA-style MLA + DSA (S 70, top-k 16) for 30 AdamW steps on one repeated
// micro-batch: the lm loss and the indexer loss both fall.
TEST(Dsa, TrainingLowersTheLmLossAndTheIndexerLoss) {
  ModelConfig c = testing::tiny_llama_config();
  c.kv_heads = c.heads = 4;
  c.mla.enabled = true;
  c.mla.q_lora_rank = 10;
  c.mla.kv_lora_rank = 9;
  c.mla.qk_head_dim = 7;
  c.mla.qk_pos_emb_head_dim = 6;
  c.mla.v_head_dim = 5;
  c.mla.qk_layernorm = true;
  c.dsa.enabled = true;
  c.dsa.n_heads = 2;
  c.dsa.head_dim = 8;
  c.dsa.topk = 16;
  c.dsa.loss_coeff = 1.0;
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  ParamBuffer& pb = model.params();
  pb.initialize(11);
  std::vector<float> m(pb.numel(), 0.0f), v(pb.numel(), 0.0f);
  const MicroBatch mb = testing::tiny_batch(c, 2, 3, false);
  std::vector<double> lm, indexer;
  for (int step = 1; step <= 30; ++step) {
    GPTModel::LossSums sums;
    pb.zero_grads();
    model.forward(0, mb, Tensor(), /*training=*/true, &sums);
    model.backward(0, Tensor(), static_cast<float>(1.0 / sums.tokens));
    lm.push_back(sums.loss_sum / sums.tokens);
    indexer.push_back(model.take_dsa_indexer_loss() / c.num_layers);
    AdamWHyper h;
    h.lr = 3e-3f;
    h.step = step;
    ops.adamw_step(pb.flat_params().data<float>(), pb.flat_grads().data<float>(), m.data(), v.data(), pb.numel(), h);
  }
  EXPECT_LT(lm.back(), 0.7 * lm.front()) << lm.front() << " -> " << lm.back();
  EXPECT_LT(indexer.back(), 0.9 * indexer.front()) << indexer.front() << " -> " << indexer.back();
}

}  // namespace
}  // namespace gale
