// MindSpeed's RiPipe schedules and per-rank recompute counts under mpirun (2 and 4 ranks, the
// pipeline over all of them, two virtual stages per rank) with a tiny real model: each rank runs
// exactly its RiPipe order, the gradients and loss are bit-identical to the run without the flag,
// and the allocator's peak shows the trade: --recompute-in-advance holds at least what the
// backward-triggered recompute held (and more on the last rank, whose last virtual stage keeps its
// activations), --recompute-in-bubble holds less on rank 0 than the run without recomputation.
#include <gtest/gtest.h>

#include <cstdlib>

#include "core/allocator.h"
#include "mpi_test_env.h"
#include "schedule/schedules.h"
#include "testing_data.h"
#include "train/engine.h"

namespace gale {
namespace {

constexpr int64_t kVocab = 120, kSeq = 8, kMicroBatch = 2;

struct TinyRun {
  ArgParser parser{"gale pretrain", "test"};
  Arguments args;
  std::unique_ptr<Engine> engine;
  testing::SyntheticDataset data{1000, kSeq, kVocab};

  // 4·PP layers, PP = the world, two virtual stages of two layers per rank; `flags` added.
  TinyRun(const std::vector<std::string>& flags, const Comm& world) {
    add_all_pretrain_args(parser, args);
    const std::string pp = std::to_string(world->size());
    std::vector<std::string> argv = {
        "gale", "--num-layers", std::to_string(4 * world->size()), "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", std::to_string(kSeq), "--max-position-embeddings", std::to_string(kSeq), "--micro-batch-size",
        std::to_string(kMicroBatch), "--global-batch-size", std::to_string(8 * kMicroBatch), "--train-iters", "1",
        "--lr", "1e-3", "--mock-data", "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1",
        "--attention-dropout", "0.1", "--pipeline-model-parallel-size", pp, "--num-virtual-stages-per-pipeline-rank",
        "2"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    std::vector<char*> ptrs;
    for (auto& a : argv) ptrs.push_back(a.data());
    GALE_CHECK_OK(parser.parse(static_cast<int>(ptrs.size()), ptrs.data()));
    GALE_CHECK_OK(validate_all_pretrain_args(args, parser, world->size()));
    args.model.padded_vocab_size = pad_vocab_size(kVocab, 64, 1);
    auto e = build_engine(args, world, reference_ops());
    GALE_CHECK_OK(e.status());
    engine = std::move(e).value();
  }

  MicroBatchSource source() const {
    return [this](int64_t m, MicroBatch* mb) {
      *mb = MicroBatch();
      mb->B = kMicroBatch;
      mb->S = kSeq;
      TrainingSample s;
      for (int64_t b = 0; b < kMicroBatch; ++b) {
        GALE_RETURN_IF_ERROR(data.get(m * kMicroBatch + b, &s));
        mb->tokens.insert(mb->tokens.end(), s.tokens.begin(), s.tokens.end());
        mb->labels.insert(mb->labels.end(), s.labels.begin(), s.labels.end());
        mb->loss_mask.insert(mb->loss_mask.end(), s.loss_mask.begin(), s.loss_mask.end());
        mb->position_ids.insert(mb->position_ids.end(), s.position_ids.begin(), s.position_ids.end());
        mb->sample_ids.push_back(m * kMicroBatch + b);
      }
      return Status::Ok();
    };
  }

  // One training forward-backward of the 8 micro-batches: the steps run, the gradients of every
  // chunk, the loss sums and the allocator's peak above the start.
  struct Result {
    std::vector<PipelineStep> steps;
    std::vector<std::vector<float>> grads;
    ForwardBackwardResult fb;
    int64_t peak = 0;
  };
  Result run() {
    Engine& e = *engine;
    Result r;
    for (auto& chunk : e.chunks) chunk->params().zero_grads();
    Allocator& a = host_allocator();
    a.reset_peak();
    const int64_t base = a.current_bytes();
    auto fb = forward_backward(e.chunk_pointers(), e.ps, 8, source(), /*forward_only=*/false,
                               [&](const PipelineStep& s) { r.steps.push_back(s); }, 0, nullptr, false, false, e.ripipe);
    GALE_CHECK_OK(fb.status());
    r.peak = a.peak_bytes() - base;
    r.fb = *fb;
    for (auto& chunk : e.chunks) {
      const Tensor& g = chunk->params().flat_grads();
      r.grads.emplace_back(g.data<float>(), g.data<float>() + g.numel());
    }
    return r;
  }
};

// The allocator also counts the transfers' buffers, whose release follows the neighbours' timing:
// peaks of the same order may differ by a few [Tl, H] f32 messages.
constexpr int64_t kTransferSlack = 4 * kSeq * kMicroBatch * 32 * 4;

const std::vector<std::string> kBlock = {"--recompute-granularity", "full", "--recompute-method", "block",
                                         "--recompute-num-layers", "1"};

void expect_same_training(const TinyRun::Result& a, const TinyRun::Result& b) {
  EXPECT_EQ(a.grads, b.grads);
  EXPECT_EQ(a.fb.loss_sum, b.fb.loss_sum);
  EXPECT_EQ(a.fb.tokens, b.fb.tokens);
}

TEST(RiPipe, RecomputeInAdvanceIsBitIdenticalAndHoldsMore) {
  Comm world = test::world();
  std::vector<std::string> flags = kBlock;
  TinyRun base(flags, world);
  flags.push_back("--recompute-in-advance");
  TinyRun advance(flags, world);
  ASSERT_EQ(advance.engine->ripipe, RiPipe::kAdvance);
  const TinyRun::Result b = base.run(), a = advance.run();
  const int pp = world->size(), rank = advance.engine->ps.coords().pp;
  EXPECT_EQ(a.steps, ripipe_interleaved_order(RiPipe::kAdvance, pp, rank, 2, 8, false));
  EXPECT_EQ(b.steps, interleaved_order(pp, rank, 2, 8, false));
  expect_same_training(a, b);
  EXPECT_GE(a.peak + kTransferSlack, b.peak) << "rank " << rank;
  if (rank == pp - 1) {
    EXPECT_GT(a.peak, b.peak) << "the last virtual stage keeps its activations";
  }
  std::printf("rank %d: peak %lld bytes with --recompute-in-advance, %lld without\n", rank,
              static_cast<long long>(a.peak), static_cast<long long>(b.peak));
}

TEST(RiPipe, RecomputeInBubbleIsBitIdenticalAndHoldsLessOnRankZero) {
  Comm world = test::world();
  TinyRun base({}, world), bubble({"--recompute-in-bubble"}, world);
  ASSERT_EQ(bubble.engine->ripipe, RiPipe::kBubble);
  const TinyRun::Result b = base.run(), r = bubble.run();
  const int pp = world->size(), rank = bubble.engine->ps.coords().pp;
  EXPECT_EQ(r.steps, ripipe_interleaved_order(RiPipe::kBubble, pp, rank, 2, 8, false));
  expect_same_training(r, b);
  const bool recomputes = max_whole_activations(interleaved_order(pp, rank, 2, 8, false)) > 2 * pp;
  EXPECT_EQ(recomputes, 2 * rank + 1 < pp) << "W + 1 = 2(P − r − 1) + (V − 1)·P + 1 > P·V on the first ranks";
  if (recomputes) {
    EXPECT_LT(r.peak, b.peak) << "rank " << rank;
  } else {
    EXPECT_EQ(r.steps, interleaved_order(pp, rank, 2, 8, false)) << "nothing to recompute";
    EXPECT_LE(std::abs(r.peak - b.peak), kTransferSlack) << "rank " << rank;
  }
  std::printf("rank %d: peak %lld bytes with --recompute-in-bubble, %lld without\n", rank,
              static_cast<long long>(r.peak), static_cast<long long>(b.peak));
}

TEST(RiPipe, RecomputeLayersPerPipelineRankIsBitIdentical) {
  Comm world = test::world();
  std::vector<std::string> flags = {"--recompute-granularity", "full", "--recompute-method", "block",
                                    "--recompute-num-layers", "3", "--enable-recompute-layers-per-pp-rank"};
  TinyRun base({}, world), per_rank(flags, world);
  // N = 3 over V = 2 chunks of 2 layers: layers 0 and 1 of chunk 0, layer 0 of chunk 1.
  const FullRecompute& c0 = per_rank.engine->chunks[0]->config().full_recompute;
  const FullRecompute& c1 = per_rank.engine->chunks[1]->config().full_recompute;
  EXPECT_EQ(c0.group(1, 2), (std::pair<int64_t, int64_t>{1, 2}));
  EXPECT_EQ(c1.group(0, 2), (std::pair<int64_t, int64_t>{0, 1}));
  EXPECT_EQ(c1.group(1, 2), (std::pair<int64_t, int64_t>{1, 1}));
  expect_same_training(per_rank.run(), base.run());
}

}  // namespace
}  // namespace gale
