// Megatron's cached teacher logits (train/cached_logits.h): the saver's top-K/top-P selection
// against a brute-force sort, the exact save -> load round trip of the payload and the tar shard,
// the dataset hash against Python's hashlib/json, and the student's DP remapping and errors.
#include "train/cached_logits.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <vector>
#include <unistd.h>

#include "core/dtype.h"
#include "model/topk_kl.h"

namespace gale {
namespace {

std::vector<float> logits_of(int64_t T, int64_t V, double seed) {
  std::vector<float> z(static_cast<size_t>(T * V));
  for (int64_t i = 0; i < T * V; ++i) z[i] = static_cast<float>(3.0 * std::sin(seed * 1.7 + 0.61 * i + 0.013 * i * i));
  return z;
}

// The teacher's saved top-K are its logits' K largest (by sorting all of them), with
// log-probabilities over the whole vocabulary rounded to fp16.
TEST(CachedLogits, TopKIsTheLogitsTopK) {
  const int64_t S = 3, B = 2, V = 50, k = 5;
  const std::vector<float> z = logits_of(S * B, V, 1.0);
  double kept = 0.0;
  auto r = select_topk_logprobs(z.data(), S, B, V, k, std::nullopt, 1, LogitsSaveDtype::kF16, &kept);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->K, k);
  EXPECT_EQ(kept, static_cast<double>(k));
  for (int64_t t = 0; t < S * B; ++t) {
    std::vector<int64_t> order(V);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return z[t * V + a] > z[t * V + b]; });
    double lse = 0.0;
    for (int64_t v = 0; v < V; ++v) lse += std::exp(static_cast<double>(z[t * V + v]));
    lse = std::log(lse);
    for (int64_t j = 0; j < k; ++j) {
      EXPECT_EQ(r->indices[t * k + j], order[j]) << t << " " << j;
      const float want = f16_to_float(float_to_f16(static_cast<float>(z[t * V + order[j]] - lse)));
      EXPECT_NEAR(r->logprobs[t * k + j], want, 1e-3 * std::abs(want) + 1e-6);
    }
  }
}

// Top-P (p = 0.45): entries are kept while the mass before them is < p (at least min_k); K is cut to the
// largest kept count and the rest are the sentinels.
TEST(CachedLogits, TopPMasksTheTail) {
  const int64_t V = 6;
  // Token 0: one dominant entry; token 1: flat.
  const std::vector<float> z = {8, 1, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1};
  auto r = select_topk_logprobs(z.data(), 2, 1, V, 6, 0.45, 1, LogitsSaveDtype::kF32);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->K, 3);  // flat: 0, 1/6, 2/6 before entries 0..2 are < 0.45; 3/6 is not
  EXPECT_EQ(r->logprobs[1], kCachedLogitsLogprobSentinel);
  EXPECT_EQ(r->indices[1], kCachedLogitsMaskedIndex);
  EXPECT_EQ(r->indices[0], 0);
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(r->logprobs[3 + j], std::log(1.0 / 6.0), 1e-6);
  auto floor2 = select_topk_logprobs(z.data(), 2, 1, V, 6, 0.45, 2, LogitsSaveDtype::kF32);
  ASSERT_TRUE(floor2.ok());
  EXPECT_NE(floor2->logprobs[1], kCachedLogitsLogprobSentinel);  // min_k 2 keeps token 0's second entry
  EXPECT_EQ(floor2->logprobs[2], kCachedLogitsLogprobSentinel);
}

TEST(CachedLogits, RefusesLargeVocabulariesAndBadFlags) {
  std::vector<float> z(kCachedLogitsMaxVocab + 1, 0.0f);
  auto r = select_topk_logprobs(z.data(), 1, 1, kCachedLogitsMaxVocab + 1, 4, std::nullopt, 1, LogitsSaveDtype::kF16);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().to_string().find("17 bits"), std::string::npos);
  auto d = parse_logits_save_dtype("fp8");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().to_string().find("--logits-save-dtype"), std::string::npos);
}

