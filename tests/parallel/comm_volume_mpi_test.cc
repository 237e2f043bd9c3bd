// Communication volume per training step: for each layout, the bytes every group's CommStats
// counts in one (steady-state) iteration equal the analytic count of docs/parallelism.md
// ("Communication volume per step") within 1%.
//
// The expected counts are computed here from the model dimensions alone (the parameter counts
// from docs/model.md's table), independently of the engine; only the bucket plan of layouts with
// a bucket-size override is read from the engine (the plan has its own unit tests).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "layouts.h"
#include "mpi_test_env.h"
#include "testing_run.h"
#include "train/engine.h"
#include "train/model_setup.h"
#include "train/trainer.h"

namespace gale {
namespace {

using testing::Layout;

// clang-format off
const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"single", 1, {}},
      {"dp2", 2, {}},
      {"dp2_distopt", 2, {"--use-distributed-optimizer"}},
      {"dp2_distopt_overlap_paramgather", 2,
       {"--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"}, 20000},
      {"tp2", 2, {"--tensor-model-parallel-size", "2"}},
      {"tp2_sp", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"tp2_dp2", 4, {"--tensor-model-parallel-size", "2", "--overlap-grad-reduce"}, 30000},
      {"tp2_dp2_sp_distopt", 4, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--use-distributed-optimizer"}},
      {"dp4_distopt", 4, {"--use-distributed-optimizer"}, 30001},
      {"tp4_sp", 4, {"--tensor-model-parallel-size", "4", "--sequence-parallel"}},
      {"tp2_dp4_distopt", 8, {"--tensor-model-parallel-size", "2", "--use-distributed-optimizer", "--overlap-grad-reduce"},
       25000},
      {"tp4_dp2_sp", 8, {"--tensor-model-parallel-size", "4", "--sequence-parallel"}},
      // Pipeline parallelism: 1F1B, interleaved, uneven stages, with TP/SP/DP and the distributed
      // optimizer (the tied embedding in a bucket of its own).
      {"pp2", 2, {"--pipeline-model-parallel-size", "2"}},
      {"pp2_vpp2", 2, {"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"}},
      {"pp4_uneven", 4, {"--pipeline-model-parallel-size", "4", "--num-layers", "6",
                         "--decoder-first-pipeline-num-layers", "1", "--decoder-last-pipeline-num-layers", "1"}},
      {"tp2_pp2_sp", 4, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                         "--sequence-parallel"}},
      {"pp2_dp2_distopt", 4, {"--pipeline-model-parallel-size", "2", "--use-distributed-optimizer"}},
      {"pp2_vpp2_dp2_distopt_overlap", 4, {"--pipeline-model-parallel-size", "2",
                                            "--num-layers-per-virtual-pipeline-stage", "1", "--use-distributed-optimizer",
                                            "--overlap-grad-reduce", "--overlap-param-gather"}, 20000},
      // Context parallelism: ring attention (--cp-comm-type p2p, the default), alone and with TP+SP,
      // PP and DP; all-gathered keys and values (allgather).
      {"cp2", 2, {"--context-parallel-size", "2"}},
      {"cp4", 4, {"--context-parallel-size", "4"}},
      {"cp2_allgather", 2, {"--context-parallel-size", "2", "--cp-comm-type", "allgather"}},
      // MindSpeed's kvallgather_cp_algo: the same all-gather; the double ring: the ring's bytes; the
      // ring's key/value cache: fewer bytes backward (full: gradients only; half: values and
      // gradients, in layers 0 and 3 of 4 with interval 2).
      {"cp2_kvallgather", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "kvallgather_cp_algo"}},
      {"cp4_window2", 4, {"--context-parallel-size", "4", "--cp-window-size", "2"}},
      {"cp4_kv_cache_full", 4, {"--context-parallel-size", "4", "--context-parallel-kv-cache-policy", "full"}},
      {"cp4_window2_kv_cache_half_interval2", 4, {"--context-parallel-size", "4", "--cp-window-size", "2",
                                                  "--context-parallel-kv-cache-policy", "half",
                                                  "--context-parallel-cache-interval", "2"}},
      {"tp2_cp2_sp_allgather", 4, {"--tensor-model-parallel-size", "2", "--context-parallel-size", "2",
                                   "--sequence-parallel", "--cp-comm-type", "allgather"}},
      {"tp2_cp2_sp", 4, {"--tensor-model-parallel-size", "2", "--context-parallel-size", "2", "--sequence-parallel"}},
      {"pp2_cp2", 4, {"--pipeline-model-parallel-size", "2", "--context-parallel-size", "2"}},
      {"dp2_cp2_distopt", 4, {"--context-parallel-size", "2", "--use-distributed-optimizer"}},
      // Ulysses: all-to-alls instead of the all-gather.
      {"cp2_ulysses", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "ulysses_cp_algo"}},
      {"tp2_cp2_ulysses_sp", 4, {"--tensor-model-parallel-size", "2", "--context-parallel-size", "2",
                                 "--context-parallel-algo", "ulysses_cp_algo", "--sequence-parallel"}},
      // Hybrid (hybrid_cp_algo): Ulysses all-to-alls within sub-groups of U consecutive cp ranks,
      // the ring across them.
      {"cp4_hybrid_u2", 4, {"--context-parallel-size", "4", "--context-parallel-algo", "hybrid_cp_algo",
                            "--ulysses-degree-in-cp", "2"}},
      {"cp8_hybrid_u2", 8, {"--context-parallel-size", "8", "--context-parallel-algo", "hybrid_cp_algo",
                            "--ulysses-degree-in-cp", "2"}},
      {"tp2_pp2_dp2_sp_distopt", 8, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                                     "--sequence-parallel", "--use-distributed-optimizer"}},
  };
  return all;
}

