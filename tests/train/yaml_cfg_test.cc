// --yaml-cfg (train/yaml_cfg.h): a file in the layout of Megatron's examples/gpt3/gpt_config.yaml
// stands for the same command line (same parsed arguments); keys of store_false destinations,
// TransformerConfig fields, refused flags at Megatron's default, ${VAR} substitution; and every
// error names the file and the key, what was expected and what was found.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>

#include "data/data_test_util.h"
#include "flag_inventory.h"
#include "train/checkpoint_args.h"
#include "train/yaml_cfg.h"

namespace gale {
namespace {

class YamlCfg : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& text) {
    testing::write_file(dir_.file(name), text);
    return dir_.file(name);
  }
  // The command line `text` stands for (without `--yaml-cfg FILE`), or the error.
  StatusOr<std::vector<std::string>> convert(const std::string& text, std::string* path_out = nullptr) {
    const std::string path = write("cfg.yaml", text);
    if (path_out) *path_out = path;
    testing::FullCli cli;
    StatusOr<YamlCfgArgs> r = yaml_cfg_to_args(path, cli.parser);
    if (!r.ok()) return r.status();
    std::vector<std::string> argv = r->argv;
    EXPECT_GE(argv.size(), 2u);
    EXPECT_EQ(argv[0], "--yaml-cfg");
    EXPECT_EQ(argv[1], path);
    argv.erase(argv.begin(), argv.begin() + 2);
    return argv;
  }
  testing::TempDir dir_;
};

// A command line as {flag -> values} (flag order does not matter to the parser).
std::map<std::string, std::vector<std::string>> by_flag(const std::vector<std::string>& argv) {
  std::map<std::string, std::vector<std::string>> out;
  std::string flag;
  for (const std::string& a : argv) {
    if (a.rfind("--", 0) == 0) {
      flag = a;
      out[flag];
    } else {
      out[flag].push_back(a);
    }
  }
  return out;
}

// A tiny LLaMA-style model in the layout of Megatron's example: the two sections, then the
// training, optimizer, checkpoint, data and logging keys, with Megatron's defaults spelled out
// for flags Gale refuses and fields Megatron derives.
const char* kTinyYaml = R"(# tiny model, Megatron's gpt_config.yaml layout
language_model:
  num_layers: 2
  hidden_size: 64
  num_attention_heads: 4
  num_query_groups: null
  ffn_hidden_size: null
  kv_channels: null
  hidden_dropout: 0.0
  attention_dropout: 0.0
  fp32_residual_connection: False
  layernorm_epsilon: 1.e-5
  layernorm_zero_centered_gamma: False
  add_bias_linear: False
  bias_activation_fusion: False
  add_qkv_bias: False
  gated_linear_unit: False
  activation_func: swiglu
  num_moe_experts: null
  rotary_interleaved: False
  window_size: null
  init_method: null
  init_method_std: 0.02
  output_layer_init_method: null
  apply_query_key_layer_scaling: False
  attention_softmax_in_fp32: False
  bias_swiglu_fusion: True
  masked_softmax_fusion: True
  persist_layer_norm: False
  memory_efficient_layer_norm: False
  bias_dropout_fusion: True
  apply_rope_fusion: True
  recompute_granularity: null
  recompute_method: null
  recompute_num_layers: null
  distribute_saved_activations: null
  fp8: null
  fp8_margin: 0
  fp8_interval: 1
  fp8_amax_history_len: 1
  fp8_amax_compute_algo: "most_recent"
  fp8_wgrad: True
  clone_scatter_output_in_embedding: True
  normalization: "RMSNorm"
  moe_router_load_balancing_type: "aux_loss"
  moe_router_topk: 2
  moe_grouped_gemm: False
  moe_aux_loss_coeff: 0
  moe_z_loss_coeff: null
  moe_token_dropping: False
