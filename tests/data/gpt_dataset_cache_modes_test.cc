// GptDataset under --dataloader-fast-cache-load and --dataloader-defer-npy-index-mmap
// (GptCacheMode): the same samples as the normal cache path; the fast path trusts the cache (a
// missing description.txt is not rebuilt, no file is rewritten, a corrupt entry surfaces only at its
// sample); an incomplete cache is an error naming --data-cache-path and the file; deferred indices
// are read at the first sample, not at construction.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <filesystem>
#include <random>
#include <thread>

#include "data/data_test_util.h"
#include "data/gpt_dataset.h"
#include "data/index_cache.h"
#include "data/npy.h"
#include "data/token_source.h"

namespace gale {
namespace {

namespace fs = std::filesystem;

struct Cached {
  testing::TempDir dir;
  std::shared_ptr<TokenSource> source;
  std::string cache;
  GptIndexParams params;
  Cached() {
    std::mt19937 rng(9);
    std::vector<std::vector<int32_t>> docs(50);
    for (auto& d : docs) {
      d.resize(2 + rng() % 12);
      for (int32_t& t : d) t = static_cast<int32_t>(rng() % 90);
      d.push_back(90);
    }
    testing::write_dataset(dir.file("docs"), docs);
    source = open_indexed_source(dir.file("docs")).value();
    cache = dir.file("cache");
    params.seq_length = 16;
    params.num_samples = 100;  // several epochs
  }
  StatusOr<std::unique_ptr<GptDataset>> build(const GptCacheMode& mode, const std::string& cache_dir) const {
    return GptDataset::build(source, DataSplit::kTrain, 0, 45, params, cache_dir, "90,10,0", mode);
  }
  std::string file(const std::string& affix) const {
    GptCacheKey key{source->name(), source->fingerprint(), DataSplit::kTrain, 0, 45, params, "90,10,0"};
    return gpt_cache_base(cache, key) + affix;
  }
};

std::vector<std::vector<int32_t>> all_samples(const TokenDataset& d) {
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(d.size()));
  for (int64_t k = 0; k < d.size(); ++k) EXPECT_TRUE(d.sample_tokens(k, -1, &out[static_cast<size_t>(k)]).ok()) << k;
  return out;
}

GptCacheMode fast() {
  GptCacheMode m;
  m.fast_cache_load = true;
  return m;
}
GptCacheMode deferred() {
  GptCacheMode m;
  m.defer_npy_index_mmap = true;
  return m;
}

TEST(GptDatasetCacheModes, SameSamplesAsTheNormalPath) {
  Cached c;
  auto normal = c.build({}, c.cache);  // builds and writes the cache
  ASSERT_TRUE(normal.ok()) << normal.status().to_string();
  ASSERT_FALSE((*normal)->loaded_from_cache());
  const auto expected = all_samples(**normal);
  ASSERT_GE(expected.size(), 100u);
  GptCacheMode both = fast();
  both.defer_npy_index_mmap = true;
  for (const GptCacheMode& mode : {fast(), deferred(), both}) {
    auto d = c.build(mode, c.cache);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    EXPECT_TRUE((*d)->loaded_from_cache());
    EXPECT_EQ((*d)->size(), (*normal)->size());  // deferred: from the sequence lengths alone
    EXPECT_EQ(all_samples(**d), expected);
    EXPECT_EQ((*d)->indices().num_epochs, (*normal)->indices().num_epochs);
    EXPECT_EQ((*d)->indices().separate_final_epoch, (*normal)->indices().separate_final_epoch);
  }
}

// The normal path rebuilds an entry without its description (and rewrites its files); the fast path
// loads the .npy files as they are and writes nothing.
TEST(GptDatasetCacheModes, FastPathTrustsTheCacheAndRebuildsNothing) {
  Cached c;
  ASSERT_TRUE(c.build({}, c.cache).ok());
  auto cached = c.build({}, c.cache);
  ASSERT_TRUE(cached.ok());
  ASSERT_TRUE((*cached)->loaded_from_cache());
  const auto expected = all_samples(**cached);
  ASSERT_TRUE(fs::remove(c.file("description.txt")));
  const auto mtime = fs::last_write_time(c.file("shuffle_index.npy"));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  auto f = c.build(fast(), c.cache);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(all_samples(**f), expected);
  EXPECT_FALSE(fs::exists(c.file("description.txt")));
  EXPECT_EQ(fs::last_write_time(c.file("shuffle_index.npy")), mtime);
  auto normal = c.build({}, c.cache);
  ASSERT_TRUE(normal.ok());
  EXPECT_FALSE((*normal)->loaded_from_cache());  // the slow path rebuilt it
  EXPECT_TRUE(fs::exists(c.file("description.txt")));
  EXPECT_NE(fs::last_write_time(c.file("shuffle_index.npy")), mtime);
}

// A shuffle entry past the sample index: the normal path refuses the entry and rebuilds it; the
// fast path takes it, and only the sample that uses it fails (bounds-checked, no stray read).
TEST(GptDatasetCacheModes, FastPathChecksBoundsPerSample) {
  Cached c;
  ASSERT_TRUE(c.build({}, c.cache).ok());
  NpyArray<int64_t> shuffle = load_npy<int64_t>(c.file("shuffle_index.npy")).value();
  shuffle.data[5] = 1 << 20;
  ASSERT_TRUE(save_npy(c.file("shuffle_index.npy"), shuffle.data, shuffle.shape).ok());
  auto f = c.build(fast(), c.cache);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  std::vector<int32_t> out;
  EXPECT_TRUE((*f)->sample_tokens(4, -1, &out).ok());
  const Status bad = (*f)->sample_tokens(5, -1, &out);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("is outside the sample index"), std::string::npos) << bad.message();
  auto normal = c.build({}, c.cache);
  ASSERT_TRUE(normal.ok());
  EXPECT_FALSE((*normal)->loaded_from_cache());
  EXPECT_TRUE((*normal)->sample_tokens(5, -1, &out).ok());
}

