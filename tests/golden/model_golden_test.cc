// Gale's model, loss, optimizer and training loop against the independent float64 PyTorch
// reference (tools/reference/gpt_reference.py): logits, loss, every gradient, and a 10-iteration
// run with gradient accumulation (logged loss, learning rate, grad norm, final parameters; with
// MoE also the logged load-balancing and z losses, whose gradients are in every gradient checked).
#include <gtest/gtest.h>

#include "golden/fixture_dataset.h"
#include "golden/golden_fixture.h"
#include "kernels/cpu/fused_ops.h"
#include "model/gpt_model.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "train/model_setup.h"
#include "train/engine.h"
#include "train/trainer.h"

namespace gale {
namespace {

using golden::GoldenFixture;

using golden::FixtureDataset;

struct GoldenRun {
  ArgParser parser{"gale pretrain", "golden"};
  Arguments args;
  OpTable ops = reference_ops();
  std::unique_ptr<GPTModel> model;

  explicit GoldenRun(const GoldenFixture& f, bool fused = false) {
    if (fused) GALE_CHECK_OK(install_all_fused_kernels(ops, Isa::kAvx512));
    add_all_pretrain_args(parser, args);
    std::vector<std::string> argv = {"gale"};
    argv.insert(argv.end(), f.megatron_args().begin(), f.megatron_args().end());
    for (const char* extra : {"--mock-data", "--eval-iters", "0", "--log-interval", "1000"}) argv.push_back(extra);
    if (f.model().reset_attention_mask) argv.push_back("--reset-attention-mask");
    if (f.model().reset_position_ids) argv.push_back("--reset-position-ids");
    std::vector<char*> ptrs;
    for (auto& a : argv) ptrs.push_back(a.data());
    GALE_CHECK_OK(parser.parse(static_cast<int>(ptrs.size()), ptrs.data()));
    GALE_CHECK_OK(validate_all_pretrain_args(args, parser, 1));
    args.model.padded_vocab_size = f.model().padded_vocab_size;
    ModelConfig config = model_config_from_args(args);
    model = std::make_unique<GPTModel>(config, single_process_partition(config), &ops);
    load_weights(f);
  }

  void load_weights(const GoldenFixture& f) {
    ParamBuffer& pb = model->params();
    int loaded = 0;
    for (const auto& [name, w] : f.initial_weights()) {
      int id = pb.find(name);
      GALE_CHECK_GE(id, 0) << "fixture parameter " << name << " is not in Gale's model";
      GALE_CHECK(pb.spec(id).local_shape() == w.shape()) << name;
      pb.param(id).copy_from(w);
      ++loaded;
    }
    GALE_CHECK_EQ(loaded, pb.size()) << "Gale's model has parameters the fixture lacks";
  }

  MicroBatch micro_batch(const GoldenFixture& f, int iteration, int m) const {
    FixtureDataset data(f);
    const int64_t mbs = f.training().micro_batch_size, S = f.model().seq_length;
    MicroBatch mb;
    mb.B = mbs;
    mb.S = S;
    for (int64_t b = 0; b < mbs; ++b) {
      TrainingSample s;
      GALE_CHECK_OK(data.get(static_cast<int64_t>(iteration) * f.training().global_batch_size + m * mbs + b, &s));
      mb.tokens.insert(mb.tokens.end(), s.tokens.begin(), s.tokens.end());
      mb.labels.insert(mb.labels.end(), s.labels.begin(), s.labels.end());
      mb.loss_mask.insert(mb.loss_mask.end(), s.loss_mask.begin(), s.loss_mask.end());
      mb.position_ids.insert(mb.position_ids.end(), s.position_ids.begin(), s.position_ids.end());
      if (f.model().reset_attention_mask) mb.document_ids.insert(mb.document_ids.end(), s.document_ids.begin(), s.document_ids.end());
    }
    return mb;
  }
};

class Golden : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto f = GoldenFixture::load(GetParam());
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    fixture_ = std::make_unique<GoldenFixture>(std::move(f).value());
  }
  std::unique_ptr<GoldenFixture> fixture_;
};

// Fixtures with a forward record (optimizer-only variants such as gpt_sgd share their model's).
std::vector<std::string> fixtures_with_forward() {
  std::vector<std::string> out;
  for (const std::string& name : golden::golden_fixture_names()) {
    auto f = GoldenFixture::load(name);
    if (!f.ok() || f.value().has_forward()) out.push_back(name);  // a load error fails in SetUp
  }
  return out;
}

class GoldenForward : public Golden {};