model_parallel:
  tensor_model_parallel_size: 1
  context_parallel_size: 1
  pipeline_model_parallel_size: 1
  virtual_pipeline_model_parallel_size: null
  sequence_parallel: False
  expert_model_parallel_size: 1
  perform_initialization: True
  use_cpu_initialization: null
  fp16: False
  bf16: False
  params_dtype: null
  timers: null
  gradient_accumulation_fusion: True
  async_tensor_model_parallel_allreduce: True
  tp_comm_overlap: False
  tp_comm_split_ag: True
  tp_comm_atomic_ag: True
  tp_comm_split_rs: True
  tp_comm_atomic_rs: True
  tp_comm_bulk_wgrad: True
  tp_comm_bulk_dgrad: True
  finalize_model_grads_func: null
  pipeline_dtype: null
  grad_scale_func: null
  enable_autocast: False
  autocast_dtype: null
  variable_seq_lengths: False
  num_microbatches_with_partial_activation_checkpoints: null
  overlap_p2p_comm: False
  batch_p2p_comm: True
  batch_p2p_sync: True
  use_ring_exchange_p2p: False
  deallocate_pipeline_outputs: False
  no_sync_func: null
  grad_sync_func: null
  param_sync_func: null
  pipeline_model_parallel_split_rank: null
  cpu_offloading: False
  cpu_offloading_num_layers: 0
  _cpu_offloading_context: null
  cpu_offloading_weights: False
  cpu_offloading_activations: True
  barrier_with_L1_time: True

use_legacy_models: False
spec: null
micro_batch_size: 2
global_batch_size: 4
rampup_batch_size: null
check_for_nan_in_loss_and_grad: True
num_layers_per_virtual_pipeline_stage: null
encoder_num_layers: null
decoder_num_layers: null
add_position_embedding: False
make_vocab_size_divisible_by: 128
group_query_attention: False
exit_signal_handler: False
exit_duration_in_mins: null
exit_interval: null
untie_embeddings_and_output_weights: True
position_embedding_type: rope
rotary_percent: 1.0
openai_gelu: False
squared_relu: False
swiglu: True
onnx_safe: null
bert_binary_head: True
max_position_embeddings: 32
transformer_impl: local
use_flash_attn: False
seed: 1234
data_parallel_random_init: False

optimizer: adam
lr: 3.e-3
lr_decay_style: cosine
lr_decay_iters: null
lr_warmup_fraction: null
lr_warmup_iters: 1
lr_warmup_init: 0.0
min_lr: 3.e-4
weight_decay: 0.1
weight_decay_incr_style: constant
clip_grad: 1.0
adam_beta1: 0.9
adam_beta2: 0.95
adam_eps: 1.e-08

save: null
no_save_optim: null
load: null
finetune: False
use_checkpoint_args: False

loss_scale: null
accumulate_allreduce_grads_in_fp32: False
fp16_lm_cross_entropy: False

distributed_backend: mpi
distributed_timeout_minutes: 10
overlap_grad_reduce: False
use_distributed_optimizer: False
lazy_mpu_init: null
nccl_communicator_config_path: null

train_iters: 4
eval_iters: 1
eval_interval: 2
skip_train: False
adlr_autoresume: False
adlr_autoresume_interval: 1000

data_path: null
split: '99,1,0'
mock_data: True
vocab_size: 4096
seq_length: 32
tokenizer_type: NullTokenizer
reset_position_ids: False
eod_mask_loss: False
dataloader_type: null

profile: False
profile_ranks: [0]
profile_step_end: 12
profile_step_start: 10

log_params_norm: False
log_interval: 1
tensorboard_dir: null
wandb_project: ''
wandb_exp_name: ''
enable_one_logger: True
one_logger_project: megatron-lm
num_threads: 1
)";

// The command line that kTinyYaml stands for, written by hand: the values that differ from
// Megatron's defaults (a value at Megatron's default, where Gale's default is the same, is not
// passed on: to Megatron it is the same as no value, and --moe-router-topk 2 alone would be an
// error here).
const std::vector<std::string> kTinyFlags = {
    "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--hidden-dropout", "0.0",
    "--attention-dropout", "0.0", "--disable-bias-linear", "--normalization", "RMSNorm", "--micro-batch-size", "2",
    "--global-batch-size", "4", "--no-position-embedding", "--untie-embeddings-and-output-weights",
    "--position-embedding-type", "rope", "--swiglu", "--max-position-embeddings", "32", "--transformer-impl", "local",
    "--lr", "3.e-3", "--lr-decay-style", "cosine", "--lr-warmup-iters", "1", "--min-lr", "3.e-4", "--weight-decay",
    "0.1", "--adam-beta2", "0.95", "--distributed-backend", "mpi", "--train-iters", "4", "--eval-iters", "1",
    "--eval-interval", "2", "--split", "99,1,0", "--mock-data", "--vocab-size", "4096", "--seq-length", "32",
    "--tokenizer-type", "NullTokenizer", "--log-interval", "1", "--num-threads", "1",
    // Megatron destinations whose file value differs from the parser's default: overlap_p2p_comm
    // (--no-overlap-p2p-communication) and one_logger_project, both accepted without effect.
    "--no-overlap-p2p-communication", "--one-logger-project", "megatron-lm"};

