// data_path_list / per_split_data_path_lists: --data-path and the per-split flags as given, or the
// lists of --data-args-path (whitespace-separated words) and --per-split-data-args-path (a JSON
// object of strings or lists), as Megatron's get_blend_and_blend_per_split reads them; errors
// name the flag.
#include "train/data_paths.h"

#include <gtest/gtest.h>

#include <fstream>

#include "data/data_test_util.h"

namespace gale {
namespace {

using Words = std::vector<std::string>;

TEST(DataPaths, DataPathOrTheWordsOfDataArgsPath) {
  testing::TempDir dir;
  DataArgs d;
  d.data_path = {"0.3", "a", "0.7", "b"};
  auto direct = data_path_list(d);
  ASSERT_TRUE(direct.ok());
  EXPECT_EQ(direct->entries, d.data_path);
  EXPECT_STREQ(direct->flag, "--data-path");

  std::ofstream(dir.file("args.txt")) << "  0.3 a\n\t0.7   b \n";
  DataArgs f;
  f.data_args_path = dir.file("args.txt");
  auto file = data_path_list(f);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->entries, (Words{"0.3", "a", "0.7", "b"}));
  EXPECT_STREQ(file->flag, "--data-args-path");

  f.data_args_path = dir.file("missing.txt");
  auto missing = data_path_list(f);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(), "--data-args-path " + dir.file("missing.txt") + ": cannot open file");
}

TEST(DataPaths, PerSplitFlagsOrTheJsonObject) {
  testing::TempDir dir;
  DataArgs d;
  d.train_data_path = {"t"};
  d.test_data_path = {"x", "y"};
  auto direct = per_split_data_path_lists(d);
  ASSERT_TRUE(direct.ok());
  EXPECT_EQ((*direct)[0].entries, Words{"t"});
  EXPECT_TRUE((*direct)[1].entries.empty());
  EXPECT_EQ((*direct)[2].entries, (Words{"x", "y"}));
  EXPECT_STREQ((*direct)[1].flag, "--valid-data-path");

  std::ofstream(dir.file("splits.json")) << R"({"train": "1 a 2 b", "valid": ["v"], "test": null})";
  DataArgs f;
  f.per_split_data_args_path = dir.file("splits.json");
  auto file = per_split_data_path_lists(f);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ((*file)[0].entries, (Words{"1", "a", "2", "b"}));
  EXPECT_EQ((*file)[1].entries, Words{"v"});
  EXPECT_TRUE((*file)[2].entries.empty());
  EXPECT_STREQ((*file)[0].flag, "--per-split-data-args-path");
  EXPECT_STREQ((*file)[2].flag, "--test-data-path");  // null: no data for the split

  std::ofstream(dir.file("bad.json")) << R"({"train": 3})";
  f.per_split_data_args_path = dir.file("bad.json");
  auto bad = per_split_data_path_lists(f);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "--per-split-data-args-path: 'train' must be a string or a list");
  std::ofstream(dir.file("list.json")) << R"(["a"])";
  f.per_split_data_args_path = dir.file("list.json");
  auto not_object = per_split_data_path_lists(f);
  ASSERT_FALSE(not_object.ok());
  EXPECT_EQ(not_object.status().message(),
            "--per-split-data-args-path " + dir.file("list.json") + ": expected a JSON object with train/valid/test");
}

}  // namespace
}  // namespace gale