const std::vector<std::string> kCommon = {
    "--num-layers", "4", "--hidden-size", "64", "--seq-length", "16", "--max-position-embeddings", "16",
    "--micro-batch-size", "2", "--global-batch-size", "16", "--train-iters", "5", "--lr", "2e-3", "--mock-data",
    "--make-vocab-size-divisible-by", "64", "--eval-iters", "0", "--log-interval", "1000", "--clip-grad", "1.0"};
const std::vector<std::string>& kGpt = testing::kTinyGpt;
const std::vector<std::string>& kLlama = testing::kTinyLlama;
// clang-format on
constexpr int64_t kVocab = testing::kTinyVocab;

// Elements of one rank's model chunk (docs/model.md's table), and of its sequence-parallel
// parameters (norms and row-parallel biases, replicated across TP).
struct ChunkSizes {
  int64_t numel = 0, sequence_parallel = 0;
};
ChunkSizes chunk_sizes(const ModelConfig& c, int64_t t, int64_t layers, bool pre, bool post) {
  const int64_t H = c.hidden, norm = c.rms_norm ? H : 2 * H, bias = c.add_bias_linear ? 1 : 0;
  const int64_t qkv_rows = (c.heads + 2 * c.kv_heads) * c.head_dim;
  int64_t layer = 2 * norm;
  layer += qkv_rows * H / t + (c.qkv_bias() ? qkv_rows / t : 0);
  layer += H * c.heads * c.head_dim / t + bias * H;
  layer += c.fc1_out() * H / t + bias * c.fc1_out() / t;
  layer += H * c.ffn / t + bias * H;
  ChunkSizes s;
  s.numel = layers * layer;
  s.sequence_parallel = layers * (2 * norm + 2 * bias * H);
  if (pre) s.numel += c.vocab * H / t + (c.position == PositionEmbedding::kLearnedAbsolute ? c.max_positions * H : 0);
  if (post) {
    s.numel += norm + (!c.tied_embeddings || !pre ? c.vocab * H / t : 0);
    s.sequence_parallel += norm;
  }
  return s;
}

// docs/parallelism.md, "Communication cost per layout": bytes per group kind for one iteration.
// Bytes of hybrid_cp_algo's sub-groups for one iteration: {Ulysses, ring}.
std::pair<int64_t, int64_t> expected_hybrid_bytes(const Arguments& args, const Engine& engine);