// The same command line with the file's values at Megatron's defaults spelled out too (those Gale
// accepts alone).
std::vector<std::string> tiny_flags_with_defaults() {
  std::vector<std::string> f = kTinyFlags;
  for (const char* x : {"--norm-epsilon", "1e-5", "--init-method-std", "0.02", "--tensor-model-parallel-size", "1",
                        "--pipeline-model-parallel-size", "1", "--make-vocab-size-divisible-by", "128",
                        "--rotary-percent", "1.0", "--seed", "1234", "--optimizer", "adam", "--lr-warmup-init", "0",
                        "--clip-grad", "1.0", "--adam-beta1", "0.9", "--adam-eps", "1e-8"})
    f.push_back(x);
  return f;
}

TEST_F(YamlCfg, MegatronLayoutStandsForTheSameCommandLine) {
  std::string path;
  StatusOr<std::vector<std::string>> argv = convert(kTinyYaml, &path);
  ASSERT_TRUE(argv.ok()) << argv.status().message();
  EXPECT_EQ(by_flag(argv.value()), by_flag(kTinyFlags));

  // Both parse and validate to the same arguments.
  testing::FullCli from_yaml, from_flags;
  std::vector<std::string> yaml_argv = {"--yaml-cfg", path};
  yaml_argv.insert(yaml_argv.end(), argv->begin(), argv->end());
  const Status yaml_status = from_yaml.parse(yaml_argv), flags_status = from_flags.parse(kTinyFlags);
  ASSERT_TRUE(yaml_status.ok()) << yaml_status.message();
  ASSERT_TRUE(flags_status.ok()) << flags_status.message();
  EXPECT_EQ(model_flags_json(from_yaml.args.model), model_flags_json(from_flags.args.model));
  EXPECT_EQ(from_yaml.args.megatron_compat.yaml_cfg, path);
  const TrainingArgs &ty = from_yaml.args.training, &tf = from_flags.args.training;
  EXPECT_EQ(ty.lr, tf.lr);
  EXPECT_EQ(ty.min_lr, tf.min_lr);
  EXPECT_EQ(ty.adam_eps, tf.adam_eps);
  EXPECT_EQ(ty.train_iters, tf.train_iters);
  EXPECT_EQ(ty.global_batch_size, tf.global_batch_size);
  EXPECT_EQ(ty.lr_decay_style, tf.lr_decay_style);
  EXPECT_EQ(from_yaml.args.data.split, from_flags.args.data.split);
  EXPECT_EQ(from_yaml.args.model.ffn_hidden_size, from_flags.args.model.ffn_hidden_size);
  std::vector<std::string> given_yaml = from_yaml.parser.given_flags(), given_flags = from_flags.parser.given_flags();
  given_yaml.erase(std::find(given_yaml.begin(), given_yaml.end(), "--yaml-cfg"));
  EXPECT_EQ(given_yaml, given_flags);

  // And to the same arguments as the command line with the defaults spelled out.
  testing::FullCli verbose;
  const Status verbose_status = verbose.parse(tiny_flags_with_defaults());
  ASSERT_TRUE(verbose_status.ok()) << verbose_status.message();
  EXPECT_EQ(model_flags_json(from_yaml.args.model), model_flags_json(verbose.args.model));
  const TrainingArgs& tv = verbose.args.training;
  EXPECT_EQ(ty.seed, tv.seed);
  EXPECT_EQ(ty.clip_grad, tv.clip_grad);
  EXPECT_EQ(ty.adam_eps, tv.adam_eps);
  EXPECT_EQ(ty.adam_beta1, tv.adam_beta1);
  EXPECT_EQ(ty.adam_beta2, tv.adam_beta2);
  EXPECT_EQ(ty.lr_warmup_init, tv.lr_warmup_init);
  EXPECT_EQ(ty.weight_decay, tv.weight_decay);
  EXPECT_EQ(from_yaml.args.model.norm_epsilon, verbose.args.model.norm_epsilon);
  EXPECT_EQ(from_yaml.args.model.init_method_std, verbose.args.model.init_method_std);
}

