// Megatron's SentencePiece-based tokenizers over Debian's libsentencepiece:
//  * SentencePieceTokenizer: adds <CLS> <SEP> <EOD> <MASK>, the pad/bos/eos pieces and
//    <extra_id_N> (--vocab-extra-ids) as special tokens (new ids after the model's pieces), splits
//    the text around them, and uses <EOD> as eod;
//  * GPTSentencePieceTokenizer: the model's pieces only, eod = the model's eos;
//  * Llama2Tokenizer: like GPTSentencePieceTokenizer, with the bos id prepended to every text.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace gale {

class SentencePieceTokenizer : public Tokenizer {
 public:
  enum class Variant { kSentencePiece, kGptSentencePiece, kLlama2 };
  static StatusOr<std::unique_ptr<SentencePieceTokenizer>> load(const std::string& model_file, Variant variant,
                                                                int64_t vocab_extra_ids);
  ~SentencePieceTokenizer() override;

  const std::string& type() const override { return type_; }
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t eod() const override { return eod_; }
  int32_t pad() const override { return pad_; }
  int32_t bos() const override { return bos_; }
  Status encode(std::string_view text, std::vector<int32_t>* ids) const override;
  StatusOr<std::string> decode(std::span<const int32_t> ids) const override;
  std::string describe() const override;

 private:
  SentencePieceTokenizer();
  Status encode_plain(std::string_view text, std::vector<int32_t>* ids) const;
  std::string type_;
  std::string file_;
  Variant variant_ = Variant::kSentencePiece;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::vector<std::pair<std::string, int32_t>> specials_;  // SentencePieceTokenizer only, in Megatron's order
  std::vector<std::string> added_pieces_;                  // ids piece_size.. of the added specials
  int64_t vocab_size_ = 0;
  int32_t eod_ = -1, pad_ = -1, bos_ = -1;
};

}  // namespace gale
