// The context-parallel feature in the registry: active with --context-parallel-size > 1 at every
// optimization level (Megatron-core functionality), reported by `gale features`.
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

TEST(ContextParallelFeature, OffWithoutContextParallelism) {
  ResolvedFeatures r({});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_FALSE(r.registry->active("context-parallel-algo"));
  // Naming the default algorithm without CP changes nothing and is not an error.
  ResolvedFeatures named({"--context-parallel-algo", "megatron_cp_algo"});
  ASSERT_TRUE(named.status.ok()) << named.status.to_string();
  EXPECT_FALSE(named.registry->active("context-parallel-algo"));
  EXPECT_TRUE(named.notices.empty());
}

TEST(ContextParallelFeature, ActiveAtEveryLevel) {
  for (const char* level : {"0", "1", "2"}) {
    ResolvedFeatures r({"--optimization-level", level, "--context-parallel-size", "2"});
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_TRUE(r.registry->active("context-parallel-algo")) << "level " << level;
    EXPECT_TRUE(r.notices.empty());
  }
}

TEST(ContextParallelFeature, ListedAsImplementedLevelZeroParallelFeature) {
  ResolvedFeatures r({"--context-parallel-size", "4"});
  const Feature* f = r.registry->find("context-parallel-algo");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->level(), 0);
  EXPECT_EQ(f->module(), FeatureModule::kParallel);
  EXPECT_EQ(f->flag(), "--context-parallel-algo");
  const std::string table = r.registry->format_table();
  const size_t row = table.find("--context-parallel-algo");
  ASSERT_NE(row, std::string::npos) << table;
  const std::string line = table.substr(row, table.find('\n', row) - row);
  EXPECT_NE(line.find("active"), std::string::npos) << line;
  EXPECT_EQ(line.find("inactive"), std::string::npos) << line;
}

}  // namespace
}  // namespace gale