// The payload round trip is exact in every save dtype, indices above 2^16 included (bit 17).
TEST(CachedLogits, PayloadRoundTripIsExact) {
  for (LogitsSaveDtype dt : {LogitsSaveDtype::kF16, LogitsSaveDtype::kBF16, LogitsSaveDtype::kF32}) {
    const int64_t V = 70000;
    std::vector<TopKLogProbs> mbs;
    for (int m = 0; m < 2; ++m) {
      std::vector<float> z = logits_of(4, V, m + 3.0);
      z[V + 69999] = 50.0f;  // an index with bit 17 set at the top of token 1
      auto r = select_topk_logprobs(z.data(), 2, 2, V, 3, std::nullopt, 1, dt);
      ASSERT_TRUE(r.ok());
      mbs.push_back(*r);
    }
    EXPECT_EQ(mbs[0].indices[3], 69999);
    auto bytes = encode_cached_logits_iteration(mbs, dt);
    ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
    EXPECT_EQ(static_cast<unsigned char>((*bytes)[0]), 0x28u);  // the zstd frame magic 28 B5 2F FD
    auto back = decode_cached_logits_iteration(*bytes, "test");
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    ASSERT_EQ(back->size(), 2u);
    for (int m = 0; m < 2; ++m) {
      EXPECT_EQ((*back)[m].S, 2);
      EXPECT_EQ((*back)[m].B, 2);
      EXPECT_EQ((*back)[m].K, 3);
      EXPECT_EQ((*back)[m].logprobs, mbs[m].logprobs);
      EXPECT_EQ((*back)[m].indices, mbs[m].indices);
    }
  }
}

// Python: json.dumps(OrderedDict(seed=1234, sequence_length=64, train_samples=128,
// blend={'kind': 'blend', 'blend': [[0.3, 'a_text_document'], [0.7, 'b_text_document']]}),
// separators=(',', ':')) and its hashlib.md5; and the mock-data identifiers.
TEST(CachedLogits, DatasetHashIsMegatrons) {
  LogitsDatasetIdentity id;
  id.seed = 1234;
  id.seq_length = 64;
  id.train_samples = 128;
  id.blend = {{0.3, "a_text_document"}, {0.7, "b_text_document"}};
  EXPECT_EQ(cached_logits_dataset_hash(id), "4241960f1af4fd568c364a5e75e1569b");
  LogitsDatasetIdentity mock;
  mock.seed = 7;
  mock.seq_length = 16;
  EXPECT_EQ(cached_logits_dataset_hash(mock), "a3c28e9dde49bb769a64e8af1351f9ce");
  LogitsSaverSettings s{8, 0.9, 2, LogitsSaveDtype::kBF16};
  EXPECT_EQ(cached_logits_meta_json(mock, s),
            R"({"hash":"a3c28e9dde49bb769a64e8af1351f9ce","identifiers":{"seed":7,"sequence_length":16,)"
            R"("train_samples":null,"blend":{"kind":"mock","mock":true}},"saver":{"k":8,"p":0.9,"min_k":2,"save_dtype":"bf16"}})");
}

// Python, as above with blend={'kind': 'blend_per_split', 'train': [...]} (Megatron's
// _blend_identifiers for --train-data-path) and {'kind': 'blend_per_split', 'train': None} (per-split
// flags without a train split).
TEST(CachedLogits, DatasetHashOfPerSplitBlendsIsMegatrons) {
  LogitsDatasetIdentity id;
  id.seed = 1234;
  id.seq_length = 64;
  id.train_samples = 128;
  id.per_split = true;
  id.blend = {{0.3, "a_text_document"}, {0.7, "b_text_document"}};
  EXPECT_EQ(cached_logits_dataset_hash(id), "6253618c6890cd2dfaf4ae1e0cbdab0a");
  id.blend = {{1.0, "only"}};
  EXPECT_EQ(cached_logits_dataset_hash(id), "9d72e6dc140a6da9a1cc99d7ae14559f");
  id.blend.clear();
  EXPECT_EQ(cached_logits_dataset_hash(id), "d1ddf40f0bd46ca9d66d4d3ed3d5b53a");
}

class CachedLogitsDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("gale_cached_logits_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
            std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // One micro-batch whose every value is `tag` (so tests can see where it came from).
  static TopKLogProbs tagged(float tag) {
    TopKLogProbs mb;
    mb.S = 2;
    mb.B = 1;
    mb.K = 2;
    mb.logprobs.assign(4, tag);
    mb.indices = {1, 2, 3, 4};
    return mb;
  }
  // Shards of `dp` saved DP ranks, iterations 0..3 in two shards each; micro-batch m of rank d at
  // iteration i is tagged -(i + 0.125·(d + dp·m)) (global micro-batch d + dp·m, round-robin).
  void save(int dp, int mbs, const std::string& hash_seed_meta) {
    for (int d = 0; d < dp; ++d)
      for (int64_t last : {1, 3}) {
        CachedLogitsTar tar;
        tar.meta = hash_seed_meta;
        for (int64_t it = last - 1; it <= last; ++it) {
          std::vector<TopKLogProbs> v;
          for (int m = 0; m < mbs; ++m) v.push_back(tagged(-static_cast<float>(it + 0.125 * (d + dp * m))));
          auto bytes = encode_cached_logits_iteration(v, LogitsSaveDtype::kF32);
          ASSERT_TRUE(bytes.ok());
          tar.iterations.emplace_back(it, *bytes);
        }
        ASSERT_TRUE(write_cached_logits_tar((dir_ / cached_logits_tar_name(0, d, last)).string(), tar).ok());
      }
  }
  std::filesystem::path dir_;
};

