// --balanced-moe-experts against the same run without it, on a skewed router (sigmoid scores with
// a fixed expert bias favouring two experts): at EP = world (2 or 4, 8 experts, top-2, alltoall,
// N = 2 hot experts on M = 2 transfer groups) and under DualPipeV with --moe-fb-overlap at PP2 ×
// EP2 × DP2 (4 ranks); at EP = world also under --bf16 and full recomputation, and EP 2 × expert-DP
// 2 with the distributed optimizer on 4 ranks. Hot experts must really be replicated and their rows must stay local: on the
// first step (identical parameters, so identical routing) every rank sends exactly the rows it
// computed with a replica fewer through the all-to-all, twice (forward inputs, backward output
// gradients), and the busiest rank's expert rows drop. Each row's output and input gradient are the
// same products of the same weights, but a hot expert's weight gradient is summed in other groups
// (the owner's rows, then each other rank's replica gradient) and its rows meet other GEMM row
// counts, so the comparison is within a tolerance, not bitwise: losses and gradient norms within
// 1e-6 relative, gradients and parameters of 4 steps within 1e-5 (measured: under 3.4e-7; without
// the replicas' gradients returned to the owners a parameter is off by 3.3e-3 after 4 steps).
#include <gtest/gtest.h>

#include <cmath>

#include "core/interleave.h"
#include "features/resolved_features.h"
#include "model/moe_dispatch.h"
#include "mpi_test_env.h"
#include "testing_run.h"