TEST_F(YamlCfg, KeysOfStoreFalseDestinationsConfigFieldsAndLists) {
  setenv("GALE_YAML_CFG_TEST_LAYERS", "3", 1);
  StatusOr<std::vector<std::string>> argv = convert(R"(
language_model:
  masked_softmax_fusion: false
  add_bias_linear: false
  layernorm_zero_centered_gamma: true
  num_moe_experts: 4
  activation_func: squaredrelu
  init_method: xavier_uniform
model_parallel:
  params_dtype: torch.bfloat16
num_layers: ${GALE_YAML_CFG_TEST_LAYERS}
data_path: '0.5 ${GALE_YAML_CFG_TEST_LAYERS} 0.5 b'
train_data_path: [a, b]
no_load_optim: true
check_for_nan_in_loss_and_grad: true
)");
  ASSERT_TRUE(argv.ok()) << argv.status().message();
  const auto f = by_flag(argv.value());
  EXPECT_EQ(f, (std::map<std::string, std::vector<std::string>>{
                   {"--no-masked-softmax-fusion", {}},
                   {"--disable-bias-linear", {}},
                   {"--apply-layernorm-1p", {}},
                   {"--num-experts", {"4"}},
                   {"--squared-relu", {}},
                   {"--init-method-xavier-uniform", {}},
                   {"--num-layers", {"3"}},  // ${VAR} replaced in an unquoted value
                   {"--data-path", {"0.5", "${GALE_YAML_CFG_TEST_LAYERS}", "0.5", "b"}},  // quoted: kept, split
                   {"--train-data-path", {"a", "b"}},
                   {"--no-load-optim", {}}}));
  unsetenv("GALE_YAML_CFG_TEST_LAYERS");
}

// Megatron's nargs='+' MoE load-balancing keys: a YAML list stands for the list form, a scalar for
// the scalar form, and Megatron's default (scalar or one-element list) is left out.
TEST_F(YamlCfg, MoeLoadBalancingTypeAndCoefficientLists) {
  StatusOr<std::vector<std::string>> list = convert(R"(
num_experts: 4
moe_router_load_balancing_type: [seq_aux_loss, global_aux_loss]
moe_aux_loss_coeff: [1.0e-3, 1.0e-4]
)");
  ASSERT_TRUE(list.ok()) << list.status().message();
  EXPECT_EQ(by_flag(list.value()), (std::map<std::string, std::vector<std::string>>{
                                       {"--num-experts", {"4"}},
                                       {"--moe-router-load-balancing-type", {"seq_aux_loss", "global_aux_loss"}},
                                       {"--moe-aux-loss-coeff", {"1.0e-3", "1.0e-4"}}}));
  StatusOr<std::vector<std::string>> scalar = convert(R"(
num_experts: 4
moe_router_load_balancing_type: seq_aux_loss
moe_aux_loss_coeff: 0.01
)");
  ASSERT_TRUE(scalar.ok()) << scalar.status().message();
  EXPECT_EQ(by_flag(scalar.value()), (std::map<std::string, std::vector<std::string>>{
                                         {"--num-experts", {"4"}},
                                         {"--moe-router-load-balancing-type", {"seq_aux_loss"}},
                                         {"--moe-aux-loss-coeff", {"0.01"}}}));
  StatusOr<std::vector<std::string>> defaults = convert(R"(
num_experts: 4
moe_router_load_balancing_type: [aux_loss]
moe_aux_loss_coeff: 0.0
)");
  ASSERT_TRUE(defaults.ok()) << defaults.status().message();
  EXPECT_EQ(by_flag(defaults.value()), (std::map<std::string, std::vector<std::string>>{{"--num-experts", {"4"}}}));
}

