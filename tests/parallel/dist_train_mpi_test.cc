// --dist-train (MindSpeed's DistTrainFeature) against the single-process run of the same model. The
// job's ranks are cut into two sub-worlds by a dist_config (train/dist_train_config.h) that each
// hold half of the 4 layers with their own TP/PP: the first the embedding, the second the output
// layer and the loss. Activations cross the boundary forward and gradients backward point to point
// (parallel/dist_train_pipeline_comm.h), across TP sizes that differ (1 → 2 fans one rank's output
// out to two ranks; 2 → 1 takes it from the first of two), with two data-parallel replicas of the
// whole chain, and across data-parallel sizes that differ (one sub-world's micro-batches cut in
// slices for the other's replicas, forward or backward). 3 iterations must reproduce the single-process losses and gradient norms (1e-5
// relative, as every invariance test), parameters (1e-3) and gradients (1e-5 relative: f32 sums in
// another order under TP; measured at most 6.5e-7 on these layouts). The boundary messages are counted,
// and a checkpoint of the job loads in one process and back.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <unistd.h>

#include <filesystem>

#include "mpi_test_env.h"
#include "testing_checkpoint_run.h"
#include "testing_run.h"
#include "train/grad_sync.h"

namespace gale {
namespace {

using testing::TestRun;

constexpr int kIterations = 3;

struct SubWorld {
  const char* name;
  int world_size, tp, pp, num_layers;
  bool forward_only = false;
  int cp = 1;
};

// MindSpeed-MM's model.json holding `subworlds` as its dist_config, in a file of this process.
std::string write_config(const std::vector<SubWorld>& subworlds) {
  std::string entries;
  for (size_t i = 0; i < subworlds.size(); ++i) {
    const SubWorld& s = subworlds[i];
    entries += str_cat(i ? ", " : "", "{\"name\": \"", s.name, "\", \"model_index\": ", i, ", \"world_size\": ",
                       s.world_size, ", \"tensor_model_parallel_size\": ", s.tp, ", \"pipeline_model_parallel_size\": ",
                       s.pp, ", \"context_parallel_size\": ", s.cp, ", \"forward_only\": ", s.forward_only ? "true" : "false",
                       ", \"num_layers\": ", s.num_layers, "}");
  }
  const std::string path = str_cat(::testing::TempDir(), "gale_dist_train_", getpid(), ".json");
  std::ofstream(path) << "{\"dist_config\": {\"model_name\": \"gpt\", \"use_multiparam_send_recv\": false, "
                      << "\"model_config\": [" << entries << "]}}";
  return path;
}

// LLaMA-style (untied output layer), 4 layers, 8 micro-batches of 2 per DP replica; or GPT-style
// (tied embeddings: the last sub-world holds a copy of the word embedding).
std::vector<std::string> model_flags(bool gpt = false) {
  return testing::join({testing::kPipelineTestFlags, gpt ? testing::kTinyGpt : testing::kTinyLlama});
}

const TestRun& reference(bool gpt = false) {
  static std::unique_ptr<TestRun> runs[2];
  std::unique_ptr<TestRun>& run = runs[gpt ? 1 : 0];
  if (!run) {
    run = std::make_unique<TestRun>(model_flags(gpt), make_self_communicator("world"), testing::kTinyVocab);
    run->train(kIterations);
  }
  return *run;
}

// Trains `subworlds` on the test's world and compares with one process; returns the run.
std::unique_ptr<TestRun> expect_dist_train_matches(const std::vector<SubWorld>& subworlds, bool gpt = false,
                                                   const std::vector<std::string>& more = {}) {
  const std::string path = write_config(subworlds);
  auto run = std::make_unique<TestRun>(testing::join({model_flags(gpt), {"--dist-train", "--mm-model", path}, more}),
                                       test::world(), testing::kTinyVocab);
  std::remove(path.c_str());
  run->train(kIterations);
  finish_param_sync(*run->engine);
  // Every layer is held by some rank: the probes name the first and the last sub-world's parts.
  const int stage = run->engine->ps.coords().pp;
  const char* probe = stage == 0 ? "embedding.word_embeddings" : "decoder.layers";
  EXPECT_GT(testing::expect_matches_reference(*run, reference(gpt), kIterations, 1e-5, probe), 0);
  return run;
}

int64_t sends(const TestRun& run) { return run.engine->ps.pp()->stats().calls[static_cast<int>(CommOp::kSend)]; }
int64_t recvs(const TestRun& run) { return run.engine->ps.pp()->stats().calls[static_cast<int>(CommOp::kRecv)]; }

// 3 ranks: "encoder" TP 1 (rank 0, layers 0-1, the embedding), "decoder" TP 2 (ranks 1-2, layers 2-3,
// the loss). Rank 0's output goes to both decoder ranks; only the decoder's TP rank 0 sends the gradient back.
TEST(DistTrain, Tp1ToTp2) {
  if (test::world()->size() != 3) GTEST_SKIP() << "needs 3 ranks";
  auto run = expect_dist_train_matches({{"encoder", 1, 1, 1, 2}, {"decoder", 2, 2, 1, 2}});
  const ParallelState& ps = run->engine->ps;
  EXPECT_EQ(ps.pp_size(), 2);
  EXPECT_EQ(ps.tp_size(), ps.world_rank() == 0 ? 1 : 2);
  const int64_t m = kIterations * 8;  // micro-batches
  const int64_t expected_sends[] = {2 * m, m, 0}, expected_recvs[] = {m, m, m};
  EXPECT_EQ(sends(*run), expected_sends[ps.world_rank()]);
  EXPECT_EQ(recvs(*run), expected_recvs[ps.world_rank()]);
}

// 4 ranks: "encoder" TP 2 (ranks 0-1), "decoder" TP 1 x PP 2 (ranks 2, 3; one layer each): three
// stages; the decoder's first stage takes its input from encoder rank 0 and sends its gradient to both.
TEST(DistTrain, Tp2ToTp1Pp2) {
  if (test::world()->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  auto run = expect_dist_train_matches({{"encoder", 2, 2, 1, 2}, {"decoder", 2, 1, 2, 2}});
  const ParallelState& ps = run->engine->ps;
  EXPECT_EQ(ps.pp_size(), 3);
  const int64_t m = kIterations * 8;
  const int64_t expected_sends[] = {m, 0, 3 * m, m}, expected_recvs[] = {m, m, 2 * m, m};
  EXPECT_EQ(sends(*run), expected_sends[ps.world_rank()]);
  EXPECT_EQ(recvs(*run), expected_recvs[ps.world_rank()]);
}

// 4 ranks: two sub-worlds of TP 1 and DP 2 each: two chains, rank 0 → 2 and rank 1 → 3, each
// training 4 micro-batches per iteration, gradients reduced over each sub-world's DP group.
TEST(DistTrain, DataParallelChains) {
  if (test::world()->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  auto run = expect_dist_train_matches({{"encoder", 2, 1, 1, 2}, {"decoder", 2, 1, 1, 2}});
  const ParallelState& ps = run->engine->ps;
  EXPECT_EQ(ps.dp_size(), 2);
  EXPECT_EQ(ps.pp()->world_ranks(), (std::vector<int>{ps.world_rank() % 2, ps.world_rank() % 2 + 2}));
  EXPECT_EQ(sends(*run), kIterations * 4);
  EXPECT_EQ(recvs(*run), kIterations * 4);
}

// --sequence-parallel across TP sizes that differ: the TP-2 sub-world's ranks hold sequence halves.
// TP 1 → TP 2: rank 0 sends each decoder rank its half and gathers their gradient halves.
TEST(DistTrain, SequenceParallelTp1ToTp2) {
  if (test::world()->size() != 3) GTEST_SKIP() << "needs 3 ranks";
  auto run = expect_dist_train_matches({{"encoder", 1, 1, 1, 2}, {"decoder", 2, 2, 1, 2}}, false, {"--sequence-parallel"});
  EXPECT_EQ(run->args.parallel.sequence_parallel, run->engine->ps.world_rank() > 0);  // off at TP 1
  const int64_t m = kIterations * 8;
  const int64_t expected_sends[] = {2 * m, m, m}, expected_recvs[] = {2 * m, m, m};
  EXPECT_EQ(sends(*run), expected_sends[run->engine->ps.world_rank()]);
  EXPECT_EQ(recvs(*run), expected_recvs[run->engine->ps.world_rank()]);
}

// TP 2 (sequence halves) → TP 1 × PP 2: the decoder's first stage gathers both halves, sends each
// encoder rank its half of the gradient.
TEST(DistTrain, SequenceParallelTp2ToTp1Pp2) {
  if (test::world()->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  auto run = expect_dist_train_matches({{"encoder", 2, 2, 1, 2}, {"decoder", 2, 1, 2, 2}}, false, {"--sequence-parallel"});
  const int64_t m = kIterations * 8;
  const int64_t expected_sends[] = {m, m, 3 * m, m}, expected_recvs[] = {m, m, 3 * m, m};
  EXPECT_EQ(sends(*run), expected_sends[run->engine->ps.world_rank()]);
  EXPECT_EQ(recvs(*run), expected_recvs[run->engine->ps.world_rank()]);
}

// Context parallelism of 2 in both sub-worlds (ranks 0-1 and 2-3): each CP rank's chunks of the
// sequence go to the same CP rank of the next sub-world; the loss, norm and tied sums count each CP
// group once.
TEST(DistTrain, ContextParallelInBothSubWorlds) {
  if (test::world()->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  auto run = expect_dist_train_matches({{"encoder", 2, 1, 1, 2, false, 2}, {"decoder", 2, 1, 1, 2, false, 2}}, true);
  const ParallelState& ps = run->engine->ps;
  EXPECT_EQ(ps.cp_size(), 2);
  EXPECT_EQ(ps.dp_size(), 1);
  EXPECT_EQ(ps.pp()->world_ranks(), (std::vector<int>{0, 1, 2, 3}));
  const int64_t m = kIterations * 8;
  EXPECT_EQ(sends(*run), m);
  EXPECT_EQ(recvs(*run), m);
}

// Tied embeddings (GPT): the last sub-world's copy of the word embedding is split over TP 2, the
// first's is whole; their gradients are summed as whole tensors over the first and last stages.
TEST(DistTrain, TiedEmbeddingsAcrossTpSizes) {
  if (test::world()->size() != 3) GTEST_SKIP() << "needs 3 ranks";
  auto run = expect_dist_train_matches({{"encoder", 1, 1, 1, 2}, {"decoder", 2, 2, 1, 2}}, /*gpt=*/true);
  // The decoder holds its copy (the output layer), which must equal the reference's embedding.
  if (run->engine->ps.world_rank() > 0)
    EXPECT_GE(run->model().params().find("embedding.word_embeddings.weight"), 0);
}

// ... and with data-parallel sizes that differ on top (TP 2 x DP 1 → TP 1 x DP 2).
TEST(DistTrain, TiedEmbeddingsAcrossTpAndDpSizes) {
  if (test::world()->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  expect_dist_train_matches({{"encoder", 2, 2, 1, 2}, {"decoder", 2, 1, 1, 2}}, /*gpt=*/true);
}

// Data-parallel sizes that differ (MindSpeed's main_dp with inner data parallelism): the sub-world
// of twice the replicas runs micro-batches of 1 sample, slices of the other's micro-batches of 2.

// 3 ranks: "encoder" DP 2 (ranks 0, 1), "decoder" DP 1 (rank 2) gathers the two halves forward and
// sends each its slice of the gradient backward.
TEST(DistTrain, EncoderOfTwiceTheReplicas) {
  if (test::world()->size() != 3) GTEST_SKIP() << "needs 3 ranks";
  auto run = expect_dist_train_matches({{"encoder", 2, 1, 1, 2}, {"decoder", 1, 1, 1, 2}});
  const ParallelState& ps = run->engine->ps;
  EXPECT_EQ(run->args.training.micro_batch_size, ps.world_rank() < 2 ? 1 : 2);
  const int64_t m = kIterations * 8;  // micro-batches of every rank
  const int64_t expected_sends[] = {m, m, 2 * m}, expected_recvs[] = {m, m, 2 * m};
  EXPECT_EQ(sends(*run), expected_sends[ps.world_rank()]);
  EXPECT_EQ(recvs(*run), expected_recvs[ps.world_rank()]);
}

// 3 ranks: "encoder" DP 1 (rank 0) sends each "decoder" replica (ranks 1, 2; DP 2, the loss) its
// slice and gathers their gradients.
TEST(DistTrain, LossSubWorldOfTwiceTheReplicas) {
  if (test::world()->size() != 3) GTEST_SKIP() << "needs 3 ranks";
  auto run = expect_dist_train_matches({{"encoder", 1, 1, 1, 2}, {"decoder", 2, 1, 1, 2}});
  const ParallelState& ps = run->engine->ps;
  const int64_t m = kIterations * 8;
  const int64_t expected_sends[] = {2 * m, m, m}, expected_recvs[] = {2 * m, m, m};
  EXPECT_EQ(sends(*run), expected_sends[ps.world_rank()]);
  EXPECT_EQ(recvs(*run), expected_recvs[ps.world_rank()]);
}

// 4 ranks: "encoder" TP 2 x DP 1 (ranks 0, 1) → "decoder" TP 1 x DP 2 (ranks 2, 3): TP and DP change
// at once; the encoder's TP rank 0 sends the slices, both encoder ranks gather the gradient.
TEST(DistTrain, TensorAndDataParallelSizesChange) {
  if (test::world()->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  auto run = expect_dist_train_matches({{"encoder", 2, 2, 1, 2}, {"decoder", 2, 1, 1, 2}});
  const ParallelState& ps = run->engine->ps;
  const int64_t m = kIterations * 8;
  const int64_t expected_sends[] = {2 * m, 0, 2 * m, 2 * m}, expected_recvs[] = {2 * m, 2 * m, m, m};
  EXPECT_EQ(sends(*run), expected_sends[ps.world_rank()]);
  EXPECT_EQ(recvs(*run), expected_recvs[ps.world_rank()]);
}

// A forward-only (frozen) encoder, MindSpeed's forward_only: rank 0 holds the embedding and layers
// 0-1 frozen and runs its forwards only (as evaluation does, so without dropout: the test runs
// without dropout); the TP-2 decoder trains and sends nothing back. The reference is one process with
// the same parameters frozen (EngineOptions::frozen_layers): losses and gradient norms within 1e-5,
// parameters 1e-3 (the frozen ones bit for bit: never updated), the trained ones' gradients 1e-5.
TEST(DistTrain, ForwardOnlyEncoder) {
  if (test::world()->size() != 3) GTEST_SKIP() << "needs 3 ranks";
  const std::vector<std::string> flags =
      testing::join({model_flags(), {"--hidden-dropout", "0", "--attention-dropout", "0"}});
  EngineOptions frozen;
  frozen.frozen_layers = 2;
  TestRun reference(flags, make_self_communicator("world"), testing::kTinyVocab, frozen);
  reference.train(kIterations);
  const std::string path = write_config({{"encoder", 1, 1, 1, 2, true}, {"decoder", 2, 2, 1, 2}});
  TestRun run(testing::join({flags, {"--dist-train", "--mm-model", path}}), test::world(), testing::kTinyVocab);
  std::remove(path.c_str());
  // The frozen encoder is initialised as the reference (compared below after training, unchanged).
  run.train(kIterations);
  finish_param_sync(*run.engine);
  for (int i = 0; i < kIterations; ++i) {
    EXPECT_NEAR(run.losses[i], reference.losses[i], 1e-5 * reference.losses[i]) << "iteration " << i + 1;
    EXPECT_NEAR(run.grad_norms[i], reference.grad_norms[i], 1e-5 * reference.grad_norms[i]) << "iteration " << i + 1;
  }
  const ParamBuffer& ref = reference.model().params();
  const ParamBuffer& pb = run.model().params();
  int frozen_params = 0, trained = 0;
  for (int id = 0; id < pb.size(); ++id) {
    const ParamSpec& s = pb.spec(id);
    const int rid = ref.find(s.whole_model_name());
    ASSERT_GE(rid, 0) << s.name;
    EXPECT_LT(testing::shard_relative_error(s, pb.param_data(id), ref.param_data(rid), nullptr), s.trainable ? 1e-3 : 1e-12)
        << "parameter " << s.name;
    if (!s.trainable) {
      ++frozen_params;
      continue;
    }
    ++trained;
    EXPECT_LT(testing::shard_relative_error(s, pb.grad_data(id), ref.grad_data(rid), nullptr), 1e-5) << "gradient " << s.name;
  }
  EXPECT_EQ(frozen_params > 0, run.engine->ps.world_rank() == 0);  // the encoder holds the frozen parameters
  EXPECT_EQ(trained > 0, run.engine->ps.world_rank() > 0);
  // Nothing travels back to the encoder: the decoder's TP rank 0 sends no gradient.
  const int64_t m = kIterations * 8;
  const int64_t expected_sends[] = {2 * m, 0, 0}, expected_recvs[] = {0, m, m};
  EXPECT_EQ(sends(run), expected_sends[run.engine->ps.world_rank()]);
  EXPECT_EQ(recvs(run), expected_recvs[run.engine->ps.world_rank()]);
}

// Checkpoints: each sub-world writes its tensors by their whole-model names and shapes, so a
// checkpoint saved by the TP 1 → TP 2 job after 2 iterations loads in one process and, again, in the
// dist-train job; both then train iteration 3 to the uninterrupted single-process loss.
TEST(DistTrain, CheckpointLoadsInOneProcessAndBack) {
  if (test::world()->size() != 3) GTEST_SKIP() << "needs 3 ranks";
  const int64_t pid = test::world()->all_reduce_scalar(test::world()->rank() == 0 ? int64_t{getpid()} : int64_t{0});
  const std::string dir = str_cat(::testing::TempDir(), "gale_dist_train_ckpt_", pid);
  const std::vector<SubWorld> layout = {{"encoder", 1, 1, 1, 2}, {"decoder", 2, 2, 1, 2}};
  {
    const std::string path = write_config(layout);
    testing::CheckpointRun run(testing::join({model_flags(), {"--dist-train", "--mm-model", path, "--save", dir, "--save-interval", "1000"}}),
                               test::world(), testing::kTinyVocab);
    std::remove(path.c_str());
    run.train(2);
    ASSERT_TRUE(run.save().ok());
  }
  test::world()->barrier();
  if (test::world()->rank() == 0) {
    testing::CheckpointRun one(testing::join({model_flags(), {"--load", dir}}), make_self_communicator("world"),
                               testing::kTinyVocab);
    ASSERT_TRUE(one.load().ok());
    one.train(1);
    EXPECT_NEAR(one.losses[0], reference().losses[2], 1e-5 * reference().losses[2]);
    EXPECT_NEAR(one.grad_norms[0], reference().grad_norms[2], 1e-5 * reference().grad_norms[2]);
  }
  {
    const std::string path = write_config(layout);
    testing::CheckpointRun run(testing::join({model_flags(), {"--dist-train", "--mm-model", path, "--load", dir}}),
                               test::world(), testing::kTinyVocab);
    std::remove(path.c_str());
    ASSERT_TRUE(run.load().ok());
    run.train(1);
    EXPECT_NEAR(run.losses[0], reference().losses[2], 1e-5 * reference().losses[2]);
    EXPECT_NEAR(run.grad_norms[0], reference().grad_norms[2], 1e-5 * reference().grad_norms[2]);
  }
  test::world()->barrier();
  if (test::world()->rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gale
