// Megatron's GPTFIMDataset sample transformation (see data/fim.h).
#include "data/fim.h"

#include <algorithm>

namespace gale {

namespace {

// Byte offsets of the code points of valid UTF-8 `text`, plus text.size() at the end.
std::vector<size_t> code_point_offsets(const std::string& text) {
  std::vector<size_t> at;
  at.reserve(text.size() + 1);
  for (size_t i = 0; i < text.size(); ++i)
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) at.push_back(i);
  at.push_back(text.size());
  return at;
}

class Transformer {
 public:
  Transformer(const FimOptions& o, const HuggingFaceTokenizer& t, NumpyRandomState& rng) : o_(o), t_(t), rng_(rng) {}

  Status draw(double p, bool* hit) {
    int64_t x = rng_.binomial(1, p);
    if (x < 0) return Internal("binomial(1, ", p, ") is outside numpy's inversion range");
    *hit = x == 1;
    return Status::Ok();
  }

  // Megatron's _permute with truncate_or_pad False.
  Status permute(std::span<const int32_t> seq, double rate, std::vector<int32_t>* out) {
    bool fim = false;
    GALE_RETURN_IF_ERROR(draw(rate, &fim));
    if (!fim) {
      out->insert(out->end(), seq.begin(), seq.end());
      return Status::Ok();
    }
    GALE_ASSIGN_OR_RETURN(std::string text, t_.decode_without_special_tokens(seq));
    if (o_.no_prefix && text.starts_with(*o_.no_prefix)) {
      out->insert(out->end(), seq.begin(), seq.end());
      return Status::Ok();
    }
    std::vector<size_t> at = code_point_offsets(text);
    const int64_t length = static_cast<int64_t>(at.size()) - 1;
    int64_t b0 = rng_.randint(0, length + 1), b1 = rng_.randint(0, length + 1);
    if (b1 < b0) std::swap(b0, b1);
    std::vector<int32_t> prefix, middle, suffix;
    std::string_view all(text);
    GALE_RETURN_IF_ERROR(t_.encode(all.substr(0, at[b0]), &prefix));
    GALE_RETURN_IF_ERROR(t_.encode(all.substr(at[b0], at[b1] - at[b0]), &middle));
    GALE_RETURN_IF_ERROR(t_.encode(all.substr(at[b1]), &suffix));
    bool spm = false;
    GALE_RETURN_IF_ERROR(draw(o_.spm_rate, &spm));
    auto add = [&](const std::vector<int32_t>& v) { out->insert(out->end(), v.begin(), v.end()); };
    if (spm) {
      out->push_back(o_.prefix);
      out->push_back(o_.suffix);
      add(suffix);
      out->push_back(o_.middle);
      add(prefix);
      add(middle);
    } else {
      out->push_back(o_.prefix);
      add(prefix);
      out->push_back(o_.suffix);
      add(suffix);
      out->push_back(o_.middle);
      add(middle);
    }
    return Status::Ok();
  }

  // Megatron's _fim_split_and_permute_sequence.
  Status split_and_permute(std::span<const int32_t> seq, std::vector<int32_t>* out) {
    if (o_.split_sample < 0 || std::find(seq.begin(), seq.end(), o_.split_sample) == seq.end())
      return permute(seq, o_.rate, out);
    bool fim = false;
    GALE_RETURN_IF_ERROR(draw(o_.rate, &fim));
    if (!fim) {
      out->insert(out->end(), seq.begin(), seq.end());
      return Status::Ok();
    }
    return for_each_piece(seq, o_.split_sample, [&](std::span<const int32_t> piece, std::vector<int32_t>* o) {
      return permute(piece, o_.fragment_rate, o);
    }, out);
  }

  // Cuts `seq` at every `mark`; each non-empty piece before a mark is transformed and followed by
  // one mark; the piece after the last mark is transformed even when empty.
  template <class F>
  Status for_each_piece(std::span<const int32_t> seq, int32_t mark, F&& f, std::vector<int32_t>* out) {
    size_t start = 0;
    for (size_t i = 0; i < seq.size(); ++i) {
      if (seq[i] != mark) continue;
      if (i > start) {
        GALE_RETURN_IF_ERROR(f(seq.subspan(start, i - start), out));
        out->push_back(mark);
      }
      start = i + 1;
    }
    return f(seq.subspan(start), out);
  }

 private:
  const FimOptions& o_;
  const HuggingFaceTokenizer& t_;
  NumpyRandomState& rng_;
};

}  // namespace

Status resolve_fim_tokens(const HuggingFaceTokenizer& tokenizer, const FimTokenNames& names, FimOptions* options) {
  auto look = [&](const char* flag, const std::string& name, int32_t* id) -> Status {
    *id = tokenizer.token_id(name);
    if (*id < 0)
      return InvalidArgument(flag, ": expected a token of the tokenizer's vocabulary, found '", name,
                             "', which the tokenizer does not have");
    return Status::Ok();
  };
  GALE_RETURN_IF_ERROR(look("--fim-prefix-token", names.prefix, &options->prefix));
  GALE_RETURN_IF_ERROR(look("--fim-middle-token", names.middle, &options->middle));
  GALE_RETURN_IF_ERROR(look("--fim-suffix-token", names.suffix, &options->suffix));
  GALE_RETURN_IF_ERROR(look("--fim-pad-token", names.pad, &options->pad));
  GALE_RETURN_IF_ERROR(look("--fim-eod-token", names.eod, &options->eod));
  options->split_sample = -1;
  if (names.split_sample) GALE_RETURN_IF_ERROR(look("--fim-split-sample", *names.split_sample, &options->split_sample));
  return Status::Ok();
}

Status fim_transform(std::span<const int32_t> sample, const FimOptions& options, const HuggingFaceTokenizer& tokenizer,
                     NumpyRandomState& rng, std::vector<int32_t>* out) {
  Transformer t(options, tokenizer, rng);
  std::vector<int32_t> joined;
  joined.reserve(sample.size() + 16);
  if (std::find(sample.begin(), sample.end(), options.eod) == sample.end()) {
    GALE_RETURN_IF_ERROR(t.split_and_permute(sample, &joined));
  } else {
    GALE_RETURN_IF_ERROR(t.for_each_piece(sample, options.eod, [&](std::span<const int32_t> piece,
                                                                   std::vector<int32_t>* o) {
      return t.split_and_permute(piece, o);
    }, &joined));
  }
  joined.resize(sample.size(), options.pad);
  *out = std::move(joined);
  return Status::Ok();
}

}  // namespace gale
