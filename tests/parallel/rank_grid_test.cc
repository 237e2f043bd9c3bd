// Rank layout: Megatron's worked examples (docs/parallelism.md, shared/reference/megatron.md §6)
// exactly, every group kind of many layouts against a brute-force definition, and the errors.
#include "parallel/rank_grid.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

namespace gale {
namespace {

RankLayout layout_of(int world, int tp, int pp, int cp = 1, int ep = 1, int etp = 0, bool tp_pp_dp = false) {
  ParallelSizes s;
  s.world_size = world, s.tp = tp, s.pp = pp, s.cp = cp, s.ep = ep, s.etp = etp, s.use_tp_pp_dp_mapping = tp_pp_dp;
  StatusOr<RankLayout> l = compute_rank_layout(s);
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  return l.value();
}

TEST(RankGrid, WorkedExampleEightRanksTp2Pp2) {
  RankLayout l = layout_of(8, 2, 2);
  EXPECT_EQ(l.dp, 2);
  EXPECT_EQ(l.order, "tp-cp-ep-dp-pp");
  EXPECT_EQ(l.formula, "tp + 2*dp + 4*pp");
  const int expect_tdp[8][3] = {{0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {1, 1, 0}, {0, 0, 1}, {1, 0, 1}, {0, 1, 1}, {1, 1, 1}};
  for (int r = 0; r < 8; ++r) {
    RankCoords c = l.coords(r);
    EXPECT_EQ(c.tp, expect_tdp[r][0]) << r;
    EXPECT_EQ(c.dp, expect_tdp[r][1]) << r;
    EXPECT_EQ(c.pp, expect_tdp[r][2]) << r;
    EXPECT_EQ(c.cp, 0);
  }
  EXPECT_EQ(l.of(Group::kTensor), (RankGroups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(l.of(Group::kData), (RankGroups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(l.of(Group::kDataContext), l.of(Group::kData));
  EXPECT_EQ(l.of(Group::kPipeline), (RankGroups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(l.of(Group::kEmbedding), l.of(Group::kPipeline));
  EXPECT_EQ(l.of(Group::kPositionEmbedding), (RankGroups{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(l.of(Group::kModel), (RankGroups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(l.of(Group::kTensorData), (RankGroups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(l.of(Group::kTensorDataContext), l.of(Group::kTensorData));
  EXPECT_EQ(l.of(Group::kTensorContext), l.of(Group::kTensor));
  EXPECT_EQ(l.of(Group::kContext), (RankGroups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  // Without MoE the expert generator equals the dense one (ETP = TP, EP = 1).
  EXPECT_EQ(l.of(Group::kExpertTensor), l.of(Group::kTensor));
  EXPECT_EQ(l.of(Group::kExpertData), l.of(Group::kData));
  EXPECT_EQ(l.group_of(Group::kData, 5), (std::vector<int>{5, 7}));
}

TEST(RankGrid, WorkedExampleWithExperts) {
  RankLayout l = layout_of(8, 2, 2, 1, /*ep=*/2, /*etp=*/1);
  EXPECT_EQ(l.expert_dp, 2);
  EXPECT_EQ(l.of(Group::kExpert), (RankGroups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(l.of(Group::kExpertData), (RankGroups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(l.of(Group::kExpertTensor), (RankGroups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(l.of(Group::kExpertTensorExpert), l.of(Group::kExpert));
  EXPECT_EQ(l.of(Group::kExpertTensorExpertPipeline), (RankGroups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(l.coords(5).ep, 1);
  EXPECT_EQ(l.coords(5).edp, 0);
}

// The docstring of Megatron's initialize_model_parallel: 16 GPUs, TP 2, PP 4.
TEST(RankGrid, MegatronDocstringSixteenRanks) {
  RankLayout l = layout_of(16, 2, 4);
  EXPECT_EQ(l.dp, 2);
  EXPECT_EQ(l.of(Group::kData), (RankGroups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(l.of(Group::kTensor), (RankGroups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(l.of(Group::kPipeline), (RankGroups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(l.of(Group::kEmbedding), (RankGroups{{0, 12}, {1, 13}, {2, 14}, {3, 15}}));
  EXPECT_EQ(l.of(Group::kPositionEmbedding), (RankGroups{{0}, {1}, {2}, {3}}));
  EXPECT_TRUE(l.group_of(Group::kEmbedding, 4).empty());  // a middle stage
}

TEST(RankGrid, TpPpDpMappingPutsPipelineInsideData) {
  RankLayout l = layout_of(8, 2, 2, 1, 1, 0, /*tp_pp_dp=*/true);
  EXPECT_EQ(l.order, "tp-cp-ep-pp-dp");
  EXPECT_EQ(l.formula, "tp + 2*pp + 4*dp");
  EXPECT_EQ(l.of(Group::kPipeline), (RankGroups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(l.of(Group::kData), (RankGroups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(l.of(Group::kModel), (RankGroups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
}

TEST(RankGrid, ContextParallelGroups) {
  RankLayout l = layout_of(8, 2, 1, /*cp=*/2);
  EXPECT_EQ(l.formula, "tp + 2*cp + 4*dp");
  EXPECT_EQ(l.of(Group::kContext), (RankGroups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(l.of(Group::kData), (RankGroups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(l.of(Group::kDataContext), (RankGroups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(l.of(Group::kTensorContext), (RankGroups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(l.of(Group::kTensorDataContext), (RankGroups{{0, 1, 2, 3, 4, 5, 6, 7}}));
}

// Brute force from the definition: coordinates from the mixed-radix formula, a group of dims X is
// the ranks agreeing outside X, ordered by their X coordinates (first dimension fastest), and
// groups ordered by their outside coordinates (first dimension fastest).
RankGroups brute_force(const std::vector<std::pair<std::string, int>>& order, const std::set<std::string>& x) {
  int world = 1;
  for (auto& d : order) world *= d.second;
  auto coords = [&](int r) {
    std::map<std::string, int> c;
    for (auto& d : order) {
      c[d.first] = r % d.second;
      r /= d.second;
    }
    return c;
  };
  auto key = [&](int r, bool inside) {  // mixed-radix index over the chosen dimensions, first fastest
    int k = 0, mult = 1;
    auto c = coords(r);
    for (auto& d : order) {
      if (x.count(d.first) != static_cast<size_t>(inside)) continue;
      k += c[d.first] * mult;
      mult *= d.second;
    }
    return k;
  };
  std::map<int, std::vector<std::pair<int, int>>> by_outside;
  for (int r = 0; r < world; ++r) by_outside[key(r, false)].push_back({key(r, true), r});
  RankGroups out;
  for (auto& [k, members] : by_outside) {
    std::sort(members.begin(), members.end());
    out.emplace_back();
    for (auto& m : members) out.back().push_back(m.second);
  }
  return out;
}

TEST(RankGrid, EveryGroupKindMatchesTheDefinitionOnManyLayouts) {
  struct Case {
    int world, tp, pp, cp, ep, etp;
    bool tp_pp_dp;
  };
  const Case cases[] = {{1, 1, 1, 1, 1, 0, false},  {2, 2, 1, 1, 1, 0, false},  {4, 1, 4, 1, 1, 0, false},
                        {8, 2, 2, 1, 1, 0, false},  {8, 4, 1, 1, 1, 0, false},  {8, 1, 2, 1, 1, 0, true},
                        {12, 2, 3, 1, 1, 0, false}, {16, 2, 2, 2, 1, 0, false}, {16, 2, 2, 1, 4, 1, false},
                        {16, 2, 2, 1, 2, 2, false}, {24, 2, 3, 1, 1, 0, true},  {32, 4, 2, 1, 2, 2, true}};
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "world " << c.world << " tp " << c.tp << " pp " << c.pp << " cp " << c.cp
                                      << " ep " << c.ep << " etp " << c.etp << (c.tp_pp_dp ? " tp-pp-dp" : ""));
    RankLayout l = layout_of(c.world, c.tp, c.pp, c.cp, c.ep, c.etp, c.tp_pp_dp);
    int dp = c.world / (c.tp * c.pp * c.cp);
    int etp = c.etp ? c.etp : c.tp;
    int edp = c.world / (etp * c.ep * c.pp);
    std::vector<std::pair<std::string, int>> dense = {{"tp", c.tp}, {"cp", c.cp}, {"dp", dp}, {"pp", c.pp}};
    std::vector<std::pair<std::string, int>> expert = {{"tp", etp}, {"ep", c.ep}, {"dp", edp}, {"pp", c.pp}};
    if (c.tp_pp_dp) {
      std::swap(dense[2], dense[3]);
      std::swap(expert[2], expert[3]);
    }
    EXPECT_EQ(l.of(Group::kTensor), brute_force(dense, {"tp"}));
    EXPECT_EQ(l.of(Group::kPipeline), brute_force(dense, {"pp"}));
    EXPECT_EQ(l.of(Group::kData), brute_force(dense, {"dp"}));
    EXPECT_EQ(l.of(Group::kContext), brute_force(dense, {"cp"}));
    EXPECT_EQ(l.of(Group::kDataContext), brute_force(dense, {"dp", "cp"}));
    EXPECT_EQ(l.of(Group::kModel), brute_force(dense, {"tp", "pp"}));
    EXPECT_EQ(l.of(Group::kTensorDataContext), brute_force(dense, {"tp", "dp", "cp"}));
    EXPECT_EQ(l.of(Group::kTensorData), brute_force(dense, {"tp", "dp"}));
    EXPECT_EQ(l.of(Group::kTensorContext), brute_force(dense, {"tp", "cp"}));
    EXPECT_EQ(l.of(Group::kExpert), brute_force(expert, {"ep"}));
    EXPECT_EQ(l.of(Group::kExpertTensor), brute_force(expert, {"tp"}));
    EXPECT_EQ(l.of(Group::kExpertTensorExpert), brute_force(expert, {"tp", "ep"}));
    EXPECT_EQ(l.of(Group::kExpertTensorExpertPipeline), brute_force(expert, {"tp", "ep", "pp"}));
    EXPECT_EQ(l.of(Group::kExpertData), brute_force(expert, {"dp"}));
    // Embedding groups: first and last stage of each pipeline group.
    const RankGroups& pp = l.of(Group::kPipeline);
    ASSERT_EQ(l.of(Group::kEmbedding).size(), pp.size());
    for (size_t i = 0; i < pp.size(); ++i) {
      std::vector<int> e = {pp[i].front()};
      if (pp[i].size() > 1) e.push_back(pp[i].back());
      EXPECT_EQ(l.of(Group::kEmbedding)[i], e);
      EXPECT_EQ(l.of(Group::kPositionEmbedding)[i], std::vector<int>{pp[i].front()});
    }
    // Coordinates agree with the group positions.
    for (int r = 0; r < c.world; ++r) {
      RankCoords rc = l.coords(r);
      auto pos = [&](Group g) {
        std::vector<int> m = l.group_of(g, r);
        return static_cast<int>(std::find(m.begin(), m.end(), r) - m.begin());
      };
      EXPECT_EQ(rc.tp, pos(Group::kTensor));
      EXPECT_EQ(rc.pp, pos(Group::kPipeline));
      EXPECT_EQ(rc.dp, pos(Group::kData));
      EXPECT_EQ(rc.cp, pos(Group::kContext));
      EXPECT_EQ(rc.ep, pos(Group::kExpert));
      EXPECT_EQ(rc.edp, pos(Group::kExpertData));
      EXPECT_EQ(rc.etp, pos(Group::kExpertTensor));
    }
  }
}

TEST(RankGrid, RankGeneratorOrderRules) {
  StatusOr<RankGenerator> g = RankGenerator::create(2, 1, 2, 2, 1, "tp-dp-pp");
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->order(), "tp-dp-pp-cp-ep");  // size-1 dimensions appended
  EXPECT_EQ(g->get_ranks("dp-tp"), g->get_ranks("tp-dp"));
  EXPECT_EQ(g->coordinate(6, "pp"), 1);
  auto message = [](const StatusOr<RankGenerator>& r) { return r.ok() ? std::string("ok") : r.status().message(); };
  EXPECT_EQ(message(RankGenerator::create(2, 1, 2, 2, 1, "tp-dp")),
            "rank order 'tp-dp' leaves out pp, whose size is 2");
  EXPECT_EQ(message(RankGenerator::create(2, 1, 2, 2, 1, "tp-xx-pp")),
            "rank order 'tp-xx-pp': unknown dimension 'xx' (expected tp, cp, ep, dp, pp)");
  EXPECT_EQ(message(RankGenerator::create(2, 1, 2, 2, 1, "tp-dp-tp")),
            "rank order 'tp-dp-tp': dimension 'tp' appears twice");
  EXPECT_EQ(message(RankGenerator::create(1, 2, 1, 1, 2, "tp-cp-ep-dp-pp")),
            "rank layout: expert parallelism (2) and context parallelism (2) cannot both be > 1 in one rank generator");
}

TEST(RankGrid, LayoutErrorsNameTheFlags) {
  auto message = [](int world, int tp, int pp, int cp = 1, int ep = 1, int etp = 0, bool tp_pp_dp = false) {
    ParallelSizes s;
    s.world_size = world, s.tp = tp, s.pp = pp, s.cp = cp, s.ep = ep, s.etp = etp, s.use_tp_pp_dp_mapping = tp_pp_dp;
    StatusOr<RankLayout> l = compute_rank_layout(s);
    return l.ok() ? std::string("ok") : l.status().message();
  };
  EXPECT_EQ(message(6, 4, 1),
            "world size 6 is not divisible by --tensor-model-parallel-size 4 x --pipeline-model-parallel-size 1 x "
            "--context-parallel-size 1 = 4");
  EXPECT_EQ(message(8, 2, 0), "--pipeline-model-parallel-size: expected a positive integer, found 0");
  EXPECT_EQ(message(8, 2, 2, 1, 3),
            "world size 8 is not divisible by --expert-tensor-parallel-size 2 x --expert-model-parallel-size 3 x "
            "--pipeline-model-parallel-size 2 = 12");
  EXPECT_EQ(message(16, 2, 2, 1, 2, 2, true),
            "--use-tp-pp-dp-mapping with --pipeline-model-parallel-size 2 needs the same data-parallel size for dense "
            "and expert layers (4 vs 2)");
  EXPECT_EQ(message(8, 2, 2, 1, 2, 2, true),
            "--use-tp-pp-dp-mapping with --pipeline-model-parallel-size 2 needs the same data-parallel size for dense "
            "and expert layers (2 vs 1)");
}

TEST(RankGrid, RenderedLayoutIsReadable) {
  std::string text = render_rank_layout(layout_of(8, 2, 2));
  EXPECT_NE(
      text.find("parallel layout: world 8 = TP 2 x CP 1 x DP 2 x PP 2, order tp-cp-ep-dp-pp: rank = tp + 2*dp + 4*pp"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("  rank    tp   cp   dp   pp\n"), std::string::npos) << text;
  EXPECT_NE(text.find("     5     1    0    0    1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  tp                  [0,1] [2,3] [4,5] [6,7]\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  embedding           [0,4] [1,5] [2,6] [3,7]\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("expert"), std::string::npos) << "expert groups shown without MoE:\n" << text;
  EXPECT_EQ(text.find("dp-cp"), std::string::npos) << "CP groups shown with CP = 1:\n" << text;
  std::string big = render_rank_layout(layout_of(128, 2, 4), 4);
  EXPECT_NE(big.find("... (124 more ranks)"), std::string::npos) << big;
  EXPECT_NE(big.find("... (64 groups)"), std::string::npos) << big;
  std::string moe = render_rank_layout(layout_of(8, 2, 2, 1, 2, 1));
  EXPECT_NE(moe.find("(experts: ETP 1 x EP 2 x EDP 2 x PP 2)"), std::string::npos) << moe;
  EXPECT_NE(moe.find("  expert-ep           [0,1] [2,3] [4,5] [6,7]\n"), std::string::npos) << moe;
}

}  // namespace
}  // namespace gale
