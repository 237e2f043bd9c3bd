// BPE merge loop (quadratic scan for short words, a priority queue for long ones) and word cache.
#include "tokenizer/bpe.h"

#include <atomic>
#include <cstdio>
#include <queue>

#include "tokenizer/unicode.h"

namespace gale {

namespace {
std::atomic<uint64_t> g_next_instance{1};

// One cache per thread, owned by the last model that used it on this thread.
struct WordCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, StringHash, std::equal_to<>>
      words;  // -> (start, count)
  std::vector<int32_t> ids;
  void reset(uint64_t new_owner) {
    owner = new_owner;
    words.clear();
    ids.clear();
  }
};
thread_local WordCache t_cache;
constexpr size_t kMaxCachedWordBytes = 96;
constexpr size_t kMaxCacheWords = 1 << 18;
constexpr size_t kSmallWord = 24;
}  // namespace

StatusOr<std::unique_ptr<BpeModel>> BpeModel::create(const StringIdMap& vocab,
                                                     const std::vector<std::pair<std::string, std::string>>& merges,
                                                     const BpeOptions& options, const std::string& name,
                                                     const std::vector<int32_t>* ranks) {
  std::unique_ptr<BpeModel> m(new BpeModel());
  m->vocab_ = vocab;
  m->options_ = options;
  m->instance_ = g_next_instance.fetch_add(1);
  for (int b = 0; b < 256; ++b) {
    m->single_byte_id_[b] = -1;
    m->fallback_id_[b] = -1;
    if (options.byte_level || b < 0x80) {
      std::string key(1, static_cast<char>(b));
      auto it = m->vocab_.find(key);
      if (it != m->vocab_.end()) m->single_byte_id_[b] = it->second;
    }
    char code[8];
    std::snprintf(code, sizeof code, "<0x%02X>", b);
    auto it = m->vocab_.find(std::string_view(code));
    if (it != m->vocab_.end()) m->fallback_id_[b] = it->second;
  }
  m->merges_.reserve(merges.size() * 2);
  std::string joined;
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    auto ia = m->vocab_.find(a), ib = m->vocab_.find(b);
    joined = a + b;
    auto ij = m->vocab_.find(joined);
    if (ia == m->vocab_.end() || ib == m->vocab_.end() || ij == m->vocab_.end())
      return InvalidArgument(name, ": merge ", r + 1, " ('", a, "' + '", b,
                             "') uses or makes a token that is not in the vocabulary");
    uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) | static_cast<uint32_t>(ib->second);
    m->merges_[key] = Merge{ranks ? (*ranks)[r] : static_cast<int32_t>(r), ij->second};
  }
  return m;
}

int32_t BpeModel::token_id(std::string_view key) const {
  auto it = vocab_.find(key);
  return it == vocab_.end() ? -1 : it->second;
}

void BpeModel::initial_symbols(std::string_view word, std::vector<Symbol>* syms) const {
  syms->clear();
  const unsigned char* p = reinterpret_cast<const unsigned char*>(word.data());
  auto push = [syms](int32_t id, int32_t len) {
    int32_t i = static_cast<int32_t>(syms->size());
    syms->push_back(Symbol{id, i - 1, i + 1, len});
  };
  // Hugging Face's order: an unknown run is added when the next known character comes (or at the
  // end), and byte-fallback tokens do not flush it.
  int32_t unk_len = 0;
  for (size_t i = 0; i < word.size();) {
    int len = options_.byte_level ? 1 : utf8_length(p[i]);
    if (i + static_cast<size_t>(len) > word.size()) len = static_cast<int>(word.size() - i);
    int32_t id = len == 1 ? single_byte_id_[p[i]] : token_id(word.substr(i, static_cast<size_t>(len)));
    if (id >= 0) {
      if (unk_len) {
        push(options_.unk_id, unk_len);
        unk_len = 0;
      }
      push(id, len);
    } else {
      bool fell_back = false;
      if (options_.byte_fallback) {
        bool all = true;
        for (int k = 0; k < len; ++k) all = all && fallback_id_[p[i + static_cast<size_t>(k)]] >= 0;
        if (all) {
          for (int k = 0; k < len; ++k) push(fallback_id_[p[i + static_cast<size_t>(k)]], 1);
          fell_back = true;
        }
      }
      if (!fell_back && options_.unk_id >= 0) {
        if (unk_len && !options_.fuse_unk) {
          push(options_.unk_id, unk_len);
          unk_len = 0;
        }
        unk_len += len;
      }
    }
    i += static_cast<size_t>(len);
  }
  if (unk_len) push(options_.unk_id, unk_len);
  if (!syms->empty()) syms->back().next = -1;
}

