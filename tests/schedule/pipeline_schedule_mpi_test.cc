// The pipeline schedules under mpirun (2 and 4 ranks) with a tiny real model: each rank runs
// exactly its 1F1B / interleaved / DualPipeV order (with --dualpipev-dw-detach's I and W steps),
// holds no more micro-batches than the schedule needs (P − r for 1F1B, 2P + 1 chunk activations
// for DualPipeV), sends and receives one activation or gradient per micro-batch and virtual-stage
// boundary, a load error on one stage stops all stages, forward-only evaluation
// gives the single-process loss, a MicroBatchLoss starts the backward on the loss stage, tied embeddings start and stay identical on the first and last
// stage, and a bad micro-batch count is a clean error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "mpi_test_env.h"
#include "schedule/schedules.h"
#include "testing_data.h"
#include "train/engine.h"
#include "train/grad_sync.h"

namespace gale {
namespace {

constexpr int64_t kVocab = 120, kSeq = 8, kMicroBatch = 2;

struct Case {
  const char* name;
  int world;
  std::vector<std::string> flags;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"pp2", 2, {"--pipeline-model-parallel-size", "2"}},
      {"pp2_vpp2", 2, {"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"}},
      {"pp4", 4, {"--pipeline-model-parallel-size", "4"}},
      {"pp4_vpp2", 4, {"--pipeline-model-parallel-size", "4", "--num-virtual-stages-per-pipeline-rank", "2",
                        "--num-layers", "8"}},
      {"tp2_pp2_sp", 4, {"--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2",
                          "--sequence-parallel"}},
      {"pp2_dp2", 4, {"--pipeline-model-parallel-size", "2"}},
      {"pp2_dualpipev", 2, {"--pipeline-model-parallel-size", "2", "--schedules-method", "dualpipev"}},
      {"pp4_dualpipev", 4, {"--pipeline-model-parallel-size", "4", "--schedules-method", "dualpipev", "--num-layers",
                             "8"}},
      {"pp2_dp2_dualpipev", 4, {"--pipeline-model-parallel-size", "2", "--schedules-method", "dualpipev"}},
      {"tp2_pp2_sp_dualpipev", 4, {"--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2",
                                    "--sequence-parallel", "--schedules-method", "dualpipev"}},
      // --dualpipev-dw-detach: the I and W steps of dualpipev_order, the same transfers and peak.
      {"pp2_dualpipev_dw_detach", 2,
       {"--pipeline-model-parallel-size", "2", "--schedules-method", "dualpipev", "--dualpipev-dw-detach"}},
      {"pp4_dualpipev_dw_detach", 4,
       {"--pipeline-model-parallel-size", "4", "--schedules-method", "dualpipev", "--num-layers", "8",
        "--dualpipev-dw-detach"}},
  };
  return all;
}

struct TinyRun {
  ArgParser parser{"gale pretrain", "test"};
  Arguments args;
  std::unique_ptr<Engine> engine;
  testing::SyntheticDataset data{1000, kSeq, kVocab};