namespace gale {
namespace {

const std::vector<std::string> kCommon = testing::join(
    {{"--num-layers", "4", "--hidden-size", "64", "--seq-length", "16", "--max-position-embeddings", "16",
      "--micro-batch-size", "2", "--global-batch-size", "16", "--train-iters", "8", "--lr", "2e-3",
      "--lr-warmup-iters", "1", "--mock-data", "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1",
      "--eval-iters", "0", "--log-interval", "1000"},
     testing::kTinyLlama,
     {"--num-experts", "8", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "48", "--moe-aux-loss-coeff", "0.01",
      "--moe-token-dispatcher-type", "alltoall", "--moe-grouped-gemm", "--moe-router-score-function", "sigmoid",
      "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate", "0"}});

const std::vector<std::string> kBalanced = {"--balanced-moe-experts", "--balanced-moe-hot-expert-num", "2",
                                            "--trans-hot-expert-group-num", "2"};

std::unique_ptr<testing::TestRun> make_run(const std::vector<std::string>& flags, const std::vector<std::string>& features) {
  ResolvedFeatures r(testing::join({flags, features}));
  GALE_CHECK_OK(r.status);
  return std::make_unique<testing::TestRun>(flags, test::world(), testing::kTinyVocab, EngineOptions{0, r.recompute},
                                            r.ops);
}

// The skewed router: every MoE layer's expert bias favours experts 0 and, less, 1 (both on EP rank 0).
void skew_router(testing::TestRun& run) {
  for (size_t c = 0; c < run.engine->chunks.size(); ++c) {
    const ParamBuffer& pb = run.engine->chunks[c]->params();
    for (int id = 0; id < pb.size(); ++id)
      if (pb.spec(id).name.find("router.expert_bias") != std::string::npos) {
        pb.param_data(id)[0] = 0.3f;
        pb.param_data(id)[1] = 0.15f;
      }
  }
}

double relative_error(const float* a, const float* b, int64_t n) {
  double diff = 0.0, norm = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// Losses, gradient norms, every parameter and gradient of this rank (same layout, same ids).
// Returns how many expert parameters were compared. `bf16`: the experts' rows meet bf16 GEMMs in
// a different grouping (the replicas' rows apart), so each product rounds differently: 5e-5 on
// the losses and gradient norms and 5e-3 on the gradients (bf16's own step is 7.8e-3; measured on
// an AVX2 CPU without native bf16 dot products, 4 ranks: 1.4e-5 and 1.9e-3), 1e-6 / 1e-5 in f32.
int expect_close(const testing::TestRun& run, const testing::TestRun& ref, bool bf16 = false) {
  const double scalar_tol = bf16 ? 5e-5 : 1e-6, tensor_tol = bf16 ? 5e-3 : 1e-5;
  EXPECT_EQ(run.losses.size(), ref.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_NEAR(run.losses[i], ref.losses[i], scalar_tol * ref.losses[i]) << "loss of iteration " << i + 1;
    EXPECT_NEAR(run.grad_norms[i], ref.grad_norms[i], scalar_tol * ref.grad_norms[i])
        << "grad norm of iteration " << i + 1;
  }
  int experts = 0;
  for (size_t c = 0; c < ref.engine->chunks.size(); ++c) {
    const ParamBuffer& pb = run.engine->chunks[c]->params();
    const ParamBuffer& rb = ref.engine->chunks[c]->params();
    EXPECT_EQ(pb.size(), rb.size());
    for (int id = 0; id < pb.size() && id < rb.size(); ++id) {
      const ParamSpec& s = pb.spec(id);
      if (!s.trainable) continue;
      experts += s.expert_parallel;
      EXPECT_LT(relative_error(pb.param_data(id), rb.param_data(id), s.local_numel()), tensor_tol) << "parameter " << s.name;
      EXPECT_LT(relative_error(pb.grad_data(id), rb.grad_data(id), s.local_numel()), tensor_tol) << "gradient " << s.name;
    }
  }
  return experts;
}

struct Counted {
  long long sent = 0, hot = 0, replicas = 0, max_rows = 0;
};

// One training step of `run` with the dispatcher's counters reset first.
Counted counted_step(testing::TestRun& run) {
  MoeDispatchCounters& k = moe_dispatch_counters();
  k.reset();
  run.train(1);
  return {k.rows_sent_to_other_ranks.load(), k.hot_rows_computed_locally.load(), k.replicas.load(),
          k.max_expert_rows.load()};
}

// `recomputed`: every forward ran twice (full recomputation), so the hot rows were counted twice
// and dispatched three times (forward, recomputed forward, backward) in the plain run.
void expect_rows_stayed_local(const Counted& plain, const Counted& balanced, bool recomputed = false) {
  EXPECT_EQ(plain.hot, 0);
  EXPECT_EQ(plain.replicas, 0);
  // the forward inputs and the backward output gradients of the hot rows stayed here
  if (recomputed)
    EXPECT_EQ(2 * balanced.sent + 3 * balanced.hot, 2 * plain.sent) << "rows through the all-to-all";
  else
    EXPECT_EQ(balanced.sent + 2 * balanced.hot, plain.sent) << "rows through the all-to-all";
  const Comm& world = test::world();
  // (the owner of the hot experts, EP rank 0, holds no replica)
  const int64_t replicas = world->all_reduce_scalar(static_cast<int64_t>(balanced.replicas), ReduceOp::kSum);
  EXPECT_GT(replicas, 0) << "no hot expert was replicated";
  const int64_t hot_anywhere = world->all_reduce_scalar(static_cast<int64_t>(balanced.hot), ReduceOp::kSum);
  EXPECT_GT(hot_anywhere, 0) << "no rows were computed with a replica";
  const int64_t busiest_plain = world->all_reduce_scalar(static_cast<int64_t>(plain.max_rows), ReduceOp::kMax);
  const int64_t busiest = world->all_reduce_scalar(static_cast<int64_t>(balanced.max_rows), ReduceOp::kMax);
  EXPECT_LT(busiest, busiest_plain) << "the busiest rank's expert rows";
}

// EP = world: fp32, --bf16 (the replicas carry the owners' bf16 GEMM copies) and full recomputation
// (the forward reruns in backward, choosing and broadcasting the same hot experts again), a shared
// expert with --moe-alltoall-overlap-comm (the shared expert, the replicas and the exchanges
// overlapped in both directions), LoRA on the experts (f32 and --bf16: the replicas carry the
// adapters, whose gradients go back to the owners; only the adapters compared); on 4
// ranks also EP 2 × expert-DP 2 with the distributed optimizer (the owners' gradients, replicas'
// included, reduce-scattered over expert-DP).
class BalancedMoe : public ::testing::TestWithParam<std::string> {};

TEST_P(BalancedMoe, SameTrainingAsWithoutAndHotRowsStayLocal) {
  const Comm& world = test::world();
  if (world->size() != 2 && world->size() != 4) GTEST_SKIP() << "needs 2 or 4 ranks";
  std::vector<std::string> extra;
  int64_t ep = world->size();
  if (GetParam() == "ep2_expert_dp2_distopt") {  // 4 ranks: EP 2 × expert-DP 2, the distributed optimizer
    if (world->size() != 4) GTEST_SKIP() << "needs 4 ranks";
    ep = 2;
    extra = {"--use-distributed-optimizer"};
  }
  std::vector<std::string> features;  // for both runs
  if (GetParam() == "shared_expert_alltoall_overlap") {
    extra = {"--moe-shared-expert-intermediate-size", "32", "--moe-permutation-async-comm"};
    features = {"--moe-alltoall-overlap-comm"};
  }
  if (GetParam() == "bf16") extra = {"--bf16"};
  // LoRA on the experts: the replicas carry the adapters, their gradients go back to the owners
  const std::vector<std::string> lora = {"--lora-r", "4", "--lora-alpha", "8", "--lora-target-modules", "linear_fc1",
                                         "linear_fc2"};
  if (GetParam() == "lora") extra = lora;
  if (GetParam() == "lora_bf16") extra = testing::join({lora, {"--bf16"}});
  if (GetParam() == "recompute_full")
    extra = {"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"};
  const std::vector<std::string> flags =
      testing::join({kCommon, {"--expert-model-parallel-size", std::to_string(ep)}, extra});
  auto plain = make_run(flags, features);
  auto balanced = make_run(flags, testing::join({kBalanced, features}));
  EXPECT_EQ(balanced->engine->ops.moe_alltoall_overlap, !features.empty());
  skew_router(*plain);
  skew_router(*balanced);
  const Counted p = counted_step(*plain), b = counted_step(*balanced);
  expect_rows_stayed_local(p, b, GetParam() == "recompute_full");
  plain->train(3);
  balanced->train(3);
  EXPECT_GT(expect_close(*balanced, *plain, GetParam() == "bf16" || GetParam() == "lora_bf16"), 0)
      << "no expert among the compared parameters";
}

INSTANTIATE_TEST_SUITE_P(Ep, BalancedMoe, ::testing::Values("fp32", "bf16", "recompute_full", "shared_expert_alltoall_overlap",
                                                             "ep2_expert_dp2_distopt", "lora", "lora_bf16"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// DualPipeV with --moe-fb-overlap (PP2 × EP2 × DP2): the replicas' broadcasts, backward and
// gradient transfers run inside the interleaved pairs.
TEST(BalancedMoeMpi, UnderDualPipeVWithFbOverlap) {
  const Comm& world = test::world();
  if (world->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const std::vector<std::string> flags =
      testing::join({kCommon, {"--pipeline-model-parallel-size", "2", "--expert-model-parallel-size", "2",
                               "--schedules-method", "dualpipev"}});
  auto plain = make_run(flags, {"--moe-fb-overlap"});
  auto balanced = make_run(flags, testing::join({kBalanced, {"--moe-fb-overlap"}}));
  ASSERT_TRUE(plain->engine->ops.moe_fb_overlap);
  ASSERT_TRUE(balanced->engine->ops.moe_fb_overlap);
  skew_router(*plain);
  skew_router(*balanced);
  const Counted p = counted_step(*plain);
  const long long before = interleave_switches();
  const Counted b = counted_step(*balanced);
  EXPECT_GT(interleave_switches(), before) << "no pair was interleaved";
  expect_rows_stayed_local(p, b);
  plain->train(3);
  balanced->train(3);
  EXPECT_GT(expect_close(*balanced, *plain), 0) << "no expert among the compared parameters";
}

}  // namespace
}  // namespace gale
