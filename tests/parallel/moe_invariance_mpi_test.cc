// Parallel invariance of mixture-of-experts models: data parallelism (experts replicated, their
// gradients reduced like any other), expert parallelism (--expert-model-parallel-size: each rank
// holds E/EP experts, tokens exchanged all-to-all, expert gradients reduced over expert-DP),
// pipeline parallelism (1F1B and interleaved), tensor parallelism with sequence parallelism (experts
// split over the expert-TP group, or whole with --expert-tensor-parallel-size 1, also with EP and
// as MindSpeed's --moe-tp-extend-ep), context parallelism (ring and Ulysses; also with EP), the distributed
// optimizer, full and selective recomputation (--recompute-modules moe, moe_act, mlp) and the input
// jitter (--moe-input-jitter-eps) reproduce the single-process run: losses, grad norms, the logged load-balancing loss, final
// parameters and gradients (fp32, 1e-5 relative, gradients 3e-5; under EP an expert sums its rows
// in another order, (source rank, token) instead of token order, and padded to capacity its GEMMs
// have other row counts, for which oneDNN's AVX2 kernel blocks the K-sum differently: 1.24e-5 was
// measured there, against under 1e-5 with its AVX-512 kernels. A missing reduction is O(1)).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "layouts.h"
#include "mpi_test_env.h"
#include "testing_run.h"
#include "train/grad_sync.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"dp2", 2, {}},
      {"pp2", 2, {"--pipeline-model-parallel-size", "2"}},
      {"pp2_vpp2", 2, {"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"}},
      {"dp2_distopt_overlap", 2, {"--use-distributed-optimizer", "--overlap-grad-reduce"}, 20000},
      {"pp2_full_recompute", 2, {"--pipeline-model-parallel-size", "2", "--recompute-granularity", "full",
                                 "--recompute-method", "uniform", "--recompute-num-layers", "1"}},
      {"pp2_dp2", 4, {"--pipeline-model-parallel-size", "2"}},
      {"dp4", 4, {}},
      // Expert parallelism: EP 2 with DP 2 (expert-DP 1), EP 2 with DP 4 (expert-DP 2) with and
      // without the distributed optimizer (expert shards over expert-DP, buckets overlapped with
      // backward), and EP 2 with PP 2 (each stage its own EP groups), all-to-all dispatch.
      {"ep2", 2, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"}},
      {"ep2_dp4", 4, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"}},
      {"ep2_dp4_overlap", 4, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall",
                              "--overlap-grad-reduce"}, 20000},
      {"ep2_dp4_distopt_overlap", 4, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall",
                                      "--use-distributed-optimizer", "--overlap-grad-reduce",
                                      "--overlap-param-gather"}, 20000},
      {"ep2_pp2", 4, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall",
                      "--pipeline-model-parallel-size", "2"}},
      // Interleaved 1F1B and full recomputation (the MoE layers' forward, with its exchange, rerun in
      // backward on both EP ranks alike).
      {"ep2_pp2_vpp2", 4, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall",
                           "--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"}},
      {"ep2_full_recompute", 2, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall",
                                 "--recompute-granularity", "full", "--recompute-method", "uniform",
                                 "--recompute-num-layers", "1"}},
      // Megatron's default all-gather dispatcher: the same run.
      {"ep2_allgather", 2, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "allgather"}},
      {"ep2_dp4_allgather_distopt", 4, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type",
                                        "allgather", "--use-distributed-optimizer"}},
      // Tensor parallelism with sequence parallelism: each TP rank routes its S/TP tokens, the experts
      // split over the expert-TP group (= TP), the aux losses over the TP group's whole sequence.
      {"tp2_sp", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"tp2_sp_dp2", 4, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"tp2_sp_dp2_distopt", 4, {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                 "--use-distributed-optimizer"}},
      // Context parallelism: each CP rank routes the tokens of its sequence chunks; the aux losses
      // over the tp-cp group; router and expert gradients reduced over DP×CP like the dense ones.
      {"cp2", 2, {"--context-parallel-size", "2"}},
      {"cp2_dp2", 4, {"--context-parallel-size", "2"}},
      {"tp2_sp_cp2", 4, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--context-parallel-size", "2"}},
      // --expert-tensor-parallel-size 1: whole experts on every TP rank, each on its own tokens,
      // their gradients all-reduced over TP.
      {"tp2_sp_etp1", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-tensor-parallel-size", "1"}},
      {"tp2_sp_etp1_dp2", 4, {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                              "--expert-tensor-parallel-size", "1"}},
      {"tp2_sp_ep2", 4, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-model-parallel-size", "2",
                         "--moe-token-dispatcher-type", "alltoall"}},
      {"tp2_sp_ep2_allgather", 4, {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                   "--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "allgather"}},
      {"cp2_ulysses", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "ulysses_cp_algo"}},
      // --expert-tensor-parallel-size 1 with EP under TP (Megatron's DeepSeek layout): the expert
      // generator rank = ep + 2·edp, so each EP group is a TP pair exchanging its SP slices, whole
      // experts, expert gradients reduced over expert-DP only (not over TP).
      {"tp2_sp_etp1_ep2", 4, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-tensor-parallel-size",
                              "1", "--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"}},
      {"tp2_sp_etp1_ep2_allgather", 4, {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                        "--expert-tensor-parallel-size", "1", "--expert-model-parallel-size", "2",
                                        "--moe-token-dispatcher-type", "allgather"}},
      {"tp2_sp_etp1_ep2_distopt_overlap", 4, {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                              "--expert-tensor-parallel-size", "1", "--expert-model-parallel-size", "2",
                                              "--moe-token-dispatcher-type", "alltoall", "--use-distributed-optimizer",
                                              "--overlap-grad-reduce"}, 20000},
      // MindSpeed's --moe-tp-extend-ep: the same layout from TP 2 and EP 1 (experts over the TP pair).
      {"tp2_sp_tp_extend_ep", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--moe-tp-extend-ep",
                                  "--moe-permutation-async-comm", "--moe-grouped-gemm", "--moe-token-dispatcher-type",
                                  "alltoall"}},
      // EP with CP: CP folded into the expert grid (expert generator cp = 1): the EP group is the
      // CP pair exchanging its chunks' tokens; expert gradients scaled by 1/DP, not 1/(DP·CP).
      {"cp2_ep2", 2, {"--context-parallel-size", "2", "--expert-model-parallel-size", "2",
                      "--moe-token-dispatcher-type", "alltoall"}},
      {"cp2_ep2_allgather", 2, {"--context-parallel-size", "2", "--expert-model-parallel-size", "2",
                                "--moe-token-dispatcher-type", "allgather"}},
      {"cp2_ep2_dp2_distopt", 4, {"--context-parallel-size", "2", "--expert-model-parallel-size", "2",
                                  "--moe-token-dispatcher-type", "alltoall", "--use-distributed-optimizer"}},
      // Megatron's selective recomputation of the MoE layers (their forward, with its exchange, rerun
      // in backward; the aux losses counted once), the experts' activations and the dense MLP.
      {"ep2_recompute_moe", 2, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall",
                                "--recompute-granularity", "selective", "--recompute-modules", "moe", "mlp",
                                "moe_act", "--moe-grouped-gemm"}},
      {"tp2_sp_recompute_modules", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                       "--recompute-granularity", "selective", "--recompute-modules", "mlp",
                                       "moe_act", "layernorm", "--moe-grouped-gemm"}},
  };
  return all;
}

