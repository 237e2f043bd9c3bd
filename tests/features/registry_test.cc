// The features manager: level gating, flags, requirement errors, notices, reports and docs.
#include "features/registry.h"
#include "features/simple_feature.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

namespace gale {
namespace {

// A level-2 feature with its own flag that requires --swiglu, installing nothing.
class NeedsSwiglu : public Feature {
 public:
  std::string name() const override { return "test-needs-swiglu"; }
  std::string flag() const override { return "--test-needs-swiglu"; }
  FeatureModule module() const override { return FeatureModule::kFusedCompute; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "none"; }
  std::string description() const override { return "test"; }
  void register_args(ArgParser& p) override { p.add_flag(flag(), &on_, "test flag"); }
  bool requested(const FeatureContext&) const override { return on_; }
  Status validate(const FeatureContext& ctx) const override {
    if (!ctx.args->model.swiglu) return InvalidArgument("--test-needs-swiglu requires --swiglu");
    return Status::Ok();
  }
  Status apply(const FeatureContext&, EngineSetup& setup) const override {
    setup.ops->impl["test"] = "applied";
    return Status::Ok();
  }

 private:
  bool on_ = false;
};

// A level-1 feature, on unless --no-test-l1 is given.
class LevelOne : public Feature {
 public:
  std::string name() const override { return "test-l1"; }
  std::string flag() const override { return "--no-test-l1"; }
  FeatureModule module() const override { return FeatureModule::kFusedCompute; }
  int level() const override { return 1; }
  std::string counterpart() const override { return "none"; }
  std::string description() const override { return "test"; }
  void register_args(ArgParser& p) override { p.add_false(flag(), &on_, "switch off"); }
  bool requested(const FeatureContext&) const override { return on_; }
  std::string not_requested_reason(const FeatureContext&) const override { return "switched off by --no-test-l1"; }

