// `gale pretrain --load` / `gale convert` on Megatron Gated DeltaNet (-2) checkpoints: every layout trains as TP 1 does.
//
// tests/data/megatron/{gdn,gdn2}/ (tools/reference/megatron_gdn_reference.py) hold one tiny GDN GPT
// model at TP 1, TP 2 and (gdn) TP 2 x PP 2 in Megatron's torch format. Loading any of them, at Gale's
// TP 1, TP 2 or PP 2, must give the TP 1 run's losses for the three iterations after the load (the
// first before any update: the loaded weights; the next two: the updated ones). `gale convert` from
// Megatron to Gale and back to Megatron at TP 2 gives a checkpoint that trains the same.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <span>
#include <sstream>

#include "ckpt/temp_dir.h"
#include "cli/log_line.h"
#include "cli/mpi_cli.h"
#include "data/indexed_dataset.h"
#include "core/status.h"
#include "subprocess.h"

namespace gale {
namespace {

using testing_util::TempDir;

std::string megatron(const std::string& name) { return std::string(GALE_TEST_DATA_DIR) + "/megatron/" + name; }

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_dataset(const std::string& prefix) {
  auto w = IndexedDatasetWriter::create(prefix, TokenDType::kUInt16).value();
  for (int d = 0; d < 64; ++d) {
    std::vector<int32_t> doc;
    for (int i = 0; i < 9; ++i) doc.push_back((d * 7 + i * 3) % 49);
    const int32_t len = static_cast<int32_t>(doc.size());
    ASSERT_TRUE(w->add_document(doc, std::span<const int32_t>(&len, 1)).ok());
  }
  ASSERT_TRUE(w->finalize().ok());
}

// The three losses after loading `dir` (iterations 8 .. 10) in `np` processes, `np` the size of `parallel`.
std::vector<double> losses(const TempDir& tmp, const std::string& variant, const std::string& dir, int np,
                           const std::string& parallel = "--tensor-model-parallel-size") {
  std::vector<std::string> flags = {
      "pretrain", "--num-layers", "4", "--hidden-size", "16", "--ffn-hidden-size", "32", "--num-attention-heads", "2",
      "--swiglu", "--position-embedding-type", "rope", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
      "--normalization", "RMSNorm", "--norm-epsilon", "1e-6", "--seq-length", "8", "--max-position-embeddings", "16",
      "--micro-batch-size", "2", "--global-batch-size", "2", "--lr", "1e-3", "--attention-dropout", "0",
      "--hidden-dropout", "0", "--tokenizer-type", "NullTokenizer", "--vocab-size", "49",
      "--make-vocab-size-divisible-by", "16", "--split", "100,0,0", "--eval-iters", "0", "--num-threads", "1",
      "--log-interval", "1", "--train-iters", "10", "--no-load-optim", "--experimental-attention-variant", variant,
      "--linear-attention-freq", "[1,1,1,0]", "--linear-conv-kernel-dim", "4", "--linear-key-head-dim", "4",
      "--linear-value-head-dim", "4", "--linear-num-key-heads", "2", "--linear-num-value-heads", "4",
      "--data-path", tmp.file("data_text_document"), "--load", dir, parallel, std::to_string(np)};
  std::vector<std::string> argv = {GALE_BINARY};
  if (np > 1) argv = testing::mpirun_argv(np), argv.push_back(GALE_BINARY);
  argv.insert(argv.end(), flags.begin(), flags.end());
  test::RunResult r = test::run_with_timeout(argv, testing::kMpiEnv, 300);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("successfully loaded checkpoint from " + dir + " at iteration 7"), std::string::npos)
      << r.output;
  const std::vector<double> out = testing::logged_values(r.output, "lm loss");
  EXPECT_EQ(out.size(), 3u) << r.output;
  return out;
}

void expect_same(const std::vector<double>& a, const std::vector<double>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 5e-6 * std::max(1.0, std::abs(a[i]))) << what << " " << i;
}

TEST(MegatronGdnCli, EveryLayoutTrainsAsTp1) {
  TempDir tmp;
  write_dataset(tmp.file("data_text_document"));
  const std::vector<double> base = losses(tmp, "gdn", megatron("gdn/tp1"), 1);
  ASSERT_EQ(base.size(), 3u);
  EXPECT_NE(base[0], base[1]);  // the updates change the loss (the comparison sees them)
  expect_same(losses(tmp, "gdn", megatron("gdn/tp2"), 1), base, "tp2 files at TP 1");
  expect_same(losses(tmp, "gdn", megatron("gdn/tp2"), 2), base, "tp2 files at TP 2");
  expect_same(losses(tmp, "gdn", megatron("gdn/tp2pp2"), 2, "--pipeline-model-parallel-size"), base, "tp2pp2 at PP 2");
  const std::vector<double> base2 = losses(tmp, "gdn2", megatron("gdn2/tp1"), 1);
  expect_same(losses(tmp, "gdn2", megatron("gdn2/tp2"), 2), base2, "gdn2 tp2 files at TP 2");
}