// A tiny Mixtral with one dense layer: 4 layers, layers 0, 1 and 3 with 4 SwiGLU experts, top-2,
// load-balancing and z losses on; dropout on (its masks are layout-independent).
const std::vector<std::string> kMoe = testing::join(
    {{"--num-layers", "4", "--hidden-size", "64", "--seq-length", "16", "--max-position-embeddings", "16",
      "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "5", "--lr", "2e-3",
      "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data", "--make-vocab-size-divisible-by", "64",
      "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters", "0", "--log-interval", "1000",
      "--clip-grad", "0.5"},
     testing::kTinyLlama,
     {"--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "48", "--moe-layer-freq", "[1,1,0,1]",
      "--moe-aux-loss-coeff", "0.1", "--moe-z-loss-coeff", "0.01"}});

// The same model with linear biases (no --disable-bias-linear): the router's bias (Megatron's
// mlp.router.bias, gpt-oss's) and the experts' biases at the layouts that split the router's tokens.
std::vector<std::string> biased(std::vector<std::string> flags) {
  flags.erase(std::find(flags.begin(), flags.end(), "--disable-bias-linear"));
  return flags;
}
const std::vector<std::string> kBiasedMoe = biased(kMoe);
const std::vector<std::string> kBiasedLayouts = {"dp2", "ep2", "tp2_sp", "cp2", "tp2_sp_ep2"};

