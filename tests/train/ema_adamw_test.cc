// --optimizer-selection fused_ema_adamw on a tiny GPT (one process): training is fused_adamw's, bit
// for bit (losses, gradient norms, parameters), with the reference and the vectorised kernels; the
// EMA is saved as optimizer.ema_params.<name> and a resumed run continues bit for bit (parameters,
// losses and EMA); a checkpoint without the EMA is refused (with --no-load-optim the EMA starts
// from the loaded parameters); `gale generate`/`evaluate --use-ema` (load_inference_model) and
// `gale convert --use-ema` read the EMA instead of the weights, and refuse a checkpoint without it.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>

#include "ckpt/checkpoint_reader.h"
#include "ckpt/temp_dir.h"
#include "kernels/cpu/fused_ops.h"
#include "testing_checkpoint_run.h"
#include "train/checkpointing.h"
#include "train/grad_sync.h"
#include "train/hf_convert.h"
#include "train/inference_model.h"

namespace gale {
namespace {

using testing_util::TempDir;

const std::vector<std::string> kFlags = {
    "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
    "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "6",
    "--lr", "3e-3", "--lr-warmup-iters", "2", "--lr-decay-style", "cosine", "--mock-data", "--hidden-dropout", "0.1",
    "--attention-dropout", "0.1", "--eval-iters", "0", "--log-interval", "1000", "--make-vocab-size-divisible-by", "64",
    "--clip-grad", "0.05", "--weight-decay", "0.1", "--tokenizer-type", "NullTokenizer", "--vocab-size", "59"};
constexpr int64_t kVocab = 60;
const std::vector<std::string> kEma = {"--optimizer-selection", "fused_ema_adamw", "--ema-decay", "0.99"};

OpTable ops_with(bool fused_adamw) {
  OpTable ops = reference_ops();
  if (fused_adamw) GALE_CHECK_OK(install_fused_kernel(ops, "adamw", Isa::kAvx512));
  return ops;
}

struct EmaRun : testing::CheckpointRun {
  explicit EmaRun(const std::vector<std::string>& extra, bool fused_adamw = false)
      : CheckpointRun(testing::join({kFlags, extra}), make_self_communicator("world"), kVocab, {}, ops_with(fused_adamw)) {}
  std::vector<uint32_t> bits(const float* x) const {
    std::vector<uint32_t> out(static_cast<size_t>(numel()));
    std::memcpy(out.data(), x, out.size() * sizeof(float));
    return out;
  }
  const float* ema() const {
    for (const auto& [name, t] : engine->optimizer->state(0))
      if (name == "ema_params") return t.data<float>();
    return nullptr;
  }
  int64_t numel() const { return engine->chunks[0]->params().trainable_numel(); }
};

TEST(EmaAdamWTraining, TrainsExactlyAsFusedAdamW) {
  for (bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "vectorised kernels" : "reference kernels");
    EmaRun plain({}, fused), ema(kEma, fused);
    EXPECT_EQ(plain.engine->optimizer->state_bytes(), 8 * plain.numel());
    EXPECT_EQ(ema.engine->optimizer->state_bytes(), 12 * ema.numel()) << "the EMA: 4 bytes per parameter";
    const std::vector<double> a = plain.train(5), b = ema.train(5);
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(a[i], b[i]) << "loss of iteration " << i + 1;
      EXPECT_EQ(plain.grad_norms[i], ema.grad_norms[i]) << "grad norm of iteration " << i + 1;
    }
    EXPECT_NE(a[0], a[4]);  // it trained
    EXPECT_EQ(plain.values(), ema.values());
    ASSERT_NE(ema.ema(), nullptr);
    EXPECT_NE(ema.bits(ema.ema()), ema.values()) << "the EMA lags the parameters";
  }
}

