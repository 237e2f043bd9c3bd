// MindSpeed's --n-shared-experts K: converted to --moe-shared-expert-intermediate-size K x
// --ffn-hidden-size (MindSpeed's rule), trains exactly as the explicit Megatron flag, its refusals
// (both flags, negative, no MoE), and the registry row (level 0, active only when K > 0).
#include <gtest/gtest.h>

#include <cstring>

#include "comm/communicator.h"
#include "features/registry.h"
#include "pretrain_cli.h"
#include "testing_run.h"

namespace gale {
namespace {

using Cli = testing::PretrainCli;

const std::vector<std::string> kMoe = {"--num-experts", "4", "--disable-bias-linear", "--ffn-hidden-size", "40",
                                       "--moe-ffn-hidden-size", "24"};

TEST(NSharedExperts, IsKTimesTheFfnHiddenSize) {
  Cli two;
  ASSERT_TRUE(two.parse_minimal(testing::join({kMoe, {"--n-shared-experts", "2"}})).ok());
  EXPECT_EQ(two.args.moe.moe_shared_expert_intermediate_size, 80);  // 2 x --ffn-hidden-size, not x moe-ffn
  Cli zero;  // MindSpeed's falsy 0: no shared expert
  ASSERT_TRUE(zero.parse_minimal(testing::join({kMoe, {"--n-shared-experts", "0"}})).ok());
  EXPECT_EQ(zero.args.moe.moe_shared_expert_intermediate_size, kUnset);
  Cli zero_with_megatron;  // 0 and the Megatron flag: the Megatron flag holds
  ASSERT_TRUE(zero_with_megatron
                  .parse_minimal(testing::join({kMoe, {"--n-shared-experts", "0", "--moe-shared-expert-intermediate-size",
                                                       "16"}}))
                  .ok());
  EXPECT_EQ(zero_with_megatron.args.moe.moe_shared_expert_intermediate_size, 16);
  Cli gated;  // the shared expert's own flags accept it as a shared expert
  ASSERT_TRUE(gated.parse_minimal(testing::join({kMoe, {"--n-shared-experts", "1", "--moe-shared-expert-gate"}})).ok());
  EXPECT_EQ(gated.args.moe.moe_shared_expert_intermediate_size, 40);
}

TEST(NSharedExperts, Refusals) {
  const std::vector<testing::FlagErrorCase> cases = {
      {testing::join({kMoe, {"--n-shared-experts", "2", "--moe-shared-expert-intermediate-size", "80"}}), 1,
       "--n-shared-experts 2 cannot be used with --moe-shared-expert-intermediate-size 80 (as MindSpeed): give one of "
       "them"},
      {testing::join({kMoe, {"--n-shared-experts", "-2"}}), 1,
       "--n-shared-experts: expected a non-negative integer, found -2"},
      {{"--n-shared-experts", "1"}, 1, "--n-shared-experts needs --num-experts (a MoE model), found no --num-experts"},
      {{"--num-experts", "4", "--n-shared-experts", "1"}, 1, "expected --disable-bias-linear"},
  };
  for (const testing::FlagErrorCase& c : cases) testing::expect_one_line_error(c);
}

TEST(NSharedExperts, RegistryRowIsLevelZeroAndActiveOnlyForAPositiveCount) {
  for (const auto& [extra, active] : std::vector<std::pair<std::vector<std::string>, bool>>{
           {{}, false}, {{"--n-shared-experts", "0"}, false}, {{"--n-shared-experts", "2"}, true}}) {
    Cli c;
    auto registry = make_feature_registry();
    registry->register_args(c.parser);
    ASSERT_TRUE(c.parse_minimal(testing::join({kMoe, extra})).ok());
    FeatureContext ctx = make_feature_context(c.args, c.parser, *registry);
    std::vector<std::string> notices;
    ASSERT_TRUE(registry->resolve(ctx, &notices).ok());
    const Feature* f = registry->find("n-shared-experts");
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(f->level(), 0);
    EXPECT_EQ(registry->active("n-shared-experts"), active) << extra.size();
  }
}

// A tiny LLaMA-style MoE trained 3 steps with --n-shared-experts 2 and with the Megatron flag of
// the same size: the same parameter names, and bit-identical losses, grad norms and parameters.
TEST(NSharedExperts, TrainsAsTheExplicitMegatronFlag) {
  const std::vector<std::string> base = testing::join(
      {{"--num-layers", "2", "--hidden-size", "64", "--seq-length", "16", "--max-position-embeddings", "16",
        "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "3", "--lr", "2e-3", "--mock-data",
        "--make-vocab-size-divisible-by", "64", "--eval-iters", "0", "--ffn-hidden-size", "48"},
       testing::kTinyLlama,
       {"--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32", "--moe-shared-expert-gate"}});
  Comm self = make_self_communicator("world");
  testing::TestRun by_count(testing::join({base, {"--n-shared-experts", "2"}}), self, testing::kTinyVocab);
  testing::TestRun megatron(testing::join({base, {"--moe-shared-expert-intermediate-size", "96"}}), self,
                            testing::kTinyVocab);
  by_count.train(3);
  megatron.train(3);
  EXPECT_EQ(by_count.losses, megatron.losses);
  EXPECT_EQ(by_count.grad_norms, megatron.grad_norms);
  const ParamBuffer& a = by_count.model().params();
  const ParamBuffer& b = megatron.model().params();
  ASSERT_EQ(a.numel(), b.numel());
  ASSERT_EQ(a.specs().size(), b.specs().size());
  bool has_shared = false;
  for (size_t i = 0; i < a.specs().size(); ++i) {
    EXPECT_EQ(a.specs()[i].name, b.specs()[i].name);
    has_shared = has_shared || a.specs()[i].name.find("shared_experts") != std::string::npos;
  }
  EXPECT_TRUE(has_shared);
  EXPECT_EQ(0, std::memcmp(a.flat_params().data<float>(), b.flat_params().data<float>(),
                           static_cast<size_t>(a.numel()) * sizeof(float)));
}

}  // namespace
}  // namespace gale
