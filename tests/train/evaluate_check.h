// The check that `gale evaluate --task ppl` scores (train/evaluate.h: whole-sequence forwards, no
// cache) a document with the training forward's lm loss, shared by the tests of each model family.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <vector>

#include "model/gpt_model.h"
#include "tokenizer/null_tokenizer.h"
#include "train/evaluate.h"
#include "train/inference_model.h"

namespace gale::testing {

// A document of `n` tokens (17·i + 5 mod V): Σ −log p of each next token by
// sequence_negative_log_likelihood equals, within 1e-5 relative, the lm loss sum of the training
// forward on the same tokens and labels. *model is lent to the InferenceModel for the call.
inline void expect_ppl_scoring_equals_training_loss(std::unique_ptr<GPTModel>* model, int n) {
  const ModelConfig& c = (*model)->config();
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>((i * 17 + 5) % c.vocab));
  MicroBatch mb;
  mb.B = 1;
  mb.S = static_cast<int64_t>(ids.size()) - 1;
  mb.tokens.assign(ids.begin(), ids.end() - 1);
  mb.labels.assign(ids.begin() + 1, ids.end());
  mb.loss_mask.assign(static_cast<size_t>(mb.S), 1.0f);
  for (int64_t s = 0; s < mb.S; ++s) mb.position_ids.push_back(static_cast<int32_t>(s));
  GPTModel::LossSums train;
  (*model)->forward(0, mb, Tensor(), /*training=*/true, &train);
  InferenceModel m;
  m.config = c;
  StatusOr<std::unique_ptr<NullTokenizer>> tok = NullTokenizer::create(c.vocab - 1);  // its vocabulary: V
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  m.tokenizer = std::move(tok).value();
  m.model = std::move(*model);
  int64_t tokens = 0;
  const double nll = sequence_negative_log_likelihood(m, ids, mb.S, &tokens);
  *model = std::move(m.model);
  EXPECT_EQ(tokens, mb.S);
  EXPECT_EQ(train.tokens, static_cast<double>(mb.S));
  EXPECT_NEAR(nll, train.loss_sum, 1e-5 * train.loss_sum);
  std::printf("evaluate %.8f, training forward %.8f\n", nll, train.loss_sum);
}

}  // namespace gale::testing
