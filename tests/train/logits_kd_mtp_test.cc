// Offline distillation with multi-token prediction (--logits-load-dir with --mtp-num-layers,
// train/logits_kd_hooks.h): on a small model with 2 MTP layers, the student's objective
//   J = α·kd/Σmask + (1 − α)·lm/Σmask + factor/D·Σ_k L_k
// (Megatron: the loss function mixes KD and LM, MTPLossAutoScaler keeps the MTP losses at their own
// factor) has its KD term equal to a float64 KL written out here from the main head's logits, MTP
// losses equal to the hook-less model's, and the gradient of every parameter matching finite
// differences of J.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <unistd.h>

#include "model/gpt_model.h"
#include "model/model_test_batches.h"
#include "model/mtp_gradcheck.h"
#include "model/topk_kl.h"
#include "testing.h"
#include "train/cached_logits.h"
#include "train/logits_kd_hooks.h"

namespace gale {
namespace {

namespace fs = std::filesystem;
constexpr int64_t kB = 2, kK = 5;
constexpr double kAlpha = 0.4;

// The ghost-token forward KL of Megatron's topk_kl_div in float64, independently of model/topk_kl.h:
// Σ_t mask_t · kl_t over rows t = s·B + b of `logits` [T, V].
double kd_float64(const std::vector<float>& logits, int64_t T, int64_t V, const TopKLogProbs& teacher,
                  const std::vector<float>& mask_sb) {
  double sum = 0.0;
  for (int64_t t = 0; t < T; ++t) {
    const float* z = logits.data() + t * V;
    double mx = -1e300, se = 0.0;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(z[v]));
    for (int64_t v = 0; v < V; ++v) se += std::exp(z[v] - mx);
    const double lse = mx + std::log(se);
    double kl = 0.0, student_mass = 0.0, teacher_mass = 0.0;
    for (int64_t k = 0; k < teacher.K; ++k) {
      const double lp = teacher.logprobs[t * teacher.K + k];
      if (lp == -1000.0) continue;
      const double ls = z[teacher.indices[t * teacher.K + k]] - lse;
      kl += std::exp(lp) * (lp - ls);
      student_mass += std::exp(ls);
      teacher_mass += std::exp(lp);
    }
    const double sr = std::log(std::max(1.0 - student_mass, 1e-8)), tr = std::log(std::max(1.0 - teacher_mass, 1e-8));
    kl += std::exp(tr) * (tr - sr);
    sum += mask_sb[t] * kl;
  }
  return sum;
}

class LogitsKdMtp : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("gale_logits_kd_mtp_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    c_ = testing::gradcheck_gpt_config();
    c_.mtp_num_layers = 2;
    c_.mtp_loss_scaling_factor = 0.3;
    mb_ = testing::masked_batch(c_, kB, 7, /*documents=*/false);
    // The teacher: the top-K of random logits over the vocabulary, as one saved micro-batch.
    const int64_t T = c_.seq_length * kB;
    const std::vector<float> z = testing::random_vector(T * c_.vocab, 99, 2.0f);
    StatusOr<TopKLogProbs> sel =
        select_topk_logprobs(z.data(), c_.seq_length, kB, c_.vocab, kK, std::nullopt, 1, LogitsSaveDtype::kF32);
    ASSERT_TRUE(sel.ok());
    teacher_ = sel.value();
    StatusOr<std::string> member = encode_cached_logits_iteration({teacher_}, LogitsSaveDtype::kF32);
    ASSERT_TRUE(member.ok());
    CachedLogitsTar tar;
    tar.meta = cached_logits_meta_json(id_, LogitsSaverSettings{kK, std::nullopt, 1, LogitsSaveDtype::kF32});
    tar.iterations.emplace_back(0, member.value());
    ASSERT_TRUE(write_cached_logits_tar((dir_ / cached_logits_tar_name(0, 0, 0)).string(), tar).ok());
  }
  void TearDown() override { fs::remove_all(dir_); }