std::string meta_for(int64_t seed) {
  LogitsDatasetIdentity id;
  id.seed = seed;
  id.seq_length = 2;
  return cached_logits_meta_json(id, LogitsSaverSettings{2, std::nullopt, 1, LogitsSaveDtype::kF32});
}

std::string hash_for(int64_t seed) {
  LogitsDatasetIdentity id;
  id.seed = seed;
  id.seq_length = 2;
  return cached_logits_dataset_hash(id);
}

// Megatron's load-balanced split written out: 2·N chunks of S/(2N); rank r holds chunks r and 2N−1−r.
int64_t lb_position(int64_t S, int N, int r, int64_t s) {
  const int64_t C = S / (2 * N);
  return (s < C ? r : 2 * N - 1 - r) * C + s % C;
}

// A whole micro-batch [S = 8, B = 2, K = 3] tagged by (position, sample, entry), its CP 2 and CP 4
// parts (one with a shorter K, as a top-P teacher's rank may have): each reshard gives every
// rank's positions in its order, padded with the sentinels, and back to one rank the whole.
TEST(CachedLogits, CpReshardMovesEachPositionToItsRank) {
  constexpr int64_t S = 8, B = 2, K = 3;
  auto value = [](int64_t g, int64_t b, int64_t k) { return -static_cast<float>(g * 100 + b * 10 + k); };
  auto part = [&](int N, int r, int64_t keep_k) {
    TopKLogProbs t;
    t.S = S / N;
    t.B = B;
    t.K = keep_k;
    for (int64_t s = 0; s < t.S; ++s)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t k = 0; k < keep_k; ++k) {
          const int64_t g = lb_position(S, N, r, s);
          t.logprobs.push_back(value(g, b, k));
          t.indices.push_back(g * 100 + b * 10 + k);
        }
    return t;
  };
  for (int saved : {1, 2, 4})
    for (int N : {1, 2, 4}) {
      std::vector<std::vector<TopKLogProbs>> per;
      for (int c = 0; c < saved; ++c) per.push_back({part(saved, c, c == 1 ? K - 1 : K), part(saved, c, K)});
      for (int r = 0; r < N; ++r) {
        auto got = cached_logits_cp_reshard(per, r, N);
        ASSERT_TRUE(got.ok()) << got.status().message();
        ASSERT_EQ(got->size(), 2u);
        for (size_t m = 0; m < 2; ++m) {
          const TopKLogProbs& t = (*got)[m];
          ASSERT_EQ(t.S, S / N);
          ASSERT_EQ(t.B, B);
          ASSERT_EQ(t.K, K);
          for (int64_t s = 0; s < t.S; ++s)
            for (int64_t b = 0; b < B; ++b)
              for (int64_t k = 0; k < K; ++k) {
                const int64_t g = lb_position(S, N, r, s);
                const int64_t i = (s * B + b) * K + k;
                // Position g came from saved rank c = the rank holding it; rank 1's first list has K − 1.
                int holder = 0;
                for (int c = 0; c < saved; ++c)
                  for (int64_t q = 0; q < S / saved; ++q) holder = lb_position(S, saved, c, q) == g ? c : holder;
                if (m == 0 && holder == 1 && k == K - 1) {
                  EXPECT_EQ(t.logprobs[i], kCachedLogitsLogprobSentinel);
                  EXPECT_EQ(t.indices[i], kCachedLogitsMaskedIndex);
                } else {
                  EXPECT_EQ(t.logprobs[i], value(g, b, k)) << saved << " -> " << N << " rank " << r << " s " << s;
                  EXPECT_EQ(t.indices[i], g * 100 + b * 10 + k);
                }
              }
        }
      }
    }
  std::vector<std::vector<TopKLogProbs>> uneven = {{part(2, 0, K)}, {part(2, 1, K), part(2, 1, K)}};
  EXPECT_FALSE(cached_logits_cp_reshard(uneven, 0, 1).ok());
  std::vector<std::vector<TopKLogProbs>> odd = {{part(1, 0, K)}};
  EXPECT_FALSE(cached_logits_cp_reshard(odd, 0, 3).ok());  // 8 is not a multiple of 2·3
}

