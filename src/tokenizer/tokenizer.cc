// The tokenizer factory.
#include "tokenizer/tokenizer.h"

#include "tokenizer/gpt2_tokenizer.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/null_tokenizer.h"
#include "tokenizer/sentencepiece_tokenizer.h"
#include "tokenizer/tiktoken_tokenizer.h"

namespace gale {

StatusOr<std::unique_ptr<Tokenizer>> build_tokenizer(const TokenizerOptions& o) {
  std::string type = o.type.empty() ? "GPT2BPETokenizer" : o.type;
  if (type == "GPT2BPETokenizer") {
    GALE_ASSIGN_OR_RETURN(auto t, Gpt2BpeTokenizer::load(o.vocab_file, o.merge_file));
    return std::unique_ptr<Tokenizer>(std::move(t));
  }
  // SFTTokenizer (Megatron's --sft tokenizer) is a HuggingFaceTokenizer underneath; its prompt
  // format and pad live in data/sft_conversation.h.
  if (type == "HuggingFaceTokenizer" || type == "PretrainedFromHF" || type == "SFTTokenizer") {
    GALE_ASSIGN_OR_RETURN(auto t, HuggingFaceTokenizer::load(o.tokenizer_model));
    return std::unique_ptr<Tokenizer>(std::move(t));
  }
  if (type == "SentencePieceTokenizer" || type == "GPTSentencePieceTokenizer" || type == "Llama2Tokenizer") {
    auto variant = type == "SentencePieceTokenizer"      ? SentencePieceTokenizer::Variant::kSentencePiece
                   : type == "GPTSentencePieceTokenizer" ? SentencePieceTokenizer::Variant::kGptSentencePiece
                                                         : SentencePieceTokenizer::Variant::kLlama2;
    GALE_ASSIGN_OR_RETURN(auto t, SentencePieceTokenizer::load(o.tokenizer_model, variant, o.vocab_extra_ids));
    return std::unique_ptr<Tokenizer>(std::move(t));
  }
  if (type == "TikTokenizer") {
    TiktokenOptions to{o.tiktoken_pattern, o.vocab_size, o.tiktoken_num_special_tokens, o.tiktoken_special_tokens};
    GALE_ASSIGN_OR_RETURN(auto t, TikTokenizer::load(o.tokenizer_model, to));
    return std::unique_ptr<Tokenizer>(std::move(t));
  }
  if (type == "NullTokenizer") {
    GALE_ASSIGN_OR_RETURN(auto t, NullTokenizer::create(o.vocab_size));
    return std::unique_ptr<Tokenizer>(std::move(t));
  }
  return Unimplemented("--tokenizer-type ", type,
                       " is not supported (Gale supports GPT2BPETokenizer, HuggingFaceTokenizer, "
                       "SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer, TikTokenizer, NullTokenizer, "
                       "SFTTokenizer)");
}

}  // namespace gale
