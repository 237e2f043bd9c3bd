// --dataloader-fast-cache-load and --dataloader-defer-npy-index-mmap: off by default (Megatron's
// store_true), read, and Megatron's checks (--data-cache-path needed; the fast path not with
// --data-path) plus Gale's refusal where no index is cached (--mock-data).
#include <gtest/gtest.h>

#include "train/pretrain_cli.h"

namespace gale {
namespace {

using testing::expect_one_line_error;
using testing::PretrainCli;

std::vector<std::string> real_data(std::vector<std::string> extra) {
  std::vector<std::string> argv = {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                                   "--seq-length", "16", "--max-position-embeddings", "32", "--micro-batch-size",
                                   "2", "--train-iters", "10", "--lr", "1e-3", "--tokenizer-type", "NullTokenizer",
                                   "--vocab-size", "100"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

TEST(DataCacheFlags, DefaultsOffAndRead) {
  PretrainCli off;
  ASSERT_TRUE(off.parse_minimal({}).ok());
  EXPECT_FALSE(off.args.data.dataloader_fast_cache_load);
  EXPECT_FALSE(off.args.data.dataloader_defer_npy_index_mmap);
  PretrainCli on;
  const Status s = on.parse(real_data({"--train-data-path", "t", "--valid-data-path", "v", "--test-data-path", "x",
                                       "--data-cache-path", "c", "--dataloader-fast-cache-load",
                                       "--dataloader-defer-npy-index-mmap"}));
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_TRUE(on.args.data.dataloader_fast_cache_load);
  EXPECT_TRUE(on.args.data.dataloader_defer_npy_index_mmap);
  PretrainCli defer_blend;  // the deferred path alone takes --data-path
  EXPECT_TRUE(defer_blend.parse(real_data({"--data-path", "p", "--data-cache-path", "c",
                                           "--dataloader-defer-npy-index-mmap"}))
                  .ok());
}

void expect_error(const std::vector<std::string>& extra, const std::string& expected) {
  PretrainCli cli;
  const Status s = cli.parse(real_data(extra));
  ASSERT_FALSE(s.ok()) << expected;
  EXPECT_NE(s.message().find(expected), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
}

TEST(DataCacheFlags, MegatronsChecks) {
  expect_error({"--train-data-path", "t", "--dataloader-fast-cache-load"},
               "--data-cache-path must be provided when using --dataloader-fast-cache-load.");
  expect_error({"--data-path", "p", "--dataloader-defer-npy-index-mmap"},
               "--data-cache-path must be provided when using --dataloader-defer-npy-index-mmap.");
  expect_error({"--data-path", "p", "--data-cache-path", "c", "--dataloader-fast-cache-load"},
               "--dataloader-fast-cache-load and --data-path cannot be used together. Use --per-split-data-args-path "
               "or --train-data-path, --valid-data-path and --test-data-path instead.");
  expect_one_line_error({{"--data-cache-path", "c", "--dataloader-defer-npy-index-mmap"}, 1,
                         "--dataloader-defer-npy-index-mmap with --mock-data: not supported"});
}

}  // namespace
}  // namespace gale
