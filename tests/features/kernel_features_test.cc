// The fused-compute features: which kernels each optimisation level and flag installs, model
// requirements, and the `gale features` command.
#include <gtest/gtest.h>

#include "features/resolved_features.h"
#include "kernels/cpu/fused_geglu.h"
#include "kernels/cpu/fused_ops.h"
#include "subprocess.h"

namespace gale {
namespace {

const std::vector<std::string> kLlama = {"--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(KernelFeatures, LevelZeroIsThePlainReference) {
  ResolvedFeatures r(with(kLlama, {"--optimization-level", "0", "--use-flash-attn", "--use-fused-swiglu"}));
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  for (const auto& [op, impl] : r.ops.impl) EXPECT_EQ(impl, "reference") << op;
  EXPECT_EQ(r.notices.size(), 2u);
}

TEST(KernelFeatures, LevelOneInstallsTheAlwaysSafeRewrites) {
  ResolvedFeatures r({"--optimization-level", "1"});  // a GPT model: LayerNorm, GeLU, learned positions
  ASSERT_TRUE(r.status.ok());
  for (const char* op : {"norm", "bias_dropout_add_norm", "bias_dropout_add", "gelu", "embedding", "adamw"})
    EXPECT_EQ(r.impl(op).rfind("fused-", 0), 0u) << op << " is " << r.impl(op);
  EXPECT_EQ(r.impl("gemm"), "partitioned");
  for (const char* op : {"attention", "lm_head_loss", "swiglu", "rope"}) EXPECT_EQ(r.impl(op), "reference") << op;
}

TEST(KernelFeatures, LevelTwoFlagsAddTheirKernels) {
  ResolvedFeatures r(with(kLlama, {"--use-fused-rmsnorm", "--use-fused-swiglu", "--use-fused-rotary-pos-emb", "--use-flash-attn",
                           "--cross-entropy-loss-fusion"}));
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  for (const auto& [op, impl] : r.ops.impl)
    if (op != "gelu") {  // SwiGLU model: no GeLU
      EXPECT_EQ(impl, fused_kernel_name(op, detected_isa())) << op;
    }
  EXPECT_EQ(r.impl("gelu"), "reference");
  EXPECT_TRUE(r.notices.empty());
}

// MindSpeed's second flash-attention kernel (ALiBi's bias inside the kernel): Gale's flash kernels
// take ALiBi, so the flag installs them like --use-flash-attn, alone or with it, and says why not
// below level 2.
TEST(KernelFeatures, FusionAttentionV2InstallsTheFlashKernels) {
  const std::vector<std::string> alibi = {"--position-embedding-type", "alibi"};
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{"--use-fusion-attn-v2"}, std::vector<std::string>{"--use-fusion-attn-v2", "--use-flash-attn"}}) {
    ResolvedFeatures r(with(alibi, flags));
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_TRUE(r.registry->active("use-fusion-attn-v2"));
    EXPECT_EQ(r.impl("attention"), fused_kernel_name("attention", detected_isa()));
    EXPECT_TRUE(r.notices.empty());
  }
  ResolvedFeatures plain(alibi);
  EXPECT_EQ(plain.impl("attention"), "reference");
  ResolvedFeatures low(with(alibi, {"--optimization-level", "1", "--use-fusion-attn-v2"}));
  ASSERT_TRUE(low.status.ok());
  EXPECT_EQ(low.impl("attention"), "reference");
  ASSERT_EQ(low.notices.size(), 1u);
  EXPECT_NE(low.notices[0].find("--use-fusion-attn-v2 is not active: it needs --optimization-level 2 (given 1)"),
            std::string::npos)
      << low.notices[0];
}

TEST(KernelFeatures, MegatronSwitchOff) {
  ResolvedFeatures r({"--no-bias-gelu-fusion", "--no-bias-dropout-fusion"});
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.impl("gelu"), "reference");
  EXPECT_EQ(r.impl("bias_dropout_add"), "reference");
  EXPECT_FALSE(r.registry->active("bias-gelu-fusion"));
}

TEST(KernelFeatures, OpenaiGeluHasOnlyTheReferenceKernel) {
  ResolvedFeatures r({"--openai-gelu"});
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.ops.gelu_tanh_forward, reference_ops().gelu_tanh_forward);
  EXPECT_FALSE(r.registry->active("bias-gelu-fusion"));
}