TEST(EmaAdamWTraining, CheckpointHoldsTheEmaAndResumesBitwise) {
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  EmaRun whole(kEma);
  const std::vector<double> expected = whole.train(6);
  EmaRun first(testing::join({kEma, {"--save", dir, "--save-interval", "3"}}));
  first.train(3);
  ASSERT_TRUE(first.save().ok());
  {
    auto r = CheckpointReader::open(dir);
    ASSERT_TRUE(r.ok()) << r.status().message();
    const auto o = r->section("optimizer");
    ASSERT_TRUE(o.ok());
    EXPECT_EQ(o->at("ema_decay").get<double>(), 0.99);
    const ParamBuffer& pb = first.engine->chunks[0]->params();
    for (int id = 0; id < pb.size(); ++id)
      EXPECT_TRUE(r->has_tensor("optimizer.ema_params." + pb.spec(id).name)) << pb.spec(id).name;
  }
  EmaRun second(testing::join({kEma, {"--load", dir}}));
  ASSERT_TRUE(second.load().ok());
  const std::vector<double> b = second.train(3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(b[i], expected[3 + i]) << "iteration " << 4 + i;
  EXPECT_EQ(second.values(), whole.values());
  EXPECT_EQ(second.bits(second.ema()), whole.bits(whole.ema())) << "the EMA continues bit for bit";
}

TEST(EmaAdamWTraining, CheckpointWithoutTheEmaIsRefusedUnlessTheOptimizerStartsAfresh) {
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  EmaRun plain({"--save", dir, "--save-interval", "100"});
  plain.train(2);
  ASSERT_TRUE(plain.save().ok());
  EmaRun resumed(testing::join({kEma, {"--load", dir}}));
  const Status st = resumed.load();
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("holds no parameter EMA"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("--no-load-optim"), std::string::npos) << st.message();
  // --no-load-optim: the EMA starts as the loaded parameters at the first step.
  EmaRun fresh(testing::join({kEma, {"--load", dir, "--no-load-optim", "--no-load-rng"}}));
  ASSERT_TRUE(fresh.load().ok());
  const std::vector<uint32_t> loaded = fresh.values();
  fresh.train(1);
  const float d = ema_decay_at(0.99, 1);
  const float* p = fresh.engine->chunks[0]->params().flat_params().data<float>();
  std::vector<float> want(static_cast<size_t>(fresh.numel()));
  for (size_t i = 0; i < want.size(); ++i) {
    float p0;
    std::memcpy(&p0, &loaded[i], sizeof p0);
    want[i] = d * p0 + (1.0f - d) * p[i];
  }
  EXPECT_EQ(fresh.bits(fresh.ema()), fresh.bits(want.data()));
}

// A checkpoint trained with the EMA, its EMA by parameter name.
struct EmaCheckpoint {
  TempDir tmp;
  std::string dir = tmp.file("ckpt");
  std::map<std::string, std::vector<float>> ema, weights;
  explicit EmaCheckpoint(const std::vector<std::string>& flags) {
    EmaRun run(testing::join({flags, {"--save", dir, "--save-interval", "100"}}));
    run.train(4);
    GALE_CHECK_OK(run.save());
    const ParamBuffer& pb = run.engine->chunks[0]->params();
    const float* e = run.ema();
    for (int id = 0; id < pb.size(); ++id) {
      const ParamSpec& s = pb.spec(id);
      ema[s.name].assign(e + s.offset, e + s.offset + s.local_numel());
      weights[s.name].assign(pb.flat_params().data<float>() + s.offset,
                             pb.flat_params().data<float>() + s.offset + s.local_numel());
    }
  }
};

Arguments inference_args(const std::string& dir, bool use_ema) {
  Arguments a;
  a.checkpoint.load = dir;
  a.checkpoint.use_checkpoint_args = true;
  a.checkpoint.use_ema = use_ema;
  a.tokenizer.tokenizer_type = "NullTokenizer";
  a.tokenizer.vocab_size = 59;
  return a;
}

TEST(EmaAdamWUse, InferenceModelReadsTheEma) {
  EmaCheckpoint c(kEma);
  for (bool use_ema : {true, false}) {
    Arguments a = inference_args(c.dir, use_ema);
    auto m = load_inference_model(a, 1);
    ASSERT_TRUE(m.ok()) << m.status().message();
    const ParamBuffer& pb = (*m)->model->params();
    for (int id = 0; id < pb.size(); ++id) {
      const ParamSpec& s = pb.spec(id);
      const std::vector<float>& want = (use_ema ? c.ema : c.weights).at(s.name);
      ASSERT_EQ(static_cast<int64_t>(want.size()), s.local_numel()) << s.name;
      EXPECT_EQ(std::memcmp(want.data(), pb.flat_params().data<float>() + s.offset, 4 * want.size()), 0)
          << s.name << (use_ema ? " (EMA)" : " (weights)");
    }
  }
}

TEST(EmaAdamWUse, ConvertExportsTheEma) {
  EmaCheckpoint c(kEma);
  auto quiet = [](const std::string&) {};
  GaleToHfOptions o;
  o.load_dir = c.dir;
  o.vocab_size = kVocab;
  o.save_dir = c.tmp.file("hf_ema");
  o.use_ema = true;
  ASSERT_TRUE(convert_gale_to_hf(o, quiet).ok());
  o.save_dir = c.tmp.file("hf_weights");
  o.use_ema = false;
  ASSERT_TRUE(convert_gale_to_hf(o, quiet).ok());
  // Back to Gale: every tensor is the checkpoint's EMA (resp. weights), the padded vocabulary rows aside.
  for (bool ema : {true, false}) {
    HfToGaleOptions back;
    back.load_dir = c.tmp.file(ema ? "hf_ema" : "hf_weights");
    back.save_dir = c.tmp.file(ema ? "gale_ema" : "gale_weights");
    back.make_vocab_size_divisible_by = 64;
    ASSERT_TRUE(convert_hf_to_gale(back, quiet).ok());
    auto r = CheckpointReader::open(back.save_dir);
    ASSERT_TRUE(r.ok()) << r.status().message();
    int compared = 0;
    for (const auto& [name, want] : ema ? c.ema : c.weights) {
      if (!r->has_tensor(name)) continue;
      auto shape = r->global_shape(name);
      ASSERT_TRUE(shape.ok());
      auto t = r->read(name, *shape, DType::kF32);
      ASSERT_TRUE(t.ok()) << name;
      int64_t n = std::min<int64_t>(t->numel(), static_cast<int64_t>(want.size()));
      if (name.find("word_embeddings") != std::string::npos || name.find("output_layer") != std::string::npos)
        n = kVocab * shape->back();  // the padded rows are not exported
      EXPECT_EQ(std::memcmp(t->data<float>(), want.data(), 4 * static_cast<size_t>(n)), 0) << name;
      ++compared;
    }
    EXPECT_GE(compared, 10) << "tensors compared";
  }
}

TEST(EmaAdamWUse, CheckpointWithoutTheEmaIsRefused) {
  EmaCheckpoint c(kEma);
  TempDir tmp;
  const std::string plain_dir = tmp.file("plain");
  {
    EmaRun plain({"--save", plain_dir, "--save-interval", "100"});
    plain.train(1);
    ASSERT_TRUE(plain.save().ok());
  }
  Arguments a = inference_args(plain_dir, true);
  auto m = load_inference_model(a, 1);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(m.status().message().find("--use-ema: checkpoint"), std::string::npos) << m.status().message();
  EXPECT_NE(m.status().message().find("holds no parameter EMA"), std::string::npos) << m.status().message();
  GaleToHfOptions o;
  o.load_dir = plain_dir;
  o.save_dir = tmp.file("hf");
  o.use_ema = true;
  const Status st = convert_gale_to_hf(o, [](const std::string&) {});
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("--use-ema: checkpoint"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace gale
