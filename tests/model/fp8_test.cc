// --fp8-format in the model (model/fp8.h): which GEMM of a linear layer reads FP8-quantised operands
// (forward, dgrad, wgrad; --no-fp8-wgrad leaves wgrad alone), the delayed recipe's amax recording and
// update, --first-last-layers-bf16's layers left alone, and short training runs per recipe close to
// the unquantised run and different from it.
#include <cmath>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/op_table.h"
#include "model/fp8.h"
#include "model/gpt_model.h"
#include "model/linear.h"
#include "model/param_builders.h"
#include "model_test_batches.h"
#include "testing.h"

namespace gale {
namespace {

Fp8Config fp8(const char* format, const char* recipe, bool wgrad = true, int64_t len = 1, const char* algo = "most_recent",
              int margin = 0) {
  StatusOr<Fp8Config> c = parse_fp8_config(format, recipe, margin, len, algo, wgrad);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.value();
}

TEST(Fp8, ParseAndRefuse) {
  EXPECT_FALSE(fp8("", "delayed").enabled);
  EXPECT_TRUE(fp8("hybrid", "mxfp8").hybrid);
  EXPECT_EQ(fp8("e4m3", "tensorwise").recipe, Fp8Recipe::kTensorwise);
  const Status blockwise = parse_fp8_config("e4m3", "blockwise", 0, 1, "max", true).status();
  EXPECT_NE(blockwise.message().find("--fp8-recipe: expected delayed, tensorwise or mxfp8, found \"blockwise\""),
            std::string::npos)
      << blockwise.message();
  EXPECT_NE(blockwise.message().find("not supported yet"), std::string::npos);
  EXPECT_NE(parse_fp8_config("e4m3", "delayed", 0, 0, "max", true).status().message().find(
                "--fp8-amax-history-len: expected at least 1, found 0"),
            std::string::npos);
}

// One FP8 linear weight [out, in] (f32 or with its bf16 copy).
struct OneWeight {
  ParamBuffer pb;
  int id = -1;
  OneWeight(int64_t out, int64_t in, const Fp8Config& c, bool bf16 = false) {
    id = pb.add(make_param_spec("decoder.layers.0.mlp.linear_fc1.weight", {out, in}, InitKind::kNormal, 0.5f, true));
    Fp8Config k = c;
    k.num_layers = 1;
    add_fp8_params(pb, k);
    pb.finalize();
    if (bf16) pb.enable_gemm_copy(DType::kBF16);
    pb.initialize(5);
    if (bf16) pb.refresh_gemm_copy();
  }
};

std::vector<float> gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const float* b,
                        int64_t ldb) {
  std::vector<float> c(static_cast<size_t>(M * N), 0.0f);
  sgemm(ta, tb, M, N, K, 1.0f, a, lda, b, ldb, 0.0f, c.data(), N);
  return c;
}

void expect_bits(const float* got, const std::vector<float>& want, const std::string& what) {
  EXPECT_EQ(0, std::memcmp(got, want.data(), want.size() * sizeof(float))) << what;
}

// Forward y = Q(x)·Q(W)ᵀ, dgrad dx = Q(dy)·Q(W), wgrad dW = Q(dy)ᵀ·Q(x), or dyᵀ·x under --no-fp8-wgrad;
// each differs from its unquantised product (the quantisation is applied where it should be, and
// only there).
TEST(Fp8, WhichGemmsReadQuantisedOperands) {
  const int64_t M = 64, out = 32, in = 64;
  for (const char* recipe : {"tensorwise", "mxfp8", "delayed"})
    for (const char* format : {"e4m3", "hybrid"})
      for (bool wgrad : {true, false}) {
        const std::string what = std::string(recipe) + " " + format + (wgrad ? "" : " --no-fp8-wgrad");
        const Fp8Config c = fp8(format, recipe, wgrad);
        OneWeight f(out, in, c);
        const LinearWeight w = linear_weight(f.pb, f.id, sgemm);
        ASSERT_TRUE(w.fp8.active()) << what;
        Tensor x = Tensor::empty({M, in}), dy = Tensor::empty({M, out});
        testing::fill_random(x.data<float>(), x.numel(), 3);
        testing::fill_random(dy.data<float>(), dy.numel(), 4);
        for (int64_t i = 0; i < dy.numel(); ++i) dy.data<float>()[i] *= 1e-3f;  // gradient-like magnitudes
        const float* W = f.pb.param_data(f.id);
        // The expected operands, on a scratch copy of the delayed state (scale 1 before any update).
        std::vector<float> hist(3, 0.0f), scale(3, 1.0f);
        const Fp8Operands scratch{w.fp8.config, hist.data(), scale.data()};
        const Tensor xq = fp8_quantise(x, scratch, kFp8Input, true), wq = fp8_quantise(W, out, in, scratch, kFp8Weight, true);
        const Tensor wq_t = fp8_quantise(W, out, in, scratch, kFp8Weight, false);
        const Tensor dq = fp8_quantise(dy, scratch, kFp8GradOutput, true), dq_t = fp8_quantise(dy, scratch, kFp8GradOutput, false);
        const Tensor xq_t = fp8_quantise(x, scratch, kFp8Input, false);

        const Tensor y = linear_forward(x, w);
        expect_bits(y.data<float>(), gemm(false, true, M, out, in, xq.data<float>(), in, wq.data<float>(), in),
                    what + " forward");
        EXPECT_NE(0, std::memcmp(y.data<float>(), gemm(false, true, M, out, in, x.data<float>(), in, W, in).data(),
                                 static_cast<size_t>(M * out) * sizeof(float)))
            << what << ": forward not quantised";
        f.pb.zero_grads();
        const Tensor dx = linear_backward(dy, x, w);
        expect_bits(dx.data<float>(), gemm(false, false, M, in, out, dq.data<float>(), out, wq_t.data<float>(), in),
                    what + " dgrad");
        const std::vector<float> plain_dw = gemm(true, false, out, in, M, dy.data<float>(), out, x.data<float>(), in);
        const float* dW = f.pb.grad_data(f.id);
        if (wgrad) {
          expect_bits(dW, gemm(true, false, out, in, M, dq_t.data<float>(), out, xq_t.data<float>(), in), what + " wgrad");
          EXPECT_NE(0, std::memcmp(dW, plain_dw.data(), plain_dw.size() * sizeof(float))) << what << ": wgrad not quantised";
        } else {
          expect_bits(dW, plain_dw, what + " unquantised wgrad");
        }
        if (c.recipe == Fp8Recipe::kDelayed) {  // the amaxes recorded in history row 0
          EXPECT_EQ(w.fp8.history[kFp8Input], fp8_amax(x.data<float>(), x.numel())) << what;
          EXPECT_EQ(w.fp8.history[kFp8Weight], fp8_amax(W, out * in)) << what;
          EXPECT_EQ(w.fp8.history[kFp8GradOutput], fp8_amax(dy.data<float>(), dy.numel())) << what;
          fp8_delayed_update_all(fp8_delayed_states(f.pb), c);
          EXPECT_EQ(w.fp8.scale[kFp8GradOutput],
                    fp8_max(c.format(kFp8GradOutput)) / fp8_amax(dy.data<float>(), dy.numel()))
              << what;
          EXPECT_EQ(w.fp8.history[kFp8Input], 0.0f) << what;
        }
      }
}

// Under --bf16 the weight quantised is the bf16 GEMM copy, x arrives as bf16, the GEMM runs in f32.
TEST(Fp8, Bf16InputsAreQuantisedFromTheirBf16Values) {
  const Fp8Config c = fp8("e4m3", "tensorwise");
  OneWeight f(32, 64, c, /*bf16=*/true);
  const LinearWeight w = linear_weight(f.pb, f.id, sgemm);
  Tensor x = Tensor::empty({8, 64});
  testing::fill_random(x.data<float>(), x.numel(), 3);
  const Tensor xb = to_gemm_input(x, DType::kBF16);
  const Tensor y = linear_forward(xb, w);
  const Tensor wf = Tensor::empty({32, 64});
  convert_bf16_to_f32(f.pb.param_bf16_data(f.id), wf.data<float>(), 32 * 64);
  const Tensor xq = fp8_quantise(xb, w.fp8, kFp8Input, true);
  const Tensor wq = fp8_quantise(wf.data<float>(), 32, 64, w.fp8, kFp8Weight, true);
  expect_bits(y.data<float>(), gemm(false, true, 8, 32, 64, xq.data<float>(), 64, wq.data<float>(), 64), "bf16 forward");
}

ModelConfig tiny_config(int64_t layers = 2) {
  ModelConfig c;
  c.num_layers = layers;
  c.hidden = 32;
  c.ffn = 64;
  c.heads = 2;
  c.kv_heads = 2;
  c.head_dim = 16;
  c.vocab = 64;
  c.seq_length = 16;
  c.max_positions = 16;
  c.init_std = 0.2f;
  return c;
}

// --first-last-layers-bf16: the first `start` and last `end` decoder layers' weights are not FP8.
TEST(Fp8, FirstLastLayersBf16LeaveThoseLayersAlone) {
  ModelConfig c = tiny_config(4);
  c.fp8 = fp8("hybrid", "tensorwise");
  c.fp8.bf16_layers_at_start = 1;
  c.fp8.bf16_layers_at_end = 2;
  const OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  int fp8_weights = 0, plain_weights = 0;
  for (int id = 0; id < model.params().size(); ++id) {
    const ParamSpec& s = model.params().spec(id);
    if (s.name.find(".linear_") == std::string::npos || s.global_shape.size() != 2) continue;
    const bool layer1 = s.name.rfind("decoder.layers.1.", 0) == 0;
    EXPECT_EQ(s.fp8, layer1) << s.name;
    EXPECT_EQ(linear_weight(model.params(), id, sgemm).fp8.active(), layer1) << s.name;
    (layer1 ? fp8_weights : plain_weights) += 1;
  }
  EXPECT_EQ(fp8_weights, 4);   // qkv, proj, fc1, fc2 of layer 1
  EXPECT_EQ(plain_weights, 12);
  for (const ParamSpec& s : model.params().specs())  // never the embedding or the output layer
    if (s.name.find("embedding") != std::string::npos || s.name.find("output_layer") != std::string::npos) {
      EXPECT_FALSE(s.fp8) << s.name;
    }
}

// The delayed recipe adds two state buffers per FP8 linear (not trained, saved), named as TE's extra state.
TEST(Fp8, DelayedStateBuffers) {
  ModelConfig c = tiny_config();
  c.fp8 = fp8("e4m3", "delayed", true, 4);
  const OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  const ParamBuffer& pb = model.params();
  const int h = pb.find("decoder.layers.1.self_attention.linear_qkv._extra_state.fp8_amax_history");
  ASSERT_GE(h, 0);
  EXPECT_EQ(pb.spec(h).global_shape, (Shape{4, 3}));
  EXPECT_TRUE(pb.spec(h).buffer);
  EXPECT_FALSE(pb.spec(h).trainable);
  EXPECT_EQ(pb.find("decoder.layers.1.self_attention.linear_qkv._extra_state.fp8_scale"), h + 1);
  EXPECT_EQ(pb.spec(pb.find("decoder.layers.1.self_attention.linear_qkv.weight")).fp8_state, h);
  EXPECT_EQ(pb.find("output_layer._extra_state.fp8_scale"), -1);
}

struct Fp8Run {
  std::vector<double> losses;
};

// `steps` AdamW steps on the same micro-batch; the delayed recipe's update after each backward.
Fp8Run train(const ModelConfig& c, int steps) {
  const OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  ParamBuffer& pb = model.params();
  pb.initialize(11);
  if (c.bf16) pb.refresh_gemm_copy();
  std::vector<float> m(pb.numel(), 0.0f), v(pb.numel(), 0.0f);
  Fp8Run run;
  for (int step = 1; step <= steps; ++step) {
    pb.zero_grads();
    GPTModel::LossSums sums;
    const MicroBatch mb = testing::masked_batch(c, 2, 21, false);
    model.forward(0, mb, Tensor(), /*training=*/true, &sums);
    model.backward(0, Tensor(), static_cast<float>(1.0 / sums.tokens));
    run.losses.push_back(sums.loss_sum / sums.tokens);
    if (pb.fp8_config()) fp8_delayed_update_all(fp8_delayed_states(pb), *pb.fp8_config());
    AdamWHyper hyper;
    hyper.lr = 1e-2f;
    hyper.step = step;
    ops.adamw_step(pb.flat_params().data<float>(), pb.flat_grads().data<float>(), m.data(), v.data(),
                   pb.trainable_numel(), hyper);
    if (c.bf16) pb.refresh_gemm_copy();
  }
  return run;
}

// Every recipe and format trains (the loss falls), differs from the unquantised run, and stays close
// to it over 6 steps of memorising one batch (loss 4.8 -> 0.7): the first step's loss (the forward's
// quantisation only) within 2% (measured: at most 1.2%, mxfp8 under bf16, whose floor-rule block
// scales saturate the largest elements), the later ones within 15% (the quantised gradients take a
// slightly different path; measured: at most 5.2% on AVX-512, mxfp8 hybrid under bf16 at step 6, and
// 10.6% on an AVX2 CPU, delayed hybrid f32 at step 6, whose GEMMs round differently before each
// E5M2 gradient cast).
TEST(Fp8, TrainsCloseToUnquantisedPerRecipe) {
  const int steps = 6;
  for (bool bf16 : {false, true}) {
    ModelConfig base = tiny_config();
    base.bf16 = bf16;
    const Fp8Run plain = train(base, steps);
    for (const char* recipe : {"delayed", "tensorwise", "mxfp8"})
      for (const char* format : {"e4m3", "hybrid"}) {
        // f32: every recipe with e4m3, and delayed with hybrid; bf16: delayed and mxfp8 with hybrid.
        const bool hybrid = std::string(format) == "hybrid", delayed = std::string(recipe) == "delayed";
        if (bf16 ? (!hybrid || std::string(recipe) == "tensorwise") : (hybrid && !delayed)) continue;
        ModelConfig c = base;
        c.fp8 = fp8(format, recipe, true, 2, "max");
        const Fp8Run r = train(c, steps);
        const std::string what = std::string(recipe) + " " + format + (bf16 ? " bf16" : " f32");
        EXPECT_LT(r.losses.back(), r.losses.front() - 1.0) << what << ": the loss did not fall";
        bool differs = false;
        for (size_t i = 0; i < r.losses.size(); ++i) {
          differs = differs || r.losses[i] != plain.losses[i];
          EXPECT_NEAR(r.losses[i], plain.losses[i], (i == 0 ? 0.02 : 0.15) * plain.losses[i]) << what << " step " << i + 1;
        }
        EXPECT_TRUE(differs) << what << ": the same losses as without FP8";
      }
  }
}

}  // namespace
}  // namespace gale
