// Checkpoints: a run saved and resumed continues bit-for-bit like an uninterrupted one; a
// mismatched or damaged checkpoint is a clear error.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "ckpt/checkpoint_reader.h"
#include "testing_run.h"
#include "train/checkpointing.h"
#include "train/engine.h"
#include "train/model_setup.h"

namespace gale {
namespace {

// A small run with dropout on, saving and loading through the trainer's checkpoint functions.
struct TrainingRun : testing::TestRun {
  explicit TrainingRun(const std::vector<std::string>& extra)
      : TestRun(testing::join({{"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
                                "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size", "2",
                                "--global-batch-size", "4", "--train-iters", "6", "--lr", "3e-3", "--lr-warmup-iters",
                                "2", "--lr-decay-style", "cosine", "--mock-data", "--hidden-dropout", "0.1",
                                "--attention-dropout", "0.1", "--eval-iters", "0", "--log-interval", "1000",
                                "--make-vocab-size-divisible-by", "64"},
                               extra}),
                make_self_communicator("world"), 60) {}
  Status save() { return save_checkpoint(args, *engine, trainer->state()); }
  Status load(bool* loaded) { return load_checkpoint(args, *engine, trainer->state(), loaded); }
};

std::string temp_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("gale_resume_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  return dir.string();
}

TEST(Resume, ContinuesBitForBit) {
  const std::string dir = temp_dir("exact");
  TrainingRun whole({});
  std::vector<double> expected = whole.train(6);

  TrainingRun first({"--save", dir, "--save-interval", "3"});
  std::vector<double> a = first.train(3);
  ASSERT_TRUE(first.save().ok());
  EXPECT_TRUE(std::filesystem::exists(dir + "/iter_0000003/metadata.json"));
  std::ifstream tracker(dir + "/latest_checkpointed_iteration.txt");
  std::string it;
  tracker >> it;
  EXPECT_EQ(it, "3");

  TrainingRun second({"--load", dir});
  bool loaded = false;
  ASSERT_TRUE(second.load(&loaded).ok());
  ASSERT_TRUE(loaded);
  EXPECT_EQ(second.trainer->state().iteration, 3);
  EXPECT_EQ(second.trainer->state().consumed_train_samples, 12);
  std::vector<double> b = second.train(3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a[i], expected[i]) << i;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(b[i], expected[3 + i]) << "iteration " << 4 + i;
  const ParamBuffer& p1 = whole.model().params();
  const ParamBuffer& p2 = second.model().params();
  for (int64_t i = 0; i < p1.numel(); ++i)
    ASSERT_EQ(p1.flat_params().data<float>()[i], p2.flat_params().data<float>()[i]) << i;
  std::filesystem::remove_all(dir);
}

// --optimizer muon (GQA + SwiGLU: the QKV split, Nesterov): the Muon parameters' momentum buffers
// and the other parameters' Adam moments are saved under their own names, and the resumed run
// continues bit-for-bit. An Adam run cannot load that optimizer state.
TEST(Resume, MuonContinuesBitForBit) {
  const std::string dir = temp_dir("muon");
  const std::vector<std::string> muon = {"--optimizer", "muon", "--muon-nesterov", "--group-query-attention",
                                         "--num-query-groups", "2", "--swiglu", "--normalization", "RMSNorm",
                                         "--position-embedding-type", "rope", "--disable-bias-linear"};
  TrainingRun whole(muon);
  std::vector<double> expected = whole.train(6);
  TrainingRun first(testing::join({muon, {"--save", dir, "--save-interval", "3"}}));
  first.train(3);
  ASSERT_TRUE(first.save().ok());
  StatusOr<CheckpointReader> r = CheckpointReader::open(dir);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const std::string qkv = "decoder.layers.0.self_attention.linear_qkv.weight";
  EXPECT_TRUE(r->has_tensor("optimizer.momentum_buffer." + qkv));
  EXPECT_FALSE(r->has_tensor("optimizer.exp_avg." + qkv));
  EXPECT_TRUE(r->has_tensor("optimizer.exp_avg.embedding.word_embeddings.weight"));
  EXPECT_TRUE(r->has_tensor("optimizer.exp_avg_sq.decoder.layers.0.input_layernorm.weight"));
  EXPECT_FALSE(r->has_tensor("optimizer.momentum_buffer.embedding.word_embeddings.weight"));

  TrainingRun second(testing::join({muon, {"--load", dir}}));
  bool loaded = false;
  ASSERT_TRUE(second.load(&loaded).ok());
  ASSERT_TRUE(loaded);
  std::vector<double> b = second.train(3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(b[i], expected[3 + i]) << "iteration " << 4 + i;
  const ParamBuffer& p1 = whole.model().params();
  const ParamBuffer& p2 = second.model().params();
  for (int64_t i = 0; i < p1.numel(); ++i)
    ASSERT_EQ(p1.flat_params().data<float>()[i], p2.flat_params().data<float>()[i]) << i;

  TrainingRun adam({"--load", dir, "--group-query-attention", "--num-query-groups", "2", "--swiglu",
                    "--normalization", "RMSNorm", "--position-embedding-type", "rope", "--disable-bias-linear"});
  Status st = adam.load(&loaded);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("holds muon optimizer state"), std::string::npos) << st.to_string();
  std::filesystem::remove_all(dir);
}

// --async-save: training goes on (parameters and optimizer state change) before the save is
// finalised; the checkpoint still holds the state at the save, and the resumed run continues
// bit-for-bit. The tracker appears only at the finalisation.
TEST(Resume, AsyncSaveContinuesBitForBit) {
  const std::string dir = temp_dir("async");
  TrainingRun whole({});
  std::vector<double> expected = whole.train(6);

  TrainingRun first({"--save", dir, "--save-interval", "3", "--async-save"});
  first.train(3);
  AsyncCheckpointSaves saves(*first.engine->ps.world());
  ASSERT_TRUE(save_checkpoint(first.args, *first.engine, first.trainer->state(), &saves).ok());
  std::vector<double> a = first.train(3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a[i], expected[3 + i]) << "the snapshot disturbed iteration " << 4 + i;
  EXPECT_FALSE(std::filesystem::exists(dir + "/latest_checkpointed_iteration.txt"));
  ASSERT_FALSE(saves.empty());
  ASSERT_TRUE(saves.maybe_finalize(/*blocking=*/true).ok());
  EXPECT_TRUE(saves.empty());

  TrainingRun second({"--load", dir});
  bool loaded = false;
  ASSERT_TRUE(second.load(&loaded).ok());
  ASSERT_TRUE(loaded);
  EXPECT_EQ(second.trainer->state().iteration, 3);
  std::vector<double> b = second.train(3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(b[i], expected[3 + i]) << "iteration " << 4 + i;
  std::filesystem::remove_all(dir);
}

// --moe-router-enable-expert-bias: the bias (a buffer, moved after every step) is saved as
// decoder.layers.{i}.mlp.router.expert_bias and resumed, so the resumed run routes and trains
// exactly like the uninterrupted one.
TEST(Resume, MoeExpertBiasContinuesBitForBit) {
  const std::string dir = temp_dir("expert_bias");
  const std::vector<std::string> moe = {"--num-experts", "4", "--moe-router-topk", "2", "--moe-router-score-function",
                                        "sigmoid", "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate",
                                        "0.02", "--moe-aux-loss-coeff", "0.01"};
  TrainingRun whole(moe);
  const std::vector<double> expected = whole.train(6);
  TrainingRun first(testing::join({moe, {"--save", dir, "--save-interval", "3"}}));
  first.train(3);
  ASSERT_TRUE(first.save().ok());
  TrainingRun second(testing::join({moe, {"--load", dir}}));
  bool loaded = false;
  ASSERT_TRUE(second.load(&loaded).ok());
  ASSERT_TRUE(loaded);
  const ParamBuffer& p1 = whole.model().params();
  const ParamBuffer& p2 = second.model().params();
  const int bias = p2.find("decoder.layers.1.mlp.router.expert_bias");
  ASSERT_GE(bias, 0);
  EXPECT_TRUE(p2.spec(bias).buffer);
  EXPECT_EQ(p2.param_data(bias)[0], first.model().params().param_data(bias)[0]);
  const std::vector<double> b = second.train(3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(b[i], expected[3 + i]) << "iteration " << 4 + i;
  // Each step moves every expert's bias by ±0.02 (or 0), so a bias can return to 0: look at both
  // layers after three steps (the first run) and after six (the whole run).
  double moved = 0.0;
  for (const std::string layer : {"0", "1"}) {
    const int id = p2.find("decoder.layers." + layer + ".mlp.router.expert_bias");
    ASSERT_GE(id, 0);
    for (int64_t e = 0; e < 4; ++e)
      moved += std::fabs(p1.param_data(id)[e]) + std::fabs(first.model().params().param_data(id)[e]);
  }
  EXPECT_GT(moved, 0.0);
  for (int64_t i = 0; i < p1.numel(); ++i)
    ASSERT_EQ(p1.flat_params().data<float>()[i], p2.flat_params().data<float>()[i]) << i;
  std::filesystem::remove_all(dir);
}

// Megatron's --moe-use-upcycling: every expert starts as a copy of its layer's dense MLP and the
// router afresh; with softmax after top-k the upcycled model computes the dense model exactly, so
// its first loss is the dense run's next one (the same batch: the dense run's consumed samples).
TEST(Resume, MoeUpcyclingCopiesTheDenseMlpIntoEveryExpert) {
  const std::string dense_dir = temp_dir("upcycle_dense"), moe_dir = temp_dir("upcycle_moe");
  const std::vector<std::string> no_dropout = {"--hidden-dropout", "0", "--attention-dropout", "0"};
  TrainingRun dense(testing::join({no_dropout, {"--save", dense_dir, "--save-interval", "3"}}));
  dense.train(2);
  ASSERT_TRUE(dense.save().ok());
  const double dense_next = dense.train(1)[0];
  const std::vector<std::string> moe = testing::join({no_dropout, {"--num-experts", "4", "--moe-router-topk", "2"}});
  TrainingRun fresh(moe);
  TrainingRun up(testing::join({moe, {"--moe-use-upcycling", "--load", dense_dir, "--save", moe_dir,
                                       "--save-interval", "3"}}));
  ASSERT_TRUE(upcycle_checkpoint(up.args, *up.engine, up.trainer->state()).ok());
  EXPECT_EQ(up.trainer->state().iteration, 0);
  EXPECT_EQ(up.trainer->state().consumed_train_samples, 8);  // the dense run's two batches of 4
  TrainingRun saved_dense(testing::join({no_dropout, {"--load", dense_dir}}));
  bool loaded = false;
  ASSERT_TRUE(saved_dense.load(&loaded).ok());
  const ParamBuffer& d = saved_dense.model().params();
  const ParamBuffer& u = up.model().params();
  const auto same = [](const ParamBuffer& a, int ia, const ParamBuffer& b, int ib) {
    const int64_t n = a.spec(ia).local_numel();
    return n == b.spec(ib).local_numel() &&
           std::equal(a.param_data(ia), a.param_data(ia) + n, b.param_data(ib));
  };
  for (int e = 0; e < 4; ++e)
    for (const char* w : {"linear_fc1.weight", "linear_fc1.bias", "linear_fc2.weight", "linear_fc2.bias"}) {
      const int id = u.find(str_cat("decoder.layers.1.mlp.experts.local_experts.", e, ".", w));
      ASSERT_GE(id, 0) << w;
      EXPECT_TRUE(same(u, id, d, d.find(str_cat("decoder.layers.1.mlp.", w)))) << "expert " << e << " " << w;
    }
  for (const char* name : {"decoder.layers.0.self_attention.linear_qkv.weight", "embedding.word_embeddings.weight"})
    EXPECT_TRUE(same(u, u.find(name), d, d.find(name))) << name;
  const ParamBuffer& f = fresh.model().params();
  const int router = u.find("decoder.layers.0.mlp.router.weight");
  ASSERT_GE(router, 0);
  EXPECT_TRUE(same(u, router, f, f.find("decoder.layers.0.mlp.router.weight")));  // initial values
  EXPECT_TRUE(std::filesystem::exists(moe_dir + "/iter_0000001/metadata.json"));
  const double upcycled_first = up.train(1)[0];
  EXPECT_NEAR(upcycled_first, dense_next, 1e-5 * dense_next);
  // A second upcycling into the same --save is refused (Megatron's message), as is a MoE --load.
  TrainingRun again(testing::join({moe, {"--moe-use-upcycling", "--load", dense_dir, "--save", moe_dir,
                                          "--save-interval", "3"}}));
  Status st = upcycle_checkpoint(again.args, *again.engine, again.trainer->state());
  EXPECT_NE(st.message().find("The upcycling destination directory already exists"), std::string::npos)
      << st.message();
  const std::string other = temp_dir("upcycle_other");
  TrainingRun from_moe(testing::join({moe, {"--moe-use-upcycling", "--load", moe_dir, "--save", other,
                                             "--save-interval", "3"}}));
  st = upcycle_checkpoint(from_moe.args, *from_moe.engine, from_moe.trainer->state());
  EXPECT_NE(st.message().find("is a MoE model (num_experts = 4); expected a dense one"), std::string::npos)
      << st.message();
  for (const std::string& dir : {dense_dir, moe_dir, other}) std::filesystem::remove_all(dir);
}

TEST(Resume, FinetuneLoadsWeightsOnly) {
  const std::string dir = temp_dir("finetune");
  TrainingRun first({"--save", dir, "--save-interval", "3"});
  first.train(2);
  ASSERT_TRUE(first.save().ok());
  TrainingRun second({"--load", dir, "--finetune"});
  bool loaded = false;
  ASSERT_TRUE(second.load(&loaded).ok());
  EXPECT_EQ(second.trainer->state().iteration, 0);
  EXPECT_EQ(second.trainer->state().consumed_train_samples, 0);
  EXPECT_EQ(second.engine->optimizer->steps_taken(), 0);
  EXPECT_EQ(second.engine->scheduler->num_steps(), 0);
  EXPECT_EQ(second.model().params().flat_params().data<float>()[5], first.model().params().flat_params().data<float>()[5]);
  std::filesystem::remove_all(dir);
}

// --ckpt-step N loads iter_N of --load, not the tracker's latest, and continues from it exactly.
TEST(Resume, CkptStepLoadsThatIteration) {
  const std::string dir = temp_dir("ckpt_step");
  TrainingRun whole({});
  std::vector<double> expected = whole.train(6);
  TrainingRun first({"--save", dir, "--save-interval", "2"});
  first.train(2);
  ASSERT_TRUE(first.save().ok());
  first.train(2);
  ASSERT_TRUE(first.save().ok());  // the tracker now says 4
  TrainingRun second({"--load", dir, "--ckpt-step", "2"});
  bool loaded = false;
  ASSERT_TRUE(second.load(&loaded).ok());
  ASSERT_TRUE(loaded);
  EXPECT_EQ(second.trainer->state().iteration, 2);
  std::vector<double> b = second.train(4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(b[i], expected[2 + i]) << "iteration " << 3 + i;
  TrainingRun missing({"--load", dir, "--ckpt-step", "3"});
  Status st = missing.load(&loaded);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("--ckpt-step 3"), std::string::npos) << st.message();
  std::filesystem::remove_all(dir);
}

// --pretrained-checkpoint: used as --finetune when --load holds no checkpoint; ignored when it does.
TEST(Resume, PretrainedCheckpointFinetunesWhenLoadIsEmpty) {
  const std::string dir = temp_dir("pretrained"), empty = temp_dir("pretrained_empty");
  TrainingRun first({"--save", dir, "--save-interval", "3"});
  first.train(3);
  ASSERT_TRUE(first.save().ok());
  TrainingRun finetune({"--load", dir, "--finetune"});
  TrainingRun pretrained({"--load", empty, "--pretrained-checkpoint", dir});
  bool loaded = false;
  ASSERT_TRUE(finetune.load(&loaded).ok());
  ASSERT_TRUE(pretrained.load(&loaded).ok());
  ASSERT_TRUE(loaded);
  EXPECT_EQ(pretrained.trainer->state().iteration, 0);
  EXPECT_EQ(pretrained.engine->optimizer->steps_taken(), 0);
  EXPECT_EQ(pretrained.train(2), finetune.train(2));
  TrainingRun resumed({"--load", dir, "--pretrained-checkpoint", empty});  // --load has one: a plain resume
  ASSERT_TRUE(resumed.load(&loaded).ok());
  EXPECT_EQ(resumed.trainer->state().iteration, 3);
  TrainingRun neither({"--load", empty, "--pretrained-checkpoint", empty});
  Status st = neither.load(&loaded);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("--pretrained-checkpoint"), std::string::npos) << st.message();
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(empty);
}

// The saved learning-rate schedule against a resumed run's flags: --use-checkpoint-opt_param-scheduler
// takes the checkpoint's (and continues exactly), --override-opt_param-scheduler and no flag keep the
// new flags'.
TEST(Resume, OptParamSchedulerFromCheckpointOrFlags) {
  const std::string dir = temp_dir("scheduler");
  TrainingRun whole({});
  std::vector<double> expected = whole.train(6);
  TrainingRun first({"--save", dir, "--save-interval", "3"});
  first.train(3);
  ASSERT_TRUE(first.save().ok());
  const std::vector<std::string> other_schedule = {"--load", dir, "--lr", "1e-3", "--lr-decay-style", "linear",
                                                   "--lr-warmup-iters", "1", "--min-lr", "1e-5"};
  TrainingRun from_checkpoint(testing::join({other_schedule, {"--use-checkpoint-opt_param-scheduler"}}));
  bool loaded = false;
  ASSERT_TRUE(from_checkpoint.load(&loaded).ok());
  const LrSchedule& s = from_checkpoint.engine->scheduler->schedule();
  EXPECT_DOUBLE_EQ(s.max_lr, 3e-3);
  EXPECT_DOUBLE_EQ(s.min_lr, 0.0);
  EXPECT_EQ(s.decay_style, "cosine");
  EXPECT_DOUBLE_EQ(s.warmup_steps, 2 * 4);  // samples: --lr-warmup-iters 2 x global batch 4
  std::vector<double> b = from_checkpoint.train(3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(b[i], expected[3 + i]) << "iteration " << 4 + i;
  for (const std::vector<std::string>& extra : {std::vector<std::string>{"--override-opt_param-scheduler"},
                                                std::vector<std::string>{}}) {
    TrainingRun from_flags(testing::join({other_schedule, extra}));
    ASSERT_TRUE(from_flags.load(&loaded).ok());
    EXPECT_DOUBLE_EQ(from_flags.engine->scheduler->schedule().max_lr, 1e-3);
    EXPECT_EQ(from_flags.engine->scheduler->schedule().decay_style, "linear");
    EXPECT_EQ(from_flags.engine->scheduler->num_steps(), 3 * 4);
  }
  std::filesystem::remove_all(dir);
}

// --noop-layers: the checkpoint has no tensors for the noop layer, a run with the same flag resumes
// from it, one without it is told what is missing; the FLOPs of the log line count real layers.
TEST(Resume, NoopLayersCheckpointAndFlops) {
  const std::string dir = temp_dir("noop");
  TrainingRun first({"--save", dir, "--save-interval", "3", "--noop-layers", "1"});
  EXPECT_EQ(first.trainer->flops_model().num_layers, 1);
  for (const ParamSpec& s : first.model().params().specs()) EXPECT_EQ(s.name.find("decoder.layers.1."), std::string::npos);
  first.train(2);
  ASSERT_TRUE(first.save().ok());
  TrainingRun again({"--load", dir, "--noop-layers", "1"});
  bool loaded = false;
  ASSERT_TRUE(again.load(&loaded).ok());
  EXPECT_TRUE(loaded);
  EXPECT_EQ(again.model().params().flat_params().data<float>()[7], first.model().params().flat_params().data<float>()[7]);
  TrainingRun dense({"--load", dir});
  const Status st = dense.load(&loaded);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("decoder.layers.1."), std::string::npos) << st.message();
  EXPECT_EQ(dense.trainer->flops_model().num_layers, 2);
  std::filesystem::remove_all(dir);
}

TEST(Resume, MissingCheckpointWarnsOrFails) {
  const std::string dir = temp_dir("missing");
  TrainingRun r({"--load", dir});
  bool loaded = true;
  EXPECT_TRUE(r.load(&loaded).ok());
  EXPECT_FALSE(loaded);
  TrainingRun strict({"--load", dir, "--exit-on-missing-checkpoint"});
  Status st = strict.load(&loaded);
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
}

TEST(Resume, MismatchedModelIsAClearError) {
  const std::string dir = temp_dir("mismatch");
  TrainingRun first({"--save", dir, "--save-interval", "3"});
  ASSERT_TRUE(first.save().ok());
  TrainingRun other({"--load", dir, "--num-layers", "3"});
  bool loaded = false;
  Status st = other.load(&loaded);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("num_layers = 2, this run has 3"), std::string::npos) << st.message();
  std::filesystem::remove_all(dir);
}

TEST(Resume, TruncatedShardIsAClearError) {
  const std::string dir = temp_dir("truncated");
  TrainingRun first({"--save", dir, "--save-interval", "3"});
  ASSERT_TRUE(first.save().ok());
  std::string shard;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/iter_0000000"))
    if (e.path().extension() == ".safetensors") shard = e.path().string();
  ASSERT_FALSE(shard.empty());
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) / 2);
  TrainingRun second({"--load", dir});
  bool loaded = false;
  Status st = second.load(&loaded);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("shard_00000.safetensors"), std::string::npos) << st.message();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gale
