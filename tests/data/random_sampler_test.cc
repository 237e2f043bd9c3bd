// Megatron's cyclic sampler and torch.randperm re-implemented: outputs compared with torch 2.5.1's
// and with a stateful re-statement of Megatron's sampler under cyclic_iter (fixture from
// tools/reference/random_sampler_reference.py), including epoch wraps inside a global batch.
#include "data/random_sampler.h"

#include <gtest/gtest.h>

#include "data/data_test_util.h"

namespace gale {
namespace {

const nlohmann::json& golden() {
  static nlohmann::json j = testing::load_json(testing::reference_path("random_sampler.json"));
  return j;
}

TEST(TorchRandperm, MatchesTorch) {
  int checked = 0;
  for (const auto& c : golden()["randperm"]) {
    const int64_t n = c["n"].get<int64_t>();
    const uint64_t seed = c["seed"].get<uint64_t>();
    StatusOr<std::vector<int64_t>> p = torch_randperm(n, seed);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    ASSERT_EQ(static_cast<int64_t>(p->size()), n);
    if (c.contains("perm")) {
      EXPECT_EQ(*p, c["perm"].get<std::vector<int64_t>>()) << "n " << n << " seed " << seed;
    } else {
      const std::vector<int64_t> head(p->begin(), p->begin() + 16), tail(p->end() - 16, p->end());
      EXPECT_EQ(head, c["head"].get<std::vector<int64_t>>()) << "n " << n;
      EXPECT_EQ(tail, c["tail"].get<std::vector<int64_t>>()) << "n " << n;
      const int64_t every = c["every"].get<int64_t>();
      std::vector<int64_t> strided;
      for (int64_t i = 0; i < n; i += every) strided.push_back((*p)[i]);
      EXPECT_EQ(strided, c["strided"].get<std::vector<int64_t>>()) << "n " << n;
    }
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

TEST(TorchRandperm, RefusesSizesWhereTorchDrawsSixtyFourBits) {
  StatusOr<std::vector<int64_t>> p = torch_randperm(kTorchRandpermSmallLimit, 0);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(p.status().message().find("214748364"), std::string::npos) << p.status().message();
}

RandomSamplerOptions options_of(const nlohmann::json& c) {
  RandomSamplerOptions o;
  o.name = "train";
  o.total_samples = c["total"].get<int64_t>();
  o.micro_batch_size = c["micro_batch_size"].get<int64_t>();
  o.data_parallel_size = c["data_parallel_size"].get<int64_t>();
  o.data_parallel_rank = c["rank"].get<int64_t>();
  o.data_sharding = c["data_sharding"].get<bool>();
  return o;
}

// Micro-batch k of a stream started at `consumed` is the pure function's micro-batch at
// consumed + k·mbs·dp, across epoch ends (the stream's sampler is restarted there).
TEST(PretrainingRandomSampler, MatchesMegatronsCyclicStream) {
  int checked = 0;
  for (const auto& c : golden()["streams"]) {
    RandomSamplerOptions o = options_of(c);
    if (!o.data_sharding && o.total_samples == 5) continue;  // the out-of-step case below
    PretrainingRandomSampler sampler(o);
    const int64_t chunk = o.micro_batch_size * o.data_parallel_size;
    const auto expected = c["micro_batches"].get<std::vector<std::vector<int64_t>>>();
    for (size_t k = 0; k < expected.size(); ++k) {
      std::vector<int64_t> got;
      int64_t epoch = -1;
      const int64_t consumed = c["consumed"].get<int64_t>() + static_cast<int64_t>(k) * chunk;
      ASSERT_TRUE(sampler.micro_batch(consumed, &got, &epoch).ok());
      EXPECT_EQ(got, expected[k]) << c.dump() << " micro-batch " << k;
      EXPECT_EQ(epoch, consumed / sampler.active_total_samples());
    }
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

// A fresh sampler at any consumed count (a resumed run) reads what the long-running one reads.
TEST(PretrainingRandomSampler, FreshSamplerAtAnyCountReadsTheSame) {
  RandomSamplerOptions o{"train", 23, 2, 2, 1, true};
  PretrainingRandomSampler running(o);
  for (int64_t consumed = 0; consumed < 100; consumed += 4) {
    std::vector<int64_t> a, b;
    ASSERT_TRUE(running.micro_batch(consumed, &a, nullptr).ok());
    PretrainingRandomSampler fresh(o);
    ASSERT_TRUE(fresh.micro_batch(consumed, &b, nullptr).ok());
    EXPECT_EQ(a, b) << consumed;
  }
}

// Without sharding, 5 samples at micro-batch 1 and 3 ranks: ranks 0 and 1 read a second micro-batch
// from epoch 0 (Megatron's ranks fall out of step). Gale reads the first and refuses to cross.
TEST(PretrainingRandomSampler, RefusesToCrossAnEpochEndWhereRanksFallOutOfStep) {
  for (const auto& c : golden()["streams"]) {
    RandomSamplerOptions o = options_of(c);
    if (o.data_sharding || o.total_samples != 5) continue;
    PretrainingRandomSampler sampler(o);
    std::vector<int64_t> got;
    ASSERT_TRUE(sampler.micro_batch(0, &got, nullptr).ok());
    EXPECT_EQ(got, c["micro_batches"][0].get<std::vector<int64_t>>());
    Status st = sampler.micro_batch(3, &got, nullptr);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.message(),
              "--dataloader-type cyclic --no-data-sharding: the train dataset's 5 samples with --micro-batch-size 1 "
              "and data-parallel size 3 give data-parallel ranks 0-1 one micro-batch more per epoch than the others "
              "(2 instead of 1), so Megatron's ranks fall out of step at the end of epoch 0; use data sharding (drop "
              "--no-data-sharding) or another micro-batch or data-parallel size");
    // A run resumed in epoch 1 is in step until that epoch ends.
    PretrainingRandomSampler resumed(o);
    EXPECT_TRUE(resumed.micro_batch(3, &got, nullptr).ok());
    EXPECT_FALSE(resumed.micro_batch(6, &got, nullptr).ok());
  }
}

TEST(PretrainingRandomSampler, Errors) {
  std::vector<int64_t> got;
  PretrainingRandomSampler tiny({"validation", 3, 2, 2, 0, true});
  Status st = tiny.micro_batch(0, &got, nullptr);
  EXPECT_EQ(st.message(),
            "--dataloader-type cyclic: the validation dataset has 3 samples, fewer than one micro-batch per "
            "data-parallel rank (--micro-batch-size 2 x data-parallel size 2)");
  PretrainingRandomSampler s({"train", 100, 2, 2, 0, true});
  st = s.micro_batch(6, &got, nullptr);
  EXPECT_EQ(st.message(),
            "--dataloader-type cyclic: 6 consumed train samples are not a multiple of --micro-batch-size 2 x "
            "data-parallel size 2 (Megatron's sampler asserts it; was the checkpoint saved at another data-parallel "
            "size?)");
}

}  // namespace
}  // namespace gale