TEST_F(YamlCfg, DerivedFieldsAreIgnoredWithANote) {
  const std::string path = write("d.yaml", "model_parallel:\n  virtual_pipeline_model_parallel_size: 4\n");
  testing::FullCli cli;
  StatusOr<YamlCfgArgs> r = yaml_cfg_to_args(path, cli.parser);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->argv.size(), 2u);  // --yaml-cfg FILE only
  ASSERT_EQ(r->notes.size(), 1u);
  EXPECT_NE(r->notes[0].find("model_parallel.virtual_pipeline_model_parallel_size: ignored, as in Megatron"),
            std::string::npos);
}

TEST_F(YamlCfg, RefusedFlagsAreAcceptedAtMegatronsDefaultOnly) {
  StatusOr<std::vector<std::string>> at_default =
      convert("wandb_project: ''\nconfig_logger_dir: ''\nadlr_autoresume: false\nuse_legacy_models: false\nfp8: null\n");
  ASSERT_TRUE(at_default.ok()) << at_default.status().message();
  EXPECT_TRUE(at_default->empty());

  std::string path;
  StatusOr<std::vector<std::string>> set = convert("s3_cache_path: my-dir\n", &path);
  ASSERT_TRUE(set.ok()) << set.status().message();
  EXPECT_EQ(set.value(), (std::vector<std::string>{"--s3-cache-path", "my-dir"}));
  testing::FullCli cli;
  const Status st = cli.parse(set.value());
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
  EXPECT_NE(st.message().find("--s3-cache-path: not supported yet (datasets on S3)"),
            std::string::npos)
      << st.message();
}

struct ErrorCase {
  std::string yaml;
  std::string expected;  // after "--yaml-cfg <file>: "
};

class YamlCfgErrors : public YamlCfg, public ::testing::WithParamInterface<ErrorCase> {};

TEST_P(YamlCfgErrors, NameTheFileTheKeyTheExpectedAndTheFound) {
  std::string path;
  StatusOr<std::vector<std::string>> r = convert(GetParam().yaml, &path);
  ASSERT_FALSE(r.ok());
  const std::string& m = r.status().message();
  EXPECT_EQ(m.rfind("--yaml-cfg " + path + ": ", 0), 0u) << m;
  EXPECT_NE(m.find(GetParam().expected), std::string::npos) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, YamlCfgErrors,
    ::testing::Values(
        ErrorCase{"language_model:\n  num_layers: two\n", "key language_model.num_layers: expected an integer, found 'two'"},
        ErrorCase{"seq_length: 1.5\n", "key seq_length: expected an integer, found '1.5'"},
        ErrorCase{"lr: [1, 2]\n", "key lr: expected a number, found a list"},
        ErrorCase{"lr: fast\n", "key lr: expected a number, found 'fast'"},
        ErrorCase{"mock_data: 'yes'\n", "key mock_data: expected true or false, found the quoted string 'yes'"},
        ErrorCase{"train_data_path: {a: 1}\n", "key train_data_path: expected a list, found a mapping"},
        ErrorCase{"num_layerz: 2\n", "key num_layerz: unknown key: expected an argument of Megatron's parser"},
        ErrorCase{"model_parallel:\n  num_layerz: 2\n", "key model_parallel.num_layerz: unknown key"},
        ErrorCase{"num_layers: 2\nlanguage_model:\n  num_layers: 2\n",
                  "key language_model.num_layers: given twice (also as num_layers)"},
        ErrorCase{"num_layers: ${GALE_YAML_CFG_TEST_UNSET}\n",
                  "key num_layers: environment variable GALE_YAML_CFG_TEST_UNSET in '${GALE_YAML_CFG_TEST_UNSET}' is "
                  "not set"},
        ErrorCase{"language_model:\n  activation_func: relu\n",
                  "key language_model.activation_func: expected swiglu, squaredrelu or gelu (Megatron's choices), "
                  "found 'relu'"},
        ErrorCase{"swiglu: true\nlanguage_model:\n  activation_func: gelu\n",
                  "key swiglu: true contradicts language_model.activation_func: gelu"},
        ErrorCase{"language_model:\n  activation_func: gelu\n  gated_linear_unit: true\n",
                  "key language_model.gated_linear_unit: not supported yet (a gated gelu MLP; Gale gates only "
                  "SwiGLU): expected false with activation_func gelu, found true"},
        ErrorCase{"model_parallel:\n  cpu_offloading: true\n",
                  "key model_parallel.cpu_offloading: not supported yet (Megatron's activation and weight CPU "
                  "offloading): expected false, found 'true'"},
        ErrorCase{"language_model:\n  init_method: kaiming\n",
                  "key language_model.init_method: expected null or xavier_uniform (Megatron's choices), found "
                  "'kaiming'"},
        ErrorCase{"language_model:\n  window_size: [8, x]\n",
                  "key language_model.window_size: expected an integer, found 'x'"},
        ErrorCase{"model_parallel:\n  timers: 3\n",
                  "key model_parallel.timers: expected null (Megatron sets this Python object itself), found '3'"},
        ErrorCase{"model_parallel:\n  tp_comm_atomic_ag: maybe\n",
                  "key model_parallel.tp_comm_atomic_ag: expected true or false, found 'maybe'"},
        ErrorCase{"language_model: 3\n", "key language_model: expected a mapping of argument names to values, found '3'"},
        ErrorCase{"- a\n- b\n", "expected a mapping of argument names to values, found a list"},
        ErrorCase{"num_layers: [2\n", "not valid YAML: line "}));

