// Multiple-choice benchmarks of `gale evaluate` from jsonl records, scored by log-likelihood as
// lm-evaluation-harness scores them (no generation):
//
// --task boolq: records {"passage", "question", "answer": true|false} (BoolQ's jsonl; MindSpeed-LLM's
//   prompt) -> context "<passage>\nQuestion: <question>?\nAnswer:", continuations " no" / " yes".
// --task hellaswag: records {"ctx" or "ctx_a" + "ctx_b", "activity_label", "endings": [4], "label"}
//   (HellaSwag's jsonl) -> context preprocess("<activity_label>: <ctx_a> <Ctx_b>") (ctx_b's first letter
//   capitalised), continuations " " + preprocess(ending), where preprocess strips the text, turns
//   " [title]" into ". ", drops other [bracketed] tags and folds double spaces.
// Accuracy takes the continuation with the highest summed log-probability; hellaswag also reports
// acc_norm, the highest log-probability per character (Unicode code point) of the continuation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace gale {

struct ChoiceItem {
  std::string context;
  std::vector<std::string> continuations;
  int answer = 0;
};

// One jsonl line of the task ("boolq" or "hellaswag"); errors name the missing or mistyped field.
StatusOr<ChoiceItem> parse_choice_item(const std::string& task, const std::string& line);

// HellaSwag's text cleaning (the header).
std::string hellaswag_preprocess(const std::string& text);

// Characters (code points) of UTF-8 text.
int64_t utf8_length(const std::string& s);

// Index of the best score after dividing each by its continuation's length in characters (the
// first on ties).
int argmax_per_character(const std::vector<double>& scores, const std::vector<std::string>& continuations);

}  // namespace gale
