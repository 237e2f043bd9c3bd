// `gale evaluate`: benchmarks of a trained checkpoint on one process (MindSpeed-LLM's
// evaluation.py --task): MMLU-style multiple choice by log-likelihood, and text perplexity
// (train/evaluate_tasks.h says what each computes). The model and tokenizer flags are those the
// checkpoint was trained with, as for `gale generate`.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "train/inference_model.h"

namespace gale {

// Log-likelihood of each continuation after `context` under `m` (see ContinuationScorer). The
// context is cut from the left when context + continuation exceed `max_tokens`; when every
// continuation is one token, one forward pass serves them all.
StatusOr<std::vector<double>> continuation_log_likelihoods(const InferenceModel& m, int64_t max_tokens,
                                                           std::span<const int32_t> context,
                                                           const std::vector<std::vector<int32_t>>& continuations);

// Σ of −log p over the predicted tokens of `ids` in windows of at most `window` + 1 tokens (each
// window's first token is context only); adds the count of predicted tokens to *tokens.
double sequence_negative_log_likelihood(const InferenceModel& m, std::span<const int32_t> ids, int64_t window,
                                        int64_t* tokens);

// Returns the process exit code (0, 2 for a command-line error, 1 for a failure).
int evaluate_main(int argc, char** argv);

}  // namespace gale