std::map<Group, int64_t> expected_bytes(const Arguments& args, const Engine& engine) {
  const ModelConfig c = model_config_from_args(args);
  const ParallelState& ps = engine.ps;
  const int64_t e = 4, t = ps.tp_size(), p = ps.pp_size(), dp = ps.dp_size(), cp = ps.cp_size();
  // T: the tokens of a micro-batch this rank holds (its share of each sequence with CP).
  const int64_t T_global = args.model.seq_length * args.training.micro_batch_size, T = T_global / cp, H = c.hidden;
  const int64_t Tl = args.parallel.sequence_parallel ? T / t : T;  // a pipeline transfer is [Tl, H]
  const int64_t m = args.training.global_batch_size / (args.training.micro_batch_size * dp);
  const bool sp = args.parallel.sequence_parallel, distopt = args.parallel.use_distributed_optimizer;
  std::map<Group, int64_t> bytes;
  // Tensor parallel, per chunk: per micro-batch, per layer 4 [T, H] all-reduces (8 all-gathers /
  // reduce-scatters with SP), the embedding and the head 1 each (2 with SP), the vocab-parallel loss
  // 3T floats; after backward, the sequence-parallel gradients.
  const int64_t per_layer = sp ? 8 : 4, per_end = sp ? 2 : 1;
  int64_t tp = 0, pp = 0, embedding = 0, dp_grads = 0, context = 0;
  for (size_t k = 0; k < engine.chunks.size(); ++k) {
    const ModelPartition& part = engine.chunks[k]->partition();
    const bool first = part.pre_process, last = part.post_process;
    const ChunkSizes sizes = chunk_sizes(c, t, part.num_layers, first, last);
    EXPECT_EQ(sizes.numel, engine.chunks[k]->params().numel()) << "docs/model.md's parameter count, chunk " << k;
    tp += m * e * T * H * (per_layer * part.num_layers + per_end * (first ? 1 : 0) + per_end * (last ? 1 : 0)) +
          (last && t > 1 ? m * 3 * T * e : 0) + (sp ? e * sizes.sequence_parallel : 0);
    // Context parallel, per micro-batch and layer, with a key/value block of this rank's tokens
    // [T, 2·KV/TP·HD]: the ring (p2p) sends and receives N − 1 blocks forward, N − 1 blocks and N
    // gradient blocks backward (each counted once sent, once received); allgather instead
    // all-gathers the keys and values (counted as its output, [T_global, 2·KV/TP·HD]) and
    // reduce-scatters their gradients (its input, the same size). Plus the loss head's two
    // all-reduces: Σ mask (one double), then Σ ℓ·mask with each of the B samples' Σ ℓ·mask and
    // Σ mask (1 + 2·B doubles; DPO's per-sequence sums, GPTModel::LossSums).
    // Ulysses instead: per micro-batch and layer four all-to-alls of this rank's tokens (counted as
    // their send buffer): QKV [T, (NH + 2·KV)/t·HD] and the attention output [T, NH/t·HD] forward,
    // their gradients backward.
    const int64_t kv_block = e * T * 2 * (c.kv_heads / t) * c.head_dim;
    // With --context-parallel-kv-cache-policy the ring's cached layers send no key/value blocks
    // backward (full) or only their value halves (half).
    // Hybrid: the cp group itself carries only the loss sums (expected_hybrid_bytes: its sub-groups).
    const std::string& algo = args.parallel.context_parallel_algo;
    const auto per_layer_cp = [&](int64_t layer) -> int64_t {
      if (algo == "hybrid_cp_algo") return 0;
      if (algo == "ulysses_cp_algo") return 2 * e * T * (2 * c.heads + 2 * c.kv_heads) / t * c.head_dim;
      if (algo == "kvallgather_cp_algo" || args.parallel.cp_comm_type != "p2p") return 2 * cp * kv_block;
      const std::string& policy = args.parallel.context_parallel_kv_cache_policy;
      const int64_t k = args.parallel.context_parallel_cache_interval;
      const bool cached = !policy.empty() && (k == 0 || layer % (k + 1) == 0);
      const int64_t backward_kv = !cached ? 2 * (cp - 1) : policy == "half" ? cp - 1 : 0;  // in half blocks
      return 2 * (kv_block * (cp - 1) + kv_block / 2 * backward_kv + kv_block * cp);
    };
    const int64_t loss_sums = 8 * (2 + 2 * args.training.micro_batch_size);
    if (cp > 1) {
      for (int64_t l = 0; l < part.num_layers; ++l) context += m * per_layer_cp(part.first_layer + l);
      context += m * (last ? loss_sums : 0);
    }
    // Pipeline: per micro-batch, a chunk that is not the last virtual stage sends its output and
    // receives its gradient; one that is not the first receives its input and sends its gradient.
    pp += m * 2 * ((last ? 0 : 1) + (first ? 0 : 1)) * Tl * H * e;
    // The tied embedding's two copies (first and last stage) sum their gradients.
    if (p > 1 && c.tied_embeddings && (first || last)) embedding += e * c.vocab * H / t;
    // Data parallel: the gradients (all-reduce, or reduce-scatter + all-gather of the padded buckets).
    if (distopt) {
      int64_t padded = 0;
      for (const GradBucket& b : engine.dp_sync[k]->buckets()) padded += b.padded_numel;
      if (engine.dp_sync[k]->buckets().size() == 1) {
        EXPECT_EQ(padded, (sizes.numel + dp - 1) / dp * dp);
      }
      dp_grads += 2 * e * padded;
    } else {
      dp_grads += e * sizes.numel;
    }
  }
  bytes[Group::kTensor] = tp;
  // The gradients and the distributed optimizer's share of the grad-norm all-reduce over DP x CP;
  // the loss sums (2 doubles) over DP (every cp rank already holds the whole sequences' sums).
  if (dp * cp > 1) bytes[Group::kDataContext] = dp_grads + (distopt ? 8 : 0);
  if (dp > 1) bytes[Group::kData] = 16;
  if (context > 0) bytes[Group::kContext] = context;
  // The stages' agreement that every micro-batch loaded (one int64) and the loss broadcast (2 doubles).
  if (p > 1) bytes[Group::kPipeline] = pp + 8 + 16;
  if (embedding > 0) bytes[Group::kEmbedding] = embedding;
  // Model parallel: the grad-norm all-reduce (one double).
  if (ps.model()->size() > 1) bytes[Group::kModel] = 8;
  return bytes;
}