  TinyRun(const std::vector<std::string>& flags, const Comm& world, int64_t global_batch) {
    add_all_pretrain_args(parser, args);
    std::vector<std::string> argv = {"gale", "--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
                                     "--seq-length", std::to_string(kSeq), "--max-position-embeddings",
                                     std::to_string(kSeq), "--micro-batch-size", std::to_string(kMicroBatch),
                                     "--global-batch-size", std::to_string(global_batch), "--train-iters", "2",
                                     "--lr", "1e-3", "--mock-data", "--make-vocab-size-divisible-by", "64",
                                     "--hidden-dropout", "0.1", "--attention-dropout", "0.1"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    std::vector<char*> ptrs;
    for (auto& a : argv) ptrs.push_back(a.data());
    GALE_CHECK_OK(parser.parse(static_cast<int>(ptrs.size()), ptrs.data()));
    GALE_CHECK_OK(validate_all_pretrain_args(args, parser, world->size()));
    args.model.padded_vocab_size = pad_vocab_size(kVocab, 64, args.parallel.tensor_model_parallel_size);
    auto e = build_engine(args, world, reference_ops());
    GALE_CHECK_OK(e.status());
    engine = std::move(e).value();
  }

  int64_t num_microbatches() const {
    return args.training.global_batch_size / (kMicroBatch * engine->ps.dp_size());
  }

  // Micro-batch m of this data-parallel rank, as the trainer builds it.
  MicroBatchSource source() const {
    return [this](int64_t m, MicroBatch* mb) {
      const int64_t dp = engine->ps.dp_size(), first = (m * dp + engine->ps.coords().dp) * kMicroBatch;
      mb->B = kMicroBatch;
      mb->S = kSeq;
      mb->tokens.clear();
      mb->labels.clear();
      mb->loss_mask.clear();
      mb->position_ids.clear();
      mb->document_ids.clear();
      mb->sample_ids.clear();
      TrainingSample s;
      for (int64_t b = 0; b < kMicroBatch; ++b) {
        GALE_RETURN_IF_ERROR(data.get(first + b, &s));
        mb->tokens.insert(mb->tokens.end(), s.tokens.begin(), s.tokens.end());
        mb->labels.insert(mb->labels.end(), s.labels.begin(), s.labels.end());
        mb->loss_mask.insert(mb->loss_mask.end(), s.loss_mask.begin(), s.loss_mask.end());
        mb->position_ids.insert(mb->position_ids.end(), s.position_ids.begin(), s.position_ids.end());
        mb->sample_ids.push_back(first + b);
      }
      return Status::Ok();
    };
  }
};

const Case* find_case(const std::string& name) {
  for (const Case& c : cases())
    if (name == c.name) return &c;
  return nullptr;
}

class PipelineSchedule : public ::testing::TestWithParam<std::string> {};

TEST_P(PipelineSchedule, RunsMegatronOrderWithBoundedMemory) {
  const Case* c = find_case(GetParam());
  ASSERT_NE(c, nullptr);
  Comm world = test::world();
  if (c->world != world->size()) GTEST_SKIP() << c->name << " needs " << c->world << " ranks";
  TinyRun setup(c->flags, world, 16);
  Engine& e = *setup.engine;
  const int pp = e.ps.pp_size(), rank = e.ps.coords().pp, vpp = static_cast<int>(e.chunks.size());
  const int64_t m = setup.num_microbatches();
  std::vector<PipelineStep> ran;
  size_t held = 0, max_held = 0;
  auto observer = [&](const PipelineStep& s) {
    ran.push_back(s);
    held = 0;
    for (auto& chunk : e.chunks) held += chunk->in_flight();
    max_held = std::max(max_held, held);
  };
  e.ps.pp()->reset_stats();
  auto fb = forward_backward(e.chunk_pointers(), e.ps, m, setup.source(), /*forward_only=*/false, observer, 0, nullptr,
                             e.dualpipev, e.dualpipev_dw_detach);
  ASSERT_TRUE(fb.ok()) << fb.status().to_string();
  // Point-to-point volume (docs/parallelism.md): one [Tl, H] f32 tensor per micro-batch and
  // virtual-stage boundary in each direction; Tl = S·B, divided by TP with sequence parallelism.
  const int64_t tl = kSeq * kMicroBatch / (setup.args.parallel.sequence_parallel ? e.ps.tp_size() : 1);
  const int64_t message = tl * 32 * 4;  // hidden size 32, f32
  // DualPipeV: chunk 0 of rank r is stage r, chunk 1 stage 2P−1−r; the last rank's turn of the V
  // (stage P−1 to P) stays inside the process.
  auto stage_of = [&](int r, int c) { return e.dualpipev ? (c == 0 ? r : 2 * pp - 1 - r) : c * pp + r; };
  auto rank_of = [&](int s) { return e.dualpipev ? (s < pp ? s : 2 * pp - 1 - s) : s % pp; };
  int64_t sends = 0, recvs = 0;
  for (int c = 0; c < vpp; ++c) {
    const int stage = stage_of(rank, c), last = pp * vpp - 1;
    const bool down = stage < last && rank_of(stage + 1) != rank, up = stage > 0 && rank_of(stage - 1) != rank;
    sends += down + up;  // activation forward, gradient backward
    recvs += up + down;
  }
  const CommStats& stats = e.ps.pp()->stats();
  EXPECT_EQ(stats.calls[static_cast<int>(CommOp::kSend)], sends * m);
  EXPECT_EQ(stats.calls[static_cast<int>(CommOp::kRecv)], recvs * m);
  EXPECT_EQ(stats.bytes[static_cast<int>(CommOp::kSend)], sends * m * message);
  EXPECT_EQ(stats.bytes[static_cast<int>(CommOp::kRecv)], recvs * m * message);
  const std::vector<PipelineStep> expected = e.dualpipev ? dualpipev_order(pp, rank, m, false, e.dualpipev_dw_detach)
                                             : vpp == 1  ? one_f_one_b_order(pp, rank, m, false)
                                                         : interleaved_order(pp, rank, vpp, m, false);
  EXPECT_EQ(ran, expected);
  EXPECT_EQ(held, 0u) << "saved activations left after the iteration";
  if (e.dualpipev_dw_detach) {
    // At most r + 1 deferred backwards of one layer each (4 layers at PP2, 8 at PP4: 2·PP chunks),
    // each holding x and dy of its 4 linears: qkv T·H + 3T·H, proj 2T·H, fc1 T·H + 4T·H, fc2
    // 4T·H + T·H = 16·T·H f32 values (hidden 32, MHA, FFN 4H, no TP).
    const int64_t t = kSeq * kMicroBatch;
    EXPECT_EQ(fb->deferred_weight_grad_peak_bytes, (rank + 1) * 16 * t * 32 * 4);
  } else {
    EXPECT_EQ(fb->deferred_weight_grad_peak_bytes, 0);
  }
  if (e.dualpipev) {
    EXPECT_EQ(max_held, static_cast<size_t>(2 * pp + 1));
  } else if (vpp == 1) {
    EXPECT_LE(max_held, static_cast<size_t>(pp - rank));
    EXPECT_EQ(max_held, static_cast<size_t>(std::min<int64_t>(pp - rank, m)));
  } else {
    EXPECT_EQ(max_held, static_cast<size_t>(std::min(interleaved_warmup(pp, rank, vpp, m, false) + 1, m * vpp)));
  }
  // The loss sums live on the loss stage only (the last rank, rank 0 under DualPipeV); every token
  // of this rank's micro-batches counted.
  if (e.ps.coords().pp == e.loss_pipeline_rank()) {
    EXPECT_EQ(fb->tokens, static_cast<double>(m * kMicroBatch * kSeq));
    EXPECT_GT(fb->loss_sum, 0.0);
  } else {
    EXPECT_EQ(fb->tokens, 0.0);
  }
}

TEST_P(PipelineSchedule, ForwardOnlyMatchesSingleProcess) {
  const Case* c = find_case(GetParam());
  ASSERT_NE(c, nullptr);
  Comm world = test::world();
  if (c->world != world->size()) GTEST_SKIP() << c->name << " needs " << c->world << " ranks";
  std::vector<std::string> model_flags;
  for (size_t i = 0; i + 1 < c->flags.size(); ++i)
    if (c->flags[i] == "--num-layers") model_flags = {"--num-layers", c->flags[i + 1]};
  TinyRun reference(model_flags, make_self_communicator("world"), 16);
  TinyRun run(c->flags, world, 16);
  Engine& e = *run.engine;
  size_t max_held = 0;
  auto observer = [&](const PipelineStep&) {
    for (auto& chunk : e.chunks) max_held = std::max(max_held, chunk->in_flight());
  };
  auto fb = forward_backward(e.chunk_pointers(), e.ps, run.num_microbatches(), run.source(), /*forward_only=*/true,
                             observer, 0, nullptr, e.dualpipev);
  ASSERT_TRUE(fb.ok()) << fb.status().to_string();
  EXPECT_EQ(max_held, 0u) << "forward-only keeps no activations";
  double sums[2] = {fb->loss_sum, fb->tokens};
  if (e.ps.dp_size() > 1) e.ps.dp()->all_reduce(sums, 2, DType::kF64, ReduceOp::kSum);
  auto ref = forward_backward(reference.engine->chunk_pointers(), reference.engine->ps, reference.num_microbatches(),
                              reference.source(), /*forward_only=*/true);
  ASSERT_TRUE(ref.ok());
  if (e.ps.coords().pp == e.loss_pipeline_rank()) {
    EXPECT_EQ(sums[1], ref->tokens);
    EXPECT_NEAR(sums[0] / sums[1], ref->loss_sum / ref->tokens, 1e-5 * ref->loss_sum / ref->tokens);
  }
}

// A MicroBatchLoss (--stage dpo's hook) runs on the loss stage only, once per micro-batch right
// after its forward, with the per-sequence sums; returning Megatron's scale it gives the default
// schedule's gradients (there from the eager fused LM-head backward, here from the backward's).
TEST_P(PipelineSchedule, MicroBatchLossStartsTheBackward) {
  const Case* c = find_case(GetParam());
  ASSERT_NE(c, nullptr);
  Comm world = test::world();
  if (c->world != world->size()) GTEST_SKIP() << c->name << " needs " << c->world << " ranks";
  TinyRun setup(c->flags, world, 16);
  Engine& e = *setup.engine;
  const int64_t m = setup.num_microbatches();
  auto fb = forward_backward(e.chunk_pointers(), e.ps, m, setup.source(), /*forward_only=*/false, {}, 0, nullptr,
                             e.dualpipev, e.dualpipev_dw_detach);
  ASSERT_TRUE(fb.ok()) << fb.status().to_string();
  std::vector<std::vector<float>> expected;
  for (auto& chunk : e.chunks) {
    const Tensor& g = chunk->params().flat_grads();
    expected.emplace_back(g.data<float>(), g.data<float>() + g.numel());
    chunk->params().zero_grads();
  }
  std::vector<int64_t> called;
  auto loss = [&](GPTModel& model, int64_t mb, const GPTModel::LossSums& sums) {
    EXPECT_TRUE(model.partition().post_process);
    EXPECT_EQ(sums.sample_loss_sums.size(), static_cast<size_t>(kMicroBatch));
    double total = 0.0;
    for (double x : sums.sample_loss_sums) total += x;
    EXPECT_NEAR(total, sums.loss_sum, 1e-9 * sums.loss_sum);
    called.push_back(mb);
    return micro_batch_loss_scale(sums.tokens, m);
  };
  fb = forward_backward(e.chunk_pointers(), e.ps, m, setup.source(), /*forward_only=*/false, {}, 0, nullptr,
                        e.dualpipev, e.dualpipev_dw_detach, RiPipe::kNone, nullptr, nullptr, loss);
  ASSERT_TRUE(fb.ok()) << fb.status().to_string();
  std::vector<int64_t> all(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) all[static_cast<size_t>(i)] = i;
  EXPECT_EQ(called, e.ps.coords().pp == e.loss_pipeline_rank() ? all : std::vector<int64_t>{});
  for (size_t k = 0; k < e.chunks.size(); ++k) {
    const Tensor& g = e.chunks[k]->params().flat_grads();
    ASSERT_EQ(static_cast<size_t>(g.numel()), expected[k].size());
    double max_diff = 0.0, max_abs = 0.0;
    for (size_t i = 0; i < expected[k].size(); ++i) {
      max_diff = std::max(max_diff, static_cast<double>(std::abs(g.data<float>()[i] - expected[k][i])));
      max_abs = std::max(max_abs, static_cast<double>(std::abs(expected[k][i])));
    }
    EXPECT_GT(max_abs, 0.0) << "chunk " << k;
    EXPECT_LE(max_diff, 1e-5 * max_abs) << "chunk " << k;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, PipelineSchedule, ::testing::Values("pp2", "pp2_vpp2", "pp4", "pp4_vpp2",
                                                                      "tp2_pp2_sp", "pp2_dp2", "pp2_dualpipev",
                                                                      "pp4_dualpipev", "pp2_dp2_dualpipev",
                                                                      "tp2_pp2_sp_dualpipev", "pp2_dualpipev_dw_detach",
                                                                      "pp4_dualpipev_dw_detach"),
                         [](const auto& info) { return info.param; });

// The last stage's copies of the first stage's embedding (GPTModel::embedding_group_param_ids): the
// tied word embedding, and with MTP layers (--mtp-num-layers, on the last stage) the word embedding,
// tied or not, and the learned position embedding. Each starts equal to the first stage's (initial
// values depend only on the parameter name) and stays equal through training (its gradient is
// summed over the embedding group, so both stages take the same optimizer step).
struct EmbeddingCopies {
  const char* name;
  std::vector<std::string> flags;
  std::vector<std::string> copies;  // the names of the copies, in order
};

class TiedEmbedding : public ::testing::TestWithParam<EmbeddingCopies> {};

TEST_P(TiedEmbedding, FirstAndLastStageCopiesStayIdentical) {
  Comm world = test::world();
  if (world->size() != 2 && world->size() != 4) GTEST_SKIP();
  std::vector<std::string> flags = {"--pipeline-model-parallel-size", std::to_string(world->size())};
  flags.insert(flags.end(), GetParam().flags.begin(), GetParam().flags.end());
  TinyRun setup(flags, world, 8);
  Engine& e = *setup.engine;
  const Comm& emb = e.ps.embedding();
  ASSERT_TRUE(e.ps.is_pipeline_first_stage() || e.ps.is_pipeline_last_stage() || emb == nullptr);
  auto compare = [&](const char* when) {
    if (!emb) return;  // middle stages hold no copy
    GPTModel& m = e.ps.is_pipeline_first_stage() ? *e.chunks.front() : *e.chunks.back();
    const std::vector<int> ids = m.embedding_group_param_ids();
    ASSERT_EQ(ids.size(), GetParam().copies.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      const int id = ids[i];
      EXPECT_EQ(m.params().spec(id).name, GetParam().copies[i]);
      const int64_t n = m.params().spec(id).local_numel();
      std::vector<float> mine(m.params().param_data(id), m.params().param_data(id) + n), theirs(static_cast<size_t>(n));
      // Exchange the copies between the two members of the embedding group.
      const int peer = 1 - emb->rank();
      WorkPtr r = emb->recv_async(theirs.data(), n, DType::kF32, peer, 7);
      emb->send(mine.data(), n, DType::kF32, peer, 7);
      r->wait();
      EXPECT_EQ(mine, theirs) << GetParam().copies[i] << " " << when;
    }
  };
  compare("at initialisation");
  for (int step = 0; step < 2; ++step) {
    start_grad_sync_iteration(e, setup.num_microbatches());
    auto fb = forward_backward(e.chunk_pointers(), e.ps, setup.num_microbatches(), setup.source(), false);
    ASSERT_TRUE(fb.ok());
    finalize_model_grads(e);
    StepResult r = optimizer_step(e, 1e-3, 0.0, false);
    ASSERT_TRUE(r.applied);
  }
  compare("after two steps");
}

INSTANTIATE_TEST_SUITE_P(
    Models, TiedEmbedding,
    ::testing::Values(
        EmbeddingCopies{"tied", {}, {"embedding.word_embeddings.weight"}},
        EmbeddingCopies{"mtp_tied",
                        {"--mtp-num-layers", "1"},
                        {"embedding.word_embeddings.weight", "embedding.position_embeddings.weight"}},
        EmbeddingCopies{"mtp_untied_rope_vpp2",
                        {"--mtp-num-layers", "2", "--untie-embeddings-and-output-weights", "--position-embedding-type",
                         "rope", "--num-layers", "8", "--num-virtual-stages-per-pipeline-rank", "2"},
                        {"embedding.word_embeddings.weight"}}),
    [](const auto& info) { return std::string(info.param.name); });

// DualPipeV: rank 0 holds the first stage (chunk 0, the embedding) and the last (chunk 1, the
// output layer and MTP layers) with their embedding copies; both chunks' copies start equal and stay
// equal through training (finalize_model_grads sums their gradients on the rank). The other ranks
// hold no copy.
TEST_P(TiedEmbedding, DualPipeVCopiesOnRankZeroStayIdentical) {
  Comm world = test::world();
  if (world->size() != 2 && world->size() != 4) GTEST_SKIP();
  if (GetParam().name == std::string("mtp_untied_rope_vpp2")) GTEST_SKIP() << "virtual stages are not DualPipeV's";
  std::vector<std::string> flags = {"--pipeline-model-parallel-size", std::to_string(world->size()),
                                    "--schedules-method", "dualpipev", "--num-layers", "8"};
  flags.insert(flags.end(), GetParam().flags.begin(), GetParam().flags.end());
  TinyRun setup(flags, world, 16);
  Engine& e = *setup.engine;
  ASSERT_EQ(e.chunks.size(), 2u);
  GPTModel& first = *e.chunks[0];
  GPTModel& last = *e.chunks[1];
  EXPECT_EQ(first.partition().pre_process, e.ps.coords().pp == 0);
  EXPECT_EQ(last.partition().post_process, e.ps.coords().pp == 0);
  EXPECT_FALSE(last.partition().pre_process);
  EXPECT_FALSE(first.partition().post_process);
  auto compare = [&](const char* when) {
    const std::vector<int> a = first.embedding_group_param_ids(), b = last.embedding_group_param_ids();
    if (e.ps.coords().pp != 0) {
      EXPECT_TRUE(a.empty() && b.empty());
      return;
    }
    ASSERT_EQ(a.size(), GetParam().copies.size());
    ASSERT_EQ(b.size(), GetParam().copies.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(first.params().spec(a[i]).name, GetParam().copies[i]);
      EXPECT_EQ(last.params().spec(b[i]).name, GetParam().copies[i]);
      const int64_t n = first.params().spec(a[i]).local_numel();
      ASSERT_EQ(n, last.params().spec(b[i]).local_numel());
      std::vector<float> x(first.params().param_data(a[i]), first.params().param_data(a[i]) + n);
      std::vector<float> y(last.params().param_data(b[i]), last.params().param_data(b[i]) + n);
      EXPECT_EQ(x, y) << GetParam().copies[i] << " " << when;
    }
  };
  compare("at initialisation");
  for (int step = 0; step < 2; ++step) {
    start_grad_sync_iteration(e, setup.num_microbatches());
    auto fb = forward_backward(e.chunk_pointers(), e.ps, setup.num_microbatches(), setup.source(), false, {}, 0,
                               nullptr, e.dualpipev);
    ASSERT_TRUE(fb.ok()) << fb.status().to_string();
    finalize_model_grads(e);
    StepResult r = optimizer_step(e, 1e-3, 0.0, false);
    ASSERT_TRUE(r.applied);
  }
  compare("after two steps");
}

// Any valid order runs through forward_backward_pipelined: GPipe's (all forwards, then all
// backwards) holds all M micro-batches where 1F1B holds P − r, and gives the same gradients
// (both accumulate the micro-batches' backwards in the same order).
TEST(PipelineSchedule, GPipeOrderGivesTheSameGradientsWithMoreMemory) {
  Comm world = test::world();
  if (world->size() != 2 && world->size() != 4) GTEST_SKIP();
  TinyRun setup({"--pipeline-model-parallel-size", std::to_string(world->size())}, world, 16);
  Engine& e = *setup.engine;
  const int64_t m = setup.num_microbatches();
  GPTModel& model = *e.chunks.front();
  auto run = [&](const std::vector<PipelineStep>& order, size_t* max_held) {
    model.params().zero_grads();
    *max_held = 0;
    auto track = [&](const PipelineStep&) { *max_held = std::max(*max_held, model.in_flight()); };
    auto fb = forward_backward_pipelined(e.chunk_pointers(), e.ps, order, m, setup.source(), false, track);
    GALE_CHECK_OK(fb.status());
    const Tensor& g = model.params().flat_grads();
    return std::vector<float>(g.data<float>(), g.data<float>() + g.numel());
  };
  size_t held_1f1b = 0, held_gpipe = 0;
  std::vector<float> g1 = run(one_f_one_b_order(e.ps.pp_size(), e.ps.coords().pp, m, false), &held_1f1b);
  std::vector<float> g2 = run(gpipe_order(m, false), &held_gpipe);
  EXPECT_EQ(g1, g2);
  EXPECT_EQ(held_gpipe, static_cast<size_t>(m));
  EXPECT_EQ(held_1f1b, static_cast<size_t>(e.ps.pp_size() - e.ps.coords().pp));
}

// A micro-batch that cannot be loaded on one stage stops every stage of the pipeline with an
// error (the failing stage's own, the others naming it) instead of leaving them waiting.
TEST(PipelineSchedule, ALoadErrorOnOneStageStopsEveryStage) {
  Comm world = test::world();
  if (world->size() != 2 && world->size() != 4) GTEST_SKIP();
  TinyRun setup({"--pipeline-model-parallel-size", std::to_string(world->size())}, world, 8);
  Engine& e = *setup.engine;
  const int failing = e.ps.pp_size() - 1;
  MicroBatchSource good = setup.source();
  MicroBatchSource source = [&](int64_t m, MicroBatch* mb) -> Status {
    if (e.ps.coords().pp == failing && m == 2) return OutOfRange("the dataset has 3 samples; sample 4 was requested");
    return good(m, mb);
  };
  auto fb = forward_backward(e.chunk_pointers(), e.ps, setup.num_microbatches(), source, false);
  ASSERT_FALSE(fb.ok());
  if (e.ps.coords().pp == failing) {
    EXPECT_EQ(fb.status().message(), "the dataset has 3 samples; sample 4 was requested");
  } else {
    EXPECT_EQ(fb.status().message(), str_cat("pipeline stage ", failing, " could not load this iteration's "
                                             "micro-batches (its error is reported by that rank)"));
  }
  for (auto& chunk : e.chunks) EXPECT_EQ(chunk->in_flight(), 0u);
  // The pipeline still works afterwards.
  auto again = forward_backward(e.chunk_pointers(), e.ps, setup.num_microbatches(), good, false);
  EXPECT_TRUE(again.ok()) << again.status().to_string();
}

TEST(PipelineSchedule, InterleavedRejectsMicroBatchesNotAMultipleOfPipelineSize) {
  Comm world = test::world();
  if (world->size() != 2) GTEST_SKIP();
  TinyRun setup({"--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "2"}, world, 8);
  auto fb = forward_backward(setup.engine->chunk_pointers(), setup.engine->ps, 3, setup.source(), false);
  ASSERT_FALSE(fb.ok());
  EXPECT_NE(fb.status().message().find("= 3) to be a multiple of --pipeline-model-parallel-size 2"), std::string::npos)
      << fb.status().message();
}

}  // namespace
}  // namespace gale
