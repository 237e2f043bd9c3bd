// Megatron's FIM transformation and dataset streams against golden samples from Megatron's own
// GPTFIMDataset code (tests/data/fim/golden.json, tools/reference/fim_reference.py).
#include "data/fim.h"

#include <gtest/gtest.h>

#include "data/data_test_util.h"
#include "data/fim_dataset.h"

namespace gale {
namespace {

const std::string kFimDir = std::string(GALE_TEST_DATA_DIR) + "/fim";

const nlohmann::json& golden() {
  static nlohmann::json j = testing::load_json(kFimDir + "/golden.json");
  return j;
}

std::shared_ptr<const HuggingFaceTokenizer> tokenizer() {
  static std::shared_ptr<const HuggingFaceTokenizer> t = [] {
    auto l = HuggingFaceTokenizer::load(kFimDir);
    EXPECT_TRUE(l.ok()) << l.status().to_string();
    return std::shared_ptr<const HuggingFaceTokenizer>(std::move(l).value());
  }();
  return t;
}

FimOptions options_of(const nlohmann::json& c) {
  const nlohmann::json& s = c["settings"];
  FimOptions o;
  FimTokenNames names;
  if (s.contains("fim_split_sample")) names.split_sample = s["fim_split_sample"].get<std::string>();
  Status st = resolve_fim_tokens(*tokenizer(), names, &o);
  EXPECT_TRUE(st.ok()) << st.to_string();
  o.rate = s["fim_rate"].get<double>();
  o.spm_rate = s["fim_spm_rate"].get<double>();
  if (s.contains("fim_fragment_rate")) o.fragment_rate = s["fim_fragment_rate"].get<double>();
  if (s.contains("fim_no_prefix")) o.no_prefix = s["fim_no_prefix"].get<std::string>();
  return o;
}

const nlohmann::json& golden_case(const std::string& name) {
  for (const auto& c : golden()["cases"])
    if (c["name"] == name) return c;
  ADD_FAILURE() << "no golden case " << name;
  static nlohmann::json none;
  return none;
}

// The golden samples of one case through fim_transform, with one stream per worker.
void expect_transform_matches(const std::string& name) {
  const nlohmann::json& c = golden_case(name);
  const FimOptions o = options_of(c);
  const size_t mbs = c["micro_batch_size"].get<size_t>(), dp = c["data_parallel_size"].get<size_t>();
  const size_t workers = std::max<size_t>(1, c["num_workers"].get<size_t>());
  // Per data-parallel rank, one stream per worker; rank r reads samples [r*mbs, (r+1)*mbs) of
  // every chunk of mbs*dp, and worker m mod W reads its micro-batch m.
  int changed = 0;
  for (size_t rank = 0; rank < dp; ++rank) {
    std::vector<NumpyRandomState> streams(workers, NumpyRandomState(c["seed"].get<uint32_t>()));
    for (size_t k = 0; k < c["raw"].size(); ++k) {
      if ((k / mbs) % dp != rank) continue;
      const auto raw = c["raw"][k].get<std::vector<int32_t>>();
      const auto want = c["fim"][k].get<std::vector<int32_t>>();
      std::vector<int32_t> got;
      Status s = fim_transform(raw, o, *tokenizer(), streams[(k / (mbs * dp)) % workers], &got);
      ASSERT_TRUE(s.ok()) << s.to_string();
      EXPECT_EQ(got, want) << name << " sample " << k;
      changed += raw != want;
    }
  }
  EXPECT_GT(changed, 0) << name << ": the golden samples should hold FIM samples";
}

TEST(FimTransform, PsmAndSpmMatchMegatron) { expect_transform_matches("psm_spm"); }
TEST(FimTransform, SplitSampleFragmentsMatchMegatron) { expect_transform_matches("split_sample"); }
TEST(FimTransform, NoPrefixMatchesMegatron) { expect_transform_matches("no_prefix"); }
TEST(FimTransform, WorkerStreamsMatchMegatron) { expect_transform_matches("workers"); }
TEST(FimTransform, DataParallelRankStreamsMatchMegatron) { expect_transform_matches("dp2"); }

TEST(FimTransform, GoldenCasesCoverBothFormatsAndTheSplitToken) {
  const FimOptions o = options_of(golden_case("split_sample"));
  bool spm = false, psm = false, split_kept = false;
  for (const auto& c : golden()["cases"])
    for (const auto& f : c["fim"]) {
      const auto v = f.get<std::vector<int32_t>>();
      for (size_t i = 0; i + 1 < v.size(); ++i) {
        if (v[i] == o.prefix) (v[i + 1] == o.suffix ? spm : psm) = true;
      }
      if (c["name"] == "split_sample" && std::find(v.begin(), v.end(), o.split_sample) != v.end()) split_kept = true;
    }
  EXPECT_TRUE(spm);
  EXPECT_TRUE(psm);
  EXPECT_TRUE(split_kept);
}

// The raw samples as a TokenDataset.
class RawSamples : public TokenDataset {
 public:
  explicit RawSamples(std::vector<std::vector<int32_t>> s) : s_(std::move(s)) {}
  int64_t size() const override { return static_cast<int64_t>(s_.size()); }
  int add_extra_token() const override { return 1; }
  int64_t seq_length() const override { return static_cast<int64_t>(s_[0].size()) - 1; }
  Status sample_tokens(int64_t k, int32_t, std::vector<int32_t>* out) const override {
    *out = s_[static_cast<size_t>(k)];
    return Status::Ok();
  }
  std::string describe() const override { return "raw"; }
  bool loaded_from_cache() const override { return false; }

