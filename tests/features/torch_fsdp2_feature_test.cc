// --use-torch-fsdp2 in the registry: implemented Megatron-module feature of level 2 (off below it,
// with a notice), and its conflicts named in one line.
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

TEST(TorchFsdp2Feature, ImplementedLevelTwoMegatronFeature) {
  ResolvedFeatures r({});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  const Feature* f = r.registry->find("torch-fsdp2");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->level(), 2);
  EXPECT_EQ(f->flag(), "--use-torch-fsdp2");
  EXPECT_EQ(f->module(), FeatureModule::kMegatron);
  EXPECT_FALSE(r.registry->active("torch-fsdp2"));
  ResolvedFeatures on({"--use-torch-fsdp2", "--untie-embeddings-and-output-weights"});
  ASSERT_TRUE(on.status.ok()) << on.status.to_string();
  EXPECT_TRUE(on.registry->active("torch-fsdp2"));
  ResolvedFeatures low({"--optimization-level", "1", "--use-torch-fsdp2", "--untie-embeddings-and-output-weights"});
  ASSERT_TRUE(low.status.ok()) << low.status.to_string();
  EXPECT_FALSE(low.registry->active("torch-fsdp2"));
  EXPECT_FALSE(low.notices.empty());
}

TEST(TorchFsdp2Feature, Conflicts) {
  const std::string untie = "--untie-embeddings-and-output-weights";
  struct Case {
    std::vector<std::string> argv;
    std::string expected;
  };
  for (const Case& c : std::vector<Case>{
           {{"--use-torch-fsdp2"}, "--use-torch-fsdp2 requires --untie-embeddings-and-output-weights"},
           {{"--use-torch-fsdp2", untie, "--use-distributed-optimizer"},
            "--use-torch-fsdp2 is not supported with --use-distributed-optimizer"},
           {{"--use-torch-fsdp2", untie, "--use-custom-fsdp"}, "--use-torch-fsdp2 and --use-custom-fsdp"},
           {{"--use-torch-fsdp2", untie, "--layerzero"}, "--use-torch-fsdp2 and --layerzero both shard the model"},
           {{"--use-torch-fsdp2", untie, "--fp16"}, "--use-torch-fsdp2 is not supported with --fp16"},
       }) {
    ResolvedFeatures r(c.argv);
    ASSERT_FALSE(r.status.ok()) << c.expected;
    EXPECT_NE(r.status.message().find(c.expected), std::string::npos) << r.status.message();
    EXPECT_EQ(r.status.message().find('\n'), std::string::npos) << r.status.message();
  }
}

}  // namespace
}  // namespace gale
