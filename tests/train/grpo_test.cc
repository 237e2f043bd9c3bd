// GRPO through the model: per-token log-probabilities, the loss's gradient reaching the parameters
// (against finite differences of the objective), zero KL and unit ratios at the reference policy,
// a gradient step that favours the above-mean-reward completion, and the importance-sampling
// correction: the sampler's inference log-probabilities of real rollouts against π_old, and the
// weight exp(old − inference), truncated, scaling the policy gradient.
#include "train/grpo.h"

#include <gtest/gtest.h>

#include <cmath>

#include "data/data_test_util.h"
#include "model/model_test_batches.h"
#include "testing.h"
#include "tokenizer/null_tokenizer.h"

namespace gale {
namespace {

using testing::gradcheck_gpt_config;

// Two rows of 8 tokens: a 3-token prompt and a 5-token completion each (pad 0 after none).
GrpoRollouts two_rollouts(const ModelConfig& c) {
  GrpoRollouts r;
  r.rows = 2;
  r.seq_length = c.seq_length;
  for (int64_t i = 0; i < r.rows * r.seq_length; ++i) r.tokens.push_back(static_cast<int32_t>((i * 7 + 3) % c.vocab));
  r.loss_mask.assign(static_cast<size_t>(r.rows * r.seq_length), 0.0f);
  for (int64_t b = 0; b < r.rows; ++b)
    for (int64_t s = 2; s < r.seq_length - 1; ++s) r.loss_mask[b * r.seq_length + s] = 1.0f;  // predicts tokens 3..7
  r.advantages = grpo_advantages({{1.0, 0.0}});
  r.rewards = {1.0, 0.0};
  return r;
}

struct Fixture {
  ModelConfig c = gradcheck_gpt_config();
  OpTable ops = reference_ops();
  GPTModel model{c, single_process_partition(c), &ops};
  GrpoRollouts r = two_rollouts(c);
  MicroBatch mb = grpo_micro_batch(r, 0, 2, 0, 0);
  Fixture() { model.params().initialize(42); }
};

TEST(GrpoModel, LogProbsAreTheNegatedTokenLosses) {
  Fixture f;
  const std::vector<double> lp = grpo_token_logprobs(f.model, f.mb);
  ASSERT_EQ(lp.size(), 16u);
  const Tensor logits = f.model.forward_logits(f.mb, Tensor());  // [B, S, V]
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t s = 0; s < 8; ++s) {
      const float* row = logits.data<float>() + (b * 8 + s) * f.c.vocab;
      double m = row[0], sum = 0.0;
      for (int64_t v = 0; v < f.c.vocab; ++v) m = std::max<double>(m, row[v]);
      for (int64_t v = 0; v < f.c.vocab; ++v) sum += std::exp(row[v] - m);
      const double want = row[f.mb.labels[b * 8 + s]] - m - std::log(sum);
      EXPECT_NEAR(lp[b * 8 + s], want, 2e-5) << b << " " << s;
    }
}

// First pass over fresh rollouts with the policy equal to the reference: every ratio 1, KL 0.
TEST(GrpoModel, ZeroKlAndUnitRatiosAtTheReferencePolicy) {
  Fixture f;
  const std::vector<double> lp = grpo_token_logprobs(f.model, f.mb);
  GrpoLossOptions o;
  o.kl_beta = 0.3;
  f.model.params().zero_grads();
  const GrpoMicroBatchLoss l = grpo_forward_backward(f.model, f.mb, 0, lp, lp, f.r.advantages, o);
  EXPECT_EQ(l.tokens, 10.0);
  EXPECT_NEAR(l.kl_sum, 0.0, 1e-12);
  EXPECT_NEAR(l.ratio_sum, l.tokens, 1e-9);
  EXPECT_EQ(l.truncated_above_sum + l.truncated_below_sum, 0.0);
}

// d objective / d parameters from the model's backward against five-point directional derivatives
// of the objective computed from evaluation forwards, every parameter (clamps, KL and entropy on).
TEST(GrpoModel, ParameterGradientsMatchFiniteDifferences) {
  Fixture f;
  const std::vector<double> lp = grpo_token_logprobs(f.model, f.mb);
  std::vector<double> old(lp.size()), ref(lp.size());
  for (size_t i = 0; i < lp.size(); ++i) {  // ratios 0.6 .. 1.5: inside and outside [0.8, 1.3], away from the bounds
    old[i] = lp[i] - std::log(0.6 + 0.9 * static_cast<double>((i * 5) % 16) / 15.0) + 1e-3;
    ref[i] = lp[i] + 0.3 * std::sin(static_cast<double>(i));
  }
  GrpoLossOptions o;
  o.clamp_eps_lower = 0.2;
  o.clamp_eps_upper = 0.3;
  o.kl_beta = 0.2;
  o.entropy_weight = 0.1;
  f.model.params().zero_grads();
  const GrpoMicroBatchLoss l = grpo_forward_backward(f.model, f.mb, 0, old, ref, f.r.advantages, o);
  EXPECT_GT(l.truncated_above_sum + l.truncated_below_sum, 0.0);
  ParamBuffer& pb = f.model.params();
  const std::vector<float> grads(pb.flat_grads().data<float>(), pb.flat_grads().data<float>() + pb.numel());
  auto objective = [&] {
    return grpo_micro_batch_loss(grpo_token_logprobs(f.model, f.mb), old, ref, f.r.advantages, f.mb.loss_mask, 2, 8,
                                 1, o)
        .mb_loss;
  };
  EXPECT_NEAR(objective(), l.mb_loss, 1e-6);
  for (int id = 0; id < pb.size(); ++id) {
    const int64_t n = pb.spec(id).local_numel();
    const std::vector<float> dir = testing::random_vector(n, 100 + id);
    const double analytic = testing::dot(grads.data() + pb.spec(id).offset, dir.data(), n);
    const double numeric = testing::directional_derivative_5point(objective, pb.param_data(id), dir.data(), n, 3e-3);
    EXPECT_LT(testing::rel_diff(analytic, numeric, 1e-2), 1e-2) << pb.spec(id).name << ": " << analytic << " vs "
                                                                << numeric;
  }
}

// A plain gradient step raises the rewarded completion's log-probability and lowers the other's.
TEST(GrpoModel, GradientStepFavoursTheAboveMeanCompletion) {
  Fixture f;
  const std::vector<double> lp = grpo_token_logprobs(f.model, f.mb);
  GrpoLossOptions o;
  o.kl_beta = 0.0;
  f.model.params().zero_grads();
  grpo_forward_backward(f.model, f.mb, 0, lp, lp, f.r.advantages, o);
  ParamBuffer& pb = f.model.params();
  float* w = pb.flat_params().data<float>();
  const float* g = pb.flat_grads().data<float>();
  for (int64_t i = 0; i < pb.numel(); ++i) w[i] -= 0.05f * g[i];
  const std::vector<double> after = grpo_token_logprobs(f.model, f.mb);
  double delta[2] = {0.0, 0.0};
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t s = 0; s < 8; ++s) delta[b] += f.mb.loss_mask[b * 8 + s] * (after[b * 8 + s] - lp[b * 8 + s]);
  EXPECT_GT(delta[0], 0.0) << "reward 1 (advantage > 0)";
  EXPECT_LT(delta[1], 0.0) << "reward 0 (advantage < 0)";
}

