// SentencePieceTokenizer, GPTSentencePieceTokenizer and Llama2Tokenizer.
#include "tokenizer/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include <fstream>

namespace gale {

SentencePieceTokenizer::SentencePieceTokenizer() : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}
SentencePieceTokenizer::~SentencePieceTokenizer() = default;

StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::load(const std::string& model_file,
                                                                               Variant variant,
                                                                               int64_t vocab_extra_ids) {
  static const char* kNames[] = {"SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer"};
  std::string type = kNames[static_cast<int>(variant)];
  if (model_file.empty())
    return InvalidArgument("--tokenizer-model is required for ", type, " (a SentencePiece .model)");
  std::ifstream probe(model_file, std::ios::binary);
  if (!probe) return NotFound("--tokenizer-model ", model_file, ": cannot open file");
  char first = 0;
  probe >> std::ws;
  probe.get(first);
  std::unique_ptr<SentencePieceTokenizer> t(new SentencePieceTokenizer());
  t->type_ = type;
  t->file_ = model_file;
  t->variant_ = variant;
  auto status = t->sp_->Load(model_file);
  if (!status.ok()) {
    if (first == '{')
      return InvalidArgument("--tokenizer-model ", model_file,
                             ": expected a SentencePiece model, found JSON (a tokenizer.json? "
                             "use --tokenizer-type HuggingFaceTokenizer)");
    return InvalidArgument("--tokenizer-model ", model_file, ": expected a SentencePiece model (", status.ToString(),
                           ")");
  }
  const int pieces = t->sp_->GetPieceSize();
  t->bos_ = t->sp_->bos_id();
  if (variant != Variant::kSentencePiece) {
    t->vocab_size_ = pieces;
    t->eod_ = t->sp_->eos_id();
    t->pad_ = variant == Variant::kGptSentencePiece ? t->sp_->pad_id() : -1;
    if (t->eod_ < 0)
      return InvalidArgument("--tokenizer-model ", model_file, ": the model has no end-of-sentence piece (eos_id)");
    if (variant == Variant::kLlama2 && t->bos_ < 0)
      return InvalidArgument("--tokenizer-model ", model_file,
                             ": the model has no beginning-of-sentence piece (bos_id)");
    return t;
  }
  // Megatron's _SentencePieceTokenizer: new specials get ids after the existing pieces.
  int32_t next = pieces;
  auto add_special = [&](const std::string& piece) -> int32_t {
    int32_t id = t->sp_->PieceToId(piece);
    // PieceToId returns unk for unknown pieces; check the round trip.
    if (id < 0 || id >= pieces || t->sp_->IdToPiece(id) != piece) {
      for (size_t k = 0; k < t->added_pieces_.size(); ++k)
        if (t->added_pieces_[k] == piece) id = pieces + static_cast<int32_t>(k);
      if (id < 0 || id >= pieces || t->sp_->IdToPiece(id) != piece) {
        if (!(id >= pieces && id < next)) {
          id = next++;
          t->added_pieces_.push_back(piece);
        }
      }
    }
    for (const auto& [p, i] : t->specials_)
      if (p == piece) return id;
    t->specials_.emplace_back(piece, id);
    return id;
  };
  add_special("<CLS>");
  add_special("<SEP>");
  t->eod_ = add_special("<EOD>");
  add_special("<MASK>");
  auto piece_or = [&](int id, const char* fallback) {
    return id >= 0 && id < pieces ? t->sp_->IdToPiece(id) : std::string(fallback);
  };
  t->pad_ = add_special(piece_or(t->sp_->pad_id(), "<PAD>"));
  t->bos_ = add_special(piece_or(t->sp_->bos_id(), "<BOS>"));
  add_special(piece_or(t->sp_->eos_id(), "<EOS>"));
  for (int64_t i = 0; i < vocab_extra_ids; ++i) add_special("<extra_id_" + std::to_string(i) + ">");
  t->vocab_size_ = next;
  return t;
}

Status SentencePieceTokenizer::encode_plain(std::string_view text, std::vector<int32_t>* ids) const {
  std::vector<int> out;
  auto status = sp_->Encode(absl::string_view(text.data(), text.size()), &out);
  if (!status.ok())
    return InvalidArgument(type_, ": SentencePiece could not encode the text (", status.ToString(), ")");
  ids->insert(ids->end(), out.begin(), out.end());
  return Status::Ok();
}

Status SentencePieceTokenizer::encode(std::string_view text, std::vector<int32_t>* ids) const {
  GALE_RETURN_IF_ERROR(check_utf8(text));
  if (variant_ == Variant::kLlama2) {
    ids->push_back(bos_);
    return encode_plain(text, ids);
  }
  if (variant_ == Variant::kGptSentencePiece) return encode_plain(text, ids);
  // Megatron: repeatedly take the earliest special token (first in order on ties).
  size_t idx = 0;
  while (true) {
    size_t best = std::string_view::npos;
    const std::pair<std::string, int32_t>* which = nullptr;
    for (const auto& sp : specials_) {
      size_t at = text.find(sp.first, idx);
      if (at != std::string_view::npos && (best == std::string_view::npos || at < best)) {
        best = at;
        which = &sp;
      }
    }
    if (!which) break;
    GALE_RETURN_IF_ERROR(encode_plain(text.substr(idx, best - idx), ids));
    ids->push_back(which->second);
    idx = best + which->first.size();
  }
  return encode_plain(text.substr(idx), ids);
}

StatusOr<std::string> SentencePieceTokenizer::decode(std::span<const int32_t> ids) const {
  const int pieces = sp_->GetPieceSize();
  auto decode_run = [&](std::span<const int32_t> run) -> StatusOr<std::string> {
    std::vector<int> v;
    for (int32_t id : run) {
      if (id < 0 || id >= pieces) return OutOfRange(type_, ": id ", id, " is not in the vocabulary of ", vocab_size_);
      v.push_back(id);
    }
    std::string out;
    auto status = sp_->Decode(v, &out);
    if (!status.ok()) return InvalidArgument(type_, ": cannot decode (", status.ToString(), ")");
    return out;
  };
  if (variant_ != Variant::kSentencePiece) return decode_run(ids);
  // Megatron: special tokens are written out, separated by spaces.
  std::string text;
  size_t last = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string* special = nullptr;
    for (const auto& sp : specials_)
      if (sp.second == ids[i]) special = &sp.first;
    if (!special) continue;
    GALE_ASSIGN_OR_RETURN(std::string part, decode_run(ids.subspan(last, i - last)));
    text += part + " " + *special + " ";
    last = i + 1;
  }
  GALE_ASSIGN_OR_RETURN(std::string rest, decode_run(ids.subspan(last)));
  return text + rest;
}

std::string SentencePieceTokenizer::describe() const {
  return str_cat(type_, " (", file_, "): vocabulary ", vocab_size_, ", eod ", eod_);
}

}  // namespace gale