// Megatron's torch_dist at TP 1 and TP 2 (tools/reference/megatron_gdn_dsa_torch_dist_reference.py) and torch_dcp at
// TP 1: loaded at Gale's TP 1 (TP 2 resharded to TP 1), TP 2 and PP 2, they train as the torch format's TP 1 files do.
TEST(MegatronGdnCli, TorchDistAndDcpTrainAsTp1) {
  TempDir tmp;
  write_dataset(tmp.file("data_text_document"));
  const std::vector<double> base = losses(tmp, "gdn", megatron("gdn/tp1"), 1);
  ASSERT_EQ(base.size(), 3u);
  expect_same(losses(tmp, "gdn", megatron("gdn/torch_dist_tp1"), 1), base, "torch_dist_tp1 at TP 1");
  expect_same(losses(tmp, "gdn", megatron("gdn/torch_dist_tp2"), 1), base, "torch_dist_tp2 at TP 1");
  expect_same(losses(tmp, "gdn", megatron("gdn/torch_dist_tp2"), 2), base, "torch_dist_tp2 at TP 2");
  expect_same(losses(tmp, "gdn", megatron("gdn/torch_dist_tp2"), 2, "--pipeline-model-parallel-size"), base,
              "torch_dist_tp2 at PP 2");
  expect_same(losses(tmp, "gdn", megatron("gdn/torch_dcp_tp1"), 1), base, "torch_dcp_tp1 at TP 1");
  const std::vector<double> base2 = losses(tmp, "gdn2", megatron("gdn2/tp1"), 1);
  expect_same(losses(tmp, "gdn2", megatron("gdn2/torch_dist_tp2"), 2), base2, "gdn2 torch_dist_tp2 at TP 2");
}

// `gale convert` from torch_dist (TP 2) to Gale and on to Megatron's torch format at TP 2 writes the same rank
// files, byte for byte, as the same conversion from the torch-format TP 2 files.
TEST(MegatronGdnCli, ConvertFromTorchDistWritesWhatTheTorchFormatWrites) {
  TempDir tmp;
  for (const char* variant : {"gdn", "gdn2"}) {
    for (const char* layout : {"tp2", "torch_dist_tp2"}) {
      const std::string gale = tmp.file(str_cat(variant, "_", layout, "_gale")), mg = tmp.file(str_cat(variant, "_", layout, "_mg"));
      test::RunResult a = test::run_with_timeout({GALE_BINARY, "convert", "--load-model-type", "mg", "--save-model-type",
                                                  "gale", "--load-dir", megatron(str_cat(variant, "/", layout)),
                                                  "--save-dir", gale},
                                                 {}, 120);
      ASSERT_EQ(a.exit_code, 0) << a.output;
      test::RunResult b = test::run_with_timeout({GALE_BINARY, "convert", "--load-model-type", "gale",
                                                  "--save-model-type", "mg", "--load-dir", gale, "--save-dir", mg,
                                                  "--target-tensor-parallel-size", "2"},
                                                 {}, 120);
      ASSERT_EQ(b.exit_code, 0) << b.output;
    }
    for (const char* rank : {"mp_rank_00", "mp_rank_01"}) {
      const std::string f = str_cat("/iter_0000007/", rank, "/model_optim_rng.pt");
      const std::string x = read_file(tmp.file(str_cat(variant, "_tp2_mg") + f)),
                        y = read_file(tmp.file(str_cat(variant, "_torch_dist_tp2_mg") + f));
      EXPECT_FALSE(x.empty()) << variant << " " << rank;
      EXPECT_TRUE(x == y) << variant << " " << rank;
    }
  }
}

// Megatron -> Gale -> Megatron (TP 2) with `gale convert`: the result loads and trains as the fixture.
TEST(MegatronGdnCli, ConvertRoundTripTrainsTheSame) {
  TempDir tmp;
  write_dataset(tmp.file("data_text_document"));
  test::RunResult a = test::run_with_timeout({GALE_BINARY, "convert", "--load-model-type", "mg", "--save-model-type",
                                              "gale", "--load-dir", megatron("gdn/tp2pp2"), "--save-dir",
                                              tmp.file("gale")},
                                             {}, 120);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  test::RunResult b = test::run_with_timeout({GALE_BINARY, "convert", "--load-model-type", "gale", "--save-model-type",
                                              "mg", "--load-dir", tmp.file("gale"), "--save-dir", tmp.file("mg"),
                                              "--target-tensor-parallel-size", "2"},
                                             {}, 120);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  expect_same(losses(tmp, "gdn", tmp.file("mg"), 2), losses(tmp, "gdn", megatron("gdn/tp1"), 1), "round trip");
}

// `gale generate --load <Megatron GDN checkpoint> --use-checkpoint-args`: the first token is the argmax
// of gdn_reference.json's last logits over the real vocabulary (41 for gdn, 48 for gdn2), and every
// layout (torch, torch_dist, torch_dcp) decodes the same text.
TEST(MegatronGdnCli, GenerateFromEveryLayoutDecodesTheReferenceToken) {
  for (const auto& [variant, first] : {std::pair{"gdn", "41"}, std::pair{"gdn2", "48"}}) {
    std::string text;
    for (const char* layout : {"tp1", "tp2", "tp2pp2", "torch_dist_tp1", "torch_dist_tp2", "torch_dcp_tp1"}) {
      if (std::string(variant) == "gdn2" && (std::string(layout) == "tp2pp2" || std::string(layout) == "torch_dcp_tp1"))
        continue;
      const std::string dir = megatron(str_cat(variant, "/", layout));
      test::RunResult r = test::run_with_timeout({GALE_BINARY, "generate", "--load", dir, "--use-checkpoint-args",
                                                  "--tokenizer-type", "NullTokenizer", "--vocab-size", "49", "--prompt",
                                                  "3 17 42 8 0 49 25 11", "--max-new-tokens", "3", "--temperature", "0"},
                                                 {}, 120);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      const size_t at = r.output.find("3 17 42 8 0 49 25 11 ");
      ASSERT_NE(at, std::string::npos) << r.output;
      const std::string line = r.output.substr(at, r.output.find('\n', at) - at);
      EXPECT_EQ(line.substr(21, std::string(first).size() + 1), std::string(first) + " ") << dir << ": " << line;
      if (text.empty()) text = line;
      EXPECT_EQ(line, text) << dir;
    }
  }
}

}  // namespace
}  // namespace gale
