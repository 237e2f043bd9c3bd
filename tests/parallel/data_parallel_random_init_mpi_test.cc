// --data-parallel-random-init at DP 2 (train/data_parallel_random_init.h), what Megatron's
// pretrain_gpt.py shows: before any synchronisation each data-parallel rank holds its own draw
// (seed + 10·rank: rank 1's weights differ from rank 0's), the broadcast then gives every rank
// data-parallel rank 0's values, which are the values drawn without the flag, so training is
// bit-identical to the run without it (losses, gradient norms, every parameter after 3 steps),
// for a dense GPT with dropout and for a MoE model; at EP 2 each rank's experts (a one-rank
// expert-data group) keep that rank's own draw, as in Megatron.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "mpi_test_env.h"
#include "optim/optimizer_test_model.h"
#include "testing_checkpoint_run.h"
#include "train/data_parallel_random_init.h"

namespace gale {
namespace {

// Every rank's copy of `bits` (rank-major).
std::vector<uint32_t> gather(const Comm& world, const std::vector<uint32_t>& bits) {
  std::vector<uint32_t> all(bits.size() * static_cast<size_t>(world->size()));
  world->all_gather(bits.data(), all.data(), static_cast<int64_t>(bits.size()), DType::kI32);
  return all;
}

std::vector<uint32_t> slice(const std::vector<uint32_t>& all, size_t rank, size_t n) {
  return std::vector<uint32_t>(all.begin() + static_cast<std::ptrdiff_t>(rank * n),
                               all.begin() + static_cast<std::ptrdiff_t>((rank + 1) * n));
}

std::vector<uint32_t> bits_of(const ParamBuffer& pb) {
  const Tensor& p = pb.flat_params();
  std::vector<uint32_t> out(static_cast<size_t>(p.numel()));
  std::memcpy(out.data(), p.data<float>(), out.size() * sizeof(float));
  return out;
}

std::vector<std::string> dense_flags() { return testing::optimizer_test_model("3", "0.1"); }
std::vector<std::string> moe_flags() { return testing::tiny_mixtral_flags(4, "alltoall"); }

TEST(DataParallelRandomInit, RanksDrawTheirOwnValuesUntilTheBroadcast) {
  Comm world = test::world();
  if (world->size() != 2) GTEST_SKIP() << "DP 2";
  testing::TestRun run(dense_flags(), world, testing::kTinyVocab);
  ParamBuffer& pb = run.model().params();
  const std::vector<uint32_t> plain = bits_of(pb);  // drawn with --seed 1234 on every rank
  const int64_t dp_rank = run.engine->ps.coords().dp;
  EXPECT_EQ(data_parallel_init_seed(1234, dp_rank), 1234u + 10u * static_cast<uint64_t>(dp_rank));
  pb.initialize(data_parallel_init_seed(1234, dp_rank));
  const std::vector<uint32_t> drawn = bits_of(pb);
  const std::vector<uint32_t> all = gather(world, drawn);
  const size_t n = drawn.size();
  if (dp_rank == 0) {
    EXPECT_EQ(drawn, plain);  // rank 0's seed is --seed
  }
  // Rank 1 drew every randomly initialised weight afresh; constant-initialised norms and biases agree.
  int random_weights = 0;
  for (int id = 0; id < pb.size(); ++id) {
    const ParamSpec& s = pb.spec(id);
    const auto a = all.begin() + s.offset, b = all.begin() + static_cast<std::ptrdiff_t>(n) + s.offset;
    const bool same = std::equal(a, a + s.local_numel(), b);
    const bool random = s.name.find("weight") != std::string::npos && s.name.find("norm") == std::string::npos;
    if (random) {
      ++random_weights;
      EXPECT_FALSE(same) << s.name << ": data-parallel ranks 0 and 1 drew the same values";
    }
  }
  EXPECT_GE(random_weights, 6);
  broadcast_params_from_data_parallel_rank0(pb, run.engine->ps.dp_cp(), run.engine->ps.expert_dp());
  EXPECT_EQ(bits_of(pb), slice(all, 0, n));  // data-parallel rank 0's draw, on every rank
  EXPECT_EQ(bits_of(pb), plain);
}

// EP 2 at DP 2: each rank's expert-data group is itself, so its experts keep its own draw (rank 1:
// seed + 10), as Megatron's broadcast over a one-rank group leaves them; the dense parameters are
// broadcast over data×context and start as without the flag.
TEST(DataParallelRandomInit, ExpertsOfAOneRankExpertDataGroupKeepTheirDraw) {
  Comm world = test::world();
  if (world->size() != 2) GTEST_SKIP() << "DP 2 x EP 2";
  std::vector<std::string> flags = testing::join({moe_flags(), {"--expert-model-parallel-size", "2"}});
  testing::TestRun plain(flags, world, testing::kTinyVocab);
  testing::TestRun reseeded(testing::join({flags, {"--seed", "1244"}}), world, testing::kTinyVocab);
  flags.push_back("--data-parallel-random-init");
  testing::TestRun random(flags, world, testing::kTinyVocab);
  ASSERT_EQ(random.engine->ps.expert_dp()->size(), 1);
  const int64_t dp_rank = random.engine->ps.coords().dp;
  const ParamBuffer &r = random.model().params(), &p = plain.model().params(), &q = reseeded.model().params();
  int experts = 0;
  for (int id = 0; id < r.size(); ++id) {
    const ParamSpec& s = r.spec(id);
    const float *a = r.param_data(id), *b = p.param_data(id), *c = q.param_data(id);
    const size_t bytes = sizeof(float) * static_cast<size_t>(s.local_numel());
    if (s.expert_parallel) {
      ++experts;
      EXPECT_EQ(std::memcmp(a, dp_rank == 0 ? b : c, bytes), 0) << s.name << " on data-parallel rank " << dp_rank;
    } else {
      EXPECT_EQ(std::memcmp(a, b, bytes), 0) << s.name;
    }
  }
  EXPECT_GT(experts, 0);
}

class TrainsAsWithoutTheFlag : public ::testing::TestWithParam<bool> {};

TEST_P(TrainsAsWithoutTheFlag, BitIdentical) {
  Comm world = test::world();
  if (world->size() != 2) GTEST_SKIP() << "DP 2";
  const bool moe = GetParam();
  std::vector<std::string> flags = moe ? moe_flags() : dense_flags();
  testing::TestRun plain(flags, world, testing::kTinyVocab);
  flags.push_back("--data-parallel-random-init");
  testing::TestRun random(flags, world, testing::kTinyVocab);
  ASSERT_EQ(random.engine->ps.dp_size(), 2);
  const std::vector<uint32_t> start = testing::param_bits(random);
  const std::vector<uint32_t> all = gather(world, start);
  EXPECT_EQ(slice(all, 0, start.size()), slice(all, 1, start.size())) << "the ranks start from different values";
  EXPECT_EQ(start, testing::param_bits(plain));
  const int iterations = 3;
  EXPECT_EQ(random.train(iterations), plain.train(iterations));
  EXPECT_EQ(random.grad_norms, plain.grad_norms);
  EXPECT_EQ(testing::param_bits(random), testing::param_bits(plain));
}

INSTANTIATE_TEST_SUITE_P(DenseAndMoe, TrainsAsWithoutTheFlag, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "Moe" : "Dense"; });

}  // namespace
}  // namespace gale