// hybrid_cp_algo, per micro-batch and layer: within the Ulysses sub-group the four all-to-alls of
// Ulysses (counted as their send buffer, this rank's T tokens); within the ring sub-group of
// R = CP/U ranks the ring's 3R − 2 blocks each way, a block holding the U·T tokens of the Ulysses
// group for 1/U of the key/value heads, i.e. the same [T, 2·KV/t·HD] floats as the plain ring's.
std::pair<int64_t, int64_t> expected_hybrid_bytes(const Arguments& args, const Engine& engine) {
  const ModelConfig c = model_config_from_args(args);
  const ParallelState& ps = engine.ps;
  const int64_t e = 4, t = ps.tp_size(), dp = ps.dp_size(), cp = ps.cp_size();
  const int64_t U = args.parallel.ulysses_degree_in_cp, R = cp / U;
  const int64_t T = args.model.seq_length * args.training.micro_batch_size / cp;
  const int64_t m = args.training.global_batch_size / (args.training.micro_batch_size * dp);
  const int64_t kv_block = e * (U * T) * 2 * (c.kv_heads / t / U) * c.head_dim;
  int64_t ulysses = 0, ring = 0;
  for (const auto& chunk : engine.chunks) {
    ulysses += m * chunk->partition().num_layers * 2 * e * T * (2 * c.heads + 2 * c.kv_heads) / t * c.head_dim;
    ring += m * chunk->partition().num_layers * 2 * kv_block * (3 * R - 2);
  }
  return {ulysses, ring};
}

