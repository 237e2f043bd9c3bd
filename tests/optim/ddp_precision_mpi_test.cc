// Megatron's DDP precision flags and --create-all-gather-group in the data-parallel sync, under mpirun.
//
// --ddp-reduce-scatter-with-fp32-accumulation (DataParallelConfig::reduce_scatter_with_fp32_accumulation):
// every owned gradient is the f32 sum, in rank order, of the ranks' scaled (bf16) gradients, rounded
// once, bucket by bucket (uneven shards included), carried by an all-to-all of the bf16 bytes;
// without the distributed optimizer nothing changes. --ddp-param-name-patterns-for-fp32-local-
// accumulation (fp32_local_accumulation): those gradients accumulate over micro-batches in f32 and
// are rounded once, the others every micro-batch. --create-all-gather-group (all_gather_group): the
// parameter all-gathers run on the duplicate, bit-identical. End to end at DP2 (bf16 gradient
// reduction with the flag against the f32 reduction) and at DP1 (the patterns against an f32 run's
// gradients, bit for bit).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "mpi_test_env.h"
#include "optim/data_parallel_sync.h"
#include "optimizer_test_model.h"
#include "small_param_buffer.h"
#include "testing_checkpoint_run.h"
#include "train/ddp_precision.h"

namespace gale {
namespace {

float local_grad(int rank, int64_t i) {
  return (rank % 2 == 0 ? 1.0f : -0.37f) * (0.3f + 0.0173f * static_cast<float>(i)) + 1e-3f * static_cast<float>(rank);
}

float bf16_round(float x) { return bf16_to_float(float_to_bf16(x)); }

bool in_ranges(const std::vector<FlatRange>& ranges, int64_t i) {
  for (const FlatRange& r : ranges)
    if (r.begin <= i && i < r.end) return true;
  return false;
}

struct Reduced {
  std::vector<float> grads;
  std::vector<FlatRange> owned;
  CommStats stats;
};

Reduced reduce(const Comm& dp, bool sharded, bool bf16, bool fp32_acc) {
  ParamBuffer pb = testing::small_param_buffer();
  DataParallelConfig c;
  c.use_distributed_optimizer = sharded;
  c.bucket_size = 10;
  c.reduce_in_bf16 = bf16;
  c.reduce_scatter_with_fp32_accumulation = fp32_acc;
  DataParallelSync sync(&pb, dp, c);
  EXPECT_GT(sync.buckets().size(), 3u);
  sync.start_iteration(1);
  float* g = pb.flat_grads().data<float>();
  for (int64_t i = 0; i < pb.numel(); ++i) g[i] = local_grad(dp->rank(), i);
  dp->reset_stats();
  sync.finish_grad_sync();
  return {std::vector<float>(g, g + pb.numel()), sync.owned_ranges(), dp->stats()};
}

TEST(DdpPrecision, Fp32AccumulationReduceScatterIsTheRankOrderedF32Sum) {
  Comm dp = test::world();
  const int n = dp->size();
  const float scale = 1.0f / static_cast<float>(n);
  for (bool bf16 : {true, false}) {
    const Reduced plain = reduce(dp, true, bf16, false), acc = reduce(dp, true, bf16, true);
    EXPECT_EQ(acc.stats.calls[static_cast<int>(CommOp::kReduceScatter)], 0);
    EXPECT_EQ(acc.stats.bytes[static_cast<int>(CommOp::kAllToAll)],
              plain.stats.bytes[static_cast<int>(CommOp::kReduceScatter)])
        << "the same bytes as the " << (bf16 ? "bf16" : "f32") << " reduce-scatter";
    int64_t checked = 0;
    for (int64_t i = 0; i < static_cast<int64_t>(acc.grads.size()); ++i) {
      if (!in_ranges(acc.owned, i)) continue;
      float sum = 0.0f;  // f32, rank 0 first
      for (int r = 0; r < n; ++r) {
        const float addend = scale * local_grad(r, i);
        sum += bf16 ? bf16_round(addend) : addend;
      }
      ASSERT_EQ(acc.grads[static_cast<size_t>(i)], bf16 ? bf16_round(sum) : sum) << "element " << i;
      // With 2 ranks the sum has one addition: the plain reduce-scatter agrees bit for bit.
      if (n == 2) {
        ASSERT_EQ(acc.grads[static_cast<size_t>(i)], plain.grads[static_cast<size_t>(i)]);
      }
      ++checked;
    }
    EXPECT_EQ(dp->all_reduce_scalar(checked), static_cast<int64_t>(acc.grads.size())) << "every element owned once";
  }
}

// Without the distributed optimizer Megatron all-reduces: the flag changes nothing.
TEST(DdpPrecision, Fp32AccumulationLeavesTheAllReduceAlone) {
  Comm dp = test::world();
  const Reduced plain = reduce(dp, false, true, false), acc = reduce(dp, false, true, true);
  EXPECT_EQ(acc.stats.calls[static_cast<int>(CommOp::kAllToAll)], 0);
  EXPECT_EQ(acc.stats.calls, plain.stats.calls);
  EXPECT_EQ(0, std::memcmp(acc.grads.data(), plain.grads.data(), acc.grads.size() * sizeof(float)));
}

// With --overlap-grad-reduce the buckets start as their parameters complete and finish in finish_grad_sync.
TEST(DdpPrecision, Fp32AccumulationWithOverlappedBuckets) {
  Comm dp = test::world();
  ParamBuffer pb[2] = {testing::small_param_buffer(), testing::small_param_buffer()};
  for (int k = 0; k < 2; ++k) {
    DataParallelConfig c;
    c.use_distributed_optimizer = true;
    c.overlap_grad_reduce = true;
    c.bucket_size = 10;
    c.reduce_in_bf16 = true;
    c.reduce_scatter_with_fp32_accumulation = k == 1;
    DataParallelSync sync(&pb[k], dp, c);
    sync.start_iteration(1);
    float* g = pb[k].flat_grads().data<float>();
    for (int64_t i = 0; i < pb[k].numel(); ++i) g[i] = local_grad(dp->rank(), i);
    for (int id = pb[k].size(); id-- > 0;) sync.on_grads_ready({id});  // backward order: every bucket launched
    sync.finish_grad_sync();
    if (k == 0) continue;
    const int n = dp->size();
    for (int64_t i = 0; i < pb[k].numel(); ++i) {
      if (!in_ranges(sync.owned_ranges(), i)) continue;
      float sum = 0.0f;
      for (int r = 0; r < n; ++r) sum += bf16_round(local_grad(r, i) / static_cast<float>(n));
      ASSERT_EQ(g[i], bf16_round(sum)) << "element " << i;
    }
  }
}

// Three micro-batches, bf16 gradient buffer: p1 and p3 accumulate in f32 and are rounded once, before
// the bucket's scaling (Megatron copies main_grad into the bf16 buffer, then scales it there): with a
// factor of 0.3 (DataParallelConfig::grad_scale) bf16(bf16(sum)·0.3), not bf16(sum·0.3).
TEST(DdpPrecision, Fp32LocalAccumulationRoundsOnceBeforeTheReduction) {
  for (double scale : {0.0, 0.3}) {
    ParamBuffer pb = testing::small_param_buffer();
    const std::vector<int> promoted = fp32_local_accumulation_params(pb, {"p1", "p[3]"});
    ASSERT_EQ(promoted, (std::vector<int>{1, 3}));
    DataParallelConfig c;
    c.reduce_in_bf16 = true;
    c.fp32_local_accumulation = promoted;
    c.grad_scale = scale;
    DataParallelSync sync(&pb, make_self_communicator("dp"), c);
    sync.start_iteration(3);
    float* g = pb.flat_grads().data<float>();
    std::vector<int> all;
    for (int id = 0; id < pb.size(); ++id) all.push_back(id);
    for (int mb = 0; mb < 3; ++mb) {
      for (int64_t i = 0; i < pb.numel(); ++i) g[i] += local_grad(mb, i);
      sync.round_grads_to_bf16(all);
    }
    sync.finish_grad_sync();
    const float factor = scale > 0.0 ? static_cast<float>(scale) : 1.0f;
    int64_t differ = 0, differ_scaling = 0;
    for (int id = 0; id < pb.size(); ++id) {
      const ParamSpec& s = pb.spec(id);
      const bool f32 = id == 1 || id == 3;
      for (int64_t i = s.offset; i < s.offset + s.local_numel(); ++i) {
        const float fp32_sum = local_grad(0, i) + local_grad(1, i) + local_grad(2, i);
        const float rounded_each =
            bf16_round(bf16_round(bf16_round(local_grad(0, i)) + local_grad(1, i)) + local_grad(2, i));
        const float expected = bf16_round((f32 ? bf16_round(fp32_sum) : rounded_each) * factor);
        ASSERT_EQ(g[i], expected) << s.name << " element " << i << " scale " << scale;
        differ += f32 && bf16_round(fp32_sum) != rounded_each;
        differ_scaling += f32 && expected != bf16_round(fp32_sum * factor);
      }
    }
    EXPECT_GT(differ, 0) << "the inputs must tell the two accumulations apart";
    if (scale > 0.0) EXPECT_GT(differ_scaling, 0) << "and rounding before the scaling from rounding after it";
  }
}

TEST(DdpPrecision, PatternsAreFnmatchOnParameterNamesWithAll) {
  EXPECT_TRUE(fnmatch_name("decoder.layers.0.mlp.linear_fc1.weight", "*.mlp.*"));
  EXPECT_TRUE(fnmatch_name("decoder.layers.0.mlp.linear_fc1.weight", "decoder.layers.?.mlp.linear_fc[12].weight"));
  EXPECT_FALSE(fnmatch_name("decoder.layers.0.mlp.linear_fc1.weight", "decoder.layers.[!0].*"));
  EXPECT_FALSE(fnmatch_name("embedding.word_embeddings.weight", "*.bias"));
  EXPECT_TRUE(fnmatch_name("a\\b", "a\\b")) << "a backslash is an ordinary character, as in Python";
  ParamBuffer pb = testing::small_param_buffer();
  EXPECT_EQ(fp32_local_accumulation_params(pb, {"all"}).size(), 6u);
  EXPECT_EQ(fp32_local_accumulation_params(pb, {"x*", "p5"}), (std::vector<int>{5}));
  std::vector<std::string> matched;  // the first pattern each matched, in Megatron's order
  EXPECT_EQ(fp32_local_accumulation_params(pb, {"p[24]", "all"}, &matched), (std::vector<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(matched, (std::vector<std::string>{"all", "all", "p[24]", "all", "p[24]", "all"}));
  EXPECT_TRUE(fp32_local_accumulation_params(pb, {}).empty());
}

// The parameter all-gathers go to the duplicate communicator, with the same bits.
TEST(DdpPrecision, AllGatherGroupCarriesTheParameterAllGathers) {
  Comm dp = test::world();
  for (bool overlap : {false, true}) {
    std::vector<float> gathered[2];
    for (int k = 0; k < 2; ++k) {
      ParamBuffer pb = testing::small_param_buffer();
      DataParallelConfig c;
      c.use_distributed_optimizer = true;
      c.overlap_param_gather = overlap;
      c.bucket_size = 10;
      if (k == 1) c.all_gather_group = dp->make_group(dp->world_ranks(), "dp-ag");
      DataParallelSync sync(&pb, dp, c);
      if (k == 1) {
        EXPECT_NE(sync.param_gather_group().get(), sync.group().get());
        EXPECT_EQ(sync.param_gather_group()->world_ranks(), sync.group()->world_ranks());
      } else {
        EXPECT_EQ(sync.param_gather_group().get(), sync.group().get());
      }
      float* p = pb.flat_params().data<float>();
      for (const FlatRange& r : sync.owned_ranges())
        for (int64_t i = r.begin; i < r.end; ++i) p[i] = static_cast<float>(dp->rank() * 1000 + i);
      dp->reset_stats();
      if (k == 1) c.all_gather_group->reset_stats();
      sync.after_optimizer_step();
      sync.finish_param_sync();
      const int64_t buckets = static_cast<int64_t>(sync.buckets().size());
      if (k == 1) {
        EXPECT_EQ(dp->stats().calls[static_cast<int>(CommOp::kAllGather)], 0) << "overlap " << overlap;
        EXPECT_EQ(c.all_gather_group->stats().calls[static_cast<int>(CommOp::kAllGather)], buckets);
      } else {
        EXPECT_EQ(dp->stats().calls[static_cast<int>(CommOp::kAllGather)], buckets);
      }
      gathered[k].assign(p, p + pb.numel());
    }
    EXPECT_EQ(0, std::memcmp(gathered[0].data(), gathered[1].data(), gathered[0].size() * sizeof(float)));
  }
}

// ---- end to end ----

std::vector<std::string> model_flags(const std::vector<std::string>& extra) {
  // optimizer_test_model without gradient clipping, which would rescale the gradient buffer.
  std::vector<std::string> f = {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "8",
                                "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size", "2",
                                "--global-batch-size", "8", "--train-iters", "12", "--lr", "5e-3",
                                "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data",
                                "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.0",
                                "--attention-dropout", "0.0", "--eval-iters", "0", "--log-interval", "1000",
                                "--clip-grad", "0.0", "--weight-decay", "0.1", "--bf16"};
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

struct DdpRun : testing::CheckpointRun {
  DdpRun(const Comm& world, const std::vector<std::string>& flags)
      : CheckpointRun(model_flags(flags), world, testing::kTinyVocab, EngineOptions{20000, {}}) {}
  const float* grads() const { return engine->chunks[0]->params().flat_grads().data<float>(); }
  int64_t numel() const { return engine->chunks[0]->params().trainable_numel(); }
};

double worst_relative(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]) / b[i]);
  return worst;
}

// DP2, distributed optimizer, 10 iterations: bf16 reduction with fp32 accumulation against the f32
// reduction within 1e-2 (the bf16 rounding of every gradient); against the plain bf16 reduce-scatter
// bit for bit (two addends: one f32 addition and one rounding either way).
TEST(DdpPrecision, TrainsAtDp2WithinToleranceOfTheF32Reduction) {
  Comm world = test::world();
  if (world->size() != 2) GTEST_SKIP() << "needs DP2";
  DdpRun f32(world, {"--use-distributed-optimizer"});
  DdpRun plain(world, {"--use-distributed-optimizer", "--grad-reduce-in-bf16"});
  DdpRun acc(world, {"--use-distributed-optimizer", "--grad-reduce-in-bf16", "--ddp-reduce-scatter-with-fp32-accumulation",
                  "--create-all-gather-group", "--overlap-grad-reduce", "--overlap-param-gather"});
  ASSERT_TRUE(acc.engine->dp_sync[0]->config().reduce_scatter_with_fp32_accumulation);
  ASSERT_NE(acc.engine->dp_sync[0]->param_gather_group().get(), acc.engine->dp_sync[0]->group().get());
  const std::vector<double> a = f32.train(10), b = plain.train(10), c = acc.train(10);
  const double worst = worst_relative(c, a);
  if (world->rank() == 0)
    std::printf("--ddp-reduce-scatter-with-fp32-accumulation DP2 vs f32 reduction: worst relative loss difference %.3g\n",
                worst);
  EXPECT_LT(worst, 1e-2);
  EXPECT_GT(worst, 0.0);
  EXPECT_EQ(b, c);
  EXPECT_EQ(testing::param_bits(plain), testing::param_bits(acc));
}

// DP4 with EP2 (expert-dp 2): both syncs gather on their duplicates (the dense one over dp-cp, the
// expert one over expert-dp), and the run is the one without the flag bit for bit.
TEST(DdpPrecision, AllGatherGroupsWithExpertParallelismAreBitIdentical) {
  Comm world = test::world();
  if (world->size() != 4) GTEST_SKIP() << "needs DP4 with EP2";
  const std::vector<std::string> flags = testing::join(
      {testing::tiny_mixtral_flags(4, "alltoall"),
       {"--expert-model-parallel-size", "2", "--use-distributed-optimizer", "--overlap-param-gather",
        "--overlap-grad-reduce", "--train-iters", "4"}});
  testing::CheckpointRun plain(flags, world, testing::kTinyVocab);
  testing::CheckpointRun ag(testing::join({flags, {"--create-all-gather-group"}}), world, testing::kTinyVocab);
  ASSERT_EQ(ag.engine->ps.expert_dp()->size(), 2);
  for (const auto* syncs : {&ag.engine->dp_sync, &ag.engine->expert_dp_sync}) {
    ASSERT_FALSE(syncs->empty());
    const DataParallelSync& s = *syncs->front();
    EXPECT_NE(s.param_gather_group().get(), s.group().get());
    EXPECT_EQ(s.param_gather_group()->world_ranks(), s.group()->world_ranks());
  }
  EXPECT_EQ(plain.engine->dp_sync[0]->param_gather_group().get(), plain.engine->dp_sync[0]->group().get());
  EXPECT_EQ(plain.train(3), ag.train(3));
  EXPECT_EQ(testing::param_bits(plain), testing::param_bits(ag));
  const Comm& edp_ag = ag.engine->expert_dp_sync[0]->param_gather_group();
  EXPECT_GT(edp_ag->stats().calls[static_cast<int>(CommOp::kAllGather)], 0) << "the expert all-gathers ran there";
  EXPECT_EQ(ag.engine->ps.expert_dp()->stats().calls[static_cast<int>(CommOp::kAllGather)],
            plain.engine->ps.expert_dp()->stats().calls[static_cast<int>(CommOp::kAllGather)] -
                edp_ag->stats().calls[static_cast<int>(CommOp::kAllGather)])
      << "and not on the expert-dp group";
}

// One process, 4 micro-batches: with 'all' every gradient is the bf16 rounding of the f32 run's
// accumulated gradient, bit for bit; with a pattern only the matched parameters are, the others are
// those of the run without patterns (rounded every micro-batch), which differ somewhere.
TEST(DdpPrecision, PatternsGiveTheF32RunsLocalAccumulation) {
  if (test::world()->rank() != 0) GTEST_SKIP() << "one process: rank 0 runs it";
  Comm self = make_self_communicator("world");
  DdpRun f32(self, {});
  DdpRun each(self, {"--grad-reduce-in-bf16"});
  DdpRun all(self, {"--grad-reduce-in-bf16", "--ddp-param-name-patterns-for-fp32-local-accumulation", "all"});
  DdpRun fc1(self, {"--grad-reduce-in-bf16", "--ddp-param-name-patterns-for-fp32-local-accumulation", "*.linear_fc1.weight",
                 "decoder.final_layernorm.*"});
  f32.train(1);
  each.train(1);
  all.train(1);
  fc1.train(1);
  const ParamBuffer& pb = fc1.engine->chunks[0]->params();
  int64_t differ = 0, matched = 0;
  for (int id = 0; id < pb.size(); ++id) {
    const ParamSpec& s = pb.spec(id);
    if (!s.trainable) continue;
    const bool promoted = fnmatch_name(s.name, "*.linear_fc1.weight") || fnmatch_name(s.name, "decoder.final_layernorm.*");
    matched += promoted;
    for (int64_t i = s.offset; i < s.offset + s.local_numel(); ++i) {
      const float once = bf16_round(f32.grads()[i]);
      ASSERT_EQ(all.grads()[i], once) << s.name << " element " << i;
      ASSERT_EQ(fc1.grads()[i], promoted ? once : each.grads()[i]) << s.name << " element " << i;
      differ += once != each.grads()[i];
    }
  }
  EXPECT_EQ(matched, 4) << "two fc1 weights, the final layernorm's weight and bias";
  EXPECT_GT(differ, 0) << "rounding every micro-batch must differ somewhere";
}

}  // namespace
}  // namespace gale