// TransformerConfig's window_size pair and window_attn_skip_freq (Megatron main) as the flags.
TEST_F(YamlCfg, WindowSizeAndSkipFrequency) {
  StatusOr<std::vector<std::string>> argv =
      convert("language_model:\n  window_size: [8, 0]\n  window_attn_skip_freq: [1, 0, 1, 0]\n");
  ASSERT_TRUE(argv.ok()) << argv.status().to_string();
  EXPECT_EQ(argv.value(), (std::vector<std::string>{"--window-size", "8,0", "--window-attn-skip-freq", "[1,0,1,0]"}));
  argv = convert("window_size: \"(-1, 0)\"\nwindow_attn_skip_freq: 4\n");
  ASSERT_TRUE(argv.ok()) << argv.status().to_string();
  EXPECT_EQ(argv.value(), (std::vector<std::string>{"--window-size", "(-1, 0)", "--window-attn-skip-freq", "4"}));
}

// Megatron main's gpt-oss activation: TransformerConfig's glu_linear_offset and
// activation_func_clamp_value, and the quick_geglu switch, as the flags.
TEST_F(YamlCfg, GptOssActivationKeys) {
  StatusOr<std::vector<std::string>> argv = convert(
      "language_model:\n  quick_geglu: true\n  glu_linear_offset: 1.0\n  activation_func_clamp_value: 7.0\n");
  ASSERT_TRUE(argv.ok()) << argv.status().to_string();
  EXPECT_EQ(argv.value(), (std::vector<std::string>{"--quick-geglu", "--glu-linear-offset", "1.0",
                                                    "--activation-func-clamp-value", "7.0"}));
}

TEST_F(YamlCfg, MissingFile) {
  testing::FullCli cli;
  const std::string path = dir_.file("absent.yaml");
  StatusOr<YamlCfgArgs> r = yaml_cfg_to_args(path, cli.parser);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "--yaml-cfg " + path + ": cannot read the file");
}

TEST(YamlCfgWorldCaps, TensorThenPipelineCappedAtTheWorldAsMegatron) {
  int64_t tp = 4, pp = 4;
  apply_yaml_cfg_world_caps(2, &tp, &pp);
  EXPECT_EQ(tp, 2);
  EXPECT_EQ(pp, 1);
  tp = 2, pp = 4;
  apply_yaml_cfg_world_caps(8, &tp, &pp);
  EXPECT_EQ(tp, 2);
  EXPECT_EQ(pp, 4);
}

TEST(YamlCfgFind, LastValueOnTheCommandLine) {
  std::vector<std::string> a = {"gale", "--lr", "1", "--yaml-cfg", "a.yaml", "--yaml-cfg=b.yaml"};
  std::vector<char*> p;
  for (auto& s : a) p.push_back(s.data());
  EXPECT_EQ(find_yaml_cfg(static_cast<int>(p.size()), p.data()), "b.yaml");
  EXPECT_EQ(find_yaml_cfg(3, p.data()), "");
}

}  // namespace
}  // namespace gale