// DeepSeek-V3-style routing on the same model: 8 experts, top-3 of sigmoid scores plus an expert
// bias (updated fast enough to change the routing within the run), limited to the 2 best of 4
// groups, weights scaled by 2.5, the per-sequence load-balancing loss.
const std::vector<std::string> kDeepSeekRouting = testing::join(
    {std::vector<std::string>(kMoe.begin(), kMoe.end() - 12),
     {"--num-experts", "8", "--moe-router-topk", "3", "--moe-ffn-hidden-size", "48", "--moe-layer-freq", "[1,1,0,1]",
      "--moe-aux-loss-coeff", "0.1", "--moe-z-loss-coeff", "0.01", "--moe-router-load-balancing-type", "seq_aux_loss",
      "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate",
      "0.05", "--moe-router-num-groups", "4", "--moe-router-group-topk", "2", "--moe-router-topk-scaling-factor",
      "2.5"}});

// Token dropping (capacity 0.5: a quarter of the pairs or more dropped) with the default routing.
// The capacity counts a rank's own tokens of a micro-batch (Megatron), so only layouts that keep
// whole micro-batches per rank (DP, EP, PP) reproduce the single-process run; under TP×SP or CP
// each rank drops within its slice of the sequence.
const std::vector<std::string> kDropping =
    testing::join({kMoe, {"--moe-expert-capacity-factor", "0.5", "--moe-token-drop-policy", "probs"}});

// Capacity 1 (the mean load: busy experts drop, idle ones are padded) with every expert's input
// padded to its capacity (weight-0 rows).
const std::vector<std::string> kDroppingPadded = testing::join(
    {kMoe, {"--moe-expert-capacity-factor", "1.0", "--moe-pad-expert-input-to-capacity"}});

// --moe-input-jitter-eps: the noise of a token is keyed by its global id, so every layout draws it
// alike (under TP×SP, CP and EP each rank jitters only its own tokens).
const std::vector<std::string> kJitter = testing::join({kMoe, {"--moe-input-jitter-eps", "0.1"}});
const std::vector<std::string> kJitterLayouts = {"dp2",   "pp2",    "ep2",         "ep2_allgather", "tp2_sp",
                                                 "cp2",   "cp2_ulysses", "tp2_sp_ep2", "tp2_sp_cp2",
                                                 "ep2_full_recompute", "ep2_recompute_moe"};

const std::vector<std::string> kRoutingLayouts = {"dp2",     "pp2",        "pp2_vpp2",   "ep2",
                                                  "ep2_allgather", "ep2_full_recompute", "tp2_sp", "cp2",
                                                  "dp2_distopt_overlap", "ep2_dp4", "ep2_dp4_distopt_overlap",
                                                  "tp2_sp_ep2", "tp2_sp_cp2", "ep2_pp2", "tp2_sp_etp1_ep2",
                                                  "tp2_sp_tp_extend_ep", "cp2_ep2", "cp2_ep2_dp2_distopt"};
const std::vector<std::string> kDroppingLayouts = {"dp2", "pp2", "ep2", "ep2_allgather", "ep2_dp4_distopt_overlap"};

const testing::TestRun& single_process_run(const std::vector<std::string>& flags) {
  static std::map<std::vector<std::string>, std::unique_ptr<testing::TestRun>> runs;
  std::unique_ptr<testing::TestRun>& run = runs[flags];
  if (!run) {
    run = std::make_unique<testing::TestRun>(flags, make_self_communicator("world"), testing::kTinyVocab);
    run->train(5);
  }
  return *run;
}

