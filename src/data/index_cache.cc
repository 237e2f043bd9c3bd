// Index cache files.
#include "data/index_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/log.h"
#include "data/npy.h"

namespace gale {

namespace {
uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

Status make_dirs(const std::string& dir) {
  std::string partial;
  std::stringstream ss(dir);
  std::string part;
  if (!dir.empty() && dir[0] == '/') partial = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    partial += part + "/";
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST)
      return IOError("--data-cache-path ", dir, ": cannot create ", partial, " (", std::strerror(errno), ")");
  }
  return Status::Ok();
}

StatusOr<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path, ": no such file");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Status write_text(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary);
    out << text;
    if (!out) return IOError(tmp, ": write failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return IOError(path, ": cannot move into place");
  return Status::Ok();
}
}  // namespace

std::string gpt_cache_description(const GptCacheKey& k) {
  return str_cat("{\n    \"class\": \"GPTDataset\",\n    \"dataset_path\": \"", k.path, "\",\n    \"fingerprint\": \"",
                 k.fingerprint, "\",\n    \"index_split\": \"", split_name(k.split), "\",\n    \"split\": \"",
                 k.split_text, "\",\n    \"sequence_range\": [", k.begin, ", ", k.end,
                 "],\n    \"num_samples\": ", k.params.num_samples, ",\n    \"random_seed\": ", k.params.seed,
                 ",\n    \"sequence_length\": ", k.params.seq_length,
                 ",\n    \"add_extra_token_to_sequence\": ", k.params.add_extra_token,
                 ",\n    \"drop_last_partial_sequence\": ", k.params.drop_last ? "true" : "false", "\n}");
}

std::string gpt_cache_base(const std::string& dir, const GptCacheKey& key) {
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(fnv1a64(gpt_cache_description(key))));
  return str_cat(dir, "/", hash, "-GPTDataset-", split_name(key.split), "-");
}

StatusOr<GptIndices> load_cached_gpt_indices(const std::string& dir, const GptCacheKey& key,
                                             const UnalignedArray<int32_t>& sizes) {
  std::string base = gpt_cache_base(dir, key);
  auto desc = read_text(base + "description.txt");
  if (!desc.ok()) return desc.status();
  auto bad = [&](const std::string& why) {
    warn_rank0(str_cat("ignoring the cached indices ", base, "*: ", why, "; rebuilding them"));
    return DataLoss(base, ": ", why);
  };
  if (*desc != gpt_cache_description(key)) return bad("the description differs (hash collision?)");
  auto doc = load_npy<int32_t>(base + "document_index.npy");
  auto sample = load_npy<int64_t>(base + "sample_index.npy");
  auto shuffle = load_npy<int64_t>(base + "shuffle_index.npy");
  if (!doc.ok()) return bad(doc.status().message());
  if (!sample.ok()) return bad(sample.status().message());
  if (!shuffle.ok()) return bad(shuffle.status().message());
  GptIndices g;
  g.document_index = std::move(doc->data);
  g.sample_index = std::move(sample->data);
  g.shuffle_index = std::move(shuffle->data);
  // Consistency: document ids inside the split, sample rows inside the document index, and the
  // shuffle a set of valid sample ids. (Cheap compared with reading the samples.)
  int64_t n = key.end - key.begin;
  if (n <= 0 || g.document_index.size() % static_cast<size_t>(n) != 0)
    return bad("document index has the wrong length");
  g.num_epochs = static_cast<int64_t>(g.document_index.size()) / n;
  for (int32_t d : g.document_index)
    if (d < key.begin || d >= key.end) return bad("document index outside the split");
  if (sample->shape.size() != 2 || sample->shape[1] != 2 || g.sample_index.size() < 2)
    return bad("sample index is not N x 2");
  int64_t total = static_cast<int64_t>(g.sample_index.size() / 2) - 1;
  for (int64_t r = 0; r <= total; ++r) {
    int64_t p = g.sample_index[static_cast<size_t>(2 * r)], o = g.sample_index[static_cast<size_t>(2 * r + 1)];
    if (p < 0 || p >= static_cast<int64_t>(g.document_index.size()) || o < 0 ||
        o > sizes[g.document_index[static_cast<size_t>(p)]])
      return bad("sample index row out of range");
    if (r > 0 && p < g.sample_index[static_cast<size_t>(2 * r - 2)]) return bad("sample index not monotonic");
  }
  if (static_cast<int64_t>(g.shuffle_index.size()) != total) return bad("shuffle index has the wrong length");
  for (int64_t s : g.shuffle_index)
    if (s < 0 || s >= total) return bad("shuffle index out of range");
  for (int64_t i = key.begin; i < key.end; ++i) g.tokens_per_epoch += sizes[i];
  g.separate_final_epoch = gpt_separate_final_epoch(g.num_epochs, g.tokens_per_epoch, key.params);
  return g;
}