// Each cp{C} shard holds one CP rank's chunk; a student at the saved CP size reads its own shards,
// at another reads every saved CP rank's and reshards (here the saved ranks' shards are copies, so
// the resharded rows are the same rows in a new order).
TEST_F(CachedLogitsDir, ReaderReshardsAnotherContextParallelSize) {
  save(1, 1, meta_for(5));  // cp0_dp0 shards only: saved at CP 1, [S = 2, B = 1]
  auto same = CachedLogitsReader::open(dir_.string(), 0, 0, 1, hash_for(5), 1);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->saved_cp_size(), 1);
  auto whole = same->iteration(1);
  ASSERT_TRUE(whole.ok());
  for (int r = 0; r < 2; ++r) {  // CP 2 of a sequence of 2: not a multiple of 2·CP = 4
    auto two = CachedLogitsReader::open(dir_.string(), r, 0, 1, hash_for(5), 2);
    ASSERT_TRUE(two.ok()) << two.status().message();
    auto mbs = two->iteration(1);
    ASSERT_FALSE(mbs.ok());
    EXPECT_NE(mbs.status().message().find("must be divisible by 2 x --context-parallel-size 2"), std::string::npos)
        << mbs.status().message();
  }
  std::filesystem::copy_file(dir_ / cached_logits_tar_name(0, 0, 1), dir_ / cached_logits_tar_name(1, 0, 1));
  std::filesystem::copy_file(dir_ / cached_logits_tar_name(0, 0, 3), dir_ / cached_logits_tar_name(1, 0, 3));
  auto one = CachedLogitsReader::open(dir_.string(), 0, 0, 1, hash_for(5), 1);  // saved at CP 2 now
  ASSERT_TRUE(one.ok()) << one.status().message();
  EXPECT_EQ(one->saved_cp_size(), 2);
  auto merged = one->iteration(1);
  ASSERT_TRUE(merged.ok()) << merged.status().message();
  ASSERT_EQ(merged->size(), 1u);
  EXPECT_EQ((*merged)[0].S, 4);  // two ranks of 2 positions
  const TopKLogProbs& w = (*whole)[0];
  // Merged position g came from rank c's local s: rows of the copy, rank 0 -> chunks 0, 3; rank 1 -> 1, 2.
  for (int64_t g = 0; g < 4; ++g) {
    const int64_t s = (g == 0 || g == 1) ? 0 : 1;
    for (int64_t k = 0; k < w.K; ++k) {
      EXPECT_EQ((*merged)[0].logprobs[g * w.K + k], w.logprobs[s * w.K + k]);
      EXPECT_EQ((*merged)[0].indices[g * w.K + k], w.indices[s * w.K + k]);
    }
  }
  std::filesystem::remove(dir_ / cached_logits_tar_name(1, 0, 1));
  std::filesystem::remove(dir_ / cached_logits_tar_name(1, 0, 3));
  std::filesystem::copy_file(dir_ / cached_logits_tar_name(0, 0, 1), dir_ / cached_logits_tar_name(2, 0, 1));
  auto gap = CachedLogitsReader::open(dir_.string(), 0, 0, 1, hash_for(5), 1);  // cp0 and cp2, no cp1
  ASSERT_FALSE(gap.ok());
  EXPECT_NE(gap.status().message().find("no shards for cp1_dp0"), std::string::npos) << gap.status().message();
}

// Saved at DP 2 with 2 micro-batches per rank: a student at DP 1 gets the 4 global micro-batches
// in order (interleaved), at DP 2 its own, at DP 4 one each (strided): every layout sees the same
// global micro-batch g at the same place.
TEST_F(CachedLogitsDir, DpRemapFindsEveryGlobalMicroBatch) {
  save(2, 2, meta_for(5));
  for (int dp_size : {1, 2, 4}) {
    for (int r = 0; r < dp_size; ++r) {
      auto reader = CachedLogitsReader::open(dir_.string(), 0, r, dp_size, hash_for(5));
      ASSERT_TRUE(reader.ok()) << reader.status().to_string();
      EXPECT_EQ(reader->saved_dp_size(), 2);
      for (int64_t it : {0, 1, 2, 3}) {
        auto mbs = reader->iteration(it);
        ASSERT_TRUE(mbs.ok()) << mbs.status().to_string();
        const int per_rank = 4 / dp_size;
        ASSERT_EQ(static_cast<int>(mbs->size()), per_rank);
        for (int m = 0; m < per_rank; ++m) {
          const int global = r + dp_size * m;  // Megatron's round-robin micro-batch order
          EXPECT_EQ((*mbs)[m].logprobs[0], -static_cast<float>(it + 0.125 * global))
              << "dp " << dp_size << " rank " << r << " it " << it << " mb " << m;
        }
      }
    }
  }
}