// Runs `layout` on `base` and compares it with the single-process run; `comm_bytes`: also the EP
// group's traffic (default routing only).
void expect_matches_single_process(const std::vector<std::string>& base, const std::string& name, bool comm_bytes) {
  const Layout* layout = testing::find_layout(layouts(), name);
  ASSERT_NE(layout, nullptr);
  Comm world = test::world();
  if (layout->world != world->size()) GTEST_SKIP() << name << " needs " << layout->world << " ranks";
  const testing::TestRun& reference = single_process_run(base);
  testing::TestRun run(testing::join({base, layout->flags}), world, testing::kTinyVocab,
                       EngineOptions{layout->bucket_size, layout->recompute});
  run.train(5);
  finish_param_sync(*run.engine);
  for (int i = 0; i < 5; ++i) {
    EXPECT_NEAR(run.losses[i], reference.losses[i], 1e-5 * reference.losses[i]) << "loss of iteration " << i + 1;
    EXPECT_NEAR(run.grad_norms[i], reference.grad_norms[i], 1e-5 * reference.grad_norms[i])
        << "grad norm of iteration " << i + 1;
    EXPECT_GT(reference.load_balancing_losses[i], 0.0);
    EXPECT_NEAR(run.load_balancing_losses[i], reference.load_balancing_losses[i],
                1e-5 * reference.load_balancing_losses[i])
        << "load_balancing_loss of iteration " << i + 1;
  }
  const ParamBuffer& ref = reference.engine->chunks[0]->params();
  // Under EP each rank holds half the experts of each of its MoE layers, by local index.
  const int64_t num_experts = reference.engine->chunks[0]->config().moe.num_experts;
  auto has = [&](const char* flag) {
    return std::find(layout->flags.begin(), layout->flags.end(), flag) != layout->flags.end();
  };
  const bool ep = has("--expert-model-parallel-size") || has("--moe-tp-extend-ep");
  int expert_parallel = 0;  // over this rank's chunks (a chunk of dense layers has none)
  for (const auto& chunk : run.engine->chunks)
    for (const ParamSpec& s : chunk->params().specs()) {
      expert_parallel += s.expert_parallel;
      if (ep) {
        EXPECT_EQ(s.name.find(str_cat("local_experts.", num_experts / 2, ".")), std::string::npos) << s.name;
      }
    }
  EXPECT_EQ(expert_parallel > 0, ep);
  const bool recompute = std::find(layout->flags.begin(), layout->flags.end(), "--recompute-granularity") !=
                         layout->flags.end();  // reruns forwards: their exchanges count twice
  if (comm_bytes && ep && !recompute) {  // the bytes docs/parallelism.md §12 gives for the expert-ep group (5 iterations;
                           // all-to-all: the combines send the rows this rank's experts got, so the
                           // EP group's sum is exact)
    const bool allgather = std::find(layout->flags.begin(), layout->flags.end(), "allgather") != layout->flags.end();
    const int64_t P = 2, E = 4, k = 2, H = 64, e_x = 4;
    const int64_t T = 16 * 2 / (run.engine->ps.tp_size() * run.engine->ps.cp_size());  // this rank's tokens
    const int64_t m = 8 / (2 * run.engine->ps.dp_size());
    int64_t moe_layers = 0;
    for (const auto& chunk : run.engine->chunks)
      for (const ParamSpec& s : chunk->params().specs()) moe_layers += s.name.find("mlp.router.weight") != std::string::npos;
    const int64_t per_layer = allgather ? P * T * (H * (e_x + 12) + 12 * k) : 8 * E + T * k * H * (e_x + 12);
    const int64_t bytes = run.engine->ps.expert()->stats().total_bytes();
    EXPECT_EQ(run.engine->ps.expert()->all_reduce_scalar(bytes), P * 5 * m * moe_layers * per_layer);
    if (allgather) {
      EXPECT_EQ(bytes, 5 * m * moe_layers * per_layer);
    }
  }
  for (size_t c = 0; c < run.engine->chunks.size(); ++c) {
    const ParamBuffer& pb = run.engine->chunks[c]->params();
    std::vector<FlatRange> owned = testing::owned_flat_ranges(run, c);
    for (int id = 0; id < pb.size(); ++id) {
      const ParamSpec& s = pb.spec(id);
      const int rid = ref.find(s.whole_model_name());  // under EP: the global expert
      ASSERT_GE(rid, 0) << s.name;
      if (s.buffer) {  // the expert bias: the same counts every step, so the same bias on every rank
        double moved = 0.0;
        for (int64_t e = 0; e < s.local_numel(); ++e) {
          EXPECT_EQ(pb.param_data(id)[e], ref.param_data(rid)[e]) << s.name << " [" << e << "]";
          moved += std::fabs(ref.param_data(rid)[e]);
        }
        EXPECT_GT(moved, 0.0) << s.name;
        continue;
      }
      EXPECT_LT(testing::shard_relative_error(s, pb.param_data(id), ref.param_data(rid), nullptr), 1e-3) << "parameter " << s.name;
      EXPECT_EQ(s.trainable, ref.spec(rid).trainable) << s.name;
      if (!s.trainable) continue;  // LoRA's frozen base: no gradient
      EXPECT_LT(testing::shard_relative_error(s, pb.grad_data(id), ref.grad_data(rid), &owned), 3e-5) << "gradient " << s.name;
    }
  }
}

class MoeInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeInvariance, MatchesSingleProcess) { expect_matches_single_process(kMoe, GetParam(), /*comm_bytes=*/true); }

INSTANTIATE_TEST_SUITE_P(Layouts, MoeInvariance, ::testing::ValuesIn(testing::layout_names(layouts())),
                         [](const auto& info) { return info.param; });

// LoRA on the attention and every routed expert's linear_fc1 / linear_fc2 (model/lora_expert.h):
// the expert adapters sit at their global expert under EP and reduce over the expert-DP group.
const std::vector<std::string> kLora = testing::join(
    {kMoe, {"--lora-r", "4", "--lora-alpha", "8", "--lora-target-modules", "linear_qkv", "linear_fc1", "linear_fc2"}});
// tp2_sp, tp2_sp_ep2: expert TP 2 (the default = TP), the experts' adapters split as the experts.
const std::vector<std::string> kLoraLayouts = {"dp2",         "ep2",         "ep2_dp4", "ep2_dp4_distopt_overlap",
                                               "ep2_allgather", "tp2_sp_etp1", "tp2_sp_etp1_ep2", "pp2", "ep2_pp2",
                                               "tp2_sp",      "tp2_sp_ep2",  "tp2_sp_dp2_distopt", "tp2_sp_tp_extend_ep"};
// The same with a gated shared expert in every MoE layer: its linear_fc1 / linear_fc2 adapted too,
// split over TP as the dense MLP's.
const std::vector<std::string> kLoraShared =
    testing::join({kLora, {"--moe-shared-expert-intermediate-size", "32", "--moe-shared-expert-gate"}});
const std::vector<std::string> kLoraSharedLayouts = {"dp2", "tp2_sp", "tp2_sp_ep2", "ep2", "pp2"};

class MoeLoraInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeLoraInvariance, ExpertAdaptersMatchSingleProcess) { expect_matches_single_process(kLora, GetParam(), false); }

INSTANTIATE_TEST_SUITE_P(Layouts, MoeLoraInvariance, ::testing::ValuesIn(kLoraLayouts),
                         [](const auto& info) { return info.param; });

class MoeLoraSharedInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeLoraSharedInvariance, SharedExpertAdaptersMatchSingleProcess) {
  expect_matches_single_process(kLoraShared, GetParam(), false);
}

INSTANTIATE_TEST_SUITE_P(Layouts, MoeLoraSharedInvariance, ::testing::ValuesIn(kLoraSharedLayouts),
                         [](const auto& info) { return info.param; });

class MoeRoutingInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeRoutingInvariance, DeepSeekRoutingMatchesSingleProcess) {
  expect_matches_single_process(kDeepSeekRouting, GetParam(), false);
}

INSTANTIATE_TEST_SUITE_P(Layouts, MoeRoutingInvariance, ::testing::ValuesIn(kRoutingLayouts),
                         [](const auto& info) { return info.param; });

class MoeDroppingInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeDroppingInvariance, TokenDroppingMatchesSingleProcess) {
  expect_matches_single_process(kDropping, GetParam(), false);
}

INSTANTIATE_TEST_SUITE_P(Layouts, MoeDroppingInvariance, ::testing::ValuesIn(kDroppingLayouts),
                         [](const auto& info) { return info.param; });

class MoeJitterInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeJitterInvariance, InputJitterMatchesSingleProcess) { expect_matches_single_process(kJitter, GetParam(), false); }

INSTANTIATE_TEST_SUITE_P(Layouts, MoeJitterInvariance, ::testing::ValuesIn(kJitterLayouts),
                         [](const auto& info) { return info.param; });

class MoeRouterBiasInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeRouterBiasInvariance, BiasedRouterAndExpertsMatchSingleProcess) {
  expect_matches_single_process(kBiasedMoe, GetParam(), false);
}

INSTANTIATE_TEST_SUITE_P(Layouts, MoeRouterBiasInvariance, ::testing::ValuesIn(kBiasedLayouts),
                         [](const auto& info) { return info.param; });

class MoePaddedInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(MoePaddedInvariance, PaddedToCapacityMatchesSingleProcess) {
  expect_matches_single_process(kDroppingPadded, GetParam(), false);
}

INSTANTIATE_TEST_SUITE_P(Layouts, MoePaddedInvariance, ::testing::Values("dp2", "ep2", "ep2_dp4"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace gale
