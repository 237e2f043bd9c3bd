// LoRA against the independent float64 PyTorch reference (tools/reference/lora_reference.py,
// tests/data/golden/lora_llama/): the llama golden model with adapters on all four linears —
// logits, loss, every adapter gradient, and three AdamW iterations through Gale's trainer
// (logged loss and grad norm, final adapters) with the base weights bit-identical afterwards.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ckpt/safetensors.h"
#include "golden/fixture_dataset.h"
#include "golden/golden_fixture.h"
#include "model/gpt_model.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "train/engine.h"
#include "train/model_setup.h"
#include "train/trainer.h"

namespace gale {
namespace {

using golden::GoldenFixture;

std::string lora_dir() { return golden::golden_dir() + "/lora_llama"; }

std::map<std::string, Tensor> read_all(const std::string& file) {
  auto f = SafetensorsFile::open(lora_dir() + "/" + file);
  GALE_CHECK(f.ok()) << f.status().to_string();
  std::map<std::string, Tensor> out;
  for (const SafetensorsEntry& e : f.value().entries()) {
    auto t = f.value().read(e.name, DType::kF32);
    GALE_CHECK(t.ok()) << t.status().to_string();
    out[e.name] = t.value();
  }
  return out;
}

nlohmann::json fixture_json() {
  std::ifstream in(lora_dir() + "/fixture.json");
  return nlohmann::json::parse(in);
}

using golden::FixtureDataset;

struct LoraRun {
  GoldenFixture f = GoldenFixture::load("llama").value();
  nlohmann::json fixture = fixture_json();
  ArgParser parser{"gale pretrain", "golden"};
  Arguments args;
  OpTable ops = reference_ops();
  std::unique_ptr<GPTModel> model;

