// Tokenizers chosen with Megatron's flags (--tokenizer-type, --vocab-file, --merge-file,
// --tokenizer-model, --vocab-size, --tiktoken-*): GPT2BPETokenizer, HuggingFaceTokenizer,
// SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer, TikTokenizer and NullTokenizer, each
// giving the ids Megatron's class of the same name gives (see docs/data.md for the rules).
// MindSpeed-LLM's PretrainedFromHF (with --tokenizer-name-or-path) is HuggingFaceTokenizer.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace gale {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual const std::string& type() const = 0;  // the --tokenizer-type name
  // The vocabulary size as Megatron reports it (tokenizer.vocab_size), before padding.
  virtual int64_t vocab_size() const = 0;
  virtual int32_t eod() const = 0;
  // Megatron's tokenizer.pad where the class defines one, else -1 (GPTDataset's fallback).
  virtual int32_t pad() const { return -1; }
  // Megatron main's tokenizer.bos (the beginning-of-sequence id its RL prompts start with), -1 where
  // the class has none: GPT2BPETokenizer <|endoftext|> (transformers' GPT-2 bos_token, which Megatron
  // main's GPT2BPETokenizer wraps); HuggingFaceTokenizer tokenizer_config.json's bos_token, else its
  // cls_token (Megatron's HF wrapper sets one from the other); the SentencePiece classes and
  // TikTokenizer the bos id their encode uses; NullTokenizer none.
  virtual int32_t bos() const { return -1; }

  // Appends the ids of `text` (Megatron's tokenizer.tokenize(text)) to *ids. Thread-safe. Fails
  // on invalid UTF-8 (naming the byte offset) or, for NullTokenizer, on text that is not
  // space-separated integers.
  virtual Status encode(std::string_view text, std::vector<int32_t>* ids) const = 0;
  // Megatron's tokenizer.detokenize(ids). Fails on an id outside the vocabulary.
  virtual StatusOr<std::string> decode(std::span<const int32_t> ids) const = 0;

  // One line for the start-up log: type, files, vocabulary size, eod.
  virtual std::string describe() const;
};

// The tokenizer flags (a copy of TokenizerArgs, so that this layer does not depend on train/).
struct TokenizerOptions {
  std::string type;  // empty -> GPT2BPETokenizer
  std::string vocab_file, merge_file, tokenizer_model;
  int64_t vocab_size = -1;
  int64_t vocab_extra_ids = 0;
  // TikTokenizer (--tiktoken-pattern, --tiktoken-num-special-tokens, --tiktoken-special-tokens).
  std::string tiktoken_pattern;
  int64_t tiktoken_num_special_tokens = 1000;
  std::vector<std::string> tiktoken_special_tokens;
};

// Builds the tokenizer; errors name the flag or file and say what was expected (e.g. a
// tokenizer.json given where a SentencePiece model is expected).
StatusOr<std::unique_ptr<Tokenizer>> build_tokenizer(const TokenizerOptions& options);

// "invalid UTF-8 at byte N" when `text` is not valid UTF-8, else OK.
Status check_utf8(std::string_view text);

}  // namespace gale
