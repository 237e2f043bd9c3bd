// A hybrid Mamba model's multi-token prediction (--hybrid-layer-pattern's block after '/',
// model/gpt_model.h): each MTP depth runs the pattern's layers (Mamba, attention, MLP) between
// eh_proj and its final norm, under Megatron's names (mtp.layers.{k}.mtp_model_layer.layers.{j}.);
// finite-difference gradients of every parameter of main + factor/D·Σ L_k; the MTP losses against an
// independent computation (the decoder and each depth's layers run as separate pipeline-stage chunks,
// norms, eh_proj, rolls and cross-entropy written out here).
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

// "M*-M" on the 2-layer test GPT's sizes (hidden 16: d_inner 32 in 4 heads of 8, 2 groups, d_state
// 4), RMSNorm, no position embedding, and D depths of `mtp`.
ModelConfig hybrid_mtp_config(const std::string& mtp, int64_t depths) {
  ModelConfig c = testing::gradcheck_gpt_config();
  c.num_layers = 4;
  c.rms_norm = true;
  c.position = PositionEmbedding::kNone;
  c.hybrid.enabled = true;
  c.hybrid.layers = "M*-M";
  c.hybrid.mtp = mtp;
  c.hybrid.headdim = 8;
  c.hybrid.ngroups = 2;
  c.hybrid.d_state = 4;
  c.mtp_num_layers = depths;
  c.mtp_loss_scaling_factor = 0.3;
  return c;
}


class HybridMtpGrad : public ::testing::TestWithParam<std::string> {};

TEST_P(HybridMtpGrad, EveryParameterMatchesFiniteDifferences) {
  const ModelConfig c = hybrid_mtp_config(GetParam(), 2);
  const OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(42);
  const MicroBatch mb = testing::masked_batch(c, 2, 7, /*documents=*/false);
  std::vector<double> mtp;
  const std::vector<std::string> names = expect_mtp_gradients_match(model, mb, 5e-3, &mtp);
  ASSERT_EQ(mtp.size(), 2u);
  EXPECT_GT(mtp[0], 0.0);
  EXPECT_GT(mtp[1], 0.0);
  EXPECT_GT(testing::count_names(names, "mtp.layers.", ".mixer."), 0);  // the MTP depths' Mamba parameters
}

INSTANTIATE_TEST_SUITE_P(Patterns, HybridMtpGrad, ::testing::Values("M*", "-M*"),
                         [](const auto& info) { return info.param == "M*" ? std::string("mamba_attention")
                                                                           : std::string("mlp_mamba_attention"); });

// Megatron's hybrid MTP names (MultiTokenPredictionLayer with a HybridStack as mtp_model_layer, no
// norm of its own after the stack) and the layers' kinds: a Mamba layer's mixer, an attention
// layer without MLP, an MLP layer without attention.
TEST(HybridMtp, MegatronParameterNames) {
  const ModelConfig c = hybrid_mtp_config("M*-", 2);
  const OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  const ParamBuffer& pb = model.params();
  for (const char* name :
       {"mtp.layers.0.enorm.weight", "mtp.layers.0.hnorm.weight", "mtp.layers.1.eh_proj.weight",
        "mtp.layers.0.mtp_model_layer.layers.0.mixer.in_proj.weight", "mtp.layers.1.mtp_model_layer.layers.0.mixer.A_log",
        "mtp.layers.1.mtp_model_layer.layers.0.mixer.in_proj.layer_norm_weight",
        "mtp.layers.0.mtp_model_layer.layers.1.self_attention.linear_qkv.weight",
        "mtp.layers.1.mtp_model_layer.layers.1.self_attention.linear_qkv.layer_norm_weight",
        "mtp.layers.1.mtp_model_layer.layers.2.mlp.linear_fc1.weight",
        "mtp.layers.1.mtp_model_layer.layers.2.mlp.linear_fc1.layer_norm_weight",
        "mtp.layers.1.final_layernorm.weight", "decoder.final_norm.weight"})
    EXPECT_GE(pb.find(name), 0) << name;
  for (const ParamSpec& s : pb.specs()) {
    EXPECT_EQ(s.name.find("transformer_layer"), std::string::npos) << s.name;
    EXPECT_EQ(s.name.find("decoder.layers.4"), std::string::npos) << s.name;  // no leftover decoder names
    if (s.name.find("mtp_model_layer.layers.1.") != std::string::npos)
      EXPECT_EQ(s.name.find(".mlp."), std::string::npos) << s.name;
    if (s.name.find("mtp_model_layer.layers.2.") != std::string::npos)
      EXPECT_EQ(s.name.find("self_attention"), std::string::npos) << s.name;
    EXPECT_EQ(s.name.find("mtp_model_layer.layers.3."), std::string::npos) << s.name;
  }
  EXPECT_EQ(pb.spec(pb.find("mtp.layers.0.eh_proj.weight")).global_shape, (Shape{16, 32}));
}

// ---- the independent computation ----