 private:
  std::vector<std::vector<int32_t>> s_;
};

TEST(FimDataset, ReadsInLoaderOrderGiveMegatronsWorkerStreams) {
  const nlohmann::json& c = golden_case("workers");
  auto loader = std::make_shared<FimLoader>();
  loader->micro_batch_size = c["micro_batch_size"].get<int64_t>();
  loader->num_workers = c["num_workers"].get<int64_t>();
  FimDataset ds(std::make_unique<RawSamples>(c["raw"].get<std::vector<std::vector<int32_t>>>()), options_of(c),
                tokenizer(), c["seed"].get<uint32_t>(), loader);
  for (size_t k = 0; k < c["fim"].size(); ++k) {
    std::vector<int32_t> got;
    ASSERT_TRUE(ds.sample_tokens(static_cast<int64_t>(k), -1, &got).ok());
    EXPECT_EQ(got, c["fim"][k].get<std::vector<int32_t>>()) << "sample " << k;
  }
  EXPECT_EQ(loader->reads, static_cast<int64_t>(c["fim"].size()));
}

TEST(FimDataset, OneStreamWithoutWorkersDiffersFromTwo) {
  // The same reads with --num-workers 0 draw from one stream: micro-batch 1 is no longer read with
  // a fresh RandomState, so the samples differ from the two-worker golden ones.
  const nlohmann::json& c = golden_case("workers");
  auto loader = std::make_shared<FimLoader>();
  loader->micro_batch_size = c["micro_batch_size"].get<int64_t>();
  loader->num_workers = 0;
  FimDataset ds(std::make_unique<RawSamples>(c["raw"].get<std::vector<std::vector<int32_t>>>()), options_of(c),
                tokenizer(), c["seed"].get<uint32_t>(), loader);
  int differ = 0;
  for (size_t k = 0; k < c["fim"].size(); ++k) {
    std::vector<int32_t> got;
    ASSERT_TRUE(ds.sample_tokens(static_cast<int64_t>(k), -1, &got).ok());
    if (k < 2) EXPECT_EQ(got, c["fim"][k].get<std::vector<int32_t>>());  // micro-batch 0: worker 0 either way
    differ += got != c["fim"][k].get<std::vector<int32_t>>();
  }
  EXPECT_GT(differ, 0);
}

TEST(FimTokens, AMissingTokenNamesTheFlagAndTheToken) {
  FimOptions o;
  FimTokenNames names;
  names.middle = "<fim-middle>";
  Status s = resolve_fim_tokens(*tokenizer(), names, &o);
  EXPECT_EQ(s.message(),
            "--fim-middle-token: expected a token of the tokenizer's vocabulary, found '<fim-middle>', which the "
            "tokenizer does not have");
  names = FimTokenNames{};
  names.split_sample = "<file_sep>";
  s = resolve_fim_tokens(*tokenizer(), names, &o);
  EXPECT_EQ(s.message(),
            "--fim-split-sample: expected a token of the tokenizer's vocabulary, found '<file_sep>', which the "
            "tokenizer does not have");
  EXPECT_TRUE(resolve_fim_tokens(*tokenizer(), FimTokenNames{}, &o).ok());
  EXPECT_EQ(o.eod, tokenizer()->eod());
}

}  // namespace
}  // namespace gale
