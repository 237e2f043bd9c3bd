// `gale pretrain --yaml-cfg FILE` (train/yaml_cfg.h): a file in the layout of Megatron's
// examples/gpt3/gpt_config.yaml trains exactly as the equivalent command line (the same losses, bit
// for bit as printed), the command line's other flags are ignored and named, and errors are one
// line naming the file and the key (exit code 2).
#include <gtest/gtest.h>

#include <regex>

#include "data/data_test_util.h"
#include "subprocess.h"

namespace gale {
namespace {

const char* kYaml = R"(# a tiny LLaMA-style model in the layout of Megatron's gpt_config.yaml
language_model:
  num_layers: 2
  hidden_size: 64
  num_attention_heads: 4
  ffn_hidden_size: null
  hidden_dropout: 0.1
  attention_dropout: 0.1
  layernorm_epsilon: 1.e-5
  add_bias_linear: False
  activation_func: swiglu
  init_method_std: 0.02
  masked_softmax_fusion: True
  normalization: RMSNorm
model_parallel:
  tensor_model_parallel_size: 1
  pipeline_model_parallel_size: 1
  sequence_parallel: False
  params_dtype: null
  timers: null
  gradient_accumulation_fusion: True
micro_batch_size: 2
global_batch_size: 4
position_embedding_type: rope
untie_embeddings_and_output_weights: True
max_position_embeddings: 32
seed: 1234
lr: 3.e-3
min_lr: 3.e-4
lr_decay_style: cosine
lr_warmup_iters: 1
weight_decay: 0.1
clip_grad: 1.0
train_iters: 4
eval_iters: 0
mock_data: True
vocab_size: 4096
seq_length: 32
log_interval: 1
wandb_project: ''
profile_ranks: [0]
num_threads: ${GALE_YAML_CFG_CLI_THREADS}
)";

const std::vector<std::string> kFlags = {
    "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--hidden-dropout", "0.1",
    "--attention-dropout", "0.1", "--norm-epsilon", "1e-5", "--disable-bias-linear", "--swiglu",
    "--init-method-std", "0.02", "--normalization", "RMSNorm", "--micro-batch-size", "2", "--global-batch-size", "4",
    "--position-embedding-type", "rope", "--untie-embeddings-and-output-weights", "--max-position-embeddings", "32",
    "--seed", "1234", "--lr", "3e-3", "--min-lr", "3e-4", "--lr-decay-style", "cosine", "--lr-warmup-iters", "1",
    "--weight-decay", "0.1", "--clip-grad", "1.0", "--train-iters", "4", "--eval-iters", "0", "--mock-data",
    "--vocab-size", "4096", "--seq-length", "32", "--log-interval", "1", "--num-threads", "1"};

// The printed losses, as text (so equal means bit-identical to the printed precision).
std::vector<std::string> losses(const std::string& output) {
  std::vector<std::string> out;
  std::regex re(R"(\| lm loss: ([0-9.E+-]+) \|)");
  for (std::sregex_iterator it(output.begin(), output.end(), re), end; it != end; ++it) out.push_back((*it)[1]);
  return out;
}

class YamlCfgCli : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& text) {
    testing::write_file(dir_.file(name), text);
    return dir_.file(name);
  }
  test::RunResult pretrain(const std::vector<std::string>& flags) {
    std::vector<std::string> argv = {GALE_BINARY, "pretrain"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    return test::run_with_timeout(argv, {"GALE_YAML_CFG_CLI_THREADS=1"}, 300);
  }
  testing::TempDir dir_;
};

TEST_F(YamlCfgCli, TrainsAsTheEquivalentCommandLineAndIgnoresOtherFlags) {
  const std::string path = write("tiny.yaml", kYaml);
  const test::RunResult flags = pretrain(kFlags);
  ASSERT_EQ(flags.exit_code, 0) << flags.output;
  // --train-iters 100 and --lr 1 are ignored: the file says 4 iterations at 3e-3.
  const test::RunResult yaml = pretrain({"--train-iters", "100", "--yaml-cfg", path, "--lr", "1"});
  ASSERT_EQ(yaml.exit_code, 0) << yaml.output;
  ASSERT_EQ(losses(flags.output).size(), 4u) << flags.output;
  EXPECT_EQ(losses(yaml.output), losses(flags.output)) << yaml.output;
  EXPECT_NE(yaml.output.find("--yaml-cfg " + path +
                             ": the arguments come from the file (Megatron's experimental YAML arguments); the "
                             "command line's other flags are ignored: --train-iters, --lr"),
            std::string::npos)
      << yaml.output;
}

TEST_F(YamlCfgCli, ErrorsAreOneLineNamingTheFileAndTheKey) {
  struct Case {
    std::string yaml, expected;
  } cases[] = {
      {"language_model:\n  num_layers: two\n",
       ": key language_model.num_layers: expected an integer, found 'two'"},
      // Passed on, then refused by the parser with the flag's reason.
      {"s3_cache_path: my-dir\n", ": --s3-cache-path: not supported yet (datasets on S3)"},
      // Validated as the command line is.
      {"num_layers: 2\nhidden_size: 64\nnum_attention_heads: 3\nseq_length: 16\nmax_position_embeddings: 16\n"
       "micro_batch_size: 1\ntrain_iters: 1\nlr: 1.e-3\nmock_data: true\n",
       ": --hidden-size"},
  };
  for (const Case& c : cases) {
    const std::string path = write("bad.yaml", c.yaml);
    const test::RunResult r = pretrain({"--yaml-cfg", path});
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("gale pretrain: error: --yaml-cfg " + path + c.expected), std::string::npos) << r.output;
  }
  // The command line is still parsed first, as Megatron's argparse does.
  const test::RunResult unknown = pretrain({"--yaml-cfg", write("ok.yaml", kYaml), "--no-such-flag"});
  EXPECT_EQ(unknown.exit_code, 2) << unknown.output;
  EXPECT_NE(unknown.output.find("unknown flag --no-such-flag"), std::string::npos) << unknown.output;
}

}  // namespace
}  // namespace gale