TEST_P(GoldenForward, ForwardLogitsLossAndGradients) {
  const GoldenFixture& f = *fixture_;
  GoldenRun s(f);
  MicroBatch mb = s.micro_batch(f, 0, 0);
  Tensor logits = s.model->forward_logits(mb, Tensor());
  EXPECT_TRUE(golden::compare_tensors(logits, f.logits(), 1e-4, 2e-6, "logits").ok())
      << golden::compare_tensors(logits, f.logits(), 1e-4, 2e-6, "logits").message();
  GPTModel::LossSums sums;
  s.model->params().zero_grads();
  s.model->forward(0, mb, Tensor(), /*training=*/true, &sums);
  EXPECT_NEAR(sums.loss_sum / sums.tokens, f.forward_loss(), 1e-6 * f.forward_loss());
  s.model->backward(0, Tensor(), static_cast<float>(1.0 / sums.tokens));
  const ParamBuffer& pb = s.model->params();
  for (int id = 0; id < pb.size(); ++id) {
    const std::string& name = pb.spec(id).name;
    if (f.has_full_grads()) {
      ASSERT_TRUE(f.grads().count(name)) << name;
      Status st = golden::compare_tensors(pb.grad(id), f.grads().at(name), 2e-3, 2e-7, name);
      EXPECT_TRUE(st.ok()) << st.message();
    } else {
      ASSERT_TRUE(f.grad_summaries().count(name)) << name;
      Status st = golden::check_summary(pb.grad(id), f.grad_summaries().at(name), 2e-3, 2e-7, name);
      EXPECT_TRUE(st.ok()) << st.message();
    }
  }
}

void train_ten_iterations(const GoldenFixture& f, bool fused) {
  GoldenRun s(f, fused);
  Engine engine;
  engine.ops = s.ops;
  engine.chunks.push_back(std::move(s.model));
  std::vector<OptimizedBuffer> buffers(1);
  buffers[0].params = &engine.chunks[0]->params();
  if (s.args.training.optimizer == "muon") set_muon_params(*engine.chunks[0], &buffers[0]);
  set_mup_params(*engine.chunks[0], s.args, &buffers[0]);  // --use-mup's learning-rate and eps groups
  engine.optimizer = std::make_unique<Optimizer>(optimizer_config_from_args(s.args), std::move(buffers), &engine.ops,
                                                 make_self_communicator("mp"));
  engine.scheduler = std::make_unique<LrScheduler>(lr_schedule_from_args(s.args));
  engine.chunks[0]->set_ops(&engine.ops);
  LrScheduler& scheduler = *engine.scheduler;
  FixtureDataset data(f);
  Trainer trainer(s.args, &engine, &data, nullptr, nullptr);
  const golden::GoldenSeries& series = f.train_series();
  ASSERT_EQ(static_cast<int>(series.loss.size()), f.num_iterations());
  for (int k = 0; k < f.num_iterations(); ++k) {
    EXPECT_NEAR(scheduler.lr(), series.lr_used[k], 1e-12) << "learning rate used by iteration " << k + 1;
    auto r = trainer.train_step();
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    SCOPED_TRACE(fused ? "fused kernels" : "reference kernels");
    ASSERT_TRUE(r->step.applied);
    EXPECT_NEAR(r->loss_sum / r->tokens, series.loss[k], 2e-5 * series.loss[k]) << "loss of iteration " << k + 1;
    EXPECT_NEAR(r->step.grad_norm, series.grad_norm[k], 1e-3 * series.grad_norm[k]) << "grad norm of iteration " << k + 1;
    EXPECT_NEAR(scheduler.lr(), series.lr[k], 1e-12) << "logged learning rate of iteration " << k + 1;
    if (!series.load_balancing_loss.empty()) {  // MoE: the logged auxiliary losses
      EXPECT_NEAR(r->load_balancing_loss[kMoeAux], series.load_balancing_loss[k], 1e-5 * series.load_balancing_loss[k])
          << "load_balancing_loss of iteration " << k + 1;
      EXPECT_NEAR(r->z_loss, series.z_loss[k], 1e-5 * series.z_loss[k]) << "z_loss of iteration " << k + 1;
    } else {
      EXPECT_EQ(r->load_balancing_loss[kMoeAux], 0.0);
    }
  }
  EXPECT_EQ(trainer.state().consumed_train_samples, f.num_iterations() * f.training().global_batch_size);
  const ParamBuffer& pb = engine.chunks[0]->params();
  for (int id = 0; id < pb.size(); ++id) {
    const std::string& name = pb.spec(id).name;
    ASSERT_TRUE(f.final_param_summaries().count(name)) << name;
    Status st = golden::check_summary(pb.param(id), f.final_param_summaries().at(name), 1e-3, 1e-6, name,
                                      &f.initial_weight(name));
    EXPECT_TRUE(st.ok()) << st.message();
  }
}

TEST_P(Golden, TenIterationsOfTraining) { train_ten_iterations(*fixture_, false); }

// The same run with every fused kernel (flash attention, fused LM head finishing its backward in
// forward, fused norms/activations/RoPE/AdamW): the same reference values, same tolerances.
TEST_P(Golden, TenIterationsOfTrainingWithFusedKernels) { train_ten_iterations(*fixture_, true); }

INSTANTIATE_TEST_SUITE_P(Fixtures, Golden, ::testing::ValuesIn(golden::golden_fixture_names()),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenForward, ::testing::ValuesIn(fixtures_with_forward()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace gale