TEST(GptDatasetCacheModes, IncompleteCacheIsAnErrorNamingTheFile) {
  Cached c;
  auto f = c.build(fast(), c.cache);  // nothing cached yet
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("--dataloader-fast-cache-load requires all the dataset caches to be built and "
                                      "stored in --data-cache-path " + c.cache),
            std::string::npos)
      << f.status().message();
  EXPECT_NE(f.status().message().find(c.file("document_index.npy")), std::string::npos) << f.status().message();
  EXPECT_FALSE(fs::exists(c.cache));  // nothing built or written
  ASSERT_TRUE(c.build({}, c.cache).ok());
  ASSERT_TRUE(fs::remove(c.file("sample_index.npy")));
  f = c.build(fast(), c.cache);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find(c.file("sample_index.npy")), std::string::npos) << f.status().message();
}

// Deferred: construction reads no .npy file (an empty cache builds fine); the first sample reads
// them, and then a missing one is that read's error.
TEST(GptDatasetCacheModes, DeferredIndicesAreReadAtTheFirstSample) {
  Cached c;
  auto empty = c.build(deferred(), c.cache);
  ASSERT_TRUE(empty.ok()) << empty.status().to_string();
  std::vector<int32_t> out;
  const Status missing = (*empty)->sample_tokens(0, -1, &out);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("--dataloader-defer-npy-index-mmap requires all the dataset caches"),
            std::string::npos)
      << missing.message();
  EXPECT_NE(missing.message().find(c.file("document_index.npy")), std::string::npos) << missing.message();

  ASSERT_TRUE(c.build({}, c.cache).ok());
  auto d = c.build(deferred(), c.cache);
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE((*d)->indices().shuffle().empty());  // not loaded at construction
  ASSERT_TRUE(fs::remove(c.file("shuffle_index.npy")));  // removed after construction
  const Status late = (*d)->sample_tokens(0, -1, &out);
  ASSERT_FALSE(late.ok());
  EXPECT_NE(late.message().find(c.file("shuffle_index.npy")), std::string::npos) << late.message();

  ASSERT_TRUE(c.build({}, c.cache).ok());  // rebuilt
  auto ok = c.build(deferred(), c.cache);
  ASSERT_TRUE(ok.ok());
  ASSERT_TRUE((*ok)->sample_tokens(0, -1, &out).ok());
  EXPECT_FALSE((*ok)->indices().shuffle().empty());
  ASSERT_TRUE(fs::remove(c.file("shuffle_index.npy")));  // loaded once: later samples need no file
  EXPECT_TRUE((*ok)->sample_tokens(1, -1, &out).ok());
}