void BpeModel::merge_small(std::vector<Symbol>* syms) const {
  // Symbols stay in a dense array; each step merges the lowest-ranked (then leftmost) pair.
  auto& s = *syms;
  while (s.size() > 1) {
    int32_t best_rank = INT32_MAX, best_id = -1;
    size_t best = 0;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const Merge* m = find_merge(s[i].id, s[i + 1].id);
      if (m && m->rank < best_rank) {
        best_rank = m->rank;
        best_id = m->id;
        best = i;
      }
    }
    if (best_id < 0) break;
    s[best].id = best_id;
    s[best].len += s[best + 1].len;
    s.erase(s.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
}

void BpeModel::merge_heap(std::vector<Symbol>* syms) const {
  auto& s = *syms;
  struct Candidate {
    int32_t rank, pos, id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  for (size_t i = 0; i + 1 < s.size(); ++i)
    if (const Merge* m = find_merge(s[i].id, s[i + 1].id)) queue.push({m->rank, static_cast<int32_t>(i), m->id});
  while (!queue.empty()) {
    Candidate top = queue.top();
    queue.pop();
    Symbol& left = s[static_cast<size_t>(top.pos)];
    if (left.len == 0 || left.next < 0) continue;
    Symbol& right = s[static_cast<size_t>(left.next)];
    const Merge* m = find_merge(left.id, right.id);
    if (!m || m->id != top.id) continue;  // stale: a neighbour changed since this was queued
    left.id = top.id;
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (left.next >= 0) s[static_cast<size_t>(left.next)].prev = top.pos;
    if (left.prev >= 0) {
      const Symbol& prev = s[static_cast<size_t>(left.prev)];
      if (const Merge* pm = find_merge(prev.id, left.id)) queue.push({pm->rank, left.prev, pm->id});
    }
    if (left.next >= 0) {
      const Symbol& next = s[static_cast<size_t>(left.next)];
      if (const Merge* nm = find_merge(left.id, next.id)) queue.push({nm->rank, top.pos, nm->id});
    }
  }
  // Compact the surviving symbols in order.
  std::vector<Symbol> out;
  for (int32_t i = s.empty() ? -1 : 0; i >= 0; i = s[static_cast<size_t>(i)].next)
    out.push_back(s[static_cast<size_t>(i)]);
  s.swap(out);
}

void BpeModel::encode_uncached(std::string_view word, std::vector<int32_t>* out) const {
  if (options_.ignore_merges) {
    int32_t id = token_id(word);
    if (id >= 0) {
      out->push_back(id);
      return;
    }
  }
  thread_local std::vector<Symbol> syms;
  initial_symbols(word, &syms);
  if (syms.size() <= kSmallWord) {
    merge_small(&syms);
  } else {
    merge_heap(&syms);
  }
  for (const Symbol& sym : syms) out->push_back(sym.id);
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (word.size() > kMaxCachedWordBytes) {
    encode_uncached(word, out);
    return;
  }
  WordCache& cache = t_cache;
  if (cache.owner != instance_) cache.reset(instance_);
  auto it = cache.words.find(word);
  if (it != cache.words.end()) {
    out->insert(out->end(), cache.ids.begin() + it->second.first,
                cache.ids.begin() + it->second.first + it->second.second);
    return;
  }
  size_t before = out->size();
  encode_uncached(word, out);
  if (cache.words.size() >= kMaxCacheWords) cache.reset(instance_);
  uint32_t start = static_cast<uint32_t>(cache.ids.size());
  cache.ids.insert(cache.ids.end(), out->begin() + static_cast<std::ptrdiff_t>(before), out->end());
  cache.words.emplace(std::string(word), std::make_pair(start, static_cast<uint32_t>(out->size() - before)));
}

}  // namespace gale