 private:
  bool on_ = true;
};

struct Parsed {
  ArgParser parser{"test", "test"};
  Arguments args;
  FeatureRegistry registry;
  Status parse(std::vector<std::string> argv) {
    registry.add(std::make_unique<NeedsSwiglu>());
    registry.add(std::make_unique<LevelOne>());
    add_all_pretrain_args(parser, args);
    registry.register_args(parser);
    std::vector<char*> ptrs{const_cast<char*>("test")};
    for (auto& a : argv) ptrs.push_back(a.data());
    storage = std::move(argv);
    return parser.parse(static_cast<int>(ptrs.size()), ptrs.data());
  }
  std::vector<std::string> storage;
};

TEST(FeatureRegistry, LevelTwoNeedsFlagAndLevel) {
  Parsed p;
  ASSERT_TRUE(p.parse({"--swiglu", "--test-needs-swiglu"}).ok());
  FeatureContext ctx = make_feature_context(p.args, p.parser, p.registry);
  std::vector<std::string> notices;
  ASSERT_TRUE(p.registry.resolve(ctx, &notices).ok());
  EXPECT_TRUE(p.registry.active("test-needs-swiglu"));
  EXPECT_TRUE(p.registry.active("test-l1"));
  EXPECT_TRUE(notices.empty());
  OpTable ops = reference_ops();
  EngineSetup setup{&ops};
  ASSERT_TRUE(p.registry.apply(ctx, setup).ok());
  EXPECT_EQ(ops.impl["test"], "applied");
}

TEST(FeatureRegistry, RequestedButLevelTooLowIsANotice) {
  Parsed p;
  ASSERT_TRUE(p.parse({"--swiglu", "--test-needs-swiglu", "--optimization-level", "1"}).ok());
  FeatureContext ctx = make_feature_context(p.args, p.parser, p.registry);
  std::vector<std::string> notices;
  ASSERT_TRUE(p.registry.resolve(ctx, &notices).ok());
  EXPECT_FALSE(p.registry.active("test-needs-swiglu"));
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_EQ(notices[0], "--test-needs-swiglu is not active: it needs --optimization-level 2 (given 1)");
  EXPECT_TRUE(p.registry.active("test-l1"));
}

TEST(FeatureRegistry, LevelZeroTurnsOffLevelOne) {
  Parsed p;
  ASSERT_TRUE(p.parse({"--optimization-level", "0"}).ok());
  FeatureContext ctx = make_feature_context(p.args, p.parser, p.registry);
  std::vector<std::string> notices;
  ASSERT_TRUE(p.registry.resolve(ctx, &notices).ok());
  EXPECT_FALSE(p.registry.active("test-l1"));
  EXPECT_NE(p.registry.format_table().find("inactive: needs --optimization-level 1 (given 0)"), std::string::npos);
}

TEST(FeatureRegistry, SwitchedOffByMegatronStyleFlag) {
  Parsed p;
  ASSERT_TRUE(p.parse({"--no-test-l1"}).ok());
  FeatureContext ctx = make_feature_context(p.args, p.parser, p.registry);
  std::vector<std::string> notices;
  ASSERT_TRUE(p.registry.resolve(ctx, &notices).ok());
  EXPECT_FALSE(p.registry.active("test-l1"));
  EXPECT_NE(p.registry.format_table().find("inactive: switched off by --no-test-l1"), std::string::npos);
}

TEST(FeatureRegistry, MissingRequirementIsAnError) {
  Parsed p;
  ASSERT_TRUE(p.parse({"--test-needs-swiglu"}).ok());
  FeatureContext ctx = make_feature_context(p.args, p.parser, p.registry);
  std::vector<std::string> notices;
  Status st = p.registry.resolve(ctx, &notices);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "--test-needs-swiglu requires --swiglu");
}

TEST(FeatureRegistry, BadLevelIsAnError) {
  Parsed p;
  ASSERT_TRUE(p.parse({"--optimization-level", "3"}).ok());
  FeatureContext ctx = make_feature_context(p.args, p.parser, p.registry);
  std::vector<std::string> notices;
  EXPECT_EQ(p.registry.resolve(ctx, &notices).message(), "--optimization-level: expected 0, 1 or 2, found 3");
}

// Every MindSpeed feature of the inventory is implemented or not applicable; a feature added to
// the registry as planned (implemented, no reason it has no place) is refused, its sub-flags too.
TEST(FeatureRegistry, PlannedFeaturesAreRejected) {
  auto registry = make_feature_registry();
  for (const auto& f : registry->features()) EXPECT_NE(implementation_status(*f), "not supported yet") << f->name();
  SimpleFeatureSpec spec;
  spec.name = "planned-example";
  spec.flag = "--planned-example";
  spec.module = FeatureModule::kParallel;
  spec.level = 2;
  spec.counterpart = "MindSpeed PlannedExampleFeature (L2)";
  spec.description = "a feature Gale lists before it implements it";
  spec.implemented = false;
  spec.sub_flags = {"--planned-example-size"};
  registry->add(std::make_unique<SimpleFeature>(spec));
  EXPECT_EQ(implementation_status(*registry->find("planned-example")), "not supported yet");
  for (const char* flag : {"--planned-example", "--planned-example-size"}) {
    ArgParser parser("test", "test");
    Arguments args;
    add_all_pretrain_args(parser, args);
    registry->register_args(parser);
    const char* argv[] = {"test", flag};
    Status st = parser.parse(2, const_cast<char**>(argv));
    EXPECT_EQ(st.code(), StatusCode::kUnimplemented) << flag;
    EXPECT_NE(st.message().find(std::string(flag) + ": not supported yet (a feature Gale lists before it implements it"),
              std::string::npos)
        << st.message();
  }
}

// MindSpeed features for Ascend NPUs or PyTorch: listed, never active, their flags and sub-flags refused.
TEST(FeatureRegistry, AscendOnlyFeaturesAreListedAndRefused) {
  auto registry = make_feature_registry();
  const Feature* aiqos = registry->find("aiqos");
  ASSERT_NE(aiqos, nullptr);
  EXPECT_FALSE(aiqos->implemented());
  EXPECT_EQ(implementation_status(*aiqos), "not applicable (Ascend/PyTorch only)");
  EXPECT_EQ(implementation_status(*registry->find("use-flash-attn")), "implemented");
  EXPECT_NE(registry->format_markdown().find("| aiqos | `--aiqos` | communication | 2 | MindSpeed QosFeature (L2) | "
                                             "not applicable (Ascend/PyTorch only) |"),
            std::string::npos);
  for (const char* flag : {"--aiqos", "--aiqos-mode"}) {
    ArgParser parser("test", "test");
    Arguments args;
    add_all_pretrain_args(parser, args);
    auto r = make_feature_registry();
    r->register_args(parser);
    const char* argv[] = {"test", flag, "auto"};
    Status st = parser.parse(3, const_cast<char**>(argv));
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << flag;
    EXPECT_EQ(st.message().rfind(std::string(flag) + ": not available in Gale (it maps traffic to the virtual lanes", 0),
              0u)
        << st.message();
  }
}

TEST(FeatureRegistry, DocsAreGeneratedFromTheRegistry) {
  auto registry = make_feature_registry();
  std::ifstream f(std::string(GALE_TEST_DATA_DIR) + "/../../docs/features.md");
  ASSERT_TRUE(f.good()) << "docs/features.md is missing: run `gale features --markdown > docs/features.md`";
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_EQ(ss.str(), registry->format_markdown())
      << "docs/features.md is out of date: run `build/bin/gale features --markdown > docs/features.md`";
}

}  // namespace
}  // namespace gale
