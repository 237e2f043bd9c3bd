// --qat-scheme in the model (model/qat.h): which weights are fake-quantised, the straight-through
// gradient against finite differences on the fake-quantised weight, training with every scheme,
// "-moe-only" leaving the dense layers' GEMM weights bit-identical, bf16, and recomputation.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "core/allocator.h"
#include "kernels/cpu/mx_quant.h"
#include "kernels/op_table.h"
#include "model/gpt_model.h"
#include "model/linear.h"
#include "model/param_builders.h"
#include "model/qat.h"
#include "model_test_batches.h"
#include "testing.h"

namespace gale {
namespace {

QatConfig qat(const char* scheme, int64_t block = 32) {
  StatusOr<QatConfig> c = parse_qat_scheme(scheme, block);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.value();
}

TEST(Qat, ParseSchemes) {
  EXPECT_FALSE(qat("").enabled());
  EXPECT_EQ(qat("w4a16-mxfp4").element, MxElement::kFp4E2M1);
  EXPECT_EQ(qat("w8a16-mxfp8", 128).element, MxElement::kFp8E4M3);
  EXPECT_EQ(qat("w8a16-mxfp8", 128).block, 128);
  EXPECT_TRUE(qat("w4a16-mxfp4-moe-only").moe_only);
  EXPECT_FALSE(qat("w8a16-mxfp8").moe_only);
  const Status bad_block = parse_qat_scheme("w4a16-mxfp4", 64).status();
  EXPECT_NE(bad_block.message().find("--qat-quant-block-size: expected 32 or 128, found 64"), std::string::npos)
      << bad_block.message();
  const Status w4a4 = parse_qat_scheme("w4a4-mxfp4", 32).status();
  EXPECT_NE(w4a4.message().find("not supported yet"), std::string::npos) << w4a4.message();
}

TEST(Qat, SelectsLinearWeightsByName) {
  const QatConfig all = qat("w4a16-mxfp4"), moe = qat("w4a16-mxfp4-moe-only");
  for (const char* n : {"decoder.layers.0.self_attention.linear_qkv.weight", "decoder.layers.1.self_attention.linear_proj.weight",
                        "decoder.layers.0.mlp.linear_fc1.weight", "decoder.layers.0.mlp.linear_fc2.weight",
                        "decoder.layers.0.mlp.shared_experts.linear_fc1.weight",
                        "mtp.layers.0.transformer_layer.mlp.linear_fc2.weight",
                        "decoder.layers.0.self_attention.linear_q_proj.weight",
                        "decoder.layers.0.self_attention.linear_q_down_proj.weight",
                        "decoder.layers.0.self_attention.linear_q_up_proj.weight",
                        "decoder.layers.0.self_attention.linear_kv_down_proj.weight",
                        "decoder.layers.0.self_attention.linear_kv_up_proj.weight"}) {
    EXPECT_TRUE(qat_selects(all, n)) << n;
    EXPECT_FALSE(qat_selects(moe, n)) << n;
  }
  EXPECT_TRUE(qat_selects(all, "decoder.layers.0.mlp.experts.local_experts.3.linear_fc2.weight"));
  EXPECT_TRUE(qat_selects(moe, "decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.weight"));
  for (const char* n : {"embedding.word_embeddings.weight", "output_layer.weight", "decoder.layers.0.mlp.router.weight",
                        "mtp.layers.0.eh_proj.weight", "decoder.layers.0.mlp.linear_fc1.bias",
                        "decoder.layers.0.self_attention.linear_qkv.lora_A.weight",
                        "decoder.layers.0.self_attention.linear_q_up_proj.layer_norm_weight"}) {
    EXPECT_FALSE(qat_selects(all, n)) << n;
    EXPECT_FALSE(qat_selects(moe, n)) << n;
  }
}

// One marked [out, in] weight in a ParamBuffer (f32, or with its bf16 GEMM copy).
struct OneWeight {
  ParamBuffer pb;
  int id = -1;
  int64_t out, in;
  OneWeight(int64_t o, int64_t i, const QatConfig& c, bool bf16) : out(o), in(i) {
    id = pb.add(make_param_spec("decoder.layers.0.mlp.linear_fc1.weight", {out, in}, InitKind::kNormal, 0.5f, true));
    mark_qat_params(pb, c);
    pb.finalize();
    if (bf16) pb.enable_gemm_copy(DType::kBF16);
    pb.initialize(5);
    if (bf16) pb.refresh_gemm_copy();
  }
  LinearWeight weight() const { return linear_weight(pb, id, sgemm); }
};

// The GEMM reads Q(W); the master stays W; dx = dy·Q(W) and dW = dyᵀ·x match central differences of
// L = Σ R ⊙ (x·Q(W)ᵀ) taken on Q(W) (the straight-through estimator) and on x.
TEST(Qat, StraightThroughGradientMatchesFiniteDifferences) {
  for (const char* scheme : {"w4a16-mxfp4", "w8a16-mxfp8"}) {
    const int64_t M = 5, out = 6, in = 64;
    OneWeight f(out, in, qat(scheme), /*bf16=*/false);
    const std::vector<float> master(f.pb.param_data(f.id), f.pb.param_data(f.id) + out * in);
    std::vector<float> wq(master.size());
    mx_fake_quant_reference(master.data(), wq.data(), out, in, 32, qat(scheme).element);
    const LinearWeight w = f.weight();
    ASSERT_NE(w.w, f.pb.param_data(f.id)) << "the GEMM must read the fake-quantised copy";
    ASSERT_EQ(0, std::memcmp(w.w, wq.data(), wq.size() * sizeof(float))) << scheme;
    int changed = 0;
    for (size_t i = 0; i < wq.size(); ++i) changed += wq[i] != master[i];
    EXPECT_GT(changed, static_cast<int>(wq.size()) / 2) << scheme << ": quantisation changed almost nothing";

    Tensor x = Tensor::empty({M, in});
    testing::fill_random(x.data<float>(), x.numel(), 3);
    const std::vector<float> R = testing::random_vector(M * out, 4);
    const Tensor y = linear_forward(x, w);
    f.pb.zero_grads();
    const Tensor dy = Tensor::from_blob(const_cast<float*>(R.data()), {M, out}, DType::kF32);
    const Tensor dx = linear_backward(dy, x, w);
    EXPECT_EQ(0, std::memcmp(f.pb.param_data(f.id), master.data(), master.size() * sizeof(float)))
        << "the master weights must not change";

    // L(x, V) in double for a weight V [out, in].
    auto loss = [&](const std::vector<double>& xv, const std::vector<double>& v) {
      double l = 0;
      for (int64_t m = 0; m < M; ++m)
        for (int64_t o = 0; o < out; ++o) {
          double s = 0;
          for (int64_t i = 0; i < in; ++i) s += xv[m * in + i] * v[o * in + i];
          l += R[m * out + o] * s;
        }
      return l;
    };
    std::vector<double> xv(x.data<float>(), x.data<float>() + x.numel()), v(wq.begin(), wq.end());
    const double eps = 1e-3;
    const float* dw = f.pb.grad_data(f.id);
    for (int64_t k = 0; k < out * in; k += 7) {
      std::vector<double> p = v, q = v;
      p[k] += eps;
      q[k] -= eps;
      const double fd = (loss(xv, p) - loss(xv, q)) / (2 * eps);
      EXPECT_NEAR(dw[k], fd, 1e-4 * (1 + std::fabs(fd))) << scheme << " dW[" << k << "]";
    }
    for (int64_t k = 0; k < M * in; k += 5) {
      std::vector<double> p = xv, q = xv;
      p[k] += eps;
      q[k] -= eps;
      const double fd = (loss(p, v) - loss(q, v)) / (2 * eps);
      EXPECT_NEAR(dx.data<float>()[k], fd, 1e-4 * (1 + std::fabs(fd))) << scheme << " dx[" << k << "]";
    }
    // And y = x·Q(W)ᵀ, not x·Wᵀ.
    std::vector<double> mv(master.begin(), master.end());
    double lq = 0;
    for (int64_t i = 0; i < y.numel(); ++i) lq += R[i] * y.data<float>()[i];
    EXPECT_NEAR(lq, loss(xv, v), 1e-4 * (1 + std::fabs(lq)));
    EXPECT_GT(std::fabs(lq - loss(xv, mv)), 1e-3) << scheme << ": the forward ignored quantisation";
  }
}

// Under --bf16 the bf16 GEMM copy is fake-quantised (exactly representable: the f32 and bf16
// copies agree bit for bit) and the master and its bf16 copy are untouched.
TEST(Qat, Bf16CopyIsFakeQuantisedExactly) {
  for (const char* scheme : {"w4a16-mxfp4", "w8a16-mxfp8"}) {
    OneWeight f(4, 128, qat(scheme, 128), /*bf16=*/true);
    const LinearWeight w = f.weight();
    const bf16* copy = f.pb.param_bf16_data(f.id);
    ASSERT_NE(w.w_bf16, copy);
    std::vector<float> widened(4 * 128), q(4 * 128);
    for (int64_t i = 0; i < 4 * 128; ++i) widened[i] = bf16_to_float(copy[i]);
    mx_fake_quant_reference(widened.data(), q.data(), 4, 128, 128, qat(scheme).element);
    for (int64_t i = 0; i < 4 * 128; ++i) {
      ASSERT_EQ(bf16_to_float(w.w_bf16[i]), q[i]) << scheme << " " << i;
      ASSERT_EQ(w.w[i], q[i]) << scheme << " " << i;
    }
  }
}

// The quantised copy comes from the allocator (so peak figures count it) and lives as long as its
// LinearWeight: 4 bytes per element, 6 under --bf16.
TEST(Qat, CopyIsAccountedAndReleased) {
  for (bool bf16 : {false, true}) {
    OneWeight f(16, 64, qat("w8a16-mxfp8"), bf16);
    const int64_t before = host_allocator().current_bytes();
    {
      const LinearWeight w = f.weight();
      EXPECT_GE(host_allocator().current_bytes() - before, 16 * 64 * (bf16 ? 6 : 4)) << "bf16 " << bf16;
    }
    EXPECT_EQ(host_allocator().current_bytes(), before) << "bf16 " << bf16;
  }
}

// --reuse-fp32-param (the master stored as its bf16 copy plus a residual, no f32 view): the GEMM
// reads the same fake-quantised bf16 weight as with a separate bf16 copy.
TEST(Qat, ReuseFp32ParamReadsTheSameQuantisedCopy) {
  auto make = [](bool reuse) {
    auto pb = std::make_unique<ParamBuffer>();
    pb->add(gemm_weight(make_param_spec("decoder.layers.0.self_attention.linear_proj.weight", {8, 64},
                                        InitKind::kNormal, 0.5f, true)));
    mark_qat_params(*pb, qat("w4a16-mxfp4"));
    pb->finalize();
    pb->enable_gemm_copy(DType::kBF16, reuse);
    pb->initialize(9);
    pb->refresh_gemm_copy();
    return pb;
  };
  const auto plain = make(false), reuse = make(true);
  ASSERT_TRUE(reuse->is_split(0));
  const LinearWeight a = linear_weight(*plain, 0, sgemm), b = linear_weight(*reuse, 0, sgemm);
  ASSERT_NE(b.w_bf16, reuse->param_bf16_data(0));
  EXPECT_EQ(0, std::memcmp(a.w_bf16, b.w_bf16, 8 * 64 * sizeof(bf16)));
  EXPECT_EQ(0, std::memcmp(a.w, b.w, 8 * 64 * sizeof(float)));
}

// A tiny MoE model: layer 0 dense, layer 1 MoE with a shared expert; every input dimension a
// multiple of 32 (hidden 32, attention 2 x 16, ffn 64, expert ffn 32, shared ffn 32).
ModelConfig tiny_moe_config() {
  ModelConfig c;
  c.num_layers = 2;
  c.hidden = 32;
  c.ffn = 64;
  c.heads = 2;
  c.kv_heads = 2;
  c.head_dim = 16;
  c.vocab = 64;
  c.seq_length = 16;
  c.max_positions = 16;
  c.init_std = 0.2f;
  c.moe.num_experts = 4;
  c.moe.topk = 2;
  c.moe.ffn = 32;
  c.moe.pattern = {0, 1};
  c.moe.shared_ffn = 32;
  c.moe.aux_loss_coeff = 0.01;
  c.add_bias_linear = false;  // the shared expert has none
  return c;
}

struct QatRun {
  std::vector<double> losses;
  std::vector<float> first_grads, final_params;
};

// `steps` AdamW steps on the same two micro-batches (so the loss must fall).
QatRun train(const ModelConfig& c, int steps) {
  const OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  ParamBuffer& pb = model.params();
  pb.initialize(11);
  if (c.bf16) pb.refresh_gemm_copy();
  std::vector<float> m(pb.numel(), 0.0f), v(pb.numel(), 0.0f);
  QatRun run;
  for (int step = 1; step <= steps; ++step) {
    pb.zero_grads();
    GPTModel::LossSums sums;
    const MicroBatch mb = testing::masked_batch(c, 2, 21, false);
    model.forward(0, mb, Tensor(), /*training=*/true, &sums);
    model.backward(0, Tensor(), static_cast<float>(1.0 / sums.tokens));
    run.losses.push_back(sums.loss_sum / sums.tokens);
    if (step == 1) run.first_grads.assign(pb.flat_grads().data<float>(), pb.flat_grads().data<float>() + pb.numel());
    AdamWHyper h;
    h.lr = 1e-2f;
    h.step = step;
    ops.adamw_step(pb.flat_params().data<float>(), pb.flat_grads().data<float>(), m.data(), v.data(), pb.numel(), h);
    if (c.bf16) pb.refresh_gemm_copy();
  }
  run.final_params.assign(pb.flat_params().data<float>(), pb.flat_params().data<float>() + pb.numel());
  return run;
}

ModelConfig with_qat(ModelConfig c, const char* scheme, int64_t block = 32) {
  c.qat = qat(scheme, block);
  return c;
}

TEST(Qat, TrainsWithEveryScheme) {
  for (bool bf16 : {false, true}) {
    ModelConfig base = tiny_moe_config();
    base.bf16 = bf16;
    const QatRun plain = train(base, 8);
    for (const char* scheme : {"w4a16-mxfp4", "w4a16-mxfp4-moe-only", "w8a16-mxfp8", "w8a16-mxfp8-moe-only"}) {
      const QatRun r = train(with_qat(base, scheme), 8);
      const std::string what = std::string(scheme) + (bf16 ? " bf16" : " f32");
      for (double l : r.losses) ASSERT_TRUE(std::isfinite(l)) << what;
      EXPECT_LT(r.losses.back(), r.losses.front() - 0.3) << what << ": the loss did not fall";
      EXPECT_NE(r.losses.front(), plain.losses.front()) << what << ": the same loss as without QAT";
      // MXFP8 is close to the unquantised model, MXFP4 further; both within reason of it.
      EXPECT_NEAR(r.losses.front(), plain.losses.front(), 0.2 * plain.losses.front()) << what;
    }
  }
}

// -moe-only: every weight outside the routed experts is read by its GEMM exactly as without QAT;
// the experts' are not. Without -moe-only the dense linears are quantised too.
TEST(Qat, MoeOnlyLeavesDenseWeightsBitIdentical) {
  const OpTable ops = reference_ops();
  const ModelConfig base = tiny_moe_config();
  GPTModel plain(base, single_process_partition(base), &ops);
  plain.params().initialize(11);
  for (const char* scheme : {"w4a16-mxfp4-moe-only", "w8a16-mxfp8-moe-only", "w4a16-mxfp4"}) {
    const ModelConfig c = with_qat(base, scheme);
    GPTModel model(c, single_process_partition(c), &ops);
    model.params().initialize(11);
    int experts = 0, dense = 0;
    for (int id = 0; id < model.params().size(); ++id) {
      const ParamSpec& s = model.params().spec(id);
      if (s.global_shape.size() != 2 || s.name.find("linear_") == std::string::npos) continue;
      const LinearWeight a = linear_weight(plain.params(), plain.params().find(s.name), sgemm);
      const LinearWeight b = linear_weight(model.params(), id, sgemm);
      const bool same = std::memcmp(a.w, b.w, static_cast<size_t>(a.out * a.in) * sizeof(float)) == 0;
      const bool expert = s.name.find(".mlp.experts.") != std::string::npos;
      (expert ? experts : dense) += 1;
      if (expert || !qat(scheme).moe_only)
        EXPECT_FALSE(same) << scheme << ": " << s.name << " was not quantised";
      else
        EXPECT_TRUE(same) << scheme << ": " << s.name << " differs from the run without QAT";
    }
    EXPECT_EQ(experts, 8) << scheme;  // 4 experts x fc1, fc2
    EXPECT_GE(dense, 6) << scheme;    // qkv, proj x 2 layers, dense fc1/fc2, shared fc1/fc2
  }
}

// Multi-latent attention: its five projections and linear_proj are marked, its latent norms not.
TEST(Qat, MarksMultiLatentAttentionProjections) {
  ModelConfig c = tiny_moe_config();
  c.moe = MoeConfig{};
  c.position = PositionEmbedding::kRope;
  c.mla.enabled = true;
  c.mla.q_lora_rank = 32;
  c.mla.kv_lora_rank = 32;
  c.mla.qk_head_dim = 8;
  c.mla.qk_pos_emb_head_dim = 4;
  c.mla.v_head_dim = 16;
  c.mla.qk_layernorm = true;
  c.qat = qat("w8a16-mxfp8");
  const OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  std::vector<std::string> marked;
  for (const ParamSpec& s : model.params().specs())
    if (s.qat_element != MxElement::kNone && s.name.find("layers.0.") != std::string::npos) marked.push_back(s.name);
  const std::vector<std::string> expected = {
      "decoder.layers.0.self_attention.linear_q_down_proj.weight", "decoder.layers.0.self_attention.linear_q_up_proj.weight",
      "decoder.layers.0.self_attention.linear_kv_down_proj.weight", "decoder.layers.0.self_attention.linear_kv_up_proj.weight",
      "decoder.layers.0.self_attention.linear_proj.weight", "decoder.layers.0.mlp.linear_fc1.weight",
      "decoder.layers.0.mlp.linear_fc2.weight"};
  for (const std::string& e : expected)
    EXPECT_NE(std::find(marked.begin(), marked.end(), e), marked.end()) << e << " not marked";
  EXPECT_EQ(marked.size(), expected.size());
}

// Full recomputation reruns the layers on the same fake-quantised weights: bit-identical training.
TEST(Qat, FullRecomputationIsBitIdentical) {
  for (const char* scheme : {"w4a16-mxfp4", "w8a16-mxfp8-moe-only"}) {
    const ModelConfig c = with_qat(tiny_moe_config(), scheme);
    ModelConfig rc = c;
    rc.full_recompute = {FullRecompute::Method::kUniform, 1};
    const QatRun a = train(c, 3), b = train(rc, 3);
    for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << scheme << " step " << i + 1;
    EXPECT_EQ(0, std::memcmp(a.first_grads.data(), b.first_grads.data(), a.first_grads.size() * sizeof(float)))
        << scheme;
    EXPECT_EQ(0, std::memcmp(a.final_params.data(), b.final_params.data(), a.final_params.size() * sizeof(float)))
        << scheme;
  }
}

// A block size that does not divide a weight's input dimension on this rank is refused, naming it.
TEST(Qat, BlockMustDivideInputDimension) {
  ModelConfig c = with_qat(tiny_moe_config(), "w8a16-mxfp8", 128);
  const OpTable ops = reference_ops();
  EXPECT_DEATH(GPTModel(c, single_process_partition(c), &ops), "--qat-quant-block-size 128 does not divide");
}

}  // namespace
}  // namespace gale