// --rl-inference-logprobs-is-correction's log-probabilities: recorded by the sampler from the KV-cache
// engine's logits at the position predicting each generated token; they equal π_old's from the full
// evaluation forward of the same policy there (float rounding apart), and are 0 elsewhere.
TEST(GrpoModel, InferenceLogProbsAreTheSamplersAtGeneratedTokens) {
  Fixture f;
  testing::TempDir dir;
  testing::write_file(dir.file("p.jsonl"), "{\"prompt\": \"1 2\", \"answer\": \"3\"}\n"
                                           "{\"prompt\": \"4 5 6\", \"answer\": \"7\"}\n");
  testing::write_file(dir.file("env.yaml"), "environment: exact_match\ndata: p.jsonl\nmax_new_tokens: 4\n");
  StatusOr<RlEnvironment> env = load_rl_environment(dir.file("env.yaml"));
  ASSERT_TRUE(env.ok()) << env.status().to_string();
  StatusOr<std::unique_ptr<NullTokenizer>> tok = NullTokenizer::create(f.c.vocab - 1);
  ASSERT_TRUE(tok.ok());
  GrpoArgs g;
  g.grpo_prompts_per_step = 2;
  g.grpo_group_size = 3;
  StatusOr<GrpoRollouts> r = collect_grpo_rollouts(f.model, **tok, *env, g, f.c.seq_length, 11, 0);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const int64_t S = f.c.seq_length;
  ASSERT_EQ(r->inference_logprobs.size(), static_cast<size_t>(r->rows * S));
  int64_t generated = 0;
  for (int64_t row = 0; row < r->rows; ++row) {
    const MicroBatch mb = grpo_micro_batch(*r, row, 1, (*tok)->eod(), 0);
    const std::vector<double> old = grpo_token_logprobs(f.model, mb);
    for (int64_t s = 0; s < S; ++s) {
      const double inf = r->inference_logprobs[static_cast<size_t>(row * S + s)];
      if (r->loss_mask[static_cast<size_t>(row * S + s)] == 0.0f) {
        if (s + 1 < S && mb.tokens[s + 1] != (*tok)->eod()) {
          EXPECT_EQ(inf, 0.0) << row << " " << s;  // predicts a prompt token
        }
        continue;
      }
      ++generated;
      EXPECT_LT(inf, 0.0);
      EXPECT_NEAR(inf, old[s], 1e-4) << row << " " << s;
    }
  }
  EXPECT_GT(generated, 6);
}

