// Byte-pair-encoding model: vocabulary, ranked merges and the merge loop, with a per-thread
// cache of encoded words.
//
// Works in "symbol space": for byte-level models (GPT-2, Llama-3, Qwen) the vocabulary keys are
// raw bytes (the byte-level characters already mapped back) and a word starts as its bytes; for
// character models (Mistral/LLaMA-2 style) the keys are UTF-8 text and a word starts as its
// characters, with `<0xXX>` byte fallback and an (optionally fused) unknown token. Merges apply
// lowest rank first, leftmost first among equal ranks, which is Hugging Face's order and gives
// the same result as GPT-2's original loop.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/status.h"

namespace gale {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct BpeOptions {
  bool byte_level = false;     // symbols are bytes
  bool byte_fallback = false;  // unknown characters become <0xXX> tokens
  int32_t unk_id = -1;         // id of the unknown token, -1 for none (unknown characters are dropped)
  bool fuse_unk = false;       // consecutive unknown characters give one unknown token
  bool ignore_merges = false;  // a word that is itself in the vocabulary is emitted as one token
};

class BpeModel {
 public:
  // `vocab` maps symbol-space keys to ids; `merges` are pairs of keys in rank order (a later
  // duplicate overrides an earlier one). Every merge's parts and result must be in the
  // vocabulary; `name` (the file) is used in errors. `ranks`, when given, holds each merge's
  // rank instead of its index (equal ranks merge leftmost first): tiktoken's rank-based BPE is
  // every split of every token into two tokens, ranked by the token's rank.
  static StatusOr<std::unique_ptr<BpeModel>> create(const StringIdMap& vocab,
                                                    const std::vector<std::pair<std::string, std::string>>& merges,
                                                    const BpeOptions& options, const std::string& name,
                                                    const std::vector<int32_t>* ranks = nullptr);

  // Appends the ids of one pre-tokenized word (symbol space). Thread-safe.
  void encode_word(std::string_view word, std::vector<int32_t>* out) const;

  int32_t token_id(std::string_view key) const;  // -1 when absent
  const BpeOptions& options() const { return options_; }

 private:
  BpeModel() = default;
  struct Merge {
    int32_t rank;
    int32_t id;
  };
  struct Symbol {
    int32_t id, prev, next, len;
  };
  const Merge* find_merge(int32_t left, int32_t right) const {
    auto it = merges_.find((static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right));
    return it == merges_.end() ? nullptr : &it->second;
  }
  void initial_symbols(std::string_view word, std::vector<Symbol>* syms) const;
  void merge_small(std::vector<Symbol>* syms) const;
  void merge_heap(std::vector<Symbol>* syms) const;
  void encode_uncached(std::string_view word, std::vector<int32_t>* out) const;

  StringIdMap vocab_;
  std::unordered_map<uint64_t, Merge> merges_;
  int32_t single_byte_id_[256];  // id of the one-byte key, -1 if absent
  int32_t fallback_id_[256];     // id of "<0xXX>", -1 if absent
  BpeOptions options_;
  uint64_t instance_ = 0;  // identifies this model in the per-thread caches
};

}  // namespace gale