class CommVolume : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(CommVolume, OneStepMatchesTheAnalyticCount) {
  const auto& [name, llama] = GetParam();
  const Layout* layout = testing::find_layout(layouts(), name);
  ASSERT_NE(layout, nullptr);
  Comm world = test::world();
  if (layout->world != world->size()) GTEST_SKIP() << name << " needs " << layout->world << " ranks";
  testing::TestRun run(testing::join({kCommon, llama ? kLlama : kGpt, layout->flags}), world, kVocab,
                       EngineOptions{layout->bucket_size, layout->recompute});
  const Arguments& args = run.args;
  Engine* engine = run.engine.get();
  Trainer& trainer = *run.trainer;
  // Steady state: the second iteration (with --overlap-param-gather it carries the all-gather of
  // the first iteration's update, as every later one does).
  ASSERT_TRUE(trainer.train_step().ok());
  engine->ps.reset_stats();
  const HybridCpGroups& hybrid = engine->cp_hybrid;
  if (hybrid.ulysses) {
    hybrid.ulysses->reset_stats();
    hybrid.ring->reset_stats();
  }
  ASSERT_TRUE(trainer.train_step().ok());
  const std::map<Group, int64_t> expected = expected_bytes(args, *engine);
  for (int g = 0; g < kNumGroups; ++g) {
    const Group kind = static_cast<Group>(g);
    const Comm& comm = engine->ps.group(kind);
    const int64_t got = comm ? comm->stats().total_bytes() : 0;
    const int64_t want = expected.count(kind) ? expected.at(kind) : 0;
    EXPECT_NEAR(static_cast<double>(got), static_cast<double>(want), 0.01 * static_cast<double>(want))
        << "group " << group_name(kind) << " (rank " << world->rank() << ")";
    if (world->rank() == 0 && want > 0)
      std::printf("%-34s %-6s %-10s %12lld bytes counted, %12lld expected\n", name.c_str(), llama ? "llama" : "gpt",
                  group_name(kind), static_cast<long long>(got), static_cast<long long>(want));
  }
}

// The hybrid's sub-groups are exactly as large as the flags say (U consecutive cp ranks; CP/U).
TEST_P(CommVolume, HybridSubGroupsCarryTheirShare) {
  const auto& [name, llama] = GetParam();
  const Layout* layout = testing::find_layout(layouts(), name);
  ASSERT_NE(layout, nullptr);
  Comm world = test::world();
  if (std::find(layout->flags.begin(), layout->flags.end(), "hybrid_cp_algo") == layout->flags.end())
    GTEST_SKIP() << name << " is not hybrid_cp_algo";
  if (layout->world != world->size()) GTEST_SKIP() << name << " needs " << layout->world << " ranks";
  testing::TestRun run(testing::join({kCommon, llama ? kLlama : kGpt, layout->flags}), world, kVocab,
                       EngineOptions{layout->bucket_size, layout->recompute});
  const HybridCpGroups& hybrid = run.engine->cp_hybrid;
  ASSERT_NE(hybrid.ulysses, nullptr);
  ASSERT_NE(hybrid.ring, nullptr);
  const int64_t U = run.args.parallel.ulysses_degree_in_cp, cp = run.engine->ps.cp_size();
  EXPECT_EQ(hybrid.ulysses->size(), U);
  EXPECT_EQ(hybrid.ring->size(), cp / U);
  // Ulysses over consecutive cp ranks, the ring over cp ranks U apart.
  const std::vector<int>& cp_ranks = run.engine->ps.cp()->world_ranks();
  const int64_t c = run.engine->ps.cp()->rank();
  for (int64_t j = 0; j < U; ++j) EXPECT_EQ(hybrid.ulysses->world_ranks()[j], cp_ranks[(c / U) * U + j]);
  for (int64_t j = 0; j < cp / U; ++j) EXPECT_EQ(hybrid.ring->world_ranks()[j], cp_ranks[j * U + c % U]);
  ASSERT_TRUE(run.trainer->train_step().ok());
  hybrid.ulysses->reset_stats();
  hybrid.ring->reset_stats();
  ASSERT_TRUE(run.trainer->train_step().ok());
  const auto [want_ulysses, want_ring] = expected_hybrid_bytes(run.args, *run.engine);
  EXPECT_NEAR(static_cast<double>(hybrid.ulysses->stats().total_bytes()), static_cast<double>(want_ulysses),
              0.01 * static_cast<double>(want_ulysses)) << "cp-ulysses (rank " << world->rank() << ")";
  EXPECT_NEAR(static_cast<double>(hybrid.ring->stats().total_bytes()), static_cast<double>(want_ring),
              0.01 * static_cast<double>(want_ring)) << "cp-ring (rank " << world->rank() << ")";
  if (world->rank() == 0)
    std::printf("%-34s %-6s cp-ulysses %12lld bytes counted, %12lld expected; cp-ring %12lld, %12lld\n", name.c_str(),
                llama ? "llama" : "gpt", static_cast<long long>(hybrid.ulysses->stats().total_bytes()),
                static_cast<long long>(want_ulysses), static_cast<long long>(hybrid.ring->stats().total_bytes()),
                static_cast<long long>(want_ring));
}

