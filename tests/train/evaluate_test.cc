// `gale evaluate`'s scoring against log-softmax computed here in double from the model's logits:
// one-token and multi-token continuations, a context cut from the left, perplexity windows.
#include "train/evaluate.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tokenizer/tokenizer.h"

namespace gale {
namespace {

std::unique_ptr<InferenceModel> tiny_model() {
  auto m = std::make_unique<InferenceModel>();
  TokenizerOptions o;
  o.type = "SentencePieceTokenizer";
  o.tokenizer_model = std::string(GALE_TEST_DATA_DIR) + "/tokenizers/spm_austen.model";
  StatusOr<std::unique_ptr<Tokenizer>> tok = build_tokenizer(o);
  EXPECT_TRUE(tok.ok()) << tok.status().message();
  m->tokenizer = std::move(tok.value());
  ModelConfig& c = m->config;
  c.num_layers = 2;
  c.hidden = 32;
  c.ffn = 64;
  c.heads = 4;
  c.kv_heads = 4;
  c.head_dim = 8;
  c.vocab = 640;  // 605 padded to a multiple of 128
  c.seq_length = 16;
  c.max_positions = 24;
  c.init_std = 0.5f;  // far from uniform predictions
  m->ops = std::make_unique<OpTable>(reference_ops());
  m->model = std::make_unique<GPTModel>(c, single_process_partition(c), m->ops.get());
  m->model->params().initialize(11);
  return m;
}

// log p(next | ids) from the logits row, in double, over the tokenizer's vocabulary only.
double log_prob_here(const InferenceModel& m, std::span<const int32_t> ids, int32_t next) {
  const Tensor logits = m.logits(ids);
  const float* row = logits.data<float>() + (static_cast<int64_t>(ids.size()) - 1) * m.config.vocab;
  double sum = 0.0;
  for (int64_t v = 0; v < m.tokenizer->vocab_size(); ++v) sum += std::exp(static_cast<double>(row[v]));
  return static_cast<double>(row[next]) - std::log(sum);
}

TEST(Evaluate, OneTokenContinuationsInOnePassEqualSeparatePasses) {
  auto m = tiny_model();
  const std::vector<int32_t> context = {5, 17, 300, 42, 9};
  const std::vector<std::vector<int32_t>> one = {{7}, {100}, {604}, {7}};
  StatusOr<std::vector<double>> got = continuation_log_likelihoods(*m, 24, context, one);
  ASSERT_TRUE(got.ok()) << got.status().message();
  for (size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(got.value()[i], log_prob_here(*m, context, one[i][0]), 1e-5) << i;
  EXPECT_EQ(got.value()[0], got.value()[3]);
  EXPECT_NE(got.value()[0], got.value()[1]);
  double total = 0.0;  // the distribution over the real vocabulary sums to one
  const Tensor logits = m->logits(context);
  for (int32_t v = 0; v < 605; ++v) total += std::exp(token_log_prob(logits.data<float>() + 4 * 640, 605, v));
  EXPECT_NEAR(total, 1.0, 1e-9);
}

TEST(Evaluate, MultiTokenContinuationsSumTheirTokens) {
  auto m = tiny_model();
  const std::vector<int32_t> context = {5, 17, 300};
  const std::vector<std::vector<int32_t>> conts = {{7, 8}, {100}, {20, 21, 22}};
  StatusOr<std::vector<double>> got = continuation_log_likelihoods(*m, 24, context, conts);
  ASSERT_TRUE(got.ok()) << got.status().message();
  for (size_t i = 0; i < conts.size(); ++i) {
    std::vector<int32_t> ids = context;
    double want = 0.0;
    for (int32_t t : conts[i]) {
      want += log_prob_here(*m, ids, t);
      ids.push_back(t);
    }
    EXPECT_NEAR(got.value()[i], want, 1e-5) << i;
  }
}

TEST(Evaluate, LongContextsAreCutFromTheLeft) {
  auto m = tiny_model();
  std::vector<int32_t> context;
  for (int32_t i = 0; i < 40; ++i) context.push_back(3 + 11 * i % 600);
  const std::vector<int32_t> tail(context.end() - 8, context.end()), tail2(context.end() - 7, context.end());
  StatusOr<std::vector<double>> one = continuation_log_likelihoods(*m, 8, context, {{7}});
  ASSERT_TRUE(one.ok());
  EXPECT_NEAR(one.value()[0], log_prob_here(*m, tail, 7), 1e-5);
  StatusOr<std::vector<double>> two = continuation_log_likelihoods(*m, 9, context, {{7, 9}});
  ASSERT_TRUE(two.ok());
  std::vector<int32_t> with7 = tail2;
  with7.push_back(7);
  EXPECT_NEAR(two.value()[0], log_prob_here(*m, tail2, 7) + log_prob_here(*m, with7, 9), 1e-5);
  EXPECT_FALSE(continuation_log_likelihoods(*m, 8, context, {{}}).ok());
  EXPECT_FALSE(continuation_log_likelihoods(*m, 8, {}, {{7}}).ok());
}

TEST(Evaluate, PerplexityWindowsPredictEveryTokenButEachWindowsFirst) {
  auto m = tiny_model();
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < 10; ++i) ids.push_back(1 + 37 * i % 600);
  int64_t tokens = 0;
  const double nll = sequence_negative_log_likelihood(*m, ids, 4, &tokens);
  // windows [0, 5), [4, 9), [8, 10): tokens 1-4, 5-8 and 9 are predicted
  double want = 0.0;
  for (int start : {0, 4, 8})
    for (int s = start + 1; s < std::min(start + 5, 10); ++s)
      want -= log_prob_here(*m, std::span<const int32_t>(ids.data() + start, s - start), ids[s]);
  EXPECT_EQ(tokens, 9);
  EXPECT_NEAR(nll, want, 1e-4);
  tokens = 0;
  EXPECT_EQ(sequence_negative_log_likelihood(*m, std::span<const int32_t>(ids.data(), 1), 4, &tokens), 0.0);
  EXPECT_EQ(tokens, 0);
}

}  // namespace
}  // namespace gale
