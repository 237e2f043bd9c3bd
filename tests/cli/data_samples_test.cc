// `gale data-samples` prints what training reads: the ids of Megatron's samples (golden file of
// tools/reference/gpt_samples_reference.py), one JSON line each, and clear errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/cli_test_util.h"
#include "data/data_test_util.h"

namespace gale {
namespace {

using json = nlohmann::json;
const std::string kSamples = std::string(GALE_TEST_DATA_DIR) + "/reference/samples";
const std::string kGpt2 = std::string(GALE_TEST_DATA_DIR) + "/../../data/tokenizers/gpt2";

std::string flags_of(const std::string& scenario, const json& g) {
  std::string out;
  for (const auto& f : g["scenarios"][scenario]["flags"]) {
    std::string s = f.get<std::string>();
    for (auto [from, to] : {std::pair<std::string, std::string>{"@SAMPLES@", kSamples}, {"@GPT2@", kGpt2}})
      for (size_t p = s.find(from); p != std::string::npos; p = s.find(from)) s.replace(p, from.size(), to);
    out += " '" + s + "'";
  }
  return out;
}

TEST(DataSamples, PrintsMegatronsSamples) {
  json g = testing::load_json(kSamples + "/golden.json");
  testing::TempDir dir;
  for (const char* scenario : {"weighted_blend", "per_split"}) {
    for (const char* split : {"train", "valid"}) {
      const json& want = g["scenarios"][scenario]["splits"][split]["samples"][1];  // index 1, then 2, 3 follow
      int64_t index = want["index"].get<int64_t>();
      auto r = testing::run_gale("data-samples" + flags_of(scenario, g) + " --sample-split " + split +
                                     " --sample-index " + std::to_string(index) + " --sample-count 3",
                                 dir.path());
      ASSERT_EQ(r.exit_code, 0) << r.err;
      std::istringstream lines(r.out);
      std::string line;
      int n = 0;
      while (std::getline(lines, line)) {
        json j = json::parse(line);
        const json& w = g["scenarios"][scenario]["splits"][split]["samples"][1 + n];
        EXPECT_EQ(j["split"], split);
        EXPECT_EQ(j["index"].get<int64_t>(), index + n);
        std::vector<int32_t> ids = w["tokens"].get<std::vector<int32_t>>();
        ids.push_back(w["labels"].back().get<int32_t>());
        EXPECT_EQ(j["ids"].get<std::vector<int32_t>>(), ids) << scenario << " " << split << " sample " << index + n;
        ++n;
      }
      EXPECT_EQ(n, 3);
    }
  }
}

TEST(DataSamples, Errors) {
  json g = testing::load_json(kSamples + "/golden.json");
  testing::TempDir dir;
  auto r = testing::run_gale("data-samples" + flags_of("weighted_blend", g) + " --sample-split test --sample-index 0",
                             dir.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("test split is empty"), std::string::npos) << r.err;
  r = testing::run_gale("data-samples" + flags_of("weighted_blend", g) + " --sample-index 199 --sample-count 5",
                        dir.path());
  EXPECT_NE(r.err.find("exceeds the train split's 200 samples"), std::string::npos) << r.err;
  r = testing::run_gale("data-samples" + flags_of("weighted_blend", g), dir.path());
  EXPECT_NE(r.err.find("--sample-index is required"), std::string::npos) << r.err;
  r = testing::run_gale("data-samples --mock-data --vocab-size 5000 --micro-batch-size 1 --sample-index 0", dir.path());
  EXPECT_NE(r.err.find("--seq-length is required"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace gale