  struct Eval {
    double j = 0.0, lm = 0.0, tokens = 0.0;
    CachedLogitsKdHook::Sums kd;
    std::vector<double> mtp;
  };
  // One training forward and backward of the student (a fresh hook: iteration 0, micro-batch 0),
  // its gradient in the model (zeroed first when `zero`).
  Eval student(GPTModel& model, bool zero) {
    StatusOr<CachedLogitsReader> reader =
        CachedLogitsReader::open(dir_.string(), 0, 0, 1, cached_logits_dataset_hash(id_));
    EXPECT_TRUE(reader.ok()) << reader.status().message();
    CachedLogitsKdHook hook(std::move(reader).value(), kAlpha, false, nullptr, [] { return int64_t{0}; });
    hook.set_active(true);
    model.set_head_logits_hook(&hook);
    GPTModel::LossSums sums;
    model.take_mtp_losses();
    model.forward(0, mb_, Tensor(), /*training=*/true, &sums);
    Eval e;
    e.mtp = model.take_mtp_losses();
    if (zero) model.params().zero_grads();
    model.backward(0, Tensor(), static_cast<float>(1.0 / sums.tokens));
    model.set_head_logits_hook(nullptr);
    EXPECT_TRUE(hook.take_error().ok());
    e.kd = hook.take_sums();
    e.lm = sums.loss_sum;
    e.tokens = sums.tokens;
    e.j = e.kd.total / e.kd.total_tokens;
    for (double l : e.mtp) e.j += c_.mtp_loss_scaling_factor / static_cast<double>(c_.mtp_num_layers) * l;
    return e;
  }

  fs::path dir_;
  ModelConfig c_;
  MicroBatch mb_;
  TopKLogProbs teacher_;
  LogitsDatasetIdentity id_;
};

TEST_F(LogitsKdMtp, KdBesideMtpMatchesFloat64AndFiniteDifferences) {
  const OpTable ops = reference_ops();
  GPTModel model(c_, single_process_partition(c_), &ops);
  model.params().initialize(42);
  // The MTP losses without the hook (a plain training step).
  std::vector<double> plain_mtp;
  testing::mtp_objective(model, mb_, true, &plain_mtp);
  ASSERT_EQ(plain_mtp.size(), 2u);
  // The main head's logits as the hook sees them (the observer's copy).
  std::vector<float> logits;
  std::vector<float> mask_sb;
  model.set_forward_observer([&](const MicroBatch& mb, const Tensor&, const Tensor& z) {
    logits.assign(z.data<float>(), z.data<float>() + z.numel());
    mask_sb.assign(static_cast<size_t>(mb.S * mb.B), 0.0f);
    for (int64_t b = 0; b < mb.B; ++b)
      for (int64_t s = 0; s < mb.S; ++s) mask_sb[s * mb.B + b] = mb.loss_mask[b * mb.S + s];
  });
  const Eval e = student(model, true);
  model.set_forward_observer(nullptr);
  const int64_t T = c_.seq_length * kB;
  ASSERT_EQ(logits.size(), static_cast<size_t>(T * c_.vocab));
  const double kd_ref = kd_float64(logits, T, c_.vocab, teacher_, mask_sb);
  EXPECT_GT(kd_ref, 0.1);
  EXPECT_NEAR(e.kd.kd, kd_ref, 1e-9 * kd_ref);
  EXPECT_EQ(e.kd.kd_tokens, e.tokens);
  EXPECT_NEAR(e.kd.total, kAlpha * kd_ref + (1.0 - kAlpha) * e.lm, 1e-9 * e.kd.total);
  // The MTP losses are the plain step's: kept beside the KD mix, not scaled by 1 − α.
  EXPECT_EQ(e.mtp, plain_mtp);
  // The gradient of J (the analytic one, then 5-point directional differences of J per parameter).
  ParamBuffer& pb = model.params();
  const std::vector<float> grads(pb.flat_grads().data<float>(), pb.flat_grads().data<float>() + pb.numel());
  auto loss = [&] { return student(model, false).j; };
  int mtp_params = 0;
  for (int id = 0; id < pb.size(); ++id) {
    const int64_t n = pb.spec(id).local_numel();
    const auto dir = testing::random_vector(n, 100 + id);
    const double analytic = testing::dot(grads.data() + pb.spec(id).offset, dir.data(), n);
    const double numeric = testing::directional_derivative_5point(loss, pb.param_data(id), dir.data(), n, 5e-3);
    EXPECT_LT(testing::rel_diff(analytic, numeric, 1e-2), 1e-2) << pb.spec(id).name << ": " << analytic << " vs " << numeric;
    mtp_params += pb.spec(id).name.rfind("mtp.layers.", 0) == 0;
  }
  EXPECT_GT(mtp_params, 10);
}

}  // namespace
}  // namespace gale