namespace {
int64_t split_tokens(const GptCacheKey& key, const UnalignedArray<int32_t>& sizes) {
  int64_t t = 0;
  for (int64_t i = key.begin; i < key.end; ++i) t += sizes[i];
  return t;
}
}  // namespace

int64_t gpt_cached_sample_count(const GptCacheKey& key, const UnalignedArray<int32_t>& sizes) {
  const int64_t tokens = split_tokens(key, sizes);
  const int64_t epochs = gpt_num_epochs(tokens, key.params);
  const int64_t available = epochs * tokens - key.params.add_extra_token, S = key.params.seq_length;
  return key.params.drop_last ? available / S : (available + S - 1) / S;
}

StatusOr<GptIndices> load_trusted_gpt_indices(const std::string& dir, const GptCacheKey& key,
                                              const UnalignedArray<int32_t>& sizes, const std::string& flag) {
  const std::string base = gpt_cache_base(dir, key);
  auto missing = [&](const std::string& file, const Status& why) {
    return FailedPrecondition(flag, " requires all the dataset caches to be built and stored in --data-cache-path ",
                              dir, ": ", why.message(), " (", file.substr(file.rfind('/') + 1),
                              "); run once without it to build them");
  };
  auto doc = map_npy<int32_t>(base + "document_index.npy");
  if (!doc.ok()) return missing(base + "document_index.npy", doc.status());
  auto sample = map_npy<int64_t>(base + "sample_index.npy");
  if (!sample.ok()) return missing(base + "sample_index.npy", sample.status());
  auto shuffle = map_npy<int64_t>(base + "shuffle_index.npy");
  if (!shuffle.ok()) return missing(base + "shuffle_index.npy", shuffle.status());
  GptIndices g;
  g.maps = {doc->file, sample->file, shuffle->file};
  g.mapped_document_index = doc->data;
  g.mapped_sample_index = sample->data;
  g.mapped_shuffle_index = shuffle->data;
  const int64_t n = key.end - key.begin;
  const std::span<const int32_t> documents = g.documents();
  if (n <= 0 || documents.empty() || documents.size() % static_cast<size_t>(n) != 0 || sample->shape.size() != 2 ||
      sample->shape[1] != 2 || g.samples().size() < 2)
    return DataLoss(base, "*: the cached indices do not have the shapes of this dataset (", flag, " trusts ",
                    "--data-cache-path ", dir, "; rebuild the cache without it)");
  g.num_epochs = static_cast<int64_t>(documents.size()) / n;
  g.tokens_per_epoch = split_tokens(key, sizes);
  g.separate_final_epoch = gpt_separate_final_epoch(g.num_epochs, g.tokens_per_epoch, key.params);
  return g;
}

Status save_cached_gpt_indices(const std::string& dir, const GptCacheKey& key, const GptIndices& g) {
  GALE_RETURN_IF_ERROR(make_dirs(dir));
  std::string base = gpt_cache_base(dir, key);
  int64_t rows = static_cast<int64_t>(g.sample_index.size() / 2);
  GALE_RETURN_IF_ERROR(
      save_npy(base + "document_index.npy", g.document_index, {static_cast<int64_t>(g.document_index.size())}));
  GALE_RETURN_IF_ERROR(save_npy(base + "sample_index.npy", g.sample_index, {rows, 2}));
  GALE_RETURN_IF_ERROR(
      save_npy(base + "shuffle_index.npy", g.shuffle_index, {static_cast<int64_t>(g.shuffle_index.size())}));
  // The description goes last: its presence marks a complete entry.
  return write_text(base + "description.txt", gpt_cache_description(key));
}

}  // namespace gale