TEST_F(CachedLogitsDir, ClearErrors) {
  save(2, 2, meta_for(5));
  auto bad_dir = CachedLogitsReader::open((dir_ / "nope").string(), 0, 0, 1, "");
  ASSERT_FALSE(bad_dir.ok());
  EXPECT_NE(bad_dir.status().to_string().find("--logits-load-dir"), std::string::npos);
  auto three = CachedLogitsReader::open(dir_.string(), 0, 0, 3, "");
  ASSERT_FALSE(three.ok());
  EXPECT_NE(three.status().to_string().find("multiple"), std::string::npos);
  auto no_cp = CachedLogitsReader::open(dir_.string(), 1, 0, 2, "");
  ASSERT_FALSE(no_cp.ok());
  EXPECT_NE(no_cp.status().to_string().find("cp1_dp0"), std::string::npos);
  auto other_seed = CachedLogitsReader::open(dir_.string(), 0, 0, 2, hash_for(6));
  ASSERT_TRUE(other_seed.ok());
  auto mism = other_seed->iteration(0);
  ASSERT_FALSE(mism.ok());
  EXPECT_NE(mism.status().to_string().find("does not align"), std::string::npos);
  auto reader = CachedLogitsReader::open(dir_.string(), 0, 0, 2, hash_for(5));
  ASSERT_TRUE(reader.ok());
  auto missing = reader->iteration(4);  // past the last shard: a missing sample
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().to_string().find("iteration 4"), std::string::npos);
}

// The teacher's saved top-K feed the KD loss: a student equal to the teacher over a top-K that
// holds nearly all the mass has a near-zero KL, a different student a larger one.
TEST(CachedLogits, SavedTopKFeedTheKdLoss) {
  const int64_t V = 8;
  std::vector<float> z = {9, 8, 7, -20, -20, -20, -20, -20};
  auto r = select_topk_logprobs(z.data(), 1, 1, V, 3, std::nullopt, 1, LogitsSaveDtype::kF32);
  ASSERT_TRUE(r.ok());
  const TeacherTopK t{r->logprobs.data(), r->indices.data(), r->K};
  const float coef = 1.0f;
  double same = 0.0, other = 0.0;
  topk_kl_forward_backward(z.data(), 1, V, 0, t, &coef, &same, nullptr);
  std::vector<float> s = {7, 8, 9, -20, -20, -20, -20, -20};
  topk_kl_forward_backward(s.data(), 1, V, 0, t, &coef, &other, nullptr);
  EXPECT_NEAR(same, 0.0, 1e-6);
  EXPECT_GT(other, 0.5);
}

// --logits-load-ignore-errors with a sample missing from the directory: the micro-batch falls back
// to the lm loss; without it the reader's error (naming the iteration) stops the run.
TEST_F(CachedLogitsDir, IgnoreErrorsFallsBackToTheLmLoss) {
  save(1, 1, meta_for(5));
  auto reader = CachedLogitsReader::open(dir_.string(), 0, 0, 1, hash_for(5));
  ASSERT_TRUE(reader.ok());
  auto kd_of = [&](int64_t it) -> StatusOr<double> {
    GALE_ASSIGN_OR_RETURN(std::vector<TopKLogProbs> mbs, reader->iteration(it));
    return static_cast<double>(-mbs[0].logprobs[0]);  // a stand-in KD sum: the tag of the sample
  };
  auto ok = mix_kd_loss(2.0, kd_of(3), 0.25, false);
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(ok->kd_used);
  EXPECT_DOUBLE_EQ(ok->total, 0.75 * 2.0 + 0.25 * 3.0);
  EXPECT_DOUBLE_EQ(ok->lm_coef, 0.75);
  EXPECT_DOUBLE_EQ(ok->kd_coef, 0.25);
  auto fallback = mix_kd_loss(2.0, kd_of(7), 0.25, true);
  ASSERT_TRUE(fallback.ok());
  EXPECT_FALSE(fallback->kd_used);
  EXPECT_DOUBLE_EQ(fallback->total, 2.0);
  EXPECT_DOUBLE_EQ(fallback->lm_coef, 1.0);
  EXPECT_DOUBLE_EQ(fallback->kd_coef, 0.0);
  auto stop = mix_kd_loss(2.0, kd_of(7), 0.25, false);
  ASSERT_FALSE(stop.ok());
  EXPECT_NE(stop.status().message().find("iteration 7"), std::string::npos);
}

}  // namespace
}  // namespace gale
