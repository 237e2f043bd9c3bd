// --use-mup (train/mup.h, train/arguments_mup.cc) against the float64 reference of Megatron-LM main's
// formulas (tools/reference/mup_reference.py -> tests/data/reference/mup/mup.json): the sampled
// init std of every weight class, the width multiplier, softmax scale and multipliers of several
// flag sets, the per-parameter learning-rate and Adam-eps groups of Adam, SGD, Lion and Muon with
// and without --decoupled-lr, the µP group's scheduled rate, the refusals, and the checkpoint args.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/gpt_model.h"
#include "pretrain_cli.h"
#include "testing.h"
#include "train/checkpoint_args.h"
#include "train/engine.h"
#include "train/model_setup.h"
#include "train/mup.h"

namespace gale {
namespace {

const nlohmann::json& reference() {
  static const nlohmann::json j = [] {
    std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/mup/mup.json");
    GALE_CHECK(in.good()) << "tests/data/reference/mup/mup.json";
    return nlohmann::json::parse(in);
  }();
  return j;
}

// The reference's model (3 layers, hidden 128, untied output layer) and run flags, then `extra`.
std::vector<std::string> model_flags(const std::vector<std::string>& extra) {
  std::vector<std::string> f = reference()["model_flags"].get<std::vector<std::string>>();
  for (const char* s : {"--micro-batch-size", "2", "--train-iters", "10", "--lr", "1e-3", "--min-lr", "1e-4",
                        "--mock-data", "--make-vocab-size-divisible-by", "64"})
    f.push_back(s);
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

// Validated arguments of `flags` (vocabulary 250, padded to 256).
Arguments parsed(const std::vector<std::string>& flags) {
  testing::PretrainCli cli;
  GALE_CHECK_OK(cli.parse(flags));
  cli.args.model.padded_vocab_size = 256;
  return cli.args;
}

TEST(MupReference, InitStdOfEveryWeightClass) {
  const Arguments a = parsed(model_flags(reference()["init"]["flags"].get<std::vector<std::string>>()));
  const ModelConfig c = model_config_from_args(a);
  EXPECT_DOUBLE_EQ(c.mup.width_mult, reference()["init"]["width_mult"].get<double>());
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(1234);
  const ParamBuffer& pb = model.params();
  const nlohmann::json& want = reference()["init"]["std"];
  int checked = 0;
  for (int id = 0; id < pb.size(); ++id) {
    const ParamSpec& s = pb.spec(id);
    if (!want.contains(s.name)) {
      EXPECT_NE(s.init, InitKind::kNormal) << s.name << ": a normal-initialised weight the reference lacks";
      continue;
    }
    const float* p = pb.param_data(id);
    double sq = 0.0;
    for (int64_t i = 0; i < s.local_numel(); ++i) sq += double(p[i]) * p[i];
    const double sampled = std::sqrt(sq / static_cast<double>(s.local_numel()));
    // The smallest matrix has 8192 elements: the sampled std is within 4 % with a wide margin
    // (its relative standard error is 1/√(2n) < 0.8 %); the classes differ by 2× or more.
    EXPECT_NEAR(sampled, want[s.name].get<double>(), 0.04 * want[s.name].get<double>()) << s.name;
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(want.size()));
}

TEST(MupReference, WidthMultiplierSoftmaxScaleAndMultipliers) {
  for (const nlohmann::json& k : reference()["scales"]) {
    const std::vector<std::string> extra = k["flags"].get<std::vector<std::string>>();
    const ModelConfig c = model_config_from_args(parsed(model_flags(extra)));
    SCOPED_TRACE(k["flags"].dump());
    EXPECT_DOUBLE_EQ(c.mup.width_mult, k["width_mult"].get<double>());
    EXPECT_FLOAT_EQ(c.softmax_scale(), static_cast<float>(k["softmax_scale"].get<double>()));
    EXPECT_FLOAT_EQ(c.mup.output_mult, static_cast<float>(k["output_mult"].get<double>()));
    EXPECT_FLOAT_EQ(c.mup.embedding_mult, static_cast<float>(k["embedding_mult"].get<double>()));
  }
}

// The optimizer's groups: OptimizedBuffer::mup_lr / ::mup_eps marked as the reference's per-parameter
// multipliers say (a multiplier other than 1 marks it), the group multipliers in the optimizer
// configuration, for Adam, SGD, Lion and Muon, with and without --decoupled-lr.
TEST(MupReference, OptimizerGroupsOfEveryOptimizer) {
  for (const nlohmann::json& g : reference()["optimizer_groups"]) {
    const std::string optimizer = g["optimizer"].get<std::string>();
    const bool decoupled = g["decoupled_lr"].get<bool>();
    SCOPED_TRACE(optimizer + (decoupled ? " with --decoupled-lr" : ""));
    std::vector<std::string> extra = g["flags"].get<std::vector<std::string>>();
    extra.insert(extra.end(), {"--optimizer", optimizer});
    if (decoupled) extra.insert(extra.end(), {"--decoupled-lr", "2e-3"});
    const Arguments a = parsed(model_flags(extra));
    const ModelConfig c = model_config_from_args(a);
    OpTable ops = reference_ops();
    GPTModel model(c, single_process_partition(c), &ops);
    OptimizedBuffer buffer{&model.params(), {}, std::nullopt};
    if (decoupled) {  // as build_engine marks them
      buffer.decoupled_lr.assign(static_cast<size_t>(model.params().size()), false);
      for (int id : {model.word_embedding_id(), model.output_weight_id()}) buffer.decoupled_lr[static_cast<size_t>(id)] = true;
    }
    if (optimizer == "muon" || optimizer == "lion") set_muon_params(model, &buffer);
    set_mup_params(model, a, &buffer);
    const OptimizerConfig oc = optimizer_config_from_args(a);
    EXPECT_DOUBLE_EQ(oc.mup_lr_mult, g["group_lr_mult"].get<double>());
    EXPECT_DOUBLE_EQ(oc.mup_eps_mult, g["group_eps_mult"].get<double>());
    const ParamBuffer& pb = model.params();
    ASSERT_EQ(buffer.mup_lr.size(), static_cast<size_t>(pb.size()));
    ASSERT_EQ(buffer.mup_eps.size(), static_cast<size_t>(pb.size()));
    int scaled_lr = 0, scaled_eps = 0;
    for (int id = 0; id < pb.size(); ++id) {
      const std::string& name = pb.spec(id).name;
      ASSERT_TRUE(g["lr_mult"].contains(name)) << name;
      const double lr = g["lr_mult"][name].get<double>(), eps = g["eps_mult"][name].get<double>();
      EXPECT_EQ(buffer.mup_lr[static_cast<size_t>(id)], lr != 1.0) << name;
      EXPECT_EQ(buffer.mup_eps[static_cast<size_t>(id)], eps != 1.0) << name;
      if (lr != 1.0) EXPECT_DOUBLE_EQ(lr, oc.mup_lr_mult) << name;
      if (eps != 1.0) EXPECT_DOUBLE_EQ(eps, oc.mup_eps_mult) << name;
      scaled_lr += lr != 1.0;
      scaled_eps += eps != 1.0;
    }
    // Muon leaves everything at the base rate (its matrices are its own, the rest vector-like).
    if (optimizer == "muon") EXPECT_EQ(scaled_lr, 0);
    else EXPECT_GT(scaled_lr, 0);
    EXPECT_EQ(scaled_eps > 0, optimizer == "adam");
  }
}

// At the base width (m = 1) Megatron adds no overrides: every parameter at the base rate and eps.
TEST(Mup, NoGroupsAtTheBaseWidth) {
  const Arguments a = parsed(model_flags({"--use-mup", "--optimizer", "sgd"}));
  const ModelConfig c = model_config_from_args(a);
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  OptimizedBuffer buffer{&model.params(), {}, std::nullopt};
  set_mup_params(model, a, &buffer);
  EXPECT_TRUE(buffer.mup_lr.empty());
  EXPECT_TRUE(buffer.mup_eps.empty());
  EXPECT_EQ(optimizer_config_from_args(a).mup_lr_mult, 1.0);
  EXPECT_EQ(c.init_std, 0.05f);                    // σ/√1
  EXPECT_EQ(c.softmax_scale(), 1.0f / 32.0f);      // still 1/kv_channels
}

// One SGD step (no momentum, weight decay or clipping) of the same µP model and gradients, once with
// the µP group's rate and once with it forced to the base rate: each parameter's update is
// lr·mult·g, so the ratio of the two updates is the reference's multiplier of its class (the
// embeddings, output layer, norms and biases ×4, the matrices ×1).
TEST(Mup, SgdStepScalesTheVectorLikeUpdates) {
  const std::vector<std::string> run = {"--optimizer", "sgd", "--sgd-momentum", "0", "--weight-decay", "0",
                                        "--clip-grad", "0", "--global-batch-size", "2", "--seed", "5",
                                        "--mup-base-hidden-size", "32", "--lr-warmup-iters", "0",
                                        "--lr-decay-style", "constant"};
  const nlohmann::json& g = reference()["optimizer_groups"];
  const nlohmann::json* sgd = nullptr;
  for (const nlohmann::json& x : g)
    if (x["optimizer"] == "sgd" && !x["decoupled_lr"].get<bool>()) sgd = &x;
  ASSERT_NE(sgd, nullptr);
  std::vector<std::string> flags = model_flags(run);
  flags.push_back("--use-mup");
  Arguments a = parsed(flags);
  const ModelConfig c = model_config_from_args(a);
  OpTable ops = reference_ops();
  auto step = [&](double mup_lr_mult) {
    auto model = std::make_unique<GPTModel>(c, single_process_partition(c), &ops);
    model->params().initialize(77);
    OptimizedBuffer buffer{&model->params(), {}, std::nullopt};
    set_mup_params(*model, a, &buffer);
    OptimizerConfig oc = optimizer_config_from_args(a);
    oc.mup_lr_mult = mup_lr_mult;
    Optimizer opt(oc, {buffer}, &ops, make_self_communicator("mp"));
    const MicroBatch mb = [&] {
      MicroBatch m;
      m.B = 2;
      m.S = 16;
      for (int64_t i = 0; i < m.B * m.S; ++i) {
        m.tokens.push_back(static_cast<int32_t>((i * 37) % 250));
        m.labels.push_back(static_cast<int32_t>((i * 53 + 1) % 250));
        m.loss_mask.push_back(1.0f);
        m.position_ids.push_back(static_cast<int32_t>(i % 16));
      }
      return m;
    }();
    model->params().zero_grads();
    GPTModel::LossSums sums;
    model->forward(0, mb, Tensor(), true, &sums);
    model->backward(0, Tensor(), static_cast<float>(1.0 / sums.tokens));
    std::vector<float> before(model->params().flat_params().data<float>(),
                              model->params().flat_params().data<float>() + model->params().numel());
    const double lr = 1.0;  // updates far above the parameters' f32 spacing
    EXPECT_TRUE(opt.step(lr, 0.0, false, 1.0f, nullptr, std::nullopt, lr * oc.mup_lr_mult).applied);
    std::vector<double> moved(static_cast<size_t>(model->params().size()));
    for (int id = 0; id < model->params().size(); ++id) {
      const ParamSpec& s = model->params().spec(id);
      double d = 0.0;
      for (int64_t i = 0; i < s.local_numel(); ++i) {
        const double x = double(model->params().param_data(id)[i]) - before[static_cast<size_t>(s.offset + i)];
        d += x * x;
      }
      moved[static_cast<size_t>(id)] = std::sqrt(d);
    }
    return std::make_pair(std::move(model), moved);
  };
  auto [mup_model, mup_moved] = step(optimizer_config_from_args(a).mup_lr_mult);
  auto [base_model, base_moved] = step(1.0);
  const ParamBuffer& pb = mup_model->params();
  for (int id = 0; id < pb.size(); ++id) {
    const std::string& name = pb.spec(id).name;
    const double want = (*sgd)["lr_mult"][name].get<double>();
    if (base_moved[static_cast<size_t>(id)] == 0.0) continue;  // e.g. rows of unused positions only
    EXPECT_NEAR(mup_moved[static_cast<size_t>(id)] / base_moved[static_cast<size_t>(id)], want, 1e-3 * want) << name;
  }
}

// One Adam step of a µP model (m = 4, no clipping or weight decay, an eps comparable to the
// gradients): at step 1 m̂ = g and v̂ = g², so each element moves by lr·k·g / (|g| + eps·e) with the
// reference's multipliers k (the rate) and e (the eps) of its parameter's class.
TEST(Mup, AdamStepUsesTheGroupRateAndEps) {
  const Arguments a = parsed(model_flags({"--use-mup", "--mup-base-hidden-size", "32", "--optimizer", "adam",
                                          "--adam-eps", "1e-4", "--weight-decay", "0", "--clip-grad", "0",
                                          "--hidden-dropout", "0", "--attention-dropout", "0"}));
  const nlohmann::json* adam = nullptr;
  for (const nlohmann::json& x : reference()["optimizer_groups"])
    if (x["optimizer"] == "adam" && !x["decoupled_lr"].get<bool>()) adam = &x;
  ASSERT_NE(adam, nullptr);
  const ModelConfig c = model_config_from_args(a);
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(3);
  OptimizedBuffer buffer{&model.params(), {}, std::nullopt};
  set_mup_params(model, a, &buffer);
  const OptimizerConfig oc = optimizer_config_from_args(a);
  Optimizer opt(oc, {buffer}, &ops, make_self_communicator("mp"));
  MicroBatch mb;
  mb.B = 2;
  mb.S = 16;
  for (int64_t i = 0; i < mb.B * mb.S; ++i) {
    mb.tokens.push_back(static_cast<int32_t>((i * 29) % 250));
    mb.labels.push_back(static_cast<int32_t>((i * 31 + 7) % 250));
    mb.loss_mask.push_back(1.0f);
    mb.position_ids.push_back(static_cast<int32_t>(i % 16));
  }
  ParamBuffer& pb = model.params();
  pb.zero_grads();
  GPTModel::LossSums sums;
  model.forward(0, mb, Tensor(), true, &sums);
  model.backward(0, Tensor(), static_cast<float>(1.0 / sums.tokens));
  const std::vector<float> p0(pb.flat_params().data<float>(), pb.flat_params().data<float>() + pb.numel());
  const std::vector<float> g(pb.flat_grads().data<float>(), pb.flat_grads().data<float>() + pb.numel());
  const double lr = 1e-2;
  ASSERT_TRUE(opt.step(lr, 0.0, false, 1.0f, nullptr, std::nullopt, lr * oc.mup_lr_mult).applied);
  int checked = 0;
  for (int id = 0; id < pb.size(); ++id) {
    const ParamSpec& s = pb.spec(id);
    const double k = (*adam)["lr_mult"][s.name].get<double>(), e = (*adam)["eps_mult"][s.name].get<double>();
    double worst = 0.0;
    for (int64_t i = 0; i < s.local_numel(); ++i) {
      const size_t at = static_cast<size_t>(s.offset + i);
      const double gi = g[at];
      const double want = -lr * k * gi / (std::abs(gi) + 1e-4 * e);
      const double got = double(pb.param_data(id)[i]) - p0[at];
      worst = std::max(worst, std::abs(got - want) / (lr * k));
    }
    EXPECT_LT(worst, 2e-3) << s.name << " (rate ×" << k << ", eps ×" << e << ")";
    ++checked;
  }
  EXPECT_EQ(checked, pb.size());
}

// The µP group's rate follows the schedule between --lr·mult and --min-lr·mult, from the unscaled
// --lr-warmup-init during warmup (Megatron's per-group max_lr / min_lr).
TEST(Mup, GroupRateIsTheScheduleBetweenScaledBounds) {
  LrSchedule s;
  s.max_lr = 1e-3;
  s.min_lr = 1e-4;
  s.init_lr = 2e-4;
  s.warmup_steps = 10;
  s.decay_steps = 100;
  s.decay_style = "cosine";
  LrScheduler sch(s);
  sch.set_num_steps(5);  // warmup: init + (max·k − init)·5/10, not k·lr
  EXPECT_DOUBLE_EQ(sch.lr(s.max_lr * 0.25, s.min_lr * 0.25), 2e-4 + (0.25e-3 - 2e-4) * 0.5);
  sch.set_num_steps(60);  // decay: k·lr exactly
  EXPECT_NEAR(sch.lr(s.max_lr * 0.25, s.min_lr * 0.25), 0.25 * sch.lr(), 1e-18);
}

TEST(MupFlags, Refusals) {
  testing::expect_one_line_error({{"--use-mup", "--mup-base-hidden-size", "0"}, 1,
                                  "--mup-base-hidden-size must be positive: expected an integer > 0, found 0"});
  testing::expect_one_line_error({{"--use-mup", "--mup-base-hidden-size", "-64"}, 1,
                                  "--mup-base-hidden-size must be positive"});
  testing::expect_one_line_error({{"--use-mup", "--mup-base-head-dim", "-4"}, 1,
                                  "--mup-base-head-dim: expected a positive number"});
  testing::expect_one_line_error({{"--use-mup", "--mup-output-mult", "inf"}, 1,
                                  "--mup-output-mult: expected a finite number"});
  // Megatron reads the --mup-* flags only with --use-mup: without it they are accepted and unused.
  testing::PretrainCli cli;
  EXPECT_TRUE(cli.parse_minimal({"--mup-base-hidden-size", "0"}).ok());
  cli.args.model.padded_vocab_size = 128;
  EXPECT_FALSE(model_config_from_args(cli.args).mup.enabled);
}

// Megatron's args hold the --use-mup flags as given; Gale's metadata.json "args" does too, and reads
// them back (generate / convert rebuild the µP model); absent: off. A bad saved value is an error.
TEST(MupCheckpoint, ArgsRoundTrip) {
  Arguments a = parsed(model_flags({"--use-mup", "--mup-base-hidden-size", "32", "--mup-embedding-mult", "2.5",
                                    "--mup-base-head-dim", "8", "--mup-attn-scale-power", "0.75"}));
  const nlohmann::json j = model_flags_json(a.model);
  EXPECT_EQ(j["use_mup"], true);
  EXPECT_EQ(j["mup_base_hidden_size"], 32);
  EXPECT_EQ(j["mup_output_mult"], 1.0);  // as given (Megatron's args), resolved by the model config
  StatusOr<ModelArgs> back = model_args_from_json(j, "metadata.json");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_TRUE(back->use_mup);
  EXPECT_EQ(back->mup_base_hidden_size, 32);
  EXPECT_EQ(back->mup_embedding_mult, 2.5);
  EXPECT_EQ(back->mup_base_head_dim, 8.0);
  EXPECT_EQ(back->mup_attn_scale_power, 0.75);
  EXPECT_EQ(back->mup_output_mult, 1.0);
  Arguments rebuilt = a;
  rebuilt.model = back.value();
  rebuilt.model.padded_vocab_size = 256;
  const ModelConfig c0 = model_config_from_args(a), c1 = model_config_from_args(rebuilt);
  EXPECT_EQ(c1.mup.width_mult, c0.mup.width_mult);
  EXPECT_EQ(c1.softmax_scale(), c0.softmax_scale());
  EXPECT_EQ(c1.mup.output_mult, c0.mup.output_mult);
  EXPECT_EQ(c1.mup.embedding_mult, c0.mup.embedding_mult);  // (the init std is not a checkpoint arg)
  // Unset base hidden size and base head dim are saved as None.
  const nlohmann::json d = model_flags_json(parsed(model_flags({"--use-mup"})).model);
  EXPECT_TRUE(d["mup_base_hidden_size"].is_null());
  EXPECT_TRUE(d["mup_base_head_dim"].is_null());
  EXPECT_EQ(model_args_from_json(d, "m.json")->mup_base_hidden_size, kUnset);
  // Without --use-mup nothing is written, and nothing is read back.
  const nlohmann::json plain = model_flags_json(parsed(model_flags({})).model);
  EXPECT_FALSE(plain.contains("use_mup"));
  EXPECT_FALSE(model_args_from_json(plain, "m.json")->use_mup);
  nlohmann::json bad = j;
  bad["mup_base_hidden_size"] = 0;
  const Status st = model_args_from_json(bad, "ckpt/metadata.json").status();
  EXPECT_NE(st.message().find("ckpt/metadata.json: args 'mup_base_hidden_size' is 0"), std::string::npos)
      << st.message();
}

}  // namespace
}  // namespace gale
