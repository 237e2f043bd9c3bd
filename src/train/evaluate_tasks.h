// The benchmarks of `gale evaluate`: multiple-choice questions scored by log-likelihood (MMLU's
// CSV files and prompt) and the perplexity of a text corpus.
//
// Multiple choice (--task mmlu). A subject is a file <subject>_test.csv (MMLU's layout: no header;
// question, one column per choice, the answer's letter last), with optional few-shot examples from
// <subject>_dev.csv. The prompt is the one of MMLU's paper and of lm-evaluation-harness:
//
//   The following are multiple choice questions (with answers) about abstract algebra.
//
//   <dev question>
//   A. <choice>
//   B. <choice>
//   ...
//   Answer: B
//
//   <test question>
//   A. ...
//   Answer:
//
// and the model's answer is the letter L whose continuation " L" has the highest log-likelihood
// after the prompt (MindSpeed-LLM's mmlu_ppl scoring; no generation, no parsing of free text).
//
// Perplexity (--task ppl): every document of a jsonl file, tokenized with an end-of-document token
// in front (the token that precedes a document in Megatron's packed training samples), in windows
// of at most --seq-length + 1 tokens; every token but a window's first is predicted from the ones
// before it in its window. Reports the mean negative log-likelihood per token and its exp.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace gale {

struct McQuestion {
  std::string question;
  std::vector<std::string> choices;
  int answer = 0;  // index into choices
};

struct McSubject {
  std::string name;               // e.g. "abstract_algebra"
  std::vector<McQuestion> test;   // scored
  std::vector<McQuestion> dev;    // few-shot examples, in file order
  std::string test_path;
};

// Questions of one MMLU-style CSV file: every row has the same number of columns (≥ 4: question,
// at least two choices, answer letter A, B, ...). Errors name the file and row.
StatusOr<std::vector<McQuestion>> read_mc_csv(const std::string& path);

// Every <subject>_test.csv under `dir` (recursively), sorted by subject, each with its
// <subject>_dev.csv when `shots` > 0 (an error names the missing file).
StatusOr<std::vector<McSubject>> read_mc_subjects(const std::string& dir, int64_t shots);

// "abstract_algebra" -> "abstract algebra".
std::string subject_title(const std::string& subject);

// One question as the prompt shows it, ending with "Answer:" (and " X\n\n" when it is an example).
std::string format_mc_question(const McQuestion& q, bool with_answer);

// The whole prompt for `q`: the header line, the first `shots` dev examples, then q.
std::string mc_prompt(const McSubject& subject, int64_t shots, const McQuestion& q);

// " A", " B", ...: the continuation scored for each choice.
std::string choice_continuation(int index);

// Log-likelihoods of each continuation after `context` (token ids): entry i is
// Σ log p(continuation_i[j] | context, continuation_i[..j]).
using ContinuationScorer = std::function<StatusOr<std::vector<double>>(
    std::span<const int32_t> context, const std::vector<std::vector<int32_t>>& continuations)>;

// Index of the highest score (the first on ties).
int argmax_choice(const std::vector<double>& scores);

}  // namespace gale
