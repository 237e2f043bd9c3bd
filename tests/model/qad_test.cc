// QAD in the model (GPTModel::set_distillation, model/logits_kl.h): the gradients the student's
// backward produces are those of weight · KL(teacher ‖ student) computed independently from both
// models' forward_logits (directional finite differences per parameter); a teacher equal to the
// student gives KL 0 and zero gradients while the logged lm loss is the plain run's; the weight and
// the reduction scale the gradients as specified; training moves the student towards the teacher
// and leaves the teacher untouched; with QAT on the student the KL of a same-weights teacher is
// positive (the quantisation error QAD distils away).
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "kernels/op_table.h"
#include "model/gpt_model.h"
#include "model/logits_kl.h"
#include "model/qat.h"
#include "model_test_batches.h"
#include "testing.h"

namespace gale {
namespace {

using testing::gradcheck_gpt_config;
using testing::masked_batch;

GPTModel::Distillation distillation(GPTModel* teacher, double tau, double weight, KlReduction r) {
  GPTModel::Distillation d;
  d.teacher = teacher;
  d.temperature = tau;
  d.weight = weight;
  d.reduction = r;
  return d;
}

// weight · KL_mb from the two models' logits ([B, S, V], sample-major like mb.loss_mask): an
// independent statement of the objective (no distillation code of the model involved).
double objective(GPTModel& student, GPTModel& teacher, const MicroBatch& mb, double tau, double weight,
                 KlReduction r) {
  const Tensor s = student.forward_logits(mb, Tensor()), z = teacher.forward_logits(mb, Tensor());
  const int64_t T = mb.B * mb.S, V = student.config().vocab;
  std::vector<double> kl(static_cast<size_t>(T));
  logits_kl_per_token(s.data<float>(), z.data<float>(), T, V, tau, kl.data());
  return weight * reduce_kl(kl, mb.loss_mask, r);
}

// One training micro-batch of the student as the no-pipelining schedule runs it (one micro-batch:
// loss scale 1 / Σ mask). Returns the lm loss sums; gradients zeroed first.
GPTModel::LossSums train_step(GPTModel& model, const MicroBatch& mb) {
  model.params().zero_grads();
  model.set_num_microbatches(1);
  GPTModel::LossSums sums;
  model.forward(0, mb, Tensor(), /*training=*/true, &sums);
  model.backward(0, Tensor(), micro_batch_loss_scale(sums.tokens, 1));
  return sums;
}

std::vector<float> grads(const GPTModel& m) {
  const Tensor& g = m.params().flat_grads();
  return std::vector<float>(g.data<float>(), g.data<float>() + g.numel());
}

std::vector<float> values(const GPTModel& m) {
  const Tensor& p = m.params().flat_params();
  return std::vector<float>(p.data<float>(), p.data<float>() + p.numel());
}

// Directional central differences of objective() along a random direction u per parameter
// (h = 1e-3): f32 forwards make the objective's round-off ~1e-6, i.e. ~5e-4 after dividing by 2h,
// hence the tolerance 2e-3 + 1e-2·|derivative|.
TEST(Qad, GradientsAreThoseOfTheKlObjective) {
  const ModelConfig c = gradcheck_gpt_config();
  OpTable ops = reference_ops();
  GPTModel student(c, single_process_partition(c), &ops), teacher(c, single_process_partition(c), &ops);
  student.params().initialize(3);
  teacher.params().initialize(4);
  const MicroBatch mb = masked_batch(c, 2, 17, false);
  for (const auto& [tau, weight, r] : {std::tuple{1.0, 1.0, KlReduction::kMean}, std::tuple{2.0, 0.5, KlReduction::kSum}}) {
    SCOPED_TRACE(str_cat(tau, " ", weight, r == KlReduction::kSum ? " sum" : " mean"));
    student.set_distillation(distillation(&teacher, tau, weight, r));
    train_step(student, mb);
    const double kl = student.take_distillation_kl();
    EXPECT_NEAR(weight * kl, objective(student, teacher, mb, tau, weight, r), 1e-6 * std::max(1.0, kl));
    const std::vector<float> g = grads(student);
    ParamBuffer& pb = student.params();
    for (int id = 0; id < pb.size(); ++id) {
      Tensor p = pb.param(id);
      const int64_t n = p.numel();
      const std::vector<float> u = testing::random_vector(n, 100 + id);
      const int64_t off = pb.spec(id).offset;
      double analytic = 0.0;
      for (int64_t i = 0; i < n; ++i) analytic += static_cast<double>(g[off + i]) * u[i];
      const std::vector<float> saved(p.data<float>(), p.data<float>() + n);
      const float h = 1e-3f;
      for (int64_t i = 0; i < n; ++i) p.data<float>()[i] = saved[i] + h * u[i];
      pb.refresh_gemm_copy();
      const double up = objective(student, teacher, mb, tau, weight, r);
      for (int64_t i = 0; i < n; ++i) p.data<float>()[i] = saved[i] - h * u[i];
      pb.refresh_gemm_copy();
      const double down = objective(student, teacher, mb, tau, weight, r);
      std::copy(saved.begin(), saved.end(), p.data<float>());
      pb.refresh_gemm_copy();
      const double fd = (up - down) / (2.0 * h);
      EXPECT_NEAR(analytic, fd, 2e-3 + 1e-2 * std::abs(fd)) << pb.spec(id).name;
    }
  }
}

// The teacher is the student (same weights, no quantisation): the KL is 0, every gradient is 0
// (the objective is weight · KL only; the lm loss gets no gradient), and the reported lm loss is
// the plain model's, bit for bit.
TEST(Qad, TeacherEqualToStudentGivesZeroKlAndZeroGradients) {
  const ModelConfig c = gradcheck_gpt_config();
  OpTable ops = reference_ops();
  GPTModel student(c, single_process_partition(c), &ops), teacher(c, single_process_partition(c), &ops),
      plain(c, single_process_partition(c), &ops);
  for (GPTModel* m : {&student, &teacher, &plain}) m->params().initialize(5);
  student.set_distillation(distillation(&teacher, 2.0, 1.0, KlReduction::kMean));
  const MicroBatch mb = masked_batch(c, 2, 23, false);
  const GPTModel::LossSums s = train_step(student, mb);
  const GPTModel::LossSums p = train_step(plain, mb);
  EXPECT_EQ(s.loss_sum, p.loss_sum);
  EXPECT_EQ(s.tokens, p.tokens);
  EXPECT_EQ(student.take_distillation_kl(), 0.0);
  EXPECT_EQ(student.take_distillation_kl(), 0.0) << "take resets the sum";
  for (float x : grads(student)) ASSERT_EQ(x, 0.0f);
  double plain_norm = 0.0;
  for (float x : grads(plain)) plain_norm += static_cast<double>(x) * x;
  EXPECT_GT(plain_norm, 0.0) << "the plain run has gradients";
}

// The weight multiplies every gradient (2 is exact in f32); "sum" is "mean" times Σ mask.
TEST(Qad, WeightAndReductionScaleTheGradients) {
  const ModelConfig c = gradcheck_gpt_config();
  OpTable ops = reference_ops();
  GPTModel student(c, single_process_partition(c), &ops), teacher(c, single_process_partition(c), &ops);
  student.params().initialize(3);
  teacher.params().initialize(8);
  const MicroBatch mb = masked_batch(c, 2, 29, false);
  double tokens = 0.0;
  for (float m : mb.loss_mask) tokens += m;
  student.set_distillation(distillation(&teacher, 1.5, 1.0, KlReduction::kMean));
  train_step(student, mb);
  const double kl_mean = student.take_distillation_kl();
  const std::vector<float> g1 = grads(student);
  student.set_distillation(distillation(&teacher, 1.5, 2.0, KlReduction::kMean));
  train_step(student, mb);
  EXPECT_EQ(student.take_distillation_kl(), kl_mean) << "the logged KL has no weight";
  const std::vector<float> g2 = grads(student);
  student.set_distillation(distillation(&teacher, 1.5, 1.0, KlReduction::kSum));
  train_step(student, mb);
  EXPECT_NEAR(student.take_distillation_kl(), kl_mean * tokens, 1e-9 * kl_mean * tokens);
  const std::vector<float> gs = grads(student);
  ASSERT_EQ(g1.size(), g2.size());
  double max_g = 0.0;
  for (float x : g1) max_g = std::max(max_g, static_cast<double>(std::abs(x)));
  EXPECT_GT(max_g, 0.0);
  for (size_t i = 0; i < g1.size(); ++i) {
    EXPECT_EQ(g2[i], 2.0f * g1[i]) << i;
    // f32 GEMMs of rescaled inputs: equal up to round-off of sums with cancellation, 1e-5 of the
    // largest gradient (f32 epsilon 6e-8 times the ~100 terms of a sum, with margin).
    EXPECT_NEAR(gs[i], tokens * g1[i], 1e-5 * tokens * max_g) << i;
  }
}

// A few SGD steps on the KL: the student approaches the teacher (the KL falls), the teacher's
// values are bit-identical to before and its gradient buffer stays zero (forward only).
TEST(Qad, TrainingMovesTheStudentAndLeavesTheTeacherUnchanged) {
  const ModelConfig c = gradcheck_gpt_config();
  OpTable ops = reference_ops();
  GPTModel student(c, single_process_partition(c), &ops), teacher(c, single_process_partition(c), &ops);
  student.params().initialize(3);
  teacher.params().initialize(9);
  teacher.params().zero_grads();
  const std::vector<float> teacher_before = values(teacher);
  student.set_distillation(distillation(&teacher, 1.0, 1.0, KlReduction::kMean));
  const MicroBatch mb = masked_batch(c, 2, 31, false);
  std::vector<double> kls;
  for (int step = 0; step < 8; ++step) {
    train_step(student, mb);
    kls.push_back(student.take_distillation_kl());
    float* p = student.params().flat_params().data<float>();
    const std::vector<float> g = grads(student);
    for (size_t i = 0; i < g.size(); ++i) p[i] -= 0.5f * g[i];
    student.params().refresh_gemm_copy();
  }
  EXPECT_LT(kls.back(), 0.7 * kls.front()) << kls.front() << " -> " << kls.back();
  EXPECT_EQ(values(teacher), teacher_before);
  for (float x : grads(teacher)) ASSERT_EQ(x, 0.0f);
}

// The QAD scenario: a student with MX fake-quantised linear weights against a teacher with the same
// (unquantised) weights has a positive KL, and distilling lowers it.
TEST(Qad, QuantisedStudentAgainstItsOwnWeightsHasPositiveKl) {
  ModelConfig c = gradcheck_gpt_config();
  c.hidden = 32;
  c.ffn = 64;
  c.head_dim = 16;
  ModelConfig q = c;
  StatusOr<QatConfig> scheme = parse_qat_scheme("w4a16-mxfp4", 32);
  ASSERT_TRUE(scheme.ok()) << scheme.status().message();
  q.qat = scheme.value();
  OpTable ops = reference_ops();
  GPTModel student(q, single_process_partition(q), &ops), teacher(c, single_process_partition(c), &ops);
  student.params().initialize(6);
  teacher.params().initialize(6);
  student.set_distillation(distillation(&teacher, 1.0, 1.0, KlReduction::kMean));
  const MicroBatch mb = masked_batch(c, 2, 37, false);
  std::vector<double> kls;
  for (int step = 0; step < 6; ++step) {
    train_step(student, mb);
    kls.push_back(student.take_distillation_kl());
    float* p = student.params().flat_params().data<float>();
    const std::vector<float> g = grads(student);
    for (size_t i = 0; i < g.size(); ++i) p[i] -= 0.2f * g[i];
    student.params().refresh_gemm_copy();
  }
  EXPECT_GT(kls.front(), 1e-6);
  EXPECT_LT(kls.back(), kls.front());
}

}  // namespace
}  // namespace gale