// The importance weight exp(old − inference) multiplies the policy term's gradient (KL and entropy
// off): inference = old − log 2 doubles every parameter gradient; with
// --rl-importance-sampling-truncation-coef 1.5 the weight, and so the gradient, is 1.5 times.
TEST(GrpoModel, ImportanceWeightScalesThePolicyGradientAndIsTruncated) {
  Fixture f;
  const std::vector<double> lp = grpo_token_logprobs(f.model, f.mb);
  std::vector<double> old(lp.size()), inference(lp.size());
  for (size_t i = 0; i < lp.size(); ++i) {
    old[i] = lp[i] + 0.05 * std::sin(static_cast<double>(i));  // ratios inside the clamp
    inference[i] = old[i] - std::log(2.0);
  }
  GrpoLossOptions o;
  o.clamp_eps_lower = o.clamp_eps_upper = 0.2;
  o.kl_beta = 0.0;
  ParamBuffer& pb = f.model.params();
  auto grads = [&](const GrpoLossOptions& opts, const std::vector<double>& inf) {
    pb.zero_grads();
    grpo_forward_backward(f.model, f.mb, 0, old, old, f.r.advantages, opts, inf);
    return std::vector<float>(pb.flat_grads().data<float>(), pb.flat_grads().data<float>() + pb.numel());
  };
  const std::vector<float> plain = grads(o, {}), weighted = grads(o, inference);
  GrpoLossOptions truncated = o;
  truncated.is_truncation_coef = 1.5;
  const std::vector<float> capped = grads(truncated, inference);
  double norm = 0.0;
  for (size_t i = 0; i < plain.size(); ++i) {
    norm += std::abs(plain[i]);
    EXPECT_NEAR(weighted[i], 2.0 * plain[i], 1e-5 + 1e-4 * std::abs(plain[i])) << i;
    EXPECT_NEAR(capped[i], 1.5 * plain[i], 1e-5 + 1e-4 * std::abs(plain[i])) << i;
  }
  EXPECT_GT(norm, 1e-3);
}

// --mtp-num-layers: the training micro-batch's loss mask becomes Megatron's for the MTP losses (every
// position but each row's last), whatever the rollouts' mask; tokens and labels stay.
TEST(GrpoModel, MtpLossMaskIsEveryPositionWithALabel) {
  GrpoRollouts r;
  r.rows = 2;
  r.seq_length = 4;
  r.tokens = {5, 6, 7, 0, 8, 9, 3, 4};
  r.loss_mask = {0, 0, 1, 0, 0, 1, 1, 0};
  r.inference_logprobs.assign(8, 0.0);
  r.rewards = {1.0, 0.0};
  r.advantages = {1.0, -1.0};
  r.prompt_index = {0, 0};
  r.completion_tokens = {1, 2};
  MicroBatch mb = grpo_micro_batch(r, 0, 2, 0, 0);
  const std::vector<int32_t> labels = mb.labels;
  grpo_mtp_loss_mask(&mb);
  EXPECT_EQ(mb.loss_mask, (std::vector<float>{1, 1, 1, 0, 1, 1, 1, 0}));
  EXPECT_EQ(mb.labels, labels);
  EXPECT_EQ(mb.labels, (std::vector<int32_t>{6, 7, 0, 0, 9, 3, 4, 0}));
  // Packed (--rl-use-sequence-packing): 1 but at each document's last position, the label rolled
  // within each rollout (Megatron's packed roll).
  MicroBatch packed;
  packed.B = 1;
  packed.S = 8;
  packed.loss_mask.assign(8, 0.0f);
  packed.document_ids = {0, 0, 0, 1, 1, 2, 2, 2};
  packed.packed_sequences = true;
  grpo_mtp_loss_mask(&packed);
  EXPECT_EQ(packed.loss_mask, (std::vector<float>{1, 1, 0, 1, 0, 1, 1, 0}));
}

}  // namespace
}  // namespace gale
