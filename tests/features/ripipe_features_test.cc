// The RiPipe features --recompute-in-advance and --recompute-in-bubble and
// --enable-recompute-layers-per-pp-rank: when they are active and the errors that name what
// they need (a command line validated as `gale pretrain` does, then resolved by the registry).
#include <gtest/gtest.h>

#include "features/registry.h"

namespace gale {
namespace {

struct Resolved {
  ArgParser parser{"gale pretrain", "test"};
  Arguments args;
  std::unique_ptr<FeatureRegistry> registry = make_feature_registry();
  std::vector<std::string> notices;
  Status status;

  // A 4-rank run of an 8-layer model with `flags`.
  explicit Resolved(std::vector<std::string> flags) {
    add_all_pretrain_args(parser, args);
    registry->register_args(parser);
    std::vector<std::string> argv = {"gale", "--num-layers", "8", "--hidden-size", "32", "--num-attention-heads", "4",
                                     "--seq-length", "8", "--max-position-embeddings", "8", "--micro-batch-size", "1",
                                     "--global-batch-size", "8", "--train-iters", "1", "--lr", "1e-3", "--mock-data",
                                     "--vocab-size", "128"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    storage_ = argv;
    std::vector<char*> ptrs;
    for (auto& a : storage_) ptrs.push_back(a.data());
    status = parser.parse(static_cast<int>(ptrs.size()), ptrs.data());
    if (!status.ok()) return;
    status = validate_all_pretrain_args(args, parser, 4);
    if (!status.ok()) return;
    FeatureContext ctx = make_feature_context(args, parser, *registry);
    status = registry->resolve(ctx, &notices);
  }

 private:
  std::vector<std::string> storage_;
};

const std::vector<std::string> kInterleaved = {"--pipeline-model-parallel-size", "4",
                                               "--num-layers-per-virtual-pipeline-stage", "1"};
std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
const std::vector<std::string> kBlock = {"--recompute-granularity", "full", "--recompute-method", "block",
                                         "--recompute-num-layers", "1"};

TEST(RiPipeFeatures, OffUnlessRequested) {
  Resolved r(kInterleaved);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  for (const char* f : {"recompute-in-advance", "recompute-in-bubble", "enable-recompute-layers-per-pp-rank"})
    EXPECT_FALSE(r.registry->active(f)) << f;
}

TEST(RiPipeFeatures, ActiveWithWhatTheyNeed) {
  Resolved advance(with(with(kInterleaved, kBlock), {"--recompute-in-advance", "--enable-recompute-layers-per-pp-rank"}));
  ASSERT_TRUE(advance.status.ok()) << advance.status.to_string();
  EXPECT_TRUE(advance.registry->active("recompute-in-advance"));
  EXPECT_TRUE(advance.registry->active("enable-recompute-layers-per-pp-rank"));
  Resolved bubble(with(kInterleaved, {"--recompute-in-bubble"}));
  ASSERT_TRUE(bubble.status.ok()) << bubble.status.to_string();
  EXPECT_TRUE(bubble.registry->active("recompute-in-bubble"));
}

TEST(RiPipeFeatures, ExclusiveOfEachOther) {
  Resolved r(with(with(kInterleaved, kBlock), {"--recompute-in-advance", "--recompute-in-bubble"}));
  ASSERT_FALSE(r.status.ok());
  EXPECT_EQ(r.status.message(),
            "--recompute-in-advance and --recompute-in-bubble are exclusive (as MindSpeed): advance speeds up full "
            "recomputation, bubble adds recomputation where there is none");
}

TEST(RiPipeFeatures, NeedTheInterleavedSchedule) {
  for (const char* flag : {"--recompute-in-advance", "--recompute-in-bubble"}) {
    std::vector<std::string> argv = {"--pipeline-model-parallel-size", "4", flag};
    if (std::string(flag) == "--recompute-in-advance") argv = with(argv, kBlock);
    Resolved r(argv);
    ASSERT_FALSE(r.status.ok()) << flag;
    EXPECT_EQ(r.status.message(),
              str_cat(flag, ": needs the interleaved pipeline schedule (--pipeline-model-parallel-size > 1 with "
                            "--num-layers-per-virtual-pipeline-stage or --num-virtual-stages-per-pipeline-rank, "
                            "without --schedules-method dualpipev), found pipeline size 4 with 1 virtual stage(s) "
                            "per rank"));
  }
  Resolved per_rank(with({"--pipeline-model-parallel-size", "4", "--enable-recompute-layers-per-pp-rank"}, kBlock));
  ASSERT_FALSE(per_rank.status.ok());
  EXPECT_EQ(per_rank.status.message(),
            "--enable-recompute-layers-per-pp-rank: needs --pipeline-model-parallel-size > 1 with virtual stages "
            "(--num-layers-per-virtual-pipeline-stage or --num-virtual-stages-per-pipeline-rank), found pipeline "
            "size 4 with 1 virtual stage(s) per rank");
}

TEST(RiPipeFeatures, AdvanceNeedsFullBlockRecompute) {
  Resolved none(with(kInterleaved, {"--recompute-in-advance"}));
  ASSERT_FALSE(none.status.ok());
  EXPECT_EQ(none.status.message(),
            "--recompute-in-advance: needs --recompute-granularity full --recompute-method block (as MindSpeed: it "
            "schedules those recomputes), found no --recompute-granularity");
  Resolved uniform(with(kInterleaved, {"--recompute-in-advance", "--recompute-granularity", "full",
                                       "--recompute-method", "uniform", "--recompute-num-layers", "1"}));
  ASSERT_FALSE(uniform.status.ok());
  EXPECT_EQ(uniform.status.message(),
            "--recompute-in-advance: needs --recompute-granularity full --recompute-method block (as MindSpeed: it "
            "schedules those recomputes), found --recompute-method uniform");
  Resolved selective(with(kInterleaved, {"--recompute-in-advance", "--recompute-granularity", "selective"}));
  ASSERT_FALSE(selective.status.ok());
  EXPECT_EQ(selective.status.message(),
            "--recompute-in-advance: needs --recompute-granularity full --recompute-method block (as MindSpeed: it "
            "schedules those recomputes), found --recompute-granularity selective");
}

TEST(RiPipeFeatures, BubbleRefusesConfiguredRecomputeAndSwapAttention) {
  Resolved full(with(with(kInterleaved, kBlock), {"--recompute-in-bubble"}));
  ASSERT_FALSE(full.status.ok());
  EXPECT_EQ(full.status.message(),
            "--recompute-in-bubble: conflicts with --recompute-granularity full (as MindSpeed: it adds recomputation "
            "to a run without any; --recompute-in-advance schedules full recomputation)");
  Resolved swap(with(kInterleaved, {"--recompute-in-bubble", "--swap-attention"}));
  ASSERT_FALSE(swap.status.ok());
  EXPECT_EQ(swap.status.message(), "--recompute-in-bubble: conflicts with --swap-attention (as MindSpeed)");
}

TEST(RiPipeFeatures, PerRankNeedsBlock) {
  Resolved r(with(kInterleaved, {"--enable-recompute-layers-per-pp-rank", "--recompute-granularity", "full",
                                 "--recompute-method", "uniform", "--recompute-num-layers", "1"}));
  ASSERT_FALSE(r.status.ok());
  EXPECT_EQ(r.status.message(),
            "--enable-recompute-layers-per-pp-rank: needs --recompute-granularity full --recompute-method block (its "
            "--recompute-num-layers is what it counts per rank; --swap-attention / --recompute-activation-function "
            "layer counts: not supported yet), found --recompute-method uniform");
}

TEST(RiPipeFeatures, MoeIsNotSupportedYet) {
  Resolved r(with(kInterleaved, {"--recompute-in-bubble", "--num-experts", "4"}));
  ASSERT_FALSE(r.status.ok());
  EXPECT_EQ(r.status.code(), StatusCode::kUnimplemented);
  EXPECT_EQ(r.status.message(), "--recompute-in-bubble with --num-experts: not supported yet");
}

TEST(RiPipeFeatures, SwappingActivationsIsNotSupportedYet) {
  Resolved advance(with(with(kInterleaved, kBlock), {"--recompute-in-advance", "--swap-attention"}));
  ASSERT_FALSE(advance.status.ok());
  EXPECT_EQ(advance.status.message(), "--recompute-in-advance with --swap-attention: not supported yet");
  Resolved bubble(with(kInterleaved, {"--recompute-in-bubble", "--swap-layer-input"}));
  ASSERT_FALSE(bubble.status.ok());
  EXPECT_EQ(bubble.status.message(), "--recompute-in-bubble with --swap-layer-input: not supported yet");
}

TEST(RiPipeFeatures, BelowLevelTwoNotActiveAndSaySo) {
  Resolved r(with(kInterleaved, {"--optimization-level", "1", "--recompute-in-bubble"}));
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_FALSE(r.registry->active("recompute-in-bubble"));
  ASSERT_EQ(r.notices.size(), 1u);
  EXPECT_EQ(r.notices[0], "--recompute-in-bubble is not active: it needs --optimization-level 2 (given 1)");
}

}  // namespace
}  // namespace gale
