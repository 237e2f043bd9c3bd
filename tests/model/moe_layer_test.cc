// The MoE MLP: finite-difference gradients (router, experts, input, aux and z losses; odd sizes,
// tied logits, idle experts), routing rules, and a whole GPT model with MoE layers.
#include "model/moe_layer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "model/gpt_model.h"
#include "model_test_batches.h"
#include "testing.h"

namespace gale {
namespace {

using testing::directional_derivative;
using testing::dot;
using testing::random_vector;
using testing::rel_diff;

ModelConfig moe_config(int64_t H, int64_t E, int64_t k, int64_t Fe, bool swiglu, bool bias) {
  ModelConfig c;
  c.num_layers = 2;
  c.hidden = H;
  c.ffn = Fe;
  c.swiglu = swiglu;
  c.add_bias_linear = bias;
  c.init_std = 0.5f;
  c.moe.num_experts = E;
  c.moe.topk = k;
  c.moe.ffn = Fe;
  c.moe.aux_loss_coeff = 0.3;
  c.moe.z_loss_coeff = 0.05;
  return c;
}

// One MoE layer with random parameters (biases too) and a fixed projection R of its output:
// L = Σ R ⊙ y + aux_coeff·aux + z_coeff·z.
struct LayerFixture {
  ModelConfig c;
  OpTable ops = reference_ops();
  ParamBuffer pb;
  MoeParamIds w;
  Tensor x;
  std::vector<float> r;

  int64_t batch = 1;  // sequences of the T rows (seq_aux_loss)

  LayerFixture(const ModelConfig& config, int64_t T, uint64_t seed, int64_t B = 1) : c(config), batch(B) {
    w = register_moe_params(pb, c, 0);
    pb.finalize();
    pb.initialize(seed);
    for (int id = 0; id < pb.size(); ++id)  // non-zero biases (and expert bias), so their gradients are checked too
      if (pb.spec(id).init == InitKind::kZeros) testing::fill_random(pb.param_data(id), pb.spec(id).local_numel(), seed + id, 0.3f);
    x = Tensor::empty({T, c.hidden});
    testing::fill_random(x.data<float>(), x.numel(), seed + 1000);
    r = random_vector(T * c.hidden, seed + 2000);
  }

  double loss() {
    MoeSaved saved;
    MoeAuxLosses aux;
    const Tensor y = moe_forward(c, ops, pb, w, x, &saved, &aux, nullptr, false, nullptr, nullptr, batch);
    double balancing = 0.0;  // every load-balancing loss that is on, with its coefficient
    for (int kind = 0; kind < kMoeAuxKinds; ++kind) balancing += c.moe.aux_coeff(kind) * aux.balancing(kind);
    return dot(y.data<float>(), r.data(), y.numel()) + balancing + c.moe.z_loss_coeff * aux.z;
  }

  // Gradients of every parameter (in pb's grad buffer) and of x.
  Tensor backward() {
    pb.zero_grads();
    MoeSaved saved;
    MoeAuxLosses aux;
    moe_forward(c, ops, pb, w, x, &saved, &aux, nullptr, false, nullptr, nullptr, batch);
    const Tensor dy = Tensor::from_blob(r.data(), x.shape(), DType::kF32);
    return moe_backward(c, ops, pb, w, saved, dy, 1.0);
  }