// This process's memory maps (/proc/self/maps).
std::string process_maps() {
  std::ifstream in("/proc/self/maps");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Both flags map the three cached .npy files read-only (Megatron's numpy.load(mmap_mode='r')):
// the arrays point into mappings of the files, which /proc/self/maps lists while the dataset
// lives, and no copy is made; the normal cache path copies (it checks every entry).
TEST(GptDatasetCacheModes, TheTrustedPathsMapTheNpyFiles) {
  Cached c;
  auto normal = c.build({}, c.cache);
  ASSERT_TRUE(normal.ok()) << normal.status().to_string();
  auto reread = c.build({}, c.cache);
  ASSERT_TRUE(reread.ok() && (*reread)->loaded_from_cache());
  EXPECT_FALSE((*reread)->indices().mapped());
  EXPECT_EQ(process_maps().find(c.file("shuffle_index.npy")), std::string::npos);
  const char* files[3] = {"document_index.npy", "sample_index.npy", "shuffle_index.npy"};
  for (const GptCacheMode& mode : {fast(), deferred()}) {
    {
      auto d = c.build(mode, c.cache);
      ASSERT_TRUE(d.ok()) << d.status().to_string();
      ASSERT_TRUE((*d)->load_indices().ok());
      const GptIndices& g = (*d)->indices();
      ASSERT_TRUE(g.mapped());
      EXPECT_TRUE(g.document_index.empty() && g.sample_index.empty() && g.shuffle_index.empty());
      EXPECT_EQ(g.size(), (*normal)->indices().size());
      EXPECT_TRUE(std::equal(g.shuffle().begin(), g.shuffle().end(), (*normal)->indices().shuffle().begin()));
      const std::string maps = process_maps();
      for (const char* f : files) EXPECT_NE(maps.find(c.file(f)), std::string::npos) << f << "\n" << maps;
      // The arrays lie inside their mappings (each file's bytes after the .npy header).
      ASSERT_EQ(g.maps.size(), 3u);
      const uint8_t* shuffle = reinterpret_cast<const uint8_t*>(g.shuffle().data());
      EXPECT_GE(shuffle, g.maps[2]->data());
      EXPECT_EQ(shuffle + g.shuffle().size_bytes(), g.maps[2]->data() + g.maps[2]->size());
    }
    EXPECT_EQ(process_maps().find(c.file("shuffle_index.npy")), std::string::npos);  // unmapped with the dataset
  }
}

// map_npy checks what load_npy checks: the dtype, and the size against the header.
TEST(GptDatasetCacheModes, MappedNpyChecksTheFile) {
  testing::TempDir dir;
  ASSERT_TRUE(save_npy<int64_t>(dir.file("a.npy"), {1, 2, 3, 4, 5, 6}, {3, 2}).ok());
  auto m = map_npy<int64_t>(dir.file("a.npy"));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(std::vector<int64_t>(m->data.begin(), m->data.end()), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  auto wrong = map_npy<int32_t>(dir.file("a.npy"));
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("expected dtype <i4"), std::string::npos) << wrong.status().message();
  fs::resize_file(dir.file("a.npy"), fs::file_size(dir.file("a.npy")) - 8);
  auto cut = map_npy<int64_t>(dir.file("a.npy"));
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find("bytes, found"), std::string::npos) << cut.status().message();
}

}  // namespace
}  // namespace gale