  LoraRun() {
    add_all_pretrain_args(parser, args);
    std::vector<std::string> argv = {"gale"};
    argv.insert(argv.end(), f.megatron_args().begin(), f.megatron_args().end());
    for (const std::string& extra : std::vector<std::string>{"--mock-data", "--eval-iters", "0", "--log-interval", "1000", "--lora-r",
                                    std::to_string(fixture["lora_r"].get<int>()), "--lora-alpha",
                                    std::to_string(fixture["lora_alpha"].get<int>()), "--lora-target-modules"})
      argv.push_back(extra);
    for (const auto& t : fixture["lora_target_modules"]) argv.push_back(t.get<std::string>());
    std::vector<char*> ptrs;
    for (auto& a : argv) ptrs.push_back(a.data());
    GALE_CHECK_OK(parser.parse(static_cast<int>(ptrs.size()), ptrs.data()));
    GALE_CHECK_OK(validate_all_pretrain_args(args, parser, 1));
    args.model.padded_vocab_size = f.model().padded_vocab_size;
    ModelConfig config = model_config_from_args(args);
    model = std::make_unique<GPTModel>(config, single_process_partition(config), &ops);
    ParamBuffer& pb = model->params();
    int loaded = 0;
    for (const auto& [name, w] : f.initial_weights()) {
      const int id = pb.find(name);
      GALE_CHECK_GE(id, 0) << name;
      pb.param(id).copy_from(w);
      ++loaded;
    }
    for (const auto& [name, w] : read_all("lora_weights.safetensors")) {
      const int id = pb.find(name);
      GALE_CHECK_GE(id, 0) << "fixture adapter " << name << " is not in Gale's model";
      GALE_CHECK(pb.spec(id).local_shape() == w.shape()) << name;
      pb.param(id).copy_from(w);
      ++loaded;
    }
    GALE_CHECK_EQ(loaded, pb.size()) << "Gale's model has parameters the fixtures lack";
  }
};

TEST(LoraGolden, ForwardLogitsLossAndAdapterGradients) {
  LoraRun s;
  FixtureDataset data(s.f);
  MicroBatch mb;
  mb.B = s.f.training().micro_batch_size;
  mb.S = s.f.model().seq_length;
  for (int64_t b = 0; b < mb.B; ++b) {
    TrainingSample t;
    ASSERT_TRUE(data.get(b, &t).ok());
    mb.tokens.insert(mb.tokens.end(), t.tokens.begin(), t.tokens.end());
    mb.labels.insert(mb.labels.end(), t.labels.begin(), t.labels.end());
    mb.loss_mask.insert(mb.loss_mask.end(), t.loss_mask.begin(), t.loss_mask.end());
    mb.position_ids.insert(mb.position_ids.end(), t.position_ids.begin(), t.position_ids.end());
  }
  const auto forward = read_all("forward.safetensors");
  Tensor logits = s.model->forward_logits(mb, Tensor());
  Status st = golden::compare_tensors(logits, forward.at("logits"), 1e-4, 2e-6, "logits");
  EXPECT_TRUE(st.ok()) << st.message();
  GPTModel::LossSums sums;
  ParamBuffer& pb = s.model->params();
  pb.zero_grads();
  s.model->forward(0, mb, Tensor(), /*training=*/true, &sums);
  const double loss = s.fixture["forward"]["loss"].get<double>();
  EXPECT_NEAR(sums.loss_sum / sums.tokens, loss, 1e-6 * loss);
  s.model->backward(0, Tensor(), static_cast<float>(1.0 / sums.tokens));
  const auto grads = read_all("grads.safetensors");
  int checked = 0;
  for (int id = 0; id < pb.size(); ++id) {
    if (!pb.spec(id).trainable) continue;
    const std::string& name = pb.spec(id).name;
    ASSERT_TRUE(grads.count(name)) << name;
    st = golden::compare_tensors(pb.grad(id), grads.at(name), 2e-3, 2e-7, name);
    EXPECT_TRUE(st.ok()) << st.message();
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(grads.size()));
}

TEST(LoraGolden, ThreeAdamWIterationsTrainTheAdaptersOnly) {
  LoraRun s;
  Engine engine;
  engine.ops = s.ops;
  engine.chunks.push_back(std::move(s.model));
  ParamBuffer& pb = engine.chunks[0]->params();
  engine.optimizer =
      std::make_unique<Optimizer>(optimizer_config_from_args(s.args), &pb, &engine.ops, make_self_communicator("mp"));
  engine.scheduler = std::make_unique<LrScheduler>(lr_schedule_from_args(s.args));
  engine.chunks[0]->set_ops(&engine.ops);
  const std::vector<float> base(pb.flat_params().data<float>() + pb.trainable_numel(),
                                pb.flat_params().data<float>() + pb.numel());
  FixtureDataset data(s.f);
  Trainer trainer(s.args, &engine, &data, nullptr, nullptr);
  const nlohmann::json& series = s.fixture["train"];
  const int iters = s.fixture["train_iters"].get<int>();
  for (int k = 0; k < iters; ++k) {
    EXPECT_NEAR(engine.scheduler->lr(), series["lr_used"][k].get<double>(), 1e-12);
    auto r = trainer.train_step();
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_TRUE(r->step.applied);
    const double loss = series["loss"][k].get<double>(), norm = series["grad_norm"][k].get<double>();
    EXPECT_NEAR(r->loss_sum / r->tokens, loss, 2e-5 * loss) << "loss of iteration " << k + 1;
    EXPECT_NEAR(r->step.grad_norm, norm, 1e-3 * norm) << "grad norm of iteration " << k + 1;
  }
  const auto final_params = read_all("final.safetensors");
  for (int id = 0; id < pb.size(); ++id) {
    if (!pb.spec(id).trainable) continue;
    const std::string& name = pb.spec(id).name;
    Status st = golden::compare_tensors(pb.param(id), final_params.at(name), 1e-3, 1e-6, name);
    EXPECT_TRUE(st.ok()) << st.message();
  }
  EXPECT_EQ(0, std::memcmp(base.data(), pb.flat_params().data<float>() + pb.trainable_numel(),
                           base.size() * sizeof(float)))
      << "a frozen base weight changed during training";
}

}  // namespace
}  // namespace gale
