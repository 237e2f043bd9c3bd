// --moe-upcycling-granularity (train/moe_upcycling.h): Megatron's granularity, scale and checks,
// each expert's slice of the dense MLP, the router's tied rows.
#include <gtest/gtest.h>

#include <cmath>

#include "pretrain_cli.h"
#include "train/moe_upcycling.h"

namespace gale {
namespace {

using Cli = testing::PretrainCli;

// --hidden-size 64 (minimal flags): an upcycling run into E experts with `extra`.
StatusOr<UpcyclingPlan> plan_for(Cli& cli, std::vector<std::string> extra) {
  std::vector<std::string> flags = {"--moe-use-upcycling", "--load", "/nonexistent/dense", "--save", "/nonexistent/moe", "--save-interval", "3"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  GALE_RETURN_IF_ERROR(cli.parse_minimal(flags));
  return make_upcycling_plan(cli.args);
}

TEST(MoeUpcycling, GranularityDefaultsToOneAsMegatron) {
  Cli cli;
  ASSERT_TRUE(cli.parse_minimal({}).ok());
  EXPECT_EQ(cli.args.moe.moe_upcycling_granularity, 1);
  Cli up;
  StatusOr<UpcyclingPlan> p = plan_for(up, {"--num-experts", "4", "--ffn-hidden-size", "64"});
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->granularity, 1);
  EXPECT_EQ(p->expansion_rate, 4);
  EXPECT_EQ(p->dense_ffn, 64);
  EXPECT_EQ(p->weight_scale, 1.0);  // softmax after top-k, G = 1: whole copies, unscaled
}

// Megatron's moe_activation_scale (G, or E·G/topk with pre-softmax) and its root: cube with a GLU
// or squared ReLU, square with GeLU.
TEST(MoeUpcycling, ScaleAsMegatron) {
  struct Case {
    std::vector<std::string> flags;
    int64_t granularity, expansion;
    double activation_scale, weight_scale;
  };
  const std::vector<Case> cases = {
      {{"--num-experts", "8", "--moe-router-topk", "4", "--ffn-hidden-size", "64", "--moe-upcycling-granularity", "4"},
       4, 2, 4.0, 2.0},
      {{"--num-experts", "8", "--moe-router-topk", "4", "--ffn-hidden-size", "64", "--moe-upcycling-granularity", "4",
        "--swiglu"},
       4, 2, 4.0, std::cbrt(4.0)},
      {{"--num-experts", "4", "--moe-router-topk", "2", "--ffn-hidden-size", "64", "--moe-upcycling-granularity", "2",
        "--squared-relu"},
       2, 2, 2.0, std::cbrt(2.0)},
      // pre-softmax: E·G/topk = 8·4/4
      {{"--num-experts", "8", "--moe-router-topk", "4", "--ffn-hidden-size", "64", "--moe-upcycling-granularity", "4",
        "--moe-router-pre-softmax"},
       4, 2, 8.0, std::sqrt(8.0)},
      {{"--num-experts", "8", "--moe-router-topk", "4", "--ffn-hidden-size", "64", "--moe-upcycling-granularity", "4",
        "--moe-router-pre-softmax", "--swiglu"},
       4, 2, 8.0, 2.0},
      // G = 1 with pre-softmax still scales: E/topk
      {{"--num-experts", "8", "--moe-router-topk", "2", "--ffn-hidden-size", "64", "--moe-router-pre-softmax"},
       1, 8, 4.0, 2.0},
      // the granularity is the dense FFN over --moe-ffn-hidden-size (Megatron's _get_config)
      {{"--num-experts", "8", "--moe-router-topk", "2", "--ffn-hidden-size", "128", "--moe-ffn-hidden-size", "32"},
       4, 2, 4.0, 2.0},
  };
  for (const Case& c : cases) {
    Cli cli;
    StatusOr<UpcyclingPlan> p = plan_for(cli, c.flags);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    EXPECT_EQ(p->granularity, c.granularity) << ::testing::PrintToString(c.flags);
    EXPECT_EQ(p->expansion_rate, c.expansion) << ::testing::PrintToString(c.flags);
    EXPECT_DOUBLE_EQ(p->activation_scale, c.activation_scale) << ::testing::PrintToString(c.flags);
    EXPECT_DOUBLE_EQ(p->weight_scale, c.weight_scale) << ::testing::PrintToString(c.flags);
  }
}

TEST(MoeUpcycling, RefusesWhatMegatronAsserts) {
  const std::vector<testing::FlagErrorCase> cases = {
      {{"--moe-use-upcycling", "--load", "d", "--save", "m", "--num-experts", "4", "--ffn-hidden-size", "96",
        "--moe-ffn-hidden-size", "64"},
       1,
       "The ffn hidden size of dense model must be divisible by ffn hidden size of moe model. (dense: --ffn-hidden-size "
       "96 x --moe-upcycling-granularity 1 = 96, experts: --moe-ffn-hidden-size 64)"},
      {{"--moe-use-upcycling", "--load", "d", "--save", "m", "--num-experts", "6", "--ffn-hidden-size", "32",
        "--moe-upcycling-granularity", "4"},
       1, "The number of experts must be divisible by granularity for upcycling (--num-experts 6, granularity 4)"},
      {{"--moe-use-upcycling", "--load", "d", "--save", "m", "--num-experts", "4", "--quick-geglu"},
       1,
       "The activation func is not supported by upcycling.Valid options are: ['gelu', 'silu', 'squared_relu']But got "
       "quick_gelu"},
      {{"--moe-use-upcycling", "--load", "d", "--save", "m", "--num-experts", "4", "--moe-upcycling-granularity", "0"},
       1, "--moe-upcycling-granularity: expected a positive integer, found 0"},
      {{"--moe-use-upcycling", "--load", "d", "--save", "m", "--num-experts", "4", "--ffn-hidden-size", "32",
        "--moe-upcycling-granularity", "2", "--moe-layer-freq", "2"},
       1, "--moe-upcycling-granularity 2 with dense layers in --moe-layer-freq (layer 1): not supported"},
      {{"--moe-use-upcycling", "--load", "d", "--save", "m", "--num-experts", "4", "--moe-upcycling-granularity", "2",
        "--ffn-hidden-size", "32", "--moe-shared-expert-intermediate-size", "32"},
       1, "--moe-use-upcycling with --moe-shared-expert-intermediate-size: not supported yet"},
      {{"--moe-use-upcycling", "--num-experts", "4", "--load", "d"}, 1,
       "When using upcycling, the --save option must be specified."},
  };
  for (const auto& c : cases) testing::expect_one_line_error(c);
  // Without --moe-use-upcycling the flag is not read (Megatron's).
  Cli cli;
  EXPECT_TRUE(cli.parse_minimal({"--moe-upcycling-granularity", "3"}).ok());
}

ParamSpec spec(const std::string& name, Shape shape) {
  ParamSpec s;
  s.name = name;
  s.global_shape = std::move(shape);
  return s;
}

// Expert e takes slice e mod G of the dense fc1 rows (gate and up halves each cut in G) and fc2
// columns; the router reads nothing; every other tensor itself.
TEST(MoeUpcycling, ExpertSlicesOfTheDenseMlp) {
  UpcyclingPlan glu;
  glu.granularity = 4;
  glu.expansion_rate = 2;
  glu.expert_ffn = 16;
  glu.dense_ffn = 64;
  glu.glu = true;
  glu.weight_scale = 1.5;
  const std::string L = "decoder.layers.1.mlp.";
  // expert 5: slice 1; a piece of 8 gate rows from row 4, and one of 8 up rows from row 16
  const ParamSpec fc1 = spec(L + "experts.local_experts.5.linear_fc1.weight", {32, 48});
  UpcyclingSource g = upcycling_sources(glu, fc1, {4, 0}, 8)[0];
  EXPECT_EQ(g.name, L + "linear_fc1.weight");
  EXPECT_EQ(g.global_shape, (Shape{128, 48}));
  EXPECT_EQ(g.offsets, (std::vector<int64_t>{1 * 16 + 4, 0}));
  EXPECT_FLOAT_EQ(g.scale, 1.5f);
  UpcyclingSource u = upcycling_sources(glu, fc1, {16, 0}, 16)[0];
  EXPECT_EQ(u.offsets, (std::vector<int64_t>{64 + 1 * 16, 0}));  // the up half starts at dense row G·Fe
  const ParamSpec b1 = spec(L + "experts.local_experts.7.linear_fc1.bias", {32});
  EXPECT_EQ(upcycling_sources(glu, b1, {20}, 4)[0].offsets, (std::vector<int64_t>{64 + 3 * 16 + 4}));
  const ParamSpec fc2 = spec(L + "experts.local_experts.6.linear_fc2.weight", {48, 16});
  UpcyclingSource c = upcycling_sources(glu, fc2, {0, 8}, 48)[0];
  EXPECT_EQ(c.name, L + "linear_fc2.weight");
  EXPECT_EQ(c.global_shape, (Shape{48, 64}));
  EXPECT_EQ(c.offsets, (std::vector<int64_t>{0, 2 * 16 + 8}));
  EXPECT_FLOAT_EQ(c.scale, 1.5f);
  UpcyclingSource b2 = upcycling_sources(glu, spec(L + "experts.local_experts.6.linear_fc2.bias", {48}), {0}, 48)[0];
  EXPECT_EQ(b2.name, L + "linear_fc2.bias");
  EXPECT_EQ(b2.global_shape, (Shape{48}));
  EXPECT_FLOAT_EQ(b2.scale, 1.0f);  // copied, unscaled
  EXPECT_TRUE(upcycling_sources(glu, spec(L + "router.weight", {8, 48}), {0, 0}, 8)[0].name.empty());
  const ParamSpec qkv = spec("decoder.layers.1.self_attention.linear_qkv.weight", {144, 48});
  UpcyclingSource q = upcycling_sources(glu, qkv, {48, 0}, 48)[0];
  EXPECT_EQ(q.name, qkv.name);
  EXPECT_EQ(q.offsets, (std::vector<int64_t>{48, 0}));
  EXPECT_FLOAT_EQ(q.scale, 1.0f);
  // A whole GLU fc1 (no TP: one piece) reads its gate rows and its up rows separately.
  const std::vector<UpcyclingSource> whole = upcycling_sources(glu, fc1, {0, 0}, 32);
  ASSERT_EQ(whole.size(), 2u);
  EXPECT_EQ(whole[0].first_row, 0);
  EXPECT_EQ(whole[0].rows, 16);
  EXPECT_EQ(whole[0].offsets, (std::vector<int64_t>{1 * 16, 0}));
  EXPECT_EQ(whole[1].first_row, 16);
  EXPECT_EQ(whole[1].rows, 16);
  EXPECT_EQ(whole[1].offsets, (std::vector<int64_t>{64 + 1 * 16, 0}));
  // Without a GLU the rows are one block of G slices.
  UpcyclingPlan gelu = glu;
  gelu.glu = false;
  const ParamSpec f1 = spec(L + "experts.local_experts.3.linear_fc1.weight", {16, 48});
  UpcyclingSource n = upcycling_sources(gelu, f1, {8, 0}, 8)[0];
  EXPECT_EQ(n.global_shape, (Shape{64, 48}));
  EXPECT_EQ(n.offsets, (std::vector<int64_t>{3 * 16 + 8, 0}));
}

TEST(MoeUpcycling, RouterRowsTieInGroupsOfG) {
  UpcyclingPlan plan;
  plan.granularity = 2;
  Tensor router = Tensor::zeros({6, 3}, DType::kF32);
  for (int64_t i = 0; i < 18; ++i) router.data<float>()[i] = static_cast<float>(i);
  upcycle_router_rows(plan, router);
  for (int64_t e = 0; e < 6; ++e)
    for (int64_t h = 0; h < 3; ++h) EXPECT_EQ(router.data<float>()[e * 3 + h], static_cast<float>((e / 2) * 3 + h)) << e;
  plan.granularity = 1;
  Tensor same = Tensor::zeros({4, 2}, DType::kF32);
  for (int64_t i = 0; i < 8; ++i) same.data<float>()[i] = static_cast<float>(i);
  upcycle_router_rows(plan, same);
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(same.data<float>()[i], static_cast<float>(i));
}

}  // namespace
}  // namespace gale