// GeGLU (MindSpeed-LLM's --geglu / --gelu-tanh): the fused kernels come with --use-fused-swiglu at level 2
// (op group "geglu", resolved by geglu_kernels); bias-gelu-fusion does not apply; level 1 keeps the reference.
TEST(KernelFeatures, GegluIsFusedByUseFusedSwiglu) {
  for (const char* form : {"--geglu", "--gelu-tanh"}) {
    SCOPED_TRACE(form);
    ResolvedFeatures r({form, "--use-fused-swiglu"});
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_TRUE(r.registry->active("use-fused-swiglu"));
    EXPECT_FALSE(r.registry->active("bias-gelu-fusion"));
    EXPECT_EQ(r.impl("geglu"), fused_kernel_name("geglu", detected_isa()));
    EXPECT_EQ(geglu_kernels(r.ops).forward, fused_geglu_kernels(detected_isa())->forward);
    EXPECT_EQ(geglu_kernels(r.ops).backward, fused_geglu_kernels(detected_isa())->backward);
    ResolvedFeatures plain({form, "--optimization-level", "1"});
    ASSERT_TRUE(plain.status.ok());
    EXPECT_EQ(plain.impl("geglu"), "reference");
    EXPECT_EQ(geglu_kernels(plain.ops).forward, &geglu_forward_ref);
  }
}

TEST(KernelFeatures, SquaredReluHasOnlyTheReferenceKernel) {
  ResolvedFeatures r({"--squared-relu"});
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.ops.squared_relu_forward, reference_ops().squared_relu_forward);
  EXPECT_EQ(r.ops.squared_relu_backward, reference_ops().squared_relu_backward);
  EXPECT_FALSE(r.registry->active("bias-gelu-fusion"));
}

TEST(KernelFeatures, InterleavedRopeStaysOnTheReferenceKernel) {
  ResolvedFeatures r({"--position-embedding-type", "rope", "--rotary-interleaved", "--use-fused-rotary-pos-emb"});
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.impl("rope"), "reference");
  EXPECT_FALSE(r.registry->active("use-fused-rotary-pos-emb"));
  ASSERT_EQ(r.notices.size(), 1u);
  EXPECT_EQ(r.notices[0],
            "--use-fused-rotary-pos-emb is not active: --rotary-interleaved: the fused kernel rotates halves only");
  ResolvedFeatures plain({"--position-embedding-type", "rope", "--use-fused-rotary-pos-emb"});
  ASSERT_TRUE(plain.status.ok());
  EXPECT_TRUE(plain.registry->active("use-fused-rotary-pos-emb"));
}

TEST(KernelFeatures, PartitionedGemmSwitchOff) {
  ResolvedFeatures r({"--optimization-level", "1", "--no-partitioned-gemm"});
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.impl("gemm"), "reference");
  EXPECT_FALSE(r.registry->active("partitioned-gemm"));
  EXPECT_EQ(r.impl("gelu").rfind("fused-", 0), 0u);  // the other level-1 rewrites stay
}

TEST(KernelFeatures, RequirementsNameBothFlags) {
  EXPECT_EQ(ResolvedFeatures({"--use-fused-swiglu"}).status.message(),
            "--use-fused-swiglu requires --swiglu (or GeGLU: --geglu, --gelu-tanh)");
  EXPECT_EQ(ResolvedFeatures({"--use-fused-rmsnorm"}).status.message(), "--use-fused-rmsnorm requires --normalization RMSNorm");
  EXPECT_EQ(ResolvedFeatures({"--use-fused-rotary-pos-emb"}).status.message(),
            "--use-fused-rotary-pos-emb requires --position-embedding-type rope or yarn");
}

TEST(KernelFeatures, UnavailableIsaFallsBackAndSaysSo) {
  // GALE_MAX_ISA caps the ISA the kernels may use; the table reports what runs.
  setenv("GALE_MAX_ISA", "avx2", 1);
  ResolvedFeatures r({"--use-flash-attn"});
  unsetenv("GALE_MAX_ISA");
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.impl("attention"), "fused-avx2");
}

TEST(GaleFeaturesCommand, PrintsTheTableAndErrors) {
  auto ok = test::run_with_timeout({GALE_BINARY, "features", "--optimization-level", "1", "--use-flash-attn"}, {}, 60);
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("optimization level 1"), std::string::npos);
  EXPECT_NE(ok.output.find("--use-flash-attn"), std::string::npos);
  EXPECT_NE(ok.output.find("inactive: needs --optimization-level 2 (given 1)"), std::string::npos) << ok.output;
  EXPECT_NE(ok.output.find("note: --use-flash-attn is not active: it needs --optimization-level 2 (given 1)"),
            std::string::npos);
  EXPECT_NE(ok.output.find("fused-layer-norm"), std::string::npos);
  auto bad = test::run_with_timeout({GALE_BINARY, "features", "--use-fused-swiglu"}, {}, 60);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find("gale features: error: --use-fused-swiglu requires --swiglu"), std::string::npos);
}

}  // namespace
}  // namespace gale