// The TP group's bytes and messages in a steady-state iteration of `layout` (GPT) on `ops`, and
// the analytic count above, plus --use-ascend-mc2's extra all-gathers when ops.tp_regather_input:
// the inputs of QKV and fc1 gathered again in backward, two more [T, H] f32 all-gathers (counted as
// their output) per layer and micro-batch.
struct TpVolume {
  int64_t bytes = 0, calls = 0, want = 0;
};
TpVolume tp_volume(const Layout& layout, const OpTable& ops) {
  testing::TestRun run(testing::join({kCommon, kGpt, layout.flags}), test::world(), kVocab,
                       EngineOptions{layout.bucket_size, layout.recompute}, ops);
  EXPECT_TRUE(run.trainer->train_step().ok());
  run.engine->ps.reset_stats();
  EXPECT_TRUE(run.trainer->train_step().ok());
  const Comm& tp = run.engine->ps.group(Group::kTensor);
  TpVolume v{tp->stats().total_bytes(), tp->stats().total_calls(),
             expected_bytes(run.args, *run.engine).at(Group::kTensor)};
  if (ops.tp_regather_input) {
    const TrainingArgs& tr = run.args.training;
    const int64_t T = run.args.model.seq_length * tr.micro_batch_size;
    const int64_t m = tr.global_batch_size / (tr.micro_batch_size * run.engine->ps.dp_size());
    for (const auto& chunk : run.engine->chunks)
      v.want += m * 2 * chunk->partition().num_layers * 4 * T * run.args.model.hidden_size;
  }
  return v;
}

// Chunked TP overlap (--use-ascend-coc --coc-parallel-num 4: OpTable::tp_comm_chunks) moves the
// same TP bytes as the analytic count above, in more messages: each linear's collective becomes 4.
// --use-ascend-mc2 (2 chunks, inputs gathered again) moves exactly its two extra all-gathers more.
TEST(CommVolumeChunkedTp, SameBytesInMoreMessages) {
  Comm world = test::world();
  int checked = 0;
  for (const char* name : {"tp2", "tp2_sp", "tp4_sp", "tp2_pp2_sp"}) {
    const Layout* layout = testing::find_layout(layouts(), name);
    ASSERT_NE(layout, nullptr) << name;
    if (layout->world != world->size()) continue;
    const bool sp = std::find(layout->flags.begin(), layout->flags.end(), "--sequence-parallel") != layout->flags.end();
    int64_t calls[2] = {0, 0};
    for (int variant : sp ? std::vector<int>{1, 4, 0} : std::vector<int>{1, 4}) {  // 0: MC2
      OpTable ops = reference_ops();
      ops.tp_comm_chunks = variant == 0 ? 2 : variant;
      ops.tp_regather_input = variant == 0;
      const TpVolume v = tp_volume(*layout, ops);
      EXPECT_NEAR(static_cast<double>(v.bytes), static_cast<double>(v.want), 0.01 * v.want)
          << name << (variant == 0 ? " with MC2" : " with " + std::to_string(variant) + " chunks") << " (rank "
          << world->rank() << ")";
      if (variant != 0) calls[variant == 1 ? 0 : 1] = v.calls;
    }
    EXPECT_GT(calls[1], calls[0]) << name << ": the chunked linears' collectives are separate messages";
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "no TP layout for " << world->size() << " ranks";
}

INSTANTIATE_TEST_SUITE_P(Layouts, CommVolume,
                         ::testing::Combine(::testing::ValuesIn(testing::layout_names(layouts())), ::testing::Bool()),
                         testing::layout_model_test_name);

}  // namespace
}  // namespace gale