  void expect_gradients_match_finite_differences() {
    const Tensor dx = backward();
    const std::vector<float> grads(pb.flat_grads().data<float>(), pb.flat_grads().data<float>() + pb.numel());
    auto l = [&] { return loss(); };
    for (int id = 0; id < pb.size(); ++id) {
      if (pb.spec(id).buffer) continue;  // the expert bias: no gradient
      const int64_t n = pb.spec(id).local_numel();
      const auto dir = random_vector(n, 300 + id);
      const double analytic = dot(grads.data() + pb.spec(id).offset, dir.data(), n);
      const double numeric = directional_derivative(l, pb.param_data(id), dir.data(), n, 1e-3);
      EXPECT_LT(rel_diff(analytic, numeric, 2e-3), 1e-2) << pb.spec(id).name << ": " << analytic << " vs " << numeric;
    }
    const auto dir = random_vector(x.numel(), 999);
    const double analytic = dot(dx.data<float>(), dir.data(), x.numel());
    const double numeric = directional_derivative(l, x.data<float>(), dir.data(), x.numel(), 1e-3);
    EXPECT_LT(rel_diff(analytic, numeric, 2e-3), 1e-2) << "input: " << analytic << " vs " << numeric;
  }
};

TEST(MoeLayer, GradientsMatchFiniteDifferencesGeluWithBiases) {
  LayerFixture f(moe_config(8, 4, 2, 6, /*swiglu=*/false, /*bias=*/true), 12, 11);
  f.expect_gradients_match_finite_differences();
}

TEST(MoeLayer, GradientsMatchFiniteDifferencesSwigluOddSizes) {
  LayerFixture f(moe_config(5, 3, 2, 3, /*swiglu=*/true, /*bias=*/false), 7, 12);
  f.expect_gradients_match_finite_differences();
}

// --add-bias-linear gives the router Megatron's bias (TopKRouter.bias, gpt-oss's router bias): a
// trained parameter [E] added to the logits, so it steers the choice (a large bias on one expert
// makes every token pick it) and gets a gradient (the finite-difference checks with biases above).
TEST(MoeLayer, RouterBiasWithAddBiasLinear) {
  LayerFixture plain(moe_config(8, 4, 1, 6, /*swiglu=*/true, /*bias=*/false), 12, 21);
  EXPECT_LT(plain.w.router_b, 0);
  EXPECT_LT(plain.pb.find("decoder.layers.0.mlp.router.bias"), 0);
  LayerFixture f(moe_config(8, 4, 1, 6, /*swiglu=*/true, /*bias=*/true), 12, 21);
  ASSERT_GE(f.w.router_b, 0);
  EXPECT_EQ(f.pb.find("decoder.layers.0.mlp.router.bias"), f.w.router_b);
  EXPECT_EQ(f.pb.spec(f.w.router_b).global_shape, (Shape{4}));
  EXPECT_TRUE(f.pb.spec(f.w.router_b).trainable);
  const std::vector<int> ids = f.w.all();
  EXPECT_NE(std::find(ids.begin(), ids.end(), f.w.router_b), ids.end());
  f.pb.param_data(f.w.router_b)[2] = 100.0f;
  MoeSaved saved;
  moe_forward(f.c, f.ops, f.pb, f.w, f.x, &saved, nullptr);
  for (int32_t e : saved.experts) EXPECT_EQ(e, 2);
  f.pb.param_data(f.w.router_b)[2] = -100.0f;
  MoeSaved none;
  moe_forward(f.c, f.ops, f.pb, f.w, f.x, &none, nullptr);
  for (int32_t e : none.experts) EXPECT_NE(e, 2);
}

// --moe-input-jitter-eps: the router sees x ⊙ n (the noise fixed: keyed by the token rows), the
// experts x; the router's weight and the input get the jittered gradients.
TEST(MoeLayer, GradientsMatchFiniteDifferencesWithInputJitter) {
  ModelConfig c = moe_config(8, 4, 2, 6, /*swiglu=*/true, /*bias=*/true);
  c.moe.input_jitter_eps = 0.3;
  LayerFixture f(c, 12, 15);
  f.expect_gradients_match_finite_differences();
  c.moe.sigmoid = true;  // and through the sigmoid scores
  LayerFixture s(c, 10, 16);
  s.expect_gradients_match_finite_differences();
}

// One expert, top-1: every token's weight is 1, so the output is the expert's on the unjittered
// input, bit for bit the run without jitter, while the router's logits (here their z-loss) see the
// noise.
TEST(MoeLayer, InputJitterReachesTheRouterOnly) {
  ModelConfig c = moe_config(8, 1, 1, 6, /*swiglu=*/false, /*bias=*/true);
  LayerFixture plain(c, 12, 17);
  c.moe.input_jitter_eps = 0.3;
  LayerFixture jittered(c, 12, 17);
  MoeSaved a, b;
  MoeAuxLosses aux_a, aux_b;
  const Tensor ya = moe_forward(plain.c, plain.ops, plain.pb, plain.w, plain.x, &a, &aux_a);
  const Tensor yb = moe_forward(jittered.c, jittered.ops, jittered.pb, jittered.w, jittered.x, &b, &aux_b);
  ASSERT_EQ(ya.numel(), yb.numel());
  for (int64_t i = 0; i < ya.numel(); ++i) ASSERT_EQ(ya.data<float>()[i], yb.data<float>()[i]) << i;
  EXPECT_NE(aux_a.z, aux_b.z);
}

TEST(MoeLayer, GradientsMatchFiniteDifferencesTopOneAndPreSoftmax) {
  ModelConfig c = moe_config(6, 5, 1, 4, true, false);
  LayerFixture top1(c, 9, 13);
  top1.expect_gradients_match_finite_differences();
  c.moe.topk = 3;
  c.moe.pre_softmax = true;
  LayerFixture pre(c, 9, 14);
  pre.expect_gradients_match_finite_differences();
}

// DeepSeek-V3-style routing: sigmoid scores, an expert bias steering the choice, group-limited
// top-k and a scaling factor.
TEST(MoeLayer, GradientsMatchFiniteDifferencesSigmoidExpertBiasGroupsScaling) {
  ModelConfig c = moe_config(8, 8, 3, 6, /*swiglu=*/true, /*bias=*/false);
  c.moe.sigmoid = true;
  c.moe.expert_bias = true;
  c.moe.num_groups = 4;
  c.moe.group_topk = 2;
  c.moe.topk_scaling_factor = 2.5;
  LayerFixture f(c, 12, 21);
  ASSERT_GE(f.w.expert_bias, 0);
  f.expect_gradients_match_finite_differences();
  c.moe.topk = 1;  // one expert: its sigmoid score, not normalised
  c.moe.group_topk = 1;
  LayerFixture top1(c, 9, 22);
  top1.expect_gradients_match_finite_differences();
}

TEST(MoeLayer, GradientsMatchFiniteDifferencesSeqAuxLoss) {
  for (bool sigmoid : {false, true}) {
    ModelConfig c = moe_config(6, 4, 2, 4, true, false);
    c.moe.sigmoid = sigmoid;
    c.moe.aux_loss_coeff = 0.0;
    c.moe.seq_aux_loss_coeff = 0.7;
    LayerFixture f(c, 12, 23, /*B=*/3);
    f.expect_gradients_match_finite_differences();
  }
}

// Megatron's list form (--moe-router-load-balancing-type aux_loss seq_aux_loss global_aux_loss,
// one coefficient each): the losses add up, and so do their gradients.
TEST(MoeLayer, GradientsMatchFiniteDifferencesWithSeveralLoadBalancingLosses) {
  for (bool sigmoid : {false, true}) {
    ModelConfig c = moe_config(6, 4, 2, 4, true, false);
    c.moe.sigmoid = sigmoid;
    c.moe.aux_loss_coeff = 0.3;
    c.moe.seq_aux_loss_coeff = 0.7;
    LayerFixture f(c, 12, 23, /*B=*/3);
    MoeSaved saved;
    MoeAuxLosses aux;
    moe_forward(f.c, f.ops, f.pb, f.w, f.x, &saved, &aux, nullptr, false, nullptr, nullptr, 3);
    EXPECT_GT(aux.load_balancing, 0.0);
    EXPECT_GT(aux.seq_load_balancing, 0.0);
    EXPECT_NE(aux.load_balancing, aux.seq_load_balancing);
    f.expect_gradients_match_finite_differences();
  }
}

// Dropped (token, expert) pairs get no row and no weight gradient; the kept weights are not
// renormalised.
TEST(MoeLayer, GradientsMatchFiniteDifferencesWithTokenDropping) {
  for (bool position : {false, true}) {
    ModelConfig c = moe_config(6, 4, 2, 4, true, true);
    c.moe.capacity_factor = 0.75;  // C = ceil(14·2/4·0.75) = 6 of 14 tokens
    c.moe.drop_by_position = position;
    LayerFixture f(c, 14, 24);
    MoeSaved saved;
    MoeAuxLosses aux;
    moe_forward(f.c, f.ops, f.pb, f.w, f.x, &saved, &aux);
    int64_t dropped = 0;
    for (int32_t e : saved.experts) dropped += e < 0;
    EXPECT_GT(dropped, 0);
    EXPECT_EQ(static_cast<int64_t>(saved.permuted_slot.size()), 14 * 2 - dropped);
    for (int64_t e = 0; e < 4; ++e) EXPECT_LE(saved.offsets[e + 1] - saved.offsets[e], 6);
    f.expect_gradients_match_finite_differences();
  }
}

// --moe-pad-expert-input-to-capacity: every expert runs on exactly C rows, and the padding rows
// (weight 0) change neither the output nor any gradient.
TEST(MoeLayer, PaddingToCapacityGivesTheSameOutputsAndGradients) {
  ModelConfig c = moe_config(6, 4, 2, 4, true, true);
  c.moe.capacity_factor = 1.25;  // C = ceil(14·2/4·1.25) = 9 of 14 tokens
  LayerFixture dropped(c, 14, 26);
  c.moe.pad_to_capacity = true;
  LayerFixture padded(c, 14, 26);
  MoeSaved a, b;
  const Tensor ya = moe_forward(dropped.c, dropped.ops, dropped.pb, dropped.w, dropped.x, &a, nullptr);
  const Tensor yb = moe_forward(padded.c, padded.ops, padded.pb, padded.w, padded.x, &b, nullptr);
  int64_t pads = 0;
  for (int64_t e = 0; e < 4; ++e) EXPECT_EQ(b.offsets[e + 1] - b.offsets[e], 9) << "expert " << e;
  for (int64_t slot : b.permuted_slot) pads += slot < 0;
  EXPECT_GT(pads, 0);
  EXPECT_EQ(a.experts, b.experts);
  for (int64_t i = 0; i < ya.numel(); ++i) EXPECT_NEAR(yb.data<float>()[i], ya.data<float>()[i], 1e-6) << i;
  const Tensor dxa = dropped.backward(), dxb = padded.backward();
  for (int64_t i = 0; i < dxa.numel(); ++i) EXPECT_NEAR(dxb.data<float>()[i], dxa.data<float>()[i], 1e-6) << i;
  const float* ga = dropped.pb.flat_grads().data<float>();
  const float* gb = padded.pb.flat_grads().data<float>();
  for (int64_t i = 0; i < dropped.pb.trainable_numel(); ++i) EXPECT_NEAR(gb[i], ga[i], 1e-6) << i;
  padded.expect_gradients_match_finite_differences();
}

// Top-1 with every token dropped but the capacity's: the dropped tokens' outputs are 0.
TEST(MoeLayer, ADroppedTopOneTokenHasZeroOutput) {
  ModelConfig c = moe_config(4, 2, 1, 3, true, false);
  c.moe.pre_softmax = true;
  c.moe.capacity_factor = 0.5;  // C = ceil(8·1/2·0.5) = 2 per expert
  LayerFixture f(c, 8, 25);
  MoeSaved saved;
  const Tensor y = moe_forward(f.c, f.ops, f.pb, f.w, f.x, &saved, nullptr);
  for (int64_t t = 0; t < 8; ++t) {
    double norm = 0.0;
    for (int64_t h = 0; h < 4; ++h) norm += std::fabs(y.data<float>()[t * 4 + h]);
    if (saved.experts[t] < 0) {
      EXPECT_EQ(norm, 0.0) << "token " << t;
    } else {
      EXPECT_GT(norm, 0.0) << "token " << t;
    }
  }
}

TEST(MoeLayer, GradientsWithoutAuxLossesAreTheRoutedOutputsOnly) {
  ModelConfig c = moe_config(6, 4, 2, 4, true, false);
  c.moe.aux_loss_coeff = 0.0;
  c.moe.z_loss_coeff = 0.0;
  LayerFixture f(c, 8, 15);
  f.expect_gradients_match_finite_differences();
  MoeSaved saved;
  MoeAuxLosses aux{1.0, 1.0, 1.0, 1.0};
  moe_forward(f.c, f.ops, f.pb, f.w, f.x, &saved, &aux);
  EXPECT_EQ(aux.load_balancing, 0.0);
  EXPECT_EQ(aux.seq_load_balancing, 0.0);
  EXPECT_EQ(aux.global_load_balancing, 0.0);
  EXPECT_EQ(aux.z, 0.0);
}

// Experts 0 and 1 have equal router rows (tied logits for every token) and expert 2 a router row
// that keeps it last: every token picks 0 then 1 with weights 1/2 each, expert 2 gets nothing.
TEST(MoeLayer, TiedLogitsGoToTheLowerExpertAndIdleExpertsGetNoGradient) {
  LayerFixture f(moe_config(4, 3, 2, 3, true, false), 6, 16);
  float* router = f.pb.param_data(f.w.router_w);
  const int64_t H = 4;
  for (int64_t h = 0; h < H; ++h) router[H + h] = router[h];
  for (int64_t t = 0; t < 6; ++t)
    for (int64_t h = 0; h < H; ++h) f.x.data<float>()[t * H + h] = std::fabs(f.x.data<float>()[t * H + h]) + 0.1f;
  for (int64_t h = 0; h < H; ++h) {
    router[h] = router[H + h] = 1.0f;
    router[2 * H + h] = -1.0f;
  }
  MoeSaved saved;
  MoeAuxLosses aux;
  moe_forward(f.c, f.ops, f.pb, f.w, f.x, &saved, &aux);
  for (int64_t t = 0; t < 6; ++t) {
    EXPECT_EQ(saved.experts[t * 2], 0);
    EXPECT_EQ(saved.experts[t * 2 + 1], 1);
    EXPECT_FLOAT_EQ(saved.probs.data<float>()[t * 2], 0.5f);
  }
  EXPECT_EQ(saved.offsets[3] - saved.offsets[2], 0);
  f.expect_gradients_match_finite_differences();
  for (int id : {f.w.fc1_w[2], f.w.fc2_w[2]})
    for (int64_t i = 0; i < f.pb.spec(id).local_numel(); ++i) ASSERT_EQ(f.pb.grad_data(id)[i], 0.0f);
}

// Default routing: the softmax over the k selected logits (= the full softmax renormalised).
TEST(MoeLayer, RoutingWeightsAreTheRenormalisedSoftmaxOfTheTopK) {
  LayerFixture f(moe_config(6, 5, 2, 4, true, false), 10, 17);
  MoeSaved saved;
  MoeAuxLosses aux;
  moe_forward(f.c, f.ops, f.pb, f.w, f.x, &saved, &aux);
  const int64_t E = 5;
  double lb = 0.0, z = 0.0;
  std::vector<double> prob_sum(E, 0.0), count(E, 0.0);
  for (int64_t t = 0; t < 10; ++t) {
    std::vector<double> l(E);
    for (int64_t e = 0; e < E; ++e) {
      l[e] = 0.0;
      for (int64_t h = 0; h < 6; ++h)
        l[e] += static_cast<double>(f.x.data<float>()[t * 6 + h]) * f.pb.param_data(f.w.router_w)[e * 6 + h];
    }
    const int a = saved.experts[t * 2], b = saved.experts[t * 2 + 1];
    for (int64_t e = 0; e < E; ++e)
      if (e != a && e != b) {
        EXPECT_LT(l[e], l[b]);
      }
    EXPECT_GE(l[a], l[b]);
    EXPECT_NEAR(saved.probs.data<float>()[t * 2], 1.0 / (1.0 + std::exp(l[b] - l[a])), 1e-5);
    double se = 0.0;
    for (double v : l) se += std::exp(v);
    for (int64_t e = 0; e < E; ++e) prob_sum[e] += std::exp(l[e]) / se;
    ++count[a];
    ++count[b];
    z += std::log(se) * std::log(se);
  }
  for (int64_t e = 0; e < E; ++e) lb += prob_sum[e] * count[e];
  EXPECT_NEAR(aux.load_balancing, lb * E / (10.0 * 10.0 * 2.0), 1e-5);
  EXPECT_NEAR(aux.z, z / 10.0, 1e-4);
}

ModelConfig mixtral_config() {
  ModelConfig c = testing::tiny_moe_config();
  c.moe.z_loss_coeff = 0.01;
  return c;
}

TEST(MoeModel, MegatronNamesAndShapes) {
  const ModelConfig c = mixtral_config();
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  const ParamBuffer& pb = model.params();
  EXPECT_EQ(pb.spec(pb.find("decoder.layers.0.mlp.router.weight")).global_shape, (Shape{4, 8}));
  EXPECT_EQ(pb.spec(pb.find("decoder.layers.2.mlp.experts.local_experts.3.linear_fc1.weight")).global_shape,
            (Shape{12, 8}));
  EXPECT_EQ(pb.spec(pb.find("decoder.layers.0.mlp.experts.local_experts.0.linear_fc2.weight")).global_shape,
            (Shape{8, 6}));
  EXPECT_GE(pb.find("decoder.layers.1.mlp.linear_fc1.weight"), 0);  // the dense layer
  EXPECT_EQ(pb.find("decoder.layers.0.mlp.linear_fc1.weight"), -1);
  EXPECT_EQ(pb.find("decoder.layers.1.mlp.router.weight"), -1);
}

// Whole model, two micro-batches: the differentiated objective is Σ_m (lm_m + coeffs·aux_m) / 2
// (Megatron: the aux-loss gradient is scaled by 1 / num_microbatches), checked by finite
// differences on every parameter; the aux losses are reported without coefficients.
// With --moe-input-jitter-eps too (its noise the same in every evaluation of the same micro-batches).
class MoeModelGradients : public ::testing::TestWithParam<double> {};

TEST_P(MoeModelGradients, EveryParameterMatchesFiniteDifferencesWithAuxLosses) {
  ModelConfig c = mixtral_config();
  c.moe.input_jitter_eps = GetParam();
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(5);
  model.set_num_microbatches(2);
  const MicroBatch mbs[2] = {testing::full_batch(c, 2, 21), testing::full_batch(c, 2, 22)};
  auto objective = [&](bool backward) {
    double total = 0.0;
    if (backward) model.params().zero_grads();
    for (int m = 0; m < 2; ++m) {
      GPTModel::LossSums sums;
      model.forward(m, mbs[m], Tensor(), true, &sums);
      model.backward(m, Tensor(), backward ? static_cast<float>(1.0 / (sums.tokens * 2)) : 0.0f);
      total += sums.loss_sum / sums.tokens / 2;
    }
    const MoeAuxLosses aux = model.take_moe_losses();
    return total + (c.moe.aux_loss_coeff * aux.load_balancing + c.moe.z_loss_coeff * aux.z) / 2;
  };
  objective(true);
  ParamBuffer& pb = model.params();
  const std::vector<float> grads(pb.flat_grads().data<float>(), pb.flat_grads().data<float>() + pb.numel());
  for (int id = 0; id < pb.size(); ++id) {
    const int64_t n = pb.spec(id).local_numel();
    const auto dir = random_vector(n, 500 + id);
    const double analytic = dot(grads.data() + pb.spec(id).offset, dir.data(), n);
    const double numeric = directional_derivative([&] { return objective(false); }, pb.param_data(id), dir.data(), n, 1e-3);
    EXPECT_LT(rel_diff(analytic, numeric, 2e-3), 1e-2) << pb.spec(id).name << ": " << analytic << " vs " << numeric;
  }
}

INSTANTIATE_TEST_SUITE_P(InputJitter, MoeModelGradients, ::testing::Values(0.0, 0.2),
                         [](const auto& info) { return info.param == 0.0 ? std::string("none") : std::string("eps_0_2"); });

// --moe-input-jitter-eps 0 is no jitter, bit for bit; so is an eps too small to move a float off
// 1 (the noise path runs, every factor rounds to 1); a real eps changes the routing and the loss.
TEST(MoeModel, InputJitterOfZeroIsNoJitter) {
  OpTable ops = reference_ops();
  auto run = [&](double eps) {
    ModelConfig c = mixtral_config();
    c.moe.input_jitter_eps = eps;
    GPTModel model(c, single_process_partition(c), &ops);
    model.params().initialize(6);
    const MicroBatch mb = testing::full_batch(c, 2, 23);
    GPTModel::LossSums sums;
    model.forward(0, mb, Tensor(), true, &sums);
    model.backward(0, Tensor(), static_cast<float>(1.0 / sums.tokens));
    const float* g = model.params().flat_grads().data<float>();
    std::vector<float> out(g, g + model.params().numel());
    out.push_back(static_cast<float>(sums.loss_sum));
    return out;
  };
  const std::vector<float> none = run(0.0);
  EXPECT_EQ(none, run(1e-9));
  EXPECT_NE(none, run(0.2));
}

// --recompute-granularity full reruns the MoE layers' forward in backward: same gradients, and the
// aux losses are counted once.
TEST(MoeModel, FullRecomputationGivesTheSameGradientsAndLosses) {
  ModelConfig c = mixtral_config();
  OpTable ops = reference_ops();
  auto run = [&](const ModelConfig& cfg, MoeAuxLosses* aux) {
    GPTModel model(cfg, single_process_partition(cfg), &ops);
    model.params().initialize(6);
    const MicroBatch mb = testing::full_batch(cfg, 2, 23);
    GPTModel::LossSums sums;
    model.forward(0, mb, Tensor(), true, &sums);
    model.backward(0, Tensor(), static_cast<float>(1.0 / sums.tokens));
    *aux = model.take_moe_losses();
    const float* g = model.params().flat_grads().data<float>();
    return std::vector<float>(g, g + model.params().numel());
  };
  MoeAuxLosses a, b;
  const std::vector<float> kept = run(c, &a);
  c.full_recompute.method = FullRecompute::Method::kUniform;
  c.full_recompute.num_layers = 2;
  const std::vector<float> recomputed = run(c, &b);
  EXPECT_EQ(kept, recomputed);
  EXPECT_GT(a.load_balancing, 0.0);
  EXPECT_EQ(a.load_balancing, b.load_balancing);
  EXPECT_EQ(a.z, b.z);
}

}  // namespace
}  // namespace gale