std::vector<double> rms_rows(const ModelConfig& c, const ParamBuffer& pb, const std::string& name,
                             const std::vector<double>& x, int64_t rows) {
  const int64_t H = c.hidden;
  const float* w = pb.param_data(pb.find(name + ".weight"));
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = x.data() + r * H;
    double sq = 0.0;
    for (int64_t i = 0; i < H; ++i) sq += xr[i] * xr[i];
    const double rstd = 1.0 / std::sqrt(sq / H + c.norm_eps);
    for (int64_t i = 0; i < H; ++i) y[r * H + i] = xr[i] * rstd * w[i];
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

// Copies `from`'s values into `to`: a name of `to` under one of the prefixes `renames[i].first` is
// read under `renames[i].second`, any other name as it is.
void copy_params(const ParamBuffer& from, ParamBuffer& to,
                 const std::vector<std::pair<std::string, std::string>>& renames = {}) {
  for (int id = 0; id < to.size(); ++id) {
    std::string name = to.spec(id).name;
    for (const auto& [to_prefix, from_prefix] : renames)
      if (name.rfind(to_prefix, 0) == 0) {
        name = from_prefix + name.substr(to_prefix.size());
        break;
      }
    const int src = from.find(name);
    ASSERT_GE(src, 0) << name;
    std::memcpy(to.param_data(id), from.param_data(src), to.spec(id).local_numel() * sizeof(float));
  }
}

std::vector<double> rows_of(const Tensor& t) { return std::vector<double>(t.data<float>(), t.data<float>() + t.numel()); }

TEST(HybridMtp, LossesEqualAnIndependentComputation) {
  ModelConfig c = hybrid_mtp_config("*M-", 2);
  c.attention_dropout = c.hidden_dropout = 0.0f;
  const OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(11);
  const ParamBuffer& pb = model.params();
  const int64_t B = 2, S = c.seq_length, T = B * S, H = c.hidden, V = c.vocab, L = c.num_layers, P = 3;
  const MicroBatch mb = testing::masked_batch(c, B, 21, /*documents=*/false);
  std::vector<double> mtp;
  mtp_objective(model, mb, true, &mtp);
  ASSERT_EQ(mtp.size(), 2u);

  // The decoder's output [T, H] (rows s·B + b) from a first-stage chunk, then the final norm.
  ModelConfig cd = c;
  cd.mtp_num_layers = 0;
  GPTModel decoder(cd, chunk(0, L, true), &ops);
  copy_params(pb, decoder.params());
  std::vector<double> h = rms_rows(c, pb, "decoder.final_norm", rows_of(decoder.forward(0, mb, Tensor(), false, nullptr)), T);
  std::vector<int32_t> ids = mb.tokens, labels = mb.labels;  // sample-major, rolled left per sample
  std::vector<float> mask = mb.loss_mask;
  auto roll = [&](auto& v) {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t s = 0; s + 1 < S; ++s) v[b * S + s] = v[b * S + s + 1];
      v[b * S + S - 1] = 0;
    }
  };
  const float* emb = pb.param_data(pb.find("embedding.word_embeddings.weight"));
  const float* out_w = pb.param_data(pb.find(c.tied_embeddings ? "embedding.word_embeddings.weight" : "output_layer.weight"));
  for (int64_t k = 0; k < c.mtp_num_layers; ++k) {
    roll(ids);
    roll(labels);
    roll(mask);
    const std::string p = "mtp.layers." + std::to_string(k) + ".";
    std::vector<double> e(static_cast<size_t>(T * H));
    for (int64_t s = 0; s < S; ++s)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < H; ++i) e[(s * B + b) * H + i] = emb[ids[b * S + s] * H + i];
    const std::vector<double> en = rms_rows(c, pb, p + "enorm", e, T), hn = rms_rows(c, pb, p + "hnorm", h, T);
    const float* W = pb.param_data(pb.find(p + "eh_proj.weight"));  // [H, 2H]: the embedding's columns first
    Tensor z = Tensor::empty({T, H});
    for (int64_t t = 0; t < T; ++t)
      for (int64_t o = 0; o < H; ++o) {
        double acc = 0.0;
        for (int64_t i = 0; i < H; ++i) acc += W[o * 2 * H + i] * en[t * H + i] + W[o * 2 * H + H + i] * hn[t * H + i];
        z.data<float>()[t * H + o] = static_cast<float>(acc);
      }
    // Depth k's layers * M - as global layers L + kP .. L + kP + 2 of a middle-stage chunk.
    GPTModel layers(cd, chunk(L + k * P, P, false), &ops);
    std::vector<std::pair<std::string, std::string>> renames;
    for (int64_t j = 0; j < P; ++j)
      renames.emplace_back("decoder.layers." + std::to_string(L + k * P + j) + ".",
                           p + "mtp_model_layer.layers." + std::to_string(j) + ".");
    copy_params(pb, layers.params(), renames);
    h = rms_rows(c, pb, p + "final_layernorm", rows_of(layers.forward(0, mb, z, false, nullptr)), T);
    double n = 0.0;
    const double loss = testing::masked_cross_entropy_sum(out_w, h, labels, mask, B, S, V, H, &n);
    EXPECT_NEAR(mtp[k], loss / n, 2e-5 * loss / n) << "MTP depth " << k + 1;
  }
}

}  // namespace
}  // namespace gale
