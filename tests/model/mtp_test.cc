// Multi-token prediction (--mtp-num-layers, model/gpt_model.h): finite-difference gradients of
// every parameter (the MTP layers', and the shared embedding and output layer through the MTP
// path) of the loss main + factor/D·Σ L_k; the MTP losses against an independent computation
// (the decoder and the MTP transformer layers run as separate pipeline-stage chunks, norms,
// eh_proj, rolls and cross-entropy written out here); and D = 0 / factor 0 leaving the model's
// loss and gradients bit for bit unchanged.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "model/gpt_model.h"
#include "model_test_batches.h"
#include "mtp_gradcheck.h"
#include "testing.h"

namespace gale {
namespace {

using testing::expect_mtp_gradients_match;
using testing::mtp_objective;

ModelConfig small_gpt(int64_t mtp) {
  ModelConfig c = testing::gradcheck_gpt_config();
  c.mtp_num_layers = mtp;
  c.mtp_loss_scaling_factor = 0.3;
  return c;
}

ModelConfig small_llama(int64_t mtp) {
  ModelConfig c = small_gpt(mtp);
  use_llama_architecture(c);
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 4;
  return c;
}


class MtpGrad : public ::testing::TestWithParam<bool> {};  // GPT or LLaMA

TEST_P(MtpGrad, EveryParameterMatchesFiniteDifferences) {
  const ModelConfig c = GetParam() ? small_llama(2) : small_gpt(2);
  const OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(42);
  const MicroBatch mb = testing::masked_batch(c, 2, 7, /*documents=*/false);
  std::vector<double> mtp;
  const std::vector<std::string> names = expect_mtp_gradients_match(model, mb, 5e-3, &mtp);
  ASSERT_EQ(mtp.size(), 2u);
  EXPECT_GT(mtp[0], 0.0);
  EXPECT_GT(mtp[1], 0.0);
  EXPECT_GT(testing::count_names(names, "mtp.layers."), 10);
}

INSTANTIATE_TEST_SUITE_P(Models, MtpGrad, ::testing::Values(false, true),
                         [](const auto& info) { return std::string(info.param ? "llama" : "gpt"); });

TEST(Mtp, MegatronParameterNames) {
  const ModelConfig c = small_gpt(2);
  const OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  const ParamBuffer& pb = model.params();
  for (const char* name : {"mtp.layers.0.enorm.weight", "mtp.layers.0.enorm.bias", "mtp.layers.0.hnorm.weight",
                           "mtp.layers.1.eh_proj.weight", "mtp.layers.1.transformer_layer.self_attention.linear_qkv.weight",
                           "mtp.layers.1.transformer_layer.mlp.linear_fc2.bias", "mtp.layers.1.final_layernorm.weight"})
    EXPECT_GE(pb.find(name), 0) << name;
  EXPECT_EQ(pb.spec(pb.find("mtp.layers.0.eh_proj.weight")).global_shape, (Shape{16, 32}));
  EXPECT_EQ(pb.find("decoder.layers.2.input_layernorm.weight"), -1);
}

// D = 0 is the model without MTP; with MTP layers and factor 0 the LM loss and every shared
// parameter's gradient are bit for bit those of the model without them, and with factor > 0 the
// LM loss still is (the MTP loss only joins the gradient).
TEST(Mtp, NoMtpLayersOrZeroFactorLeaveTheModelUnchanged) {
  for (bool llama : {false, true}) {
    const ModelConfig plain = llama ? small_llama(0) : small_gpt(0);
    ModelConfig zero = llama ? small_llama(1) : small_gpt(1);
    zero.mtp_loss_scaling_factor = 0.0;
    const OpTable ops = reference_ops();
    GPTModel a(plain, single_process_partition(plain), &ops), b(zero, single_process_partition(zero), &ops);
    a.params().initialize(5);
    b.params().initialize(5);
    int extra = 0;  // the MTP layer's parameters
    for (const ParamSpec& s : b.params().specs()) extra += s.name.rfind("mtp.layers.0.", 0) == 0;
    EXPECT_EQ(a.params().size() + extra, b.params().size());
    EXPECT_EQ(extra, llama ? 10 : 19);
    const MicroBatch mb = testing::masked_batch(plain, 2, 9, false);
    GPTModel::LossSums sa, sb;
    a.forward(0, mb, Tensor(), true, &sa);
    b.forward(0, mb, Tensor(), true, &sb);
    EXPECT_EQ(sa.loss_sum, sb.loss_sum);
    a.backward(0, Tensor(), static_cast<float>(1.0 / sa.tokens));
    b.backward(0, Tensor(), static_cast<float>(1.0 / sb.tokens));
    EXPECT_TRUE(a.take_mtp_losses().empty());
    for (int id = 0; id < a.params().size(); ++id) {
      const ParamSpec& s = a.params().spec(id);
      const int other = b.params().find(s.name);
      ASSERT_GE(other, 0) << s.name;
      EXPECT_EQ(0, std::memcmp(a.params().param_data(id), b.params().param_data(other), s.local_numel() * 4)) << s.name;
      EXPECT_EQ(0, std::memcmp(a.params().grad_data(id), b.params().grad_data(other), s.local_numel() * 4)) << s.name;
    }
    ModelConfig tenth = zero;
    tenth.mtp_loss_scaling_factor = 0.1;
    GPTModel t(tenth, single_process_partition(tenth), &ops);
    t.params().initialize(5);
    GPTModel::LossSums st;
    t.forward(0, mb, Tensor(), true, &st);
    t.backward(0, Tensor(), static_cast<float>(1.0 / st.tokens));
    EXPECT_EQ(sa.loss_sum, st.loss_sum);
    const int emb = t.params().find("embedding.word_embeddings.weight");
    EXPECT_NE(0, std::memcmp(a.params().grad_data(a.params().find("embedding.word_embeddings.weight")),
                             t.params().grad_data(emb), t.params().spec(emb).local_numel() * 4));
  }
}

// ---- the independent computation ----

std::vector<double> norm_rows(const ModelConfig& c, const ParamBuffer& pb, const std::string& name,
                              const std::vector<double>& x, int64_t rows) {
  const int64_t H = c.hidden;
  const float* w = pb.param_data(pb.find(name + ".weight"));
  const int bi = pb.find(name + ".bias");
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = x.data() + r * H;
    double mean = 0.0, sq = 0.0;
    if (!c.rms_norm) {
      for (int64_t i = 0; i < H; ++i) mean += xr[i];
      mean /= H;
    }
    for (int64_t i = 0; i < H; ++i) sq += (xr[i] - mean) * (xr[i] - mean);
    const double rstd = 1.0 / std::sqrt(sq / H + c.norm_eps);
    for (int64_t i = 0; i < H; ++i)
      y[r * H + i] = (xr[i] - mean) * rstd * w[i] + (bi >= 0 ? pb.param_data(bi)[i] : 0.0);
  }
  return y;
}

// A pipeline-stage chunk of `c` holding layers [first, first + n) (and the embedding when `pre`).
ModelPartition chunk(int64_t first, int64_t n, bool pre) {
  ModelPartition p;
  p.tp = make_self_communicator("tp");
  p.first_layer = first;
  p.num_layers = n;
  p.pre_process = pre;
  p.post_process = false;
  return p;
}

void copy_params(const ParamBuffer& from, ParamBuffer& to, const std::string& from_prefix, const std::string& to_prefix) {
  for (int id = 0; id < to.size(); ++id) {
    std::string name = to.spec(id).name;
    if (name.rfind(to_prefix, 0) == 0) name = from_prefix + name.substr(to_prefix.size());
    const int src = from.find(name);
    ASSERT_GE(src, 0) << name;
    std::memcpy(to.param_data(id), from.param_data(src), to.spec(id).local_numel() * sizeof(float));
  }
}

std::vector<double> rows_of(const Tensor& t) { return std::vector<double>(t.data<float>(), t.data<float>() + t.numel()); }

class MtpLoss : public ::testing::TestWithParam<bool> {};  // GPT (learned positions, tied) or LLaMA (RoPE, untied)

TEST_P(MtpLoss, EqualsAnIndependentComputation) {
  ModelConfig c = GetParam() ? small_llama(2) : small_gpt(2);
  c.mtp_num_layers = 2;
  c.attention_dropout = c.hidden_dropout = 0.0f;
  const OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(11);
  const ParamBuffer& pb = model.params();
  const int64_t B = 2, S = c.seq_length, T = B * S, H = c.hidden, V = c.vocab, L = c.num_layers;
  const MicroBatch mb = testing::masked_batch(c, B, 21, /*documents=*/false);
  std::vector<double> mtp;
  mtp_objective(model, mb, true, &mtp);

  // The decoder's output [T, H] (rows s·B + b) from a first-stage chunk, then the final norm.
  ModelConfig cd = c;
  cd.mtp_num_layers = 0;
  GPTModel decoder(cd, chunk(0, L, true), &ops);
  copy_params(pb, decoder.params(), "", "");
  std::vector<double> h = norm_rows(c, pb, "decoder.final_layernorm",
                                    rows_of(decoder.forward(0, mb, Tensor(), false, nullptr)), T);
  // Sample-major ids, positions, labels, mask rolled left along each sample.
  std::vector<int32_t> ids = mb.tokens, pos = mb.position_ids, labels = mb.labels;
  std::vector<float> mask = mb.loss_mask;
  auto roll = [&](auto& v) {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t s = 0; s + 1 < S; ++s) v[b * S + s] = v[b * S + s + 1];
      v[b * S + S - 1] = 0;
    }
  };
  const float* emb = pb.param_data(pb.find("embedding.word_embeddings.weight"));
  const int pos_id = pb.find("embedding.position_embeddings.weight");
  const float* out_w = pb.param_data(pb.find(c.tied_embeddings ? "embedding.word_embeddings.weight" : "output_layer.weight"));
  for (int64_t k = 0; k < c.mtp_num_layers; ++k) {
    roll(ids);
    roll(pos);
    roll(labels);
    roll(mask);
    const std::string p = "mtp.layers." + std::to_string(k) + ".";
    std::vector<double> e(static_cast<size_t>(T * H));
    for (int64_t s = 0; s < S; ++s)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < H; ++i)
          e[(s * B + b) * H + i] = emb[ids[b * S + s] * H + i] +
                                   (pos_id >= 0 ? pb.param_data(pos_id)[pos[b * S + s] * H + i] : 0.0);
    const std::vector<double> en = norm_rows(c, pb, p + "enorm", e, T), hn = norm_rows(c, pb, p + "hnorm", h, T);
    const float* W = pb.param_data(pb.find(p + "eh_proj.weight"));  // [H, 2H]
    Tensor z = Tensor::empty({T, H});
    for (int64_t t = 0; t < T; ++t)
      for (int64_t o = 0; o < H; ++o) {
        double acc = 0.0;
        for (int64_t i = 0; i < H; ++i) acc += W[o * 2 * H + i] * en[t * H + i] + W[o * 2 * H + H + i] * hn[t * H + i];
        z.data<float>()[t * H + o] = static_cast<float>(acc);
      }
    // The MTP transformer layer as global layer L + k of a middle-stage chunk.
    GPTModel layer(cd, chunk(L + k, 1, false), &ops);
    copy_params(pb, layer.params(), p + "transformer_layer.", "decoder.layers." + std::to_string(L + k) + ".");
    h = norm_rows(c, pb, p + "final_layernorm", rows_of(layer.forward(0, mb, z, false, nullptr)), T);
    double n = 0.0;
    const double loss = testing::masked_cross_entropy_sum(out_w, h, labels, mask, B, S, V, H, &n);
    EXPECT_NEAR(mtp[k], loss / n, 2e-5 * loss / n) << "MTP layer " << k + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, MtpLoss, ::testing::Values(false, true),
                         [](const auto& info) { return std::string(info.param ? "llama" : "gpt"); });

}  // namespace
}  // namespace gale
