// Megatron flag parsing: names, defaults, derived values, and one-line errors naming the flag.
#include "pretrain_cli.h"
#include "train/arguments.h"
#include "train/checkpoint_args.h"
#include "train/model_setup.h"

#include <gtest/gtest.h>

namespace gale {
namespace {

using Cli = testing::PretrainCli;
using testing::minimal_pretrain_flags;

std::vector<std::string> with(std::vector<std::string> base, std::vector<std::string> extra) {
  base.insert(base.end(), extra.begin(), extra.end());
  return base;
}

// --qk-l2-norm replaces --qk-layernorm's learned norms, as Megatron's layer spec picks L2Norm for
// both; the checkpoint records it.
TEST(Arguments, QkL2NormReplacesTheLearnedQkNorms) {
  Cli c;
  ASSERT_TRUE(c.parse(with(minimal_pretrain_flags(), {"--qk-l2-norm", "--qk-layernorm"})).ok());
  EXPECT_TRUE(c.args.model.qk_l2_norm);
  c.args.model.padded_vocab_size = 128;
  const ModelConfig config = model_config_from_args(c.args);
  EXPECT_TRUE(config.qk_l2_norm);
  EXPECT_FALSE(config.qk_layernorm);
  const nlohmann::json args = model_flags_json(c.args.model);
  EXPECT_EQ(args["qk_l2_norm"], true);
  EXPECT_TRUE(model_args_from_json(args, "x").value().qk_l2_norm);
  EXPECT_EQ(checkpoint_model_section(config)["qk_l2_norm"], true);
  Cli plain;
  ASSERT_TRUE(plain.parse(minimal_pretrain_flags()).ok());
  plain.args.model.padded_vocab_size = 128;
  const ModelConfig p = model_config_from_args(plain.args);
  EXPECT_FALSE(p.qk_l2_norm);
  EXPECT_FALSE(model_flags_json(plain.args.model).contains("qk_l2_norm"));  // absent: off
  EXPECT_FALSE(checkpoint_model_section(p).contains("qk_l2_norm"));
  nlohmann::json megatron = model_flags_json(plain.args.model);
  megatron["qk_l2_norm"] = false;  // Megatron's own record
  EXPECT_FALSE(model_args_from_json(megatron, "x").value().qk_l2_norm);
}

// --freeze-all-layers: Megatron's warnings turn off the distributed optimizer and the parameter
// all-gather overlap, and --load becomes weights-only (--finetune).
TEST(Arguments, FreezeAllLayersTurnsOffTheDistributedOptimizerAndLoadsWeightsOnly) {
  Cli c;
  ASSERT_TRUE(c.parse(with(minimal_pretrain_flags(), {"--freeze-all-layers", "--use-distributed-optimizer",
                                                      "--overlap-grad-reduce", "--overlap-param-gather"}))
                  .ok());
  EXPECT_TRUE(c.args.training.freeze_all_layers);
  EXPECT_FALSE(c.args.parallel.use_distributed_optimizer);
  EXPECT_FALSE(c.args.parallel.overlap_param_gather);
  EXPECT_TRUE(c.args.checkpoint.finetune);
  Cli plain;
  ASSERT_TRUE(plain.parse(with(minimal_pretrain_flags(), {"--use-distributed-optimizer"})).ok());
  EXPECT_TRUE(plain.args.parallel.use_distributed_optimizer);
  EXPECT_FALSE(plain.args.checkpoint.finetune);
}

TEST(Arguments, MegatronDefaultsAndDerivedValues) {
  Cli c;
  ASSERT_TRUE(c.parse(minimal_pretrain_flags()).ok());
  EXPECT_EQ(c.args.model.ffn_hidden_size, 256);
  EXPECT_EQ(c.args.model.kv_channels, 16);
  EXPECT_EQ(c.args.model.num_kv_heads, 4);
  EXPECT_EQ(c.args.training.global_batch_size, 2);
  EXPECT_EQ(c.args.training.seed, 1234);
  EXPECT_DOUBLE_EQ(c.args.training.weight_decay, 0.01);
  EXPECT_DOUBLE_EQ(c.args.training.start_weight_decay, 0.01);
  EXPECT_DOUBLE_EQ(c.args.model.attention_dropout, 0.1);
  EXPECT_EQ(c.args.model.make_vocab_size_divisible_by, 128);
  EXPECT_EQ(c.args.logging.log_interval, 100);
  EXPECT_EQ(c.args.model.normalization, "LayerNorm");
  EXPECT_EQ(c.args.training.lr_decay_style, "linear");
  EXPECT_TRUE(c.args.model.add_bias_linear);
  EXPECT_TRUE(c.args.checkpoint.load_optim);
}

TEST(Arguments, CheckpointFormatAndAsyncSaveAsMegatron) {
  Cli defaults;
  ASSERT_TRUE(defaults.parse(minimal_pretrain_flags()).ok());
  EXPECT_EQ(defaults.args.checkpoint.ckpt_format, "torch_dist");
  EXPECT_FALSE(defaults.args.checkpoint.async_save);
  for (const char* format : {"torch", "torch_dist", "zarr", "torch_dcp", "fsdp_dtensor"}) {
    Cli c;
    Status st = c.parse(with(minimal_pretrain_flags(), {"--ckpt-format", format}));
    ASSERT_TRUE(st.ok()) << format << ": " << st.to_string();
    EXPECT_EQ(c.args.checkpoint.ckpt_format, format);
  }
  for (const char* format : {"torch_dist", "torch_dcp", "fsdp_dtensor"}) {
    Cli c;
    Status st = c.parse(with(minimal_pretrain_flags(), {"--async-save", "--ckpt-format", format}));
    ASSERT_TRUE(st.ok()) << format << ": " << st.to_string();
    EXPECT_TRUE(c.args.checkpoint.async_save);
  }
  Cli persistent;  // Megatron's newer scripts pair --async-save with it
  ASSERT_TRUE(persistent.parse(with(minimal_pretrain_flags(), {"--async-save", "--use-persistent-ckpt-worker"})).ok());
}

TEST(Arguments, DataloaderTypeAndDataShardingAsMegatron) {
  Cli defaults;
  ASSERT_TRUE(defaults.parse(minimal_pretrain_flags()).ok());
  EXPECT_EQ(defaults.args.data.dataloader_type, "single");
  EXPECT_TRUE(defaults.args.data.data_sharding);
  Cli cyclic;
  ASSERT_TRUE(cyclic.parse(with(minimal_pretrain_flags(), {"--dataloader-type", "cyclic", "--no-data-sharding"})).ok());
  EXPECT_EQ(cyclic.args.data.dataloader_type, "cyclic");
  EXPECT_FALSE(cyclic.args.data.data_sharding);
}

TEST(Arguments, TensorBoardFlagsAsMegatron) {
  Cli defaults;
  ASSERT_TRUE(defaults.parse(minimal_pretrain_flags()).ok());
  const LoggingArgs& d = defaults.args.logging;
  EXPECT_EQ(d.tensorboard_dir, "");
  EXPECT_EQ(d.tensorboard_log_interval, 1);
  EXPECT_EQ(d.tensorboard_queue_size, 1000);
  EXPECT_FALSE(d.log_timers_to_tensorboard);
  EXPECT_FALSE(d.log_batch_size_to_tensorboard);
  EXPECT_TRUE(d.log_learning_rate_to_tensorboard);
  EXPECT_TRUE(d.log_loss_scale_to_tensorboard);
  EXPECT_FALSE(d.log_validation_ppl_to_tensorboard);
  EXPECT_FALSE(d.log_memory_to_tensorboard);
  EXPECT_FALSE(d.log_world_size_to_tensorboard);
  Cli c;
  ASSERT_TRUE(c.parse(with(minimal_pretrain_flags(),
                           {"--tensorboard-dir", "runs/x", "--tensorboard-log-interval", "10", "--tensorboard-queue-size",
                            "5", "--log-timers-to-tensorboard", "--log-batch-size-to-tensorboard",
                            "--no-log-learnig-rate-to-tensorboard", "--no-log-loss-scale-to-tensorboard",
                            "--log-validation-ppl-to-tensorboard", "--log-memory-to-tensorboard",
                            "--log-world-size-to-tensorboard"}))
                  .ok());
  const LoggingArgs& l = c.args.logging;
  EXPECT_EQ(l.tensorboard_dir, "runs/x");
  EXPECT_EQ(l.tensorboard_log_interval, 10);
  EXPECT_EQ(l.tensorboard_queue_size, 5);
  EXPECT_TRUE(l.log_timers_to_tensorboard);
  EXPECT_TRUE(l.log_batch_size_to_tensorboard);
  EXPECT_FALSE(l.log_learning_rate_to_tensorboard);
  EXPECT_FALSE(l.log_loss_scale_to_tensorboard);
  EXPECT_TRUE(l.log_validation_ppl_to_tensorboard);
  EXPECT_TRUE(l.log_memory_to_tensorboard);
  EXPECT_TRUE(l.log_world_size_to_tensorboard);
}

TEST(Arguments, TimerFlagsAsMegatron) {
  Cli defaults;
  ASSERT_TRUE(defaults.parse(minimal_pretrain_flags()).ok());
  EXPECT_EQ(defaults.args.logging.timing_log_level, 0);
  EXPECT_EQ(defaults.args.logging.timing_log_option, "minmax");
  EXPECT_TRUE(defaults.args.logging.barrier_with_l1_time);
  Cli c;
  ASSERT_TRUE(c.parse(with(minimal_pretrain_flags(), {"--timing-log-level", "2", "--timing-log-option", "all",
                                                      "--no-barrier-with-level-1-timing"}))
                  .ok());
  EXPECT_EQ(c.args.logging.timing_log_level, 2);
  EXPECT_EQ(c.args.logging.timing_log_option, "all");
  EXPECT_FALSE(c.args.logging.barrier_with_l1_time);
  for (const char* level : {"-1", "3"}) {
    Cli bad;
    EXPECT_EQ(bad.parse(with(minimal_pretrain_flags(), {"--timing-log-level", level})).message(),
              std::string("--timing-log-level: expected 0, 1 or 2, found ") + level);
  }
  Cli option;
  const Status s = option.parse(with(minimal_pretrain_flags(), {"--timing-log-option", "min"}));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--timing-log-option"), std::string::npos) << s.message();
}

TEST(Arguments, SwigluFfnRuleAndGqa) {
  Cli c;
  ASSERT_TRUE(c.parse(with(minimal_pretrain_flags(), {"--swiglu", "--group-query-attention", "--num-query-groups", "2",
                                       "--disable-bias-linear", "--no-load-optim", "--hidden-size", "768",
                                       "--num-attention-heads", "12", "--num-query-groups", "4"}))
                  .ok());
  EXPECT_EQ(c.args.model.ffn_hidden_size, 2048);  // int(4*768*2/3/64)*64
  EXPECT_EQ(c.args.model.num_kv_heads, 4);
  EXPECT_FALSE(c.args.model.add_bias_linear);
  EXPECT_FALSE(c.args.checkpoint.load_optim);
}

TEST(Arguments, VocabPadding) {
  EXPECT_EQ(pad_vocab_size(50257, 128, 1), 50304);
  EXPECT_EQ(pad_vocab_size(50257, 128, 8), 51200);
  EXPECT_EQ(pad_vocab_size(32000, 1, 1), 32000);
  EXPECT_EQ(pad_vocab_size(96, 64, 1), 128);
}

TEST(Arguments, MicrobatchGroupSizeFollowsMegatronsRules) {
  // PP 2 x 2 virtual stages on 2 ranks; micro-batches per iteration = global batch / 2.
  auto parse = [](std::vector<std::string> extra) {
    std::vector<std::string> argv = minimal_pretrain_flags();
    argv[1] = "4";  // --num-layers 4: 2 per stage, 1 per virtual stage
    Cli c;
    return c.parse(with(argv, with({"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"},
                                   extra)),
                   2);
  };
  EXPECT_TRUE(parse({"--global-batch-size", "10", "--microbatch-group-size-per-virtual-pipeline-stage", "3"}).ok());
  EXPECT_TRUE(parse({"--global-batch-size", "8", "--microbatch-group-size-per-virtual-pipeline-stage", "2"}).ok());
  Status s = parse({"--global-batch-size", "14", "--microbatch-group-size-per-virtual-pipeline-stage", "3"});
  EXPECT_EQ(s.message(),
            "the number of micro-batches per iteration (--global-batch-size / (--micro-batch-size x data-parallel "
            "size) = 7) leaves a last group of 1 micro-batches after groups of "
            "--microbatch-group-size-per-virtual-pipeline-stage 3; it must be 0 or at least "
            "--pipeline-model-parallel-size 2");
  s = parse({"--global-batch-size", "8", "--microbatch-group-size-per-virtual-pipeline-stage", "1"});
  EXPECT_NE(s.message().find("--microbatch-group-size-per-virtual-pipeline-stage 1 must lie between "
                             "--pipeline-model-parallel-size 2 and"),
            std::string::npos)
      << s.message();
  Cli plain;  // without interleaving the flag changes nothing, as in Megatron
  EXPECT_TRUE(plain.parse(with(minimal_pretrain_flags(), {"--microbatch-group-size-per-virtual-pipeline-stage", "3"})).ok());
}

TEST(Arguments, AliasAndEqualsSyntax) {
  Cli c;
  ASSERT_TRUE(c.parse(with(minimal_pretrain_flags(), {"--save=/tmp/x", "--persistent-save-interval", "5"})).ok());
  EXPECT_EQ(c.args.checkpoint.save, "/tmp/x");
  EXPECT_EQ(c.args.checkpoint.save_interval, 5);
}

// Megatron's router flags: defaults, and a DeepSeek-V3-style routing reaching the model config.
TEST(Arguments, MoeRouterFlagsDefaultsAndModelConfig) {
  Cli d;
  ASSERT_TRUE(d.parse(with(minimal_pretrain_flags(), {"--num-experts", "8"})).ok());
  EXPECT_EQ(d.args.moe.moe_router_score_function, "softmax");
  EXPECT_FALSE(d.args.moe.moe_router_enable_expert_bias);
  EXPECT_EQ(d.args.moe.moe_router_bias_update_rate, 1e-3);
  EXPECT_TRUE(unset(d.args.moe.moe_router_topk_scaling_factor));
  EXPECT_EQ(d.args.moe.moe_router_num_groups, kUnset);
  EXPECT_TRUE(unset(d.args.moe.moe_expert_capacity_factor));
  EXPECT_EQ(d.args.moe.moe_token_drop_policy, "probs");
  d.args.model.padded_vocab_size = 128;  // set by the tokenizer setup in a run
  const ModelConfig dc = model_config_from_args(d.args);
  EXPECT_FALSE(dc.moe.sigmoid);
  EXPECT_EQ(dc.moe.topk_scaling_factor, 1.0);
  EXPECT_EQ(dc.moe.capacity_factor, 0.0);
  Cli c;
  ASSERT_TRUE(c.parse(with(minimal_pretrain_flags(), {"--num-experts", "8", "--moe-router-topk", "4", "--moe-router-score-function",
                                       "sigmoid", "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate",
                                       "0.01", "--moe-router-num-groups", "4", "--moe-router-group-topk", "2",
                                       "--moe-router-topk-scaling-factor", "2.5", "--moe-router-load-balancing-type",
                                       "seq_aux_loss", "--moe-aux-loss-coeff", "1e-4", "--moe-expert-capacity-factor",
                                       "1.5", "--moe-token-drop-policy", "position"}))
                  .ok());
  c.args.model.padded_vocab_size = 128;
  const ModelConfig mc = model_config_from_args(c.args);
  EXPECT_TRUE(mc.moe.sigmoid);
  EXPECT_TRUE(mc.moe.expert_bias);
  EXPECT_EQ(mc.moe.bias_update_rate, 0.01);
  EXPECT_EQ(mc.moe.num_groups, 4);
  EXPECT_EQ(mc.moe.group_topk, 2);
  EXPECT_EQ(mc.moe.topk_scaling_factor, 2.5);
  EXPECT_EQ(mc.moe.seq_aux_loss_coeff, 1e-4);
  EXPECT_EQ(mc.moe.aux_loss_coeff, 0.0);
  EXPECT_EQ(mc.moe.global_aux_loss_coeff, 0.0);
  EXPECT_EQ(mc.moe.capacity_factor, 1.5);
  EXPECT_TRUE(mc.moe.drop_by_position);
  Cli negative;  // Megatron: a negative capacity factor is None (dropless)
  ASSERT_TRUE(negative.parse(with(minimal_pretrain_flags(), {"--num-experts", "8", "--moe-expert-capacity-factor", "-1"})).ok());
  negative.args.model.padded_vocab_size = 128;
  EXPECT_EQ(model_config_from_args(negative.args).moe.capacity_factor, 0.0);
}

// Megatron's nargs='+' forms of --moe-router-load-balancing-type and --moe-aux-loss-coeff: a list of
// one is the scalar form (Megatron turns it into a scalar), a longer list pairs each type with its
// coefficient, and a flag given twice keeps its last occurrence's values (argparse).
TEST(Arguments, MoeLoadBalancingTypeListForm) {
  Cli scalar, one;
  ASSERT_TRUE(scalar.parse(with(minimal_pretrain_flags(), {"--num-experts", "8", "--moe-router-load-balancing-type",
                                                           "seq_aux_loss", "--moe-aux-loss-coeff", "1e-3"})).ok());
  ASSERT_TRUE(one.parse(with(minimal_pretrain_flags(), {"--num-experts", "8", "--moe-router-load-balancing-type=seq_aux_loss",
                                                        "--moe-aux-loss-coeff=1e-3"})).ok());
  for (Cli* c : {&scalar, &one}) {
    EXPECT_EQ(c->args.moe.moe_router_load_balancing_type, "seq_aux_loss");
    EXPECT_EQ(c->args.moe.moe_aux_loss_coeff, 1e-3);
    EXPECT_TRUE(c->args.moe.moe_router_load_balancing_types.empty());
    EXPECT_TRUE(c->args.moe.moe_aux_loss_coeffs.empty());
    c->args.model.padded_vocab_size = 128;
  }
  EXPECT_EQ(model_config_from_args(one.args).moe.seq_aux_loss_coeff, 1e-3);

  Cli list;
  ASSERT_TRUE(list.parse(with(minimal_pretrain_flags(),
                              {"--num-experts", "8", "--moe-router-load-balancing-type", "seq_aux_loss", "global_aux_loss",
                               "--moe-aux-loss-coeff", "1e-3", "1e-4"})).ok());
  EXPECT_EQ(list.args.moe.moe_router_load_balancing_types, (std::vector<std::string>{"seq_aux_loss", "global_aux_loss"}));
  EXPECT_EQ(list.args.moe.moe_aux_loss_coeffs, (std::vector<double>{1e-3, 1e-4}));
  EXPECT_EQ(list.args.moe.aux_loss_coeff("seq_aux_loss"), 1e-3);
  EXPECT_EQ(list.args.moe.aux_loss_coeff("global_aux_loss"), 1e-4);
  EXPECT_EQ(list.args.moe.aux_loss_coeff("aux_loss"), 0.0);
  EXPECT_TRUE(list.args.moe.uses_load_balancing_type("global_aux_loss"));
  EXPECT_FALSE(list.args.moe.uses_load_balancing_type("aux_loss"));
  list.args.model.padded_vocab_size = 128;
  const ModelConfig mc = model_config_from_args(list.args);
  EXPECT_EQ(mc.moe.aux_loss_coeff, 0.0);
  EXPECT_EQ(mc.moe.seq_aux_loss_coeff, 1e-3);
  EXPECT_EQ(mc.moe.global_aux_loss_coeff, 1e-4);
  EXPECT_FALSE(mc.moe.sinkhorn);

  Cli twice;  // the last occurrence wins, its whole list
  ASSERT_TRUE(twice.parse(with(minimal_pretrain_flags(),
                               {"--num-experts", "8", "--moe-router-load-balancing-type", "aux_loss", "seq_aux_loss",
                                "--moe-aux-loss-coeff", "1", "2", "--moe-router-load-balancing-type", "global_aux_loss",
                                "--moe-aux-loss-coeff", "3"})).ok());
  EXPECT_EQ(twice.args.moe.moe_router_load_balancing_type, "global_aux_loss");
  EXPECT_EQ(twice.args.moe.moe_aux_loss_coeff, 3.0);
  EXPECT_TRUE(twice.args.moe.moe_router_load_balancing_types.empty());

  Cli qb;  // Megatron main's quantile balancing and its EMA (default 0)
  ASSERT_TRUE(qb.parse(with(minimal_pretrain_flags(), {"--num-experts", "8", "--moe-router-load-balancing-type",
                                                       "quantile_balancing", "--moe-router-quantile-balancing-ema",
                                                       "0.25"})).ok());
  qb.args.model.padded_vocab_size = 128;
  const ModelConfig qc = model_config_from_args(qb.args);
  EXPECT_TRUE(qc.moe.quantile_balancing);
  EXPECT_EQ(qc.moe.qb_ema, 0.25);
  EXPECT_FALSE(qc.moe.any_aux_loss());
  EXPECT_FALSE(mc.moe.quantile_balancing);
  EXPECT_EQ(mc.moe.qb_ema, 0.0);

  Cli force;
  ASSERT_TRUE(force.parse(with(minimal_pretrain_flags(), {"--num-experts", "8", "--moe-router-force-load-balancing"})).ok());
  force.args.model.padded_vocab_size = 128;
  EXPECT_TRUE(model_config_from_args(force.args).moe.force_load_balancing);
  EXPECT_FALSE(model_config_from_args(list.args).moe.force_load_balancing);
}

TEST(Arguments, MixtureOfExpertsDefaultsAndLayerPatterns) {
  Cli c;
  ASSERT_TRUE(c.parse(with(minimal_pretrain_flags(), {"--num-experts", "8", "--moe-grouped-gemm"})).ok());
  EXPECT_EQ(c.args.moe.moe_router_topk, 2);
  EXPECT_EQ(c.args.moe.moe_ffn_hidden_size, 256);  // --ffn-hidden-size
  EXPECT_EQ(c.args.moe.moe_aux_loss_coeff, 0.0);
  EXPECT_EQ(c.args.moe.moe_router_load_balancing_type, "aux_loss");
  EXPECT_EQ(c.args.moe.layer_pattern, (std::vector<int>{1, 1}));
  EXPECT_EQ(c.args.moe.expert_tensor_parallel_size, 1);
  EXPECT_EQ(c.args.moe.moe_shared_expert_intermediate_size, kUnset);  // no shared expert
  Cli shared;
  ASSERT_TRUE(shared.parse(with(minimal_pretrain_flags(), {"--num-experts", "4", "--disable-bias-linear",
                                            "--moe-shared-expert-intermediate-size", "24", "--moe-shared-expert-gate"}))
                  .ok());
  EXPECT_EQ(shared.args.moe.moe_shared_expert_intermediate_size, 24);
  EXPECT_TRUE(shared.args.moe.moe_shared_expert_gate);
  Cli overlap;
  ASSERT_TRUE(overlap.parse(with(minimal_pretrain_flags(), {"--num-experts", "4", "--disable-bias-linear",
                                             "--moe-shared-expert-intermediate-size", "24", "--moe-shared-expert-overlap",
                                             "--moe-token-dispatcher-type", "alltoall"}))
                  .ok());
  EXPECT_TRUE(overlap.args.moe.moe_shared_expert_overlap);
  Cli none;
  ASSERT_TRUE(none.parse(with(minimal_pretrain_flags(), {"--num-experts", "0"})).ok());  // Megatron: 0 is None
  EXPECT_FALSE(none.args.moe.enabled());
  EXPECT_TRUE(none.args.moe.layer_pattern.empty());
  EXPECT_EQ(parse_moe_layer_freq("2", 5).value(), (std::vector<int>{1, 0, 1, 0, 1}));
  EXPECT_EQ(parse_moe_layer_freq("[0, 1, 1]", 3).value(), (std::vector<int>{0, 1, 1}));
  EXPECT_EQ(parse_moe_layer_freq("([0]+[1]*3)", 4).value(), (std::vector<int>{0, 1, 1, 1}));
  EXPECT_EQ(parse_moe_layer_freq("[1,0]*2+[1]", 5).value(), (std::vector<int>{1, 0, 1, 0, 1}));
  EXPECT_EQ(parse_moe_layer_freq("([1]*2+[0])*2", 6).value(), (std::vector<int>{1, 1, 0, 1, 1, 0}));
  // --linear-attention-freq's int rule (Megatron's get_linear_attention_pattern): 0 where (i + 1) % N == 0.
  const auto linear = [](int64_t k, int64_t i) { return (i + 1) % k != 0; };
  EXPECT_EQ(parse_layer_pattern("--linear-attention-freq", "4", 8, linear).value(),
            (std::vector<int>{1, 1, 1, 0, 1, 1, 1, 0}));
  EXPECT_EQ(parse_layer_pattern("--linear-attention-freq", "([1]*3+[0]*1)*2", 8, linear).value(),
            (std::vector<int>{1, 1, 1, 0, 1, 1, 1, 0}));
  EXPECT_FALSE(parse_layer_pattern("--linear-attention-freq", "([1]*3+[0]*1)*2", 7, linear).ok());
  EXPECT_FALSE(parse_moe_layer_freq("0", 4).ok());
  EXPECT_FALSE(parse_moe_layer_freq("[1,0]*x", 4).ok());
}

// --expert-model-parallel-size: Megatron's expert generator needs world % (EP·PP) == 0 and E % EP == 0;
TEST(Arguments, ExpertParallelism) {
  const std::vector<std::string> ep2 = {"--num-experts", "4", "--expert-model-parallel-size", "2",
                                        "--moe-token-dispatcher-type", "alltoall"};
  Cli ok;
  ASSERT_TRUE(ok.parse(with(minimal_pretrain_flags(), ep2), 2).ok());
  EXPECT_EQ(ok.args.parallel.expert_model_parallel_size, 2);
  EXPECT_EQ(ok.args.parallel.data_parallel_size, 2);
  Cli pp;
  EXPECT_TRUE(pp.parse(with(minimal_pretrain_flags(), with(ep2, {"--pipeline-model-parallel-size", "2"})), 4).ok());
  Cli world;
  EXPECT_EQ(world.parse(with(minimal_pretrain_flags(), with(ep2, {"--pipeline-model-parallel-size", "2"})), 2).message(),
            "world size 2 is not divisible by --expert-model-parallel-size 2 x --pipeline-model-parallel-size 2 = 4");
  Cli odd;
  EXPECT_EQ(odd.parse(with(minimal_pretrain_flags(), {"--num-experts", "6", "--expert-model-parallel-size", "4",
                                       "--moe-token-dispatcher-type", "alltoall"}), 4).message(),
            "--num-experts 6 must be divisible by --expert-model-parallel-size 4");
  Cli dense;
  EXPECT_EQ(dense.parse(with(minimal_pretrain_flags(), {"--expert-model-parallel-size", "2"}), 2).message(),
            "--expert-model-parallel-size 2 needs --num-experts (a MoE model), found no --num-experts");
  Cli allgather;  // Megatron's default dispatcher
  EXPECT_TRUE(allgather.parse(with(minimal_pretrain_flags(), {"--num-experts", "4", "--expert-model-parallel-size", "2"}), 2).ok());
  Cli padded;  // padding rows are not carried by the all-gather dispatcher
  EXPECT_EQ(padded.parse(with(minimal_pretrain_flags(), {"--num-experts", "4", "--expert-model-parallel-size", "2",
                                          "--moe-expert-capacity-factor", "1", "--moe-pad-expert-input-to-capacity"}),
                         2).message(),
            "--moe-pad-expert-input-to-capacity with --moe-token-dispatcher-type allgather and "
            "--expert-model-parallel-size 2: not supported yet (use alltoall)");
  Cli padded_alltoall;
  EXPECT_TRUE(padded_alltoall.parse(with(minimal_pretrain_flags(), with(ep2, {"--moe-expert-capacity-factor", "1",
                                                               "--moe-pad-expert-input-to-capacity"})), 2).ok());
}

TEST(Arguments, MixtureOfExpertsWithTensorParallelismNeedsSequenceParallelism) {
  Cli tp;
  const Status st = tp.parse(with(minimal_pretrain_flags(), {"--num-experts", "4", "--tensor-model-parallel-size", "2"}), 2);
  EXPECT_EQ(st.message(),
            "--num-experts with --tensor-model-parallel-size 2: expected --sequence-parallel (MoE under TP routes each "
            "rank's own tokens), found it off");
  Cli sp;
  EXPECT_TRUE(sp.parse(with(minimal_pretrain_flags(), {"--num-experts", "4", "--tensor-model-parallel-size", "2", "--sequence-parallel"}),
                       2).ok());
  Cli etp1;
  EXPECT_TRUE(etp1.parse(with(minimal_pretrain_flags(), {"--num-experts", "4", "--tensor-model-parallel-size", "2", "--sequence-parallel",
                                          "--expert-tensor-parallel-size", "1"}), 2).ok());
  Cli etp;
  EXPECT_EQ(etp.parse(with(minimal_pretrain_flags(), {"--num-experts", "4", "--tensor-model-parallel-size", "4", "--sequence-parallel",
                                       "--expert-tensor-parallel-size", "2"}), 4).message(),
            "--expert-tensor-parallel-size 2 with --num-experts: not supported yet (expected 1 or "
            "--tensor-model-parallel-size 4)");
  Cli tp_ep;
  EXPECT_TRUE(tp_ep.parse(with(minimal_pretrain_flags(), {"--num-experts", "4", "--tensor-model-parallel-size", "2", "--sequence-parallel",
                                           "--expert-model-parallel-size", "2", "--global-batch-size", "4"}), 4).ok());
  // Megatron's DeepSeek layout: whole experts, EP carved out of the same ranks as TP.
  Cli etp1_ep;
  EXPECT_TRUE(etp1_ep.parse(with(minimal_pretrain_flags(), {"--num-experts", "4", "--tensor-model-parallel-size", "2", "--sequence-parallel",
                                           "--expert-model-parallel-size", "2", "--expert-tensor-parallel-size", "1",
                                           "--global-batch-size", "4"}), 4).ok());
  EXPECT_EQ(etp1_ep.args.moe.expert_tensor_parallel_size, 1);
  EXPECT_EQ(expert_grid_ep_size(etp1_ep.args), 2);
}

TEST(Arguments, MixtureOfExpertsWithContextParallelism) {
  Cli cp;
  EXPECT_TRUE(cp.parse(with(minimal_pretrain_flags(), {"--num-experts", "4", "--context-parallel-size", "2"}), 2).ok());
  // CP folded into the expert grid, as Megatron's expert generator (cp = 1).
  Cli cp_ep;
  EXPECT_TRUE(cp_ep.parse(with(minimal_pretrain_flags(), {"--num-experts", "4", "--context-parallel-size", "2",
                                         "--expert-model-parallel-size", "2"}), 2).ok());
}

// MindSpeed's --moe-tp-extend-ep: Megatron's expert TP 1 with expert-parallel size TP x EP, and
// MindSpeed's requirements as one-line errors.
TEST(Arguments, MoeTpExtendEpIsExpertTensorParallelOneOverTensorTimesExpertRanks) {
  const std::vector<std::string> base = {"--num-experts", "8", "--tensor-model-parallel-size", "2", "--sequence-parallel",
                                         "--moe-token-dispatcher-type", "alltoall", "--moe-tp-extend-ep",
                                         "--moe-permutation-async-comm", "--moe-grouped-gemm", "--global-batch-size", "4"};
  Cli ok;
  ASSERT_TRUE(ok.parse(with(minimal_pretrain_flags(), with(base, {"--expert-model-parallel-size", "2"})), 4).ok());
  EXPECT_EQ(ok.args.moe.expert_tensor_parallel_size, 1);
  EXPECT_EQ(expert_grid_ep_size(ok.args), 4);
  EXPECT_EQ(ok.args.parallel.expert_model_parallel_size, 2);  // the flag as given
  Cli tp_only;  // EP 1: the experts over the TP pair
  ASSERT_TRUE(tp_only.parse(with(minimal_pretrain_flags(), base), 2).ok());
  EXPECT_EQ(expert_grid_ep_size(tp_only.args), 2);
  const std::vector<testing::FlagErrorCase> errors = {
      {with(base, {"--num-experts", "4", "--expert-model-parallel-size", "4"}), 4,
       "--moe-tp-extend-ep: expected --num-experts 4 divisible by --tensor-model-parallel-size 2 x "
       "--expert-model-parallel-size 4 = 8"},
      {{"--num-experts", "8", "--tensor-model-parallel-size", "2", "--sequence-parallel", "--moe-token-dispatcher-type",
        "alltoall", "--moe-tp-extend-ep", "--moe-grouped-gemm"},
       2, "--moe-tp-extend-ep needs --moe-permutation-async-comm and --moe-grouped-gemm (as MindSpeed), found no "
          "--moe-permutation-async-comm"},
      {{"--num-experts", "8", "--tensor-model-parallel-size", "2", "--sequence-parallel", "--moe-token-dispatcher-type",
        "alltoall", "--moe-tp-extend-ep"},
       2, "found no --moe-permutation-async-comm and no --moe-grouped-gemm"},
      {with(base, {"--moe-expert-capacity-factor", "1.0"}), 2,
       "--moe-tp-extend-ep: expected no --moe-expert-capacity-factor (dropless, as MindSpeed), found 1"},
      {with(base, {"--moe-token-dispatcher-type", "allgather"}), 2,
       "--moe-tp-extend-ep: expected --moe-token-dispatcher-type alltoall (as MindSpeed), found allgather"},
      {with(base, {"--expert-tensor-parallel-size", "2"}), 2,
       "--moe-tp-extend-ep: expected --expert-tensor-parallel-size 1 or unset (the experts are not split), found 2"},
      {with(base, {"--expert-model-parallel-size", "2"}), 2,
       "--moe-tp-extend-ep: world size 2 is not divisible by --tensor-model-parallel-size 2 x "
       "--expert-model-parallel-size 2 x --pipeline-model-parallel-size 1 = 4"},
      {{"--moe-tp-extend-ep"}, 1, "--moe-tp-extend-ep needs --num-experts (a MoE model), found no --num-experts"},
  };
  for (const testing::FlagErrorCase& e : errors) expect_one_line_error(e);
}

struct ErrorCase {
  std::vector<std::string> extra;
  StatusCode code;
  std::string message;  // exact, or a prefix when it ends with "..."
};

class ArgumentErrors : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(ArgumentErrors, OneLineNamingTheFlag) {
  const ErrorCase& e = GetParam();
  Cli c;
  std::vector<std::string> argv = with(minimal_pretrain_flags(), e.extra);
  Status st = c.parse(argv);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), e.code) << st.to_string();
  if (e.message.size() > 3 && e.message.substr(e.message.size() - 3) == "...")
    EXPECT_EQ(st.message().substr(0, e.message.size() - 3), e.message.substr(0, e.message.size() - 3)) << st.message();
  else
    EXPECT_EQ(st.message(), e.message);
  EXPECT_EQ(st.message().find('\n'), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ArgumentErrors,
    ::testing::Values(
        ErrorCase{{"--num-layerz", "3"}, StatusCode::kInvalidArgument, "unknown flag --num-layerz (run `gale pretrain --help` for the list)"},
        ErrorCase{{"--hidden-size", "66"}, StatusCode::kInvalidArgument,
                  "--hidden-size 66 must be divisible by --num-attention-heads 4 (or give --kv-channels)"},
        ErrorCase{{"--min-lr", "0.1"}, StatusCode::kInvalidArgument, "--min-lr 0.1 must not exceed --lr 0.001"},
        ErrorCase{{"--qk-l2-norm", "--multi-latent-attention"}, StatusCode::kInvalidArgument,
                  "--qk-l2-norm with --multi-latent-attention: qk_l2_norm is not supported with MLA (Megatron "
                  "normalises the heads of standard self-attention only)"},
        ErrorCase{{"--qk-l2-norm", "--is-hybrid-model", "--mamba-num-groups", "2"}, StatusCode::kUnimplemented,
                  "--qk-l2-norm with --is-hybrid-model: not supported yet"},
        ErrorCase{{"--freeze-all-layers", "--use-custom-fsdp", "--data-parallel-sharding-strategy", "optim_grads"},
                  StatusCode::kUnimplemented,
                  "--freeze-all-layers with a sharded optimizer, gradients or parameters (--use-custom-fsdp optim, "
                  "optim_grads or optim_grads_params, --use-torch-fsdp2, --layerzero): not supported yet"},
        ErrorCase{{"--freeze-all-layers", "--qk-clip"}, StatusCode::kUnimplemented,
                  "--freeze-all-layers with --qk-clip: not supported yet (the clip rescales the weights after the "
                  "optimizer step)"},
        ErrorCase{{"--finetune", "--override-ckpt-iteration", "5"}, StatusCode::kInvalidArgument,
                  "--override-ckpt-iteration with --finetune: cannot override checkpoint iteration together with "
                  "finetune flag"},
        ErrorCase{{"--override-ckpt-iteration", "-3"}, StatusCode::kInvalidArgument,
                  "--override-ckpt-iteration: expected an iteration ≥ 0, found -3"},
        ErrorCase{{"--optimizer", "lion", "--fp16"}, StatusCode::kInvalidArgument,
                  "--optimizer lion with --fp16: expected --bf16 or fp32 (Megatron: emerging optimizer with fp16 is "
                  "not supported)"},
        ErrorCase{{"--optimizer", "muon", "--muon-scalar-optimizer", "lion", "--lion-beta2", "1.5"},
                  StatusCode::kInvalidArgument, "--lion-beta2: expected Lion's beta in [0, 1), found 1.5"},
        ErrorCase{{"--no-weight-decay-cond-type", "qwen3_next"}, StatusCode::kInvalidArgument, "--no-weight-decay-cond-type..."},
        ErrorCase{{"--save", "/tmp/ckpt"}, StatusCode::kInvalidArgument,
                  "--save needs --save-interval (iterations between checkpoints)"},
        ErrorCase{{"--global-batch-size", "3"}, StatusCode::kInvalidArgument,
                  "--global-batch-size 3 must be a multiple of --micro-batch-size 2 times the data-parallel size 1"},
        ErrorCase{{"--train-samples", "100"}, StatusCode::kInvalidArgument, "give exactly one of --train-iters and --train-samples"},
        ErrorCase{{"--lr", "abc"}, StatusCode::kInvalidArgument, "--lr: expected a number, found 'abc'"},
        ErrorCase{{"--num-layers", "2.5"}, StatusCode::kInvalidArgument, "--num-layers: expected an integer, found '2.5'"},
        ErrorCase{{"--normalization", "BatchNorm"}, StatusCode::kInvalidArgument, "--normalization..."},
        ErrorCase{{"--fp16", "--bf16"}, StatusCode::kInvalidArgument, "--fp16 and --bf16 are exclusive: give one of them"},
        ErrorCase{{"--fp16", "--min-loss-scale", "0"}, StatusCode::kInvalidArgument,
                  "--min-loss-scale: expected a positive number not above --initial-loss-scale 4.29497e+09, found 0"},
        ErrorCase{{"--tensorboard-log-interval", "0"}, StatusCode::kInvalidArgument,
                  "--tensorboard-log-interval: expected a positive integer, found 0"},
        ErrorCase{{"--tensorboard-queue-size", "-1"}, StatusCode::kInvalidArgument,
                  "--tensorboard-queue-size: expected a positive integer, found -1"},
        ErrorCase{{"--ckpt-format", "torch_distributed"}, StatusCode::kInvalidArgument,
                  "--ckpt-format: expected one of torch, torch_dist, zarr, torch_dcp, fsdp_dtensor, found "
                  "'torch_distributed'"},
        ErrorCase{{"--async-save", "--ckpt-format", "torch"}, StatusCode::kInvalidArgument,
                  "--async-save needs --ckpt-format torch_dist (or torch_dcp, fsdp_dtensor), found torch (Megatron "
                  "has no asynchronous save for that format)"},
        ErrorCase{{"--async-save", "--ckpt-format", "zarr"}, StatusCode::kInvalidArgument,
                  "--async-save needs --ckpt-format torch_dist (or torch_dcp, fsdp_dtensor), found zarr (Megatron "
                  "has no asynchronous save for that format)"},
        ErrorCase{{"--distribute-saved-activations"}, StatusCode::kInvalidArgument,
                  "--distribute-saved-activations distributes over tensor-parallel ranks: expected "
                  "--tensor-model-parallel-size > 1, found 1"},
        ErrorCase{{"--dataloader-type", "external"}, StatusCode::kUnimplemented,
                  "--dataloader-type external: not supported yet (Megatron hands a user-built data loader through); "
                  "accepted values: single, cyclic"},
        ErrorCase{{"--dataloader-type", "Cyclic"}, StatusCode::kInvalidArgument,
                  "--dataloader-type: expected single or cyclic, found 'Cyclic'"},
        ErrorCase{{"--wandb-project", "p"}, StatusCode::kInvalidArgument,
                  "--wandb-exp-name: Please specify the wandb experiment name! (--wandb-project is 'p')"},
        ErrorCase{{"--wandb-project", "p", "--wandb-exp-name", "e"}, StatusCode::kInvalidArgument,
                  "--wandb-project needs --wandb-save-dir or --save (the run is written to {--save}/wandb), found "
                  "neither"},
        ErrorCase{{"--context-parallel-kv-cache-policy", "all"}, StatusCode::kInvalidArgument,
                  "--context-parallel-kv-cache-policy..."},
        ErrorCase{{"--num-experts", "-2"}, StatusCode::kInvalidArgument, "--num-experts: expected a positive integer, found -2"},
        ErrorCase{{"--moe-router-topk", "2"}, StatusCode::kInvalidArgument,
                  "--moe-router-topk needs --num-experts (a MoE model), found no --num-experts"},
        ErrorCase{{"--num-experts", "4", "--moe-router-topk", "5"}, StatusCode::kInvalidArgument,
                  "--moe-router-topk: expected 1 to --num-experts 4, found 5"},
        ErrorCase{{"--num-experts", "4", "--moe-aux-loss-coeff", "-0.1"}, StatusCode::kInvalidArgument,
                  "--moe-aux-loss-coeff: expected a non-negative number, found -0.1"},
        ErrorCase{{"--num-experts", "4", "--moe-layer-freq", "[1,0,1]"}, StatusCode::kInvalidArgument,
                  "--moe-layer-freq: expected an integer >= 1 or a list of 2 zeros and ones, found '[1,0,1]' (3 entries "
                  "for --num-layers 2)"},
        ErrorCase{{"--num-experts", "4", "--moe-layer-freq", "[1,2]"}, StatusCode::kInvalidArgument,
                  "--moe-layer-freq: expected an integer >= 1 or a list of 2 zeros and ones, found '[1,2]' (element '2' "
                  "is not 0 or 1)"},
        ErrorCase{{"--num-experts", "4", "--moe-pad-expert-input-to-capacity"}, StatusCode::kInvalidArgument,
                  "--moe-pad-expert-input-to-capacity: expected --moe-expert-capacity-factor too, found it unset"},
        ErrorCase{{"--num-experts", "4", "--moe-expert-capacity-factor", "0"}, StatusCode::kInvalidArgument,
                  "--moe-expert-capacity-factor: expected a positive number (or negative: dropless), found 0"},
        ErrorCase{{"--moe-expert-capacity-factor", "1"}, StatusCode::kInvalidArgument,
                  "--moe-expert-capacity-factor needs --num-experts (a MoE model), found no --num-experts"},
        ErrorCase{{"--num-experts", "4", "--moe-router-enable-expert-bias"}, StatusCode::kInvalidArgument,
                  "--moe-router-enable-expert-bias: expected --moe-router-score-function sigmoid, found softmax"},
        ErrorCase{{"--num-experts", "4", "--moe-router-group-topk", "2"}, StatusCode::kInvalidArgument,
                  "--moe-router-group-topk 2: expected --moe-router-num-groups too, found it unset"},
        ErrorCase{{"--num-experts", "4", "--moe-router-num-groups", "3", "--moe-router-group-topk", "1"},
                  StatusCode::kInvalidArgument, "--moe-router-num-groups: expected a divisor of --num-experts 4, found 3"},
        ErrorCase{{"--num-experts", "4", "--moe-router-num-groups", "2", "--moe-router-group-topk", "3"},
                  StatusCode::kInvalidArgument, "--moe-router-group-topk: expected 1 to --moe-router-num-groups 2, found 3"},
        ErrorCase{{"--num-experts", "8", "--moe-router-topk", "1", "--moe-router-num-groups", "4",
                   "--moe-router-group-topk", "2"},
                  StatusCode::kInvalidArgument, "--moe-router-group-topk: expected at most --moe-router-topk 1, found 2"},
        ErrorCase{{"--num-experts", "8", "--moe-router-topk", "4", "--moe-router-num-groups", "4",
                   "--moe-router-group-topk", "1"},
                  StatusCode::kInvalidArgument,
                  "--moe-router-group-topk 1: expected groups holding at least --moe-router-topk 4 experts, found 2"},
        ErrorCase{{"--num-experts", "4", "--moe-router-topk-scaling-factor", "0"}, StatusCode::kInvalidArgument,
                  "--moe-router-topk-scaling-factor: expected a positive number, found 0"},
        ErrorCase{{"--num-experts", "4", "--moe-router-load-balancing-type", "sinkhorn", "--moe-aux-loss-coeff", "0.01"},
                  StatusCode::kInvalidArgument,
                  "--moe-router-load-balancing-type sinkhorn: expected --moe-aux-loss-coeff 0 (sinkhorn routing has no "
                  "load-balancing loss), found 0.01"},
        ErrorCase{{"--num-experts", "4", "--moe-router-load-balancing-type", "sinkhorn", "--moe-router-pre-softmax"},
                  StatusCode::kInvalidArgument,
                  "--moe-router-load-balancing-type sinkhorn with --moe-router-pre-softmax: expected neither (sinkhorn routing scores with "
                  "sigmoid for top-1, else softmax over all experts, unscaled, without groups or expert bias; "
                  "Megatron ignores --moe-router-pre-softmax there)"},
        ErrorCase{{"--num-experts", "4", "--moe-router-load-balancing-type", "sinkhorn", "--moe-router-score-function",
                   "sigmoid", "--moe-router-enable-expert-bias"},
                  StatusCode::kInvalidArgument,
                  "--moe-router-load-balancing-type sinkhorn with --moe-router-score-function sigmoid: expected neither (sinkhorn routing scores with "
                  "sigmoid for top-1, else softmax over all experts, unscaled, without groups or expert bias; "
                  "Megatron ignores --moe-router-score-function sigmoid there)"},
        ErrorCase{{"--num-experts", "4", "--moe-router-load-balancing-type", "aux_loss", "seq_aux_loss",
                   "--moe-aux-loss-coeff", "1e-3"},
                  StatusCode::kInvalidArgument,
                  "--moe-aux-loss-coeff: expected a list of the same length as --moe-router-load-balancing-type "
                  "aux_loss seq_aux_loss (2 values), found 1"},
        ErrorCase{{"--num-experts", "4", "--moe-aux-loss-coeff", "1e-3", "1e-4"}, StatusCode::kInvalidArgument,
                  "--moe-aux-loss-coeff: expected one value with --moe-router-load-balancing-type aux_loss, found 2"},
        ErrorCase{{"--num-experts", "4", "--moe-router-load-balancing-type", "sinkhorn", "aux_loss", "--moe-aux-loss-coeff",
                   "0", "1e-3"},
                  StatusCode::kInvalidArgument,
                  "--moe-router-load-balancing-type sinkhorn aux_loss: expected a list of aux_loss, seq_aux_loss, "
                  "global_aux_loss or none (Megatron routes a list with sinkhorn in it as plain top-k), found sinkhorn"},
        ErrorCase{{"--num-experts", "4", "--moe-router-load-balancing-type", "aux_loss", "aux_loss", "--moe-aux-loss-coeff",
                   "1e-3", "1e-4"},
                  StatusCode::kInvalidArgument,
                  "--moe-router-load-balancing-type aux_loss aux_loss: expected each type once (Megatron would use the "
                  "first one's coefficient), found aux_loss twice"},
        ErrorCase{{"--num-experts", "4", "--moe-router-load-balancing-type", "aux_loss", "seq_aux_loss",
                   "--moe-aux-loss-coeff", "1e-3", "-1"},
                  StatusCode::kInvalidArgument, "--moe-aux-loss-coeff: expected non-negative numbers, found -1"},
        ErrorCase{{"--num-experts", "4", "--moe-router-load-balancing-type", "quantile_balancing",
                   "--moe-aux-loss-coeff", "0.01"},
                  StatusCode::kInvalidArgument,
                  "--moe-router-load-balancing-type quantile_balancing: expected --moe-aux-loss-coeff 0 (quantile "
                  "balancing balances with its bias qb_beta; Megatron asserts the aux losses off), found 0.01"},
        ErrorCase{{"--num-experts", "4", "--moe-router-load-balancing-type", "quantile_balancing",
                   "--moe-router-num-groups", "2", "--moe-router-group-topk", "1"},
                  StatusCode::kInvalidArgument,
                  "--moe-router-load-balancing-type quantile_balancing with --moe-router-num-groups: expected no "
                  "group-limited routing (Megatron's quantile balancing does not support it)"},
        ErrorCase{{"--num-experts", "2", "--moe-router-load-balancing-type", "quantile_balancing"},
                  StatusCode::kInvalidArgument,
                  "--moe-router-load-balancing-type quantile_balancing: expected --moe-router-topk below --num-experts "
                  "2 (the dual update takes each token's top-(k+1)), found 2"},
        ErrorCase{{"--num-experts", "6", "--moe-router-load-balancing-type", "quantile_balancing"},
                  StatusCode::kInvalidArgument,
                  "--moe-router-load-balancing-type quantile_balancing: expected the routed assignments of a "
                  "micro-batch (--seq-length 16 x --micro-batch-size 2 x --moe-router-topk 2 = 64) divisible by "
                  "--num-experts 6, found remainder 4"},
        ErrorCase{{"--num-experts", "4", "--moe-router-load-balancing-type", "quantile_balancing", "aux_loss",
                   "--moe-aux-loss-coeff", "0", "1e-3"},
                  StatusCode::kInvalidArgument,
                  "--moe-router-load-balancing-type quantile_balancing aux_loss: expected a list of aux_loss, "
                  "seq_aux_loss, global_aux_loss or none (Megatron routes a list with quantile_balancing in it as "
                  "plain top-k), found quantile_balancing"},
        ErrorCase{{"--num-experts", "4", "--moe-router-load-balancing-type", "quantile_balancing",
                   "--moe-router-quantile-balancing-ema", "1.5"},
                  StatusCode::kInvalidArgument,
                  "--moe-router-quantile-balancing-ema: expected a number in [0, 1], found 1.5"},
        ErrorCase{{"--moe-router-force-load-balancing"}, StatusCode::kInvalidArgument,
                  "--moe-router-force-load-balancing needs --num-experts (a MoE model), found no --num-experts"},
        ErrorCase{{"--num-experts", "4", "--moe-token-dispatcher-type", "flex"}, StatusCode::kUnimplemented,
                  "--moe-token-dispatcher-type flex: not supported yet (allgather or alltoall)"},
        ErrorCase{{"--moe-shared-expert-intermediate-size", "8"}, StatusCode::kInvalidArgument,
                  "--moe-shared-expert-intermediate-size needs --num-experts (a MoE model), found no --num-experts"},
        ErrorCase{{"--num-experts", "4", "--moe-shared-expert-intermediate-size", "8"}, StatusCode::kInvalidArgument,
                  "--moe-shared-expert-intermediate-size: expected --disable-bias-linear (the shared experts have no "
                  "biases, as in Megatron), found the linear biases on"},
        ErrorCase{{"--num-experts", "4", "--disable-bias-linear", "--moe-shared-expert-intermediate-size", "0"},
                  StatusCode::kInvalidArgument, "--moe-shared-expert-intermediate-size: expected a positive integer, found 0"},
        ErrorCase{{"--num-experts", "4", "--moe-shared-expert-gate"}, StatusCode::kInvalidArgument,
                  "--moe-shared-expert-gate needs --moe-shared-expert-intermediate-size (a shared expert), found none"},
        ErrorCase{{"--num-experts", "4", "--disable-bias-linear", "--moe-shared-expert-intermediate-size", "8",
                   "--moe-shared-expert-overlap"},
                  StatusCode::kInvalidArgument,
                  "--moe-shared-expert-overlap: expected --moe-token-dispatcher-type alltoall (the overlap hides the "
                  "shared expert behind its exchange, as Megatron), found allgather"},
        ErrorCase{{"--num-experts", "4", "--expert-tensor-parallel-size", "2"}, StatusCode::kUnimplemented,
                  "--expert-tensor-parallel-size 2 with --num-experts: not supported yet (expected 1 or "
                  "--tensor-model-parallel-size 1)"},
        ErrorCase{{"--num-experts", "4", "--expert-model-parallel-size", "2"}, StatusCode::kInvalidArgument,
                  "world size 1 is not divisible by --expert-model-parallel-size 2 x --pipeline-model-parallel-size 1 = 2"},
        ErrorCase{{"--microbatch-group-size-per-virtual-pipeline-stage", "0"}, StatusCode::kInvalidArgument,
                  "--microbatch-group-size-per-virtual-pipeline-stage: expected a positive integer, found 0"},
        ErrorCase{{"--tokenizer-type", "BertWordPieceCase"}, StatusCode::kUnimplemented,
                  "--tokenizer-type BertWordPieceCase: not supported yet..."},
        ErrorCase{{"--group-query-attention", "--num-query-groups", "3"}, StatusCode::kInvalidArgument,
                  "--num-attention-heads 4 must be divisible by --num-query-groups 3"},
        ErrorCase{{"--max-position-embeddings", "8"}, StatusCode::kInvalidArgument,
                  "--max-position-embeddings 8 must be at least --seq-length 16"},
        ErrorCase{{"--lr-warmup-iters", "10"}, StatusCode::kInvalidArgument, "--lr-warmup-iters 10 must be less than --lr-decay-iters 10"},
        ErrorCase{{"--attention-dropout", "1.5"}, StatusCode::kInvalidArgument,
                  "--attention-dropout: expected a probability in [0, 1), found 1.5"},
        ErrorCase{{"--position-embedding-type", "rope", "--rotary-percent", "0.1"}, StatusCode::kInvalidArgument,
                  "--rotary-percent 0.1 of --kv-channels 16 gives 1 rotary dimensions; expected a positive even number"},
        ErrorCase{{"--lr-decay-style", "WSD"}, StatusCode::kInvalidArgument,
                  "--lr-decay-style WSD needs --lr-wsd-decay-iters (or --lr-wsd-decay-samples)"},
        ErrorCase{{"--seed", "0"}, StatusCode::kInvalidArgument, "--seed: expected an integer in [1, 2^32-1], found 0"},
        ErrorCase{{"--weight-decay-incr-style", "linear"}, StatusCode::kInvalidArgument,
                  "--weight-decay-incr-style linear needs --start-weight-decay and --end-weight-decay"},
        ErrorCase{{"--recompute-granularity", "full", "--recompute-num-layers", "1"}, StatusCode::kInvalidArgument,
                  "--recompute-granularity full requires --recompute-method uniform or block"},
        ErrorCase{{"--recompute-granularity", "full", "--recompute-method", "block"}, StatusCode::kInvalidArgument,
                  "--recompute-granularity full requires --recompute-num-layers"},
        ErrorCase{{"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "0"},
                  StatusCode::kInvalidArgument, "--recompute-num-layers: expected at least 1, found 0"},
        ErrorCase{{"--recompute-method", "uniform"}, StatusCode::kInvalidArgument,
                  "--recompute-method requires --recompute-granularity full, found no --recompute-granularity"},
        ErrorCase{{"--recompute-activations", "--recompute-method", "block"}, StatusCode::kInvalidArgument,
                  "--recompute-method requires --recompute-granularity full, found --recompute-granularity selective"},
        ErrorCase{{"--recompute-num-layers", "2"}, StatusCode::kInvalidArgument,
                  "--recompute-num-layers requires --recompute-granularity full"},
        ErrorCase{{"--noop-layers", "0,x"}, StatusCode::kInvalidArgument,
                  "--noop-layers: expected comma-separated layer indices such as 0,23, found \"x\" in \"0,x\""},
        ErrorCase{{"--noop-layers", "1,"}, StatusCode::kInvalidArgument,
                  "--noop-layers: expected comma-separated layer indices such as 0,23, found \"\" in \"1,\""},
        ErrorCase{{"--noop-layers", "-1"}, StatusCode::kInvalidArgument,
                  "--noop-layers: expected comma-separated layer indices such as 0,23, found \"-1\" in \"-1\""},
        ErrorCase{{"--noop-layers", "2"}, StatusCode::kInvalidArgument,
                  "--noop-layers: layer 2 is not below --num-layers 2 (indices count from 0)"},
        ErrorCase{{"--recompute-modules", "layernorm"}, StatusCode::kInvalidArgument,
                  "--recompute-modules requires --recompute-granularity selective, found no --recompute-granularity"},
        ErrorCase{{"--recompute-activations", "--recompute-modules", "layernorm", "mla_up_proj"},
                  StatusCode::kInvalidArgument,
                  "--recompute-modules mla_up_proj: expected --multi-latent-attention (it recomputes MLA's up "
                  "projections), found it off"},
        ErrorCase{{"--recompute-activations", "--recompute-modules", "moe_act", "--num-experts", "4"},
                  StatusCode::kInvalidArgument,
                  "--recompute-modules moe_act: expected --moe-grouped-gemm (Megatron supports it only with grouped "
                  "GEMM), found it off"},
        ErrorCase{{"--recompute-activations", "--recompute-modules", "shared_experts", "--num-experts", "4",
                   "--disable-bias-linear", "--moe-shared-expert-intermediate-size", "24", "--moe-shared-expert-overlap",
                   "--moe-token-dispatcher-type", "alltoall"},
                  StatusCode::kInvalidArgument,
                  "--recompute-modules shared_experts: cannot work with --moe-shared-expert-overlap, found both"},
        ErrorCase{{"--num-experts", "4", "--moe-input-jitter-eps", "-0.1"}, StatusCode::kInvalidArgument,
                  "--moe-input-jitter-eps: expected a number in [0, 1), found -0.1"},
        ErrorCase{{"--moe-input-jitter-eps", "0.1"}, StatusCode::kInvalidArgument,
                  "--moe-input-jitter-eps needs --num-experts (a MoE model), found no --num-experts"},
        ErrorCase{{"--recompute-activations", "--recompute-modules", "norm"}, StatusCode::kInvalidArgument,
                  "--recompute-modules: expected core_attn, layernorm, moe_act, mla_up_proj, mlp, moe, "
                  "shared_experts or mhc, found 'norm'"},
        ErrorCase{{"--recompute-activations", "--recompute-granularity", "full"}, StatusCode::kInvalidArgument,
                  "--recompute-activations means --recompute-granularity selective, found --recompute-granularity full"},
        ErrorCase{{"--recompute-granularity", "partial"}, StatusCode::kInvalidArgument, "--recompute-granularity..."},
        ErrorCase{{"--context-parallel-algo", "hybrid_cp_algo"}, StatusCode::kInvalidArgument,
                  "--context-parallel-algo hybrid_cp_algo: expected --ulysses-degree-in-cp U with 1 < U < "
                  "--context-parallel-size 1 and U dividing it (U = 1 is megatron_cp_algo, U = CP ulysses_cp_algo), "
                  "found none"},
        ErrorCase{{"--ulysses-degree-in-cp", "2"}, StatusCode::kInvalidArgument,
                  "--ulysses-degree-in-cp 2 needs --context-parallel-algo hybrid_cp_algo, found 'megatron_cp_algo'"},
        ErrorCase{{"--context-parallel-algo", "hybrid_adaptive_cp_algo"}, StatusCode::kInvalidArgument,
                  "--context-parallel-algo hybrid_adaptive_cp_algo: expected --ulysses-degree-in-cp U with 1 < U < "
                  "--context-parallel-size 1 and U dividing it (U = 1 is megatron_cp_algo, U = CP ulysses_cp_algo), "
                  "found none"},
        ErrorCase{{"--context-parallel-algo", "ring"}, StatusCode::kInvalidArgument,
                  "--context-parallel-algo: expected megatron_cp_algo, kvallgather_cp_algo, ulysses_cp_algo, "
                  "hybrid_cp_algo, adaptive_cp_algo or hybrid_adaptive_cp_algo, found 'ring'"},
        ErrorCase{{"--cp-comm-type", "a2a+p2p"}, StatusCode::kInvalidArgument,
                  "--hierarchical-context-parallel-sizes must be set when a2a+p2p is used in cp comm"},
        ErrorCase{{"--cp-comm-type", "a2a", "--context-parallel-algo", "hybrid_cp_algo"},
                  StatusCode::kInvalidArgument,
                  "--cp-comm-type a2a selects the context-parallel algorithm itself (ulysses_cp_algo): expected "
                  "--context-parallel-algo megatron_cp_algo (the default), found 'hybrid_cp_algo'"},
        ErrorCase{{"--cp-comm-type", "all_gather"}, StatusCode::kInvalidArgument,
                  "--cp-comm-type: expected p2p, a2a, allgather or a2a+p2p, found 'all_gather'"},
        ErrorCase{{"--cp-comm-type", "p2p", "p2p", "p2p"}, StatusCode::kInvalidArgument,
                  "--cp-comm-type: expected one type or one per layer (--num-layers 2), found 3 types"},
        ErrorCase{{"--num-layers", "3", "--cp-comm-type", "p2p", "a2a", "p2p"}, StatusCode::kUnimplemented,
                  "--cp-comm-type with different types per layer (p2p, a2a): not supported yet (expected one type "
                  "for all layers)"},
        ErrorCase{{"--hierarchical-context-parallel-sizes", "2", "2"}, StatusCode::kInvalidArgument,
                  "--hierarchical-context-parallel-sizes: expected sizes whose product is --context-parallel-size 1, "
                  "found a product of 4"},
        ErrorCase{{"--hierarchical-context-parallel-sizes", "two"}, StatusCode::kInvalidArgument,
                  "--hierarchical-context-parallel-sizes: expected positive integers, found 'two'"},
        ErrorCase{{"--use-rope-scaling"}, StatusCode::kInvalidArgument,
                  "--use-rope-scaling needs --position-embedding-type rope, found learned_absolute"},
        ErrorCase{{"--position-embedding-type", "rope", "--use-rope-scaling", "--rope-scaling-factor", "0.5"},
                  StatusCode::kInvalidArgument, "--rope-scaling-factor: expected a number ≥ 1, found 0.5"},
        ErrorCase{{"--position-embedding-type", "rope", "--use-rope-scaling", "--multi-latent-attention"},
                  StatusCode::kInvalidArgument,
                  "--use-rope-scaling with --multi-latent-attention: MLA's RoPE scaling is YaRN (--rotary-scaling-factor)"},
        ErrorCase{{"--openai-gelu", "--swiglu"}, StatusCode::kInvalidArgument,
                  "--openai-gelu with --swiglu: the SwiGLU MLP has no GeLU"},
        ErrorCase{{"--squared-relu", "--swiglu"}, StatusCode::kInvalidArgument,
                  "--squared-relu with --swiglu: the MLP has one activation (squared ReLU or SwiGLU)"},
        ErrorCase{{"--squared-relu", "--openai-gelu"}, StatusCode::kInvalidArgument,
                  "--squared-relu with --openai-gelu: the MLP has one activation (squared ReLU or GeLU)"},
        ErrorCase{{"--quick-geglu", "--swiglu"}, StatusCode::kInvalidArgument,
                  "--quick-geglu with --swiglu: the gated MLP has one activation (quick GeLU or SiLU)"},
        ErrorCase{{"--quick-geglu", "--squared-relu"}, StatusCode::kInvalidArgument,
                  "--quick-geglu with --squared-relu: the MLP has one activation (quick GeGLU or squared ReLU)"},
        ErrorCase{{"--quick-geglu", "--openai-gelu"}, StatusCode::kInvalidArgument,
                  "--quick-geglu with --openai-gelu: the quick GeGLU MLP has no tanh GeLU"},
        ErrorCase{{"--glu-linear-offset", "1.5"}, StatusCode::kInvalidArgument,
                  "--glu-linear-offset 1.5 needs a gated MLP (--swiglu or --quick-geglu), found a GeLU MLP"},
        ErrorCase{{"--squared-relu", "--activation-func-clamp-value", "7"}, StatusCode::kInvalidArgument,
                  "--activation-func-clamp-value 7 needs a gated MLP (--swiglu or --quick-geglu), found --squared-relu"},
        ErrorCase{{"--quick-geglu", "--activation-func-clamp-value", "-7"}, StatusCode::kInvalidArgument,
                  "--activation-func-clamp-value: expected a finite number greater than zero, found -7"},
        ErrorCase{{"--quick-geglu", "--activation-func-clamp-value", "inf"}, StatusCode::kInvalidArgument,
                  "--activation-func-clamp-value: expected a finite number greater than zero, found inf"},
        ErrorCase{{"--swiglu", "--num-experts", "4", "--activation-func-clamp-value", "7", "--glu-linear-offset", "1"},
                  StatusCode::kInvalidArgument,
                  "--glu-linear-offset 1 with --swiglu and --activation-func-clamp-value: Megatron requires the "
                  "offset to be 0 for a clamped SwiGLU"},
        ErrorCase{{"--swiglu", "--activation-func-clamp-value", "7"}, StatusCode::kInvalidArgument,
                  "--activation-func-clamp-value with --swiglu needs --num-experts (Megatron clamps SwiGLU only in MoE "
                  "models), found a dense model"},
        ErrorCase{{"--rotary-interleaved"}, StatusCode::kInvalidArgument,
                  "--rotary-interleaved needs --position-embedding-type rope (or --multi-latent-attention), found "
                  "learned_absolute"},
        ErrorCase{{"--rotary-seq-len-interpolation-factor", "2"}, StatusCode::kInvalidArgument,
                  "--rotary-seq-len-interpolation-factor needs --position-embedding-type rope without "
                  "--multi-latent-attention (found learned_absolute)"},
        ErrorCase{{"--position-embedding-type", "rope", "--rotary-seq-len-interpolation-factor", "0"},
                  StatusCode::kInvalidArgument, "--rotary-seq-len-interpolation-factor: expected a positive number, found 0"},
        ErrorCase{{"--sliding-window", "0"}, StatusCode::kInvalidArgument,
                  "--sliding-window: expected a positive window (tokens), found 0"},
        ErrorCase{{"--position-embedding-type", "alibi", "--use-rotary-position-embeddings"},
                  StatusCode::kInvalidArgument,
                  "--use-rotary-position-embeddings with --position-embedding-type alibi: expected one position "
                  "embedding, found RoPE and ALiBi"},
        ErrorCase{{"--position-embedding-type", "alibi", "--use-rope-scaling"}, StatusCode::kInvalidArgument,
                  "--use-rope-scaling needs --position-embedding-type rope, found alibi"},
        ErrorCase{{"--position-embedding-type", "alibi", "--rotary-interleaved"}, StatusCode::kInvalidArgument,
                  "--rotary-interleaved needs --position-embedding-type rope (or --multi-latent-attention), found alibi"},
        ErrorCase{{"--position-embedding-type", "alibi", "--alibi-fusion-attn-type", "0"}, StatusCode::kInvalidArgument,
                  "--alibi-fusion-attn-type: expected 2 (Gale's in-kernel bias -m*(i-j)), found 0 (an explicit "
                  "compressed bias tensor, not supported)"},
        ErrorCase{{"--position-embedding-type", "alibi", "--alibi-fusion-attn-type", "3"}, StatusCode::kInvalidArgument,
                  "--alibi-fusion-attn-type: expected 2 (Gale's in-kernel bias -m*(i-j)), found 3 (a different "
                  "in-kernel bias form, not supported)"},
        ErrorCase{{"--position-embedding-type", "alibi", "--alibi-fusion-attn-type", "1"}, StatusCode::kInvalidArgument,
                  "--alibi-fusion-attn-type: expected 0, 2 or 3 (MindSpeed), found 1"},
        ErrorCase{{"--position-embedding-type", "alibi", "--fill-neg-inf"}, StatusCode::kInvalidArgument,
                  "--fill-neg-inf needs --square-alibi-mask (MindSpeed), found it off"},
        ErrorCase{{"--square-alibi-mask"}, StatusCode::kInvalidArgument,
                  "--square-alibi-mask needs --position-embedding-type alibi, found learned_absolute"},
        ErrorCase{{"--position-embedding-type", "alibi", "--multi-latent-attention"}, StatusCode::kUnimplemented,
                  "--position-embedding-type alibi with --multi-latent-attention: not supported (MLA carries its "
                  "positions in the RoPE part of its heads)"}));

TEST(Arguments, ModelVariantFlagsReachTheModelConfig) {
  Cli c;
  ASSERT_TRUE(c.parse(with(minimal_pretrain_flags(), {"--squared-relu", "--apply-layernorm-1p",
                                                      "--init-method-xavier-uniform", "--position-embedding-type", "rope",
                                                      "--rotary-seq-len-interpolation-factor", "4",
                                                      "--rotary-interleaved"}))
                  .ok());
  c.args.model.padded_vocab_size = 128;
  const ModelConfig m = model_config_from_args(c.args);
  EXPECT_TRUE(m.squared_relu);
  EXPECT_TRUE(m.norm_weight_1p);
  EXPECT_TRUE(m.init_xavier_uniform);
  EXPECT_EQ(m.rope_position_scale, 0.25);
  EXPECT_TRUE(m.rope_interleaved);
  Cli plain;
  ASSERT_TRUE(plain.parse(minimal_pretrain_flags()).ok());
  plain.args.model.padded_vocab_size = 128;
  const ModelConfig p = model_config_from_args(plain.args);
  EXPECT_FALSE(p.squared_relu || p.norm_weight_1p || p.init_xavier_uniform || p.rope_interleaved);
  EXPECT_EQ(p.rope_position_scale, 1.0);
}

// --quick-geglu, --glu-linear-offset and --activation-func-clamp-value: the model's gated activation
// (fc1 doubled as with --swiglu, ffn default 4h as Megatron's), recorded in the checkpoint args and
// the model section only when set, and read back.
TEST(Arguments, GptOssActivationFlagsReachTheModelAndTheCheckpointArgs) {
  Cli c;
  ASSERT_TRUE(c.parse(with(minimal_pretrain_flags(), {"--quick-geglu", "--glu-linear-offset", "1.0",
                                                      "--activation-func-clamp-value", "7.0"}))
                  .ok());
  EXPECT_EQ(c.args.model.ffn_hidden_size, 4 * c.args.model.hidden_size);  // not SwiGLU's 8h/3
  c.args.model.padded_vocab_size = 128;
  const ModelConfig m = model_config_from_args(c.args);
  EXPECT_TRUE(m.quick_geglu && m.gated() && !m.swiglu);
  EXPECT_EQ(m.fc1_out(), 2 * m.ffn);
  EXPECT_EQ(m.glu_linear_offset, 1.0f);
  EXPECT_EQ(m.activation_clamp, 7.0f);
  const nlohmann::json args = model_flags_json(c.args.model);
  EXPECT_EQ(args["quick_geglu"], true);
  EXPECT_EQ(args["glu_linear_offset"], 1.0);
  EXPECT_EQ(args["activation_func_clamp_value"], 7.0);
  const ModelArgs back = model_args_from_json(args, "x").value();
  EXPECT_TRUE(back.quick_geglu);
  EXPECT_EQ(back.glu_linear_offset, 1.0);
  EXPECT_EQ(back.activation_func_clamp_value, 7.0);
  const nlohmann::json section = checkpoint_model_section(m);
  EXPECT_EQ(section["quick_geglu"], true);
  EXPECT_EQ(section["glu_linear_offset"], 1.0);
  EXPECT_EQ(section["activation_func_clamp_value"], 7.0);
  Cli plain;
  ASSERT_TRUE(plain.parse(minimal_pretrain_flags()).ok());
  plain.args.model.padded_vocab_size = 128;
  const nlohmann::json none = model_flags_json(plain.args.model);
  EXPECT_FALSE(none.contains("quick_geglu") || none.contains("glu_linear_offset") ||
               none.contains("activation_func_clamp_value"));
  const ModelConfig p = model_config_from_args(plain.args);
  EXPECT_FALSE(p.quick_geglu || p.gated());
  EXPECT_EQ(p.activation_clamp, 0.0f);
  // Megatron's own records: False / 0.0 / None.
  nlohmann::json megatron = none;
  megatron["quick_geglu"] = false;
  megatron["glu_linear_offset"] = 0.0;
  megatron["activation_func_clamp_value"] = nullptr;
  const ModelArgs from_megatron = model_args_from_json(megatron, "x").value();
  EXPECT_FALSE(from_megatron.quick_geglu);
  EXPECT_TRUE(unset(from_megatron.activation_func_clamp_value));
  megatron["activation_func_clamp_value"] = "seven";
  EXPECT_EQ(model_args_from_json(megatron, "x").status().message(),
            "x: args 'activation_func_clamp_value' is \"seven\", expected a number");
}

// MindSpeed-LLM's --sliding-window (default None): the model's window, recorded in the checkpoint
// args only when set and read back.
TEST(Arguments, SlidingWindowReachesTheModelAndTheCheckpointArgs) {
  Cli c;
  ASSERT_TRUE(c.parse(with(minimal_pretrain_flags(), {"--sliding-window", "4096"})).ok());
  EXPECT_EQ(c.args.model.sliding_window, 4096);
  c.args.model.padded_vocab_size = 128;
  EXPECT_EQ(model_config_from_args(c.args).sliding_window, 4096);
  const nlohmann::json args = model_flags_json(c.args.model);
  EXPECT_EQ(args["sliding_window"], 4096);
  EXPECT_EQ(model_args_from_json(args, "x").value().sliding_window, 4096);
  EXPECT_EQ(checkpoint_model_section(model_config_from_args(c.args))["sliding_window"], 4096);
  Cli plain;
  ASSERT_TRUE(plain.parse(minimal_pretrain_flags()).ok());
  EXPECT_EQ(plain.args.model.sliding_window, kUnset);
  plain.args.model.padded_vocab_size = 128;
  EXPECT_EQ(model_config_from_args(plain.args).sliding_window, 0);
  EXPECT_FALSE(model_flags_json(plain.args.model).contains("sliding_window"));
  EXPECT_EQ(model_args_from_json(model_flags_json(plain.args.model), "x").value().sliding_window, kUnset);
  nlohmann::json bad = args;
  bad["sliding_window"] = 0;
  EXPECT_EQ(model_args_from_json(bad, "m.json").status().message(),
            "m.json: args 'sliding_window' is 0, expected at least 1");
}

// MindSpeed's --position-embedding-type alibi: the model's bias, recorded in the checkpoint args;
// the flags equal to Gale's semantics are accepted.
TEST(Arguments, AlibiReachesTheModelAndTheCheckpointArgs) {
  Cli c;
  ASSERT_TRUE(c.parse(with(minimal_pretrain_flags(), {"--position-embedding-type", "alibi", "--alibi-fusion-attn-type",
                                                      "2", "--square-alibi-mask", "--fill-neg-inf",
                                                      "--alibi-diagonal-opposite"}))
                  .ok());
  c.args.model.padded_vocab_size = 128;
  const ModelConfig m = model_config_from_args(c.args);
  EXPECT_EQ(m.position, PositionEmbedding::kAlibi);
  EXPECT_FALSE(m.uses_rope_tables());
  EXPECT_EQ(checkpoint_model_section(m)["position_embedding_type"], "alibi");
  const nlohmann::json args = model_flags_json(c.args.model);
  EXPECT_EQ(args["position_embedding_type"], "alibi");
  EXPECT_EQ(model_args_from_json(args, "x").value().position_embedding_type, "alibi");
  Cli unset;
  ASSERT_TRUE(unset.parse(with(minimal_pretrain_flags(), {"--position-embedding-type", "alibi"})).ok());
  EXPECT_EQ(unset.args.model.alibi_fusion_attn_type, kUnset);
}

TEST(Arguments, RecomputeModulesLayernormRecomputesBothNorms) {
  Cli d;
  ASSERT_TRUE(d.parse(with(minimal_pretrain_flags(), {"--recompute-granularity", "selective"})).ok());
  EXPECT_EQ(d.args.model.recompute_modules, std::vector<std::string>{"core_attn"});  // Megatron's default
  RecomputePlan plan;
  apply_recompute_modules(d.args.model, &plan);
  EXPECT_EQ(plan.norm_layers, 0);
  Cli c;
  ASSERT_TRUE(c.parse(with(minimal_pretrain_flags(), {"--recompute-activations", "--recompute-modules", "core_attn",
                                                      "layernorm"}))
                  .ok());
  apply_recompute_modules(c.args.model, &plan);
  EXPECT_EQ(plan.norm_layers, RecomputePlan::kAllLayers);
  EXPECT_EQ(plan.activation_layers, 0);
}

TEST(Arguments, RecomputeModulesOfTheMlpAndMoe) {
  Cli c;
  ASSERT_TRUE(c.parse(with(minimal_pretrain_flags(), {"--recompute-granularity", "selective", "--recompute-modules", "mlp",
                                                      "moe_act", "shared_experts", "moe", "--num-experts", "4",
                                                      "--moe-grouped-gemm"}))
                  .ok());
  RecomputePlan plan;
  apply_recompute_modules(c.args.model, &plan);
  EXPECT_TRUE(plan.mlp);
  EXPECT_TRUE(plan.moe_act);
  EXPECT_TRUE(plan.shared_experts);
  EXPECT_TRUE(plan.moe);
  EXPECT_EQ(plan.norm_layers, 0);
  EXPECT_FALSE(plan.mla_up_proj);
  Cli one;
  ASSERT_TRUE(one.parse(with(minimal_pretrain_flags(), {"--recompute-activations", "--recompute-modules", "mlp"})).ok());
  RecomputePlan only_mlp;
  apply_recompute_modules(one.args.model, &only_mlp);
  EXPECT_TRUE(only_mlp.mlp);
  EXPECT_FALSE(only_mlp.moe_act || only_mlp.shared_experts || only_mlp.moe);
}

TEST(Arguments, MoeInputJitterEps) {
  Cli d;
  ASSERT_TRUE(d.parse(with(minimal_pretrain_flags(), {"--num-experts", "4"})).ok());
  EXPECT_TRUE(unset(d.args.moe.moe_input_jitter_eps));  // Megatron's None
  d.args.model.padded_vocab_size = 128;
  EXPECT_EQ(model_config_from_args(d.args).moe.input_jitter_eps, 0.0);
  Cli c;
  ASSERT_TRUE(c.parse(with(minimal_pretrain_flags(), {"--num-experts", "4", "--moe-input-jitter-eps", "0.01"})).ok());
  c.args.model.padded_vocab_size = 128;
  EXPECT_EQ(model_config_from_args(c.args).moe.input_jitter_eps, 0.01);
}

TEST(Arguments, RecomputeFlagsAsMegatron) {
  Cli c;
  ASSERT_TRUE(c.parse(with(minimal_pretrain_flags(), {"--recompute-granularity", "full", "--recompute-method", "uniform",
                                       "--recompute-num-layers", "2"}))
                  .ok());
  EXPECT_EQ(c.args.model.recompute_granularity, "full");
  EXPECT_EQ(c.args.model.recompute_method, "uniform");
  EXPECT_EQ(c.args.model.recompute_num_layers, 2);
  Cli s;
  ASSERT_TRUE(s.parse(with(minimal_pretrain_flags(), {"--recompute-activations"})).ok());
  EXPECT_EQ(s.args.model.recompute_granularity, "selective");
}

TEST(Arguments, NoopLayersAsMindSpeed) {
  Cli c;
  ASSERT_TRUE(c.parse(with(minimal_pretrain_flags(), {"--noop-layers", "1,0,1"})).ok());
  EXPECT_EQ(c.args.model.noop_layers, (std::vector<int64_t>{0, 1}));  // sorted, duplicates collapse
  Cli none;
  ASSERT_TRUE(none.parse(minimal_pretrain_flags()).ok());
  EXPECT_TRUE(none.args.model.noop_layers.empty());
}

TEST(Arguments, MissingRequiredFlags) {
  for (const char* flag : {"--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length",
                           "--max-position-embeddings", "--micro-batch-size", "--lr"}) {
    std::vector<std::string> argv = minimal_pretrain_flags();
    for (size_t i = 0; i < argv.size(); ++i)
      if (argv[i] == flag) {
        argv.erase(argv.begin() + static_cast<long>(i), argv.begin() + static_cast<long>(i) + 2);
        break;
      }
    Cli c;
    Status st = c.parse(argv);
    EXPECT_EQ(st.message(), std::string(flag) + " is required") << flag;
  }
}

TEST(Arguments, NoDataIsAnError) {
  Cli c;
  std::vector<std::string> argv = minimal_pretrain_flags();
  argv.pop_back();  // --mock-data
  Status st = c.parse(argv);
  EXPECT_EQ(st.message().substr(0, 17), "no training data:");
}

TEST(Arguments, ContextParallelism) {
  Cli ok;
  ASSERT_TRUE(ok.parse(with(minimal_pretrain_flags(), {"--context-parallel-size", "2", "--global-batch-size", "4"}), 4).ok());
  EXPECT_EQ(ok.args.parallel.context_parallel_size, 2);
  EXPECT_EQ(ok.args.parallel.data_parallel_size, 2);  // world 4 / CP 2
  EXPECT_EQ(ok.args.parallel.context_parallel_algo, "megatron_cp_algo");
  EXPECT_EQ(ok.args.parallel.cp_comm_type, "p2p");  // Megatron's default: ring attention
  Cli named;
  ASSERT_TRUE(named.parse(with(minimal_pretrain_flags(), {"--context-parallel-size", "2", "--context-parallel-algo",
                                           "megatron_cp_algo", "--cp-comm-type", "allgather"}), 2).ok());
  EXPECT_EQ(named.args.parallel.cp_comm_type, "allgather");
  Cli ring;
  ASSERT_TRUE(ring.parse(with(minimal_pretrain_flags(), {"--context-parallel-size", "2", "--cp-comm-type", "p2p"}), 2).ok());
  EXPECT_EQ(ring.args.parallel.cp_comm_type, "p2p");
  // Megatron's a2a is Ulysses over the whole cp group; a2a+p2p with sizes [A, P] is the hybrid with
  // A adjacent cp ranks per all-to-all (A = 1: the ring; A = CP: Ulysses). One type per layer, all
  // the same, is one type.
  const auto resolved = [](std::vector<std::string> flags, int64_t world) {
    Cli c;
    const Status st = c.parse(with(minimal_pretrain_flags(), flags), world);
    EXPECT_TRUE(st.ok()) << st.message();
    return std::tuple{c.args.parallel.context_parallel_algo, c.args.parallel.ulysses_degree_in_cp,
                      c.args.parallel.cp_comm_type};
  };
  using Resolved = std::tuple<std::string, int64_t, std::string>;
  EXPECT_EQ(resolved({"--context-parallel-size", "2", "--cp-comm-type", "a2a"}, 2),
            (Resolved{"ulysses_cp_algo", 0, "p2p"}));
  EXPECT_EQ(resolved({"--context-parallel-size", "2", "--cp-comm-type", "a2a", "a2a"}, 2),
            (Resolved{"ulysses_cp_algo", 0, "p2p"}));
  EXPECT_EQ(resolved({"--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p",
                      "--hierarchical-context-parallel-sizes", "2", "2"}, 4),
            (Resolved{"hybrid_cp_algo", 2, "p2p"}));
  EXPECT_EQ(resolved({"--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p",
                      "--hierarchical-context-parallel-sizes", "1", "4"}, 4),
            (Resolved{"megatron_cp_algo", 0, "p2p"}));
  EXPECT_EQ(resolved({"--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p",
                      "--hierarchical-context-parallel-sizes", "4", "1"}, 4),
            (Resolved{"ulysses_cp_algo", 0, "p2p"}));
  EXPECT_EQ(resolved({"--context-parallel-size", "4", "--hierarchical-context-parallel-sizes", "2", "2"}, 4),
            (Resolved{"megatron_cp_algo", 0, "p2p"}));
  Cli three_levels;
  EXPECT_EQ(three_levels.parse(with(minimal_pretrain_flags(), {"--context-parallel-size", "4", "--cp-comm-type",
                                                               "a2a+p2p", "--hierarchical-context-parallel-sizes",
                                                               "2", "1", "2"}), 4).message(),
            "--cp-comm-type a2a+p2p: expected two --hierarchical-context-parallel-sizes (the all-to-all level and "
            "the ring level), found 3");
  // --seq-length 16 is cut into 2·CP chunks: CP 8 would need 16 chunks of 1, CP 3 six chunks.
  Cli c3;
  EXPECT_EQ(c3.parse(with(minimal_pretrain_flags(), {"--context-parallel-size", "3"}), 3).message(),
            "--seq-length 16 must be divisible by 2 x --context-parallel-size 3 = 6 (each sequence is cut into 2 x CP "
            "equal chunks)");
  // Ulysses splits heads and query groups over TP x CP (minimal_pretrain_flags(): 4 heads).
  Cli ulysses;
  ASSERT_TRUE(ulysses.parse(with(minimal_pretrain_flags(), {"--context-parallel-size", "4", "--context-parallel-algo",
                                             "ulysses_cp_algo", "--seq-length", "32"}), 4).ok());
  EXPECT_EQ(ulysses.args.parallel.context_parallel_algo, "ulysses_cp_algo");
  Cli heads;
  EXPECT_EQ(heads.parse(with(minimal_pretrain_flags(), {"--context-parallel-size", "4", "--tensor-model-parallel-size", "2",
                                         "--context-parallel-algo", "ulysses_cp_algo", "--seq-length", "32"}), 8)
                .message(),
            "--context-parallel-algo ulysses_cp_algo splits the heads over TP x CP: --num-attention-heads 4 must be "
            "divisible by --tensor-model-parallel-size 2 x --context-parallel-size 4 = 8");
  // Fewer query groups than CP ranks: each group's key and value go to the ranks of its heads.
  Cli repeat;
  EXPECT_TRUE(repeat.parse(with(minimal_pretrain_flags(), {"--context-parallel-size", "2", "--context-parallel-algo",
                                                           "ulysses_cp_algo", "--group-query-attention",
                                                           "--num-query-groups", "1"}), 2).ok());
  Cli groups;
  EXPECT_EQ(groups.parse(with(minimal_pretrain_flags(), {"--context-parallel-size", "2", "--context-parallel-algo", "ulysses_cp_algo",
                                          "--num-attention-heads", "6", "--hidden-size", "48",
                                          "--group-query-attention", "--num-query-groups", "3"}), 2)
                .message(),
            "--context-parallel-algo ulysses_cp_algo splits the query groups over TP x CP: --num-query-groups 3 must "
            "be divisible by --tensor-model-parallel-size 1 x --context-parallel-size 2 = 2, or by TP with "
            "--context-parallel-size a multiple of the 3 groups per TP rank");
  // --use-ulysses-allgather-kv: Ulysses with one query group per TP rank (MindSpeed's rules).
  Cli allgather_kv;
  EXPECT_TRUE(allgather_kv.parse(with(minimal_pretrain_flags(), {"--context-parallel-size", "2", "--context-parallel-algo",
                                                                 "ulysses_cp_algo", "--group-query-attention",
                                                                 "--num-query-groups", "1",
                                                                 "--use-ulysses-allgather-kv"}), 2).ok());
  EXPECT_TRUE(allgather_kv.args.parallel.use_ulysses_allgather_kv);
  Cli allgather_kv_cp1;
  EXPECT_EQ(allgather_kv_cp1.parse(with(minimal_pretrain_flags(), {"--use-ulysses-allgather-kv"}), 1).message(),
            "--use-ulysses-allgather-kv needs --context-parallel-size > 1 with ulysses_cp_algo, found "
            "--context-parallel-size 1");
  Cli allgather_kv_ring;
  EXPECT_EQ(allgather_kv_ring.parse(with(minimal_pretrain_flags(), {"--context-parallel-size", "2",
                                                                    "--use-ulysses-allgather-kv"}), 2).message(),
            "--use-ulysses-allgather-kv needs --context-parallel-algo ulysses_cp_algo, found 'megatron_cp_algo'");
  Cli allgather_kv_groups;
  EXPECT_EQ(allgather_kv_groups.parse(with(minimal_pretrain_flags(), {"--context-parallel-size", "2",
                                                                      "--context-parallel-algo", "ulysses_cp_algo",
                                                                      "--group-query-attention", "--num-query-groups",
                                                                      "2", "--use-ulysses-allgather-kv"}), 2).message(),
            "--use-ulysses-allgather-kv all-gathers one key/value head per TP rank (as MindSpeed): expected "
            "--num-query-groups = --tensor-model-parallel-size 1, found 2 query groups");
  // Hybrid: U divides CP with 1 < U < CP; heads and query groups split over TP x U; the ring across
  // the Ulysses groups is p2p.
  Cli hybrid;
  ASSERT_TRUE(hybrid.parse(with(minimal_pretrain_flags(), {"--context-parallel-size", "4", "--context-parallel-algo", "hybrid_cp_algo",
                                            "--ulysses-degree-in-cp", "2", "--seq-length", "32"}), 4).ok());
  EXPECT_EQ(hybrid.args.parallel.ulysses_degree_in_cp, 2);
  const std::vector<std::string> hybrid4 = {"--context-parallel-size", "4", "--context-parallel-algo", "hybrid_cp_algo",
                                            "--seq-length", "32"};
  for (const char* u : {"3", "4", "1", "8"}) {
    Cli bad;
    std::vector<std::string> flags = hybrid4;
    flags.insert(flags.end(), {"--ulysses-degree-in-cp", u});
    EXPECT_EQ(bad.parse(with(minimal_pretrain_flags(), flags), 4).message(),
              std::string("--context-parallel-algo hybrid_cp_algo: expected --ulysses-degree-in-cp U with 1 < U < "
                          "--context-parallel-size 4 and U dividing it (U = 1 is megatron_cp_algo, U = CP "
                          "ulysses_cp_algo), found ") + u);
  }
  Cli without_algo;
  EXPECT_EQ(without_algo.parse(with(minimal_pretrain_flags(), {"--context-parallel-size", "4", "--context-parallel-algo",
                                                "ulysses_cp_algo", "--ulysses-degree-in-cp", "2",
                                                "--seq-length", "32"}), 4).message(),
            "--ulysses-degree-in-cp 2 needs --context-parallel-algo hybrid_cp_algo, found 'ulysses_cp_algo'");
  Cli hybrid_heads;
  EXPECT_EQ(hybrid_heads.parse(with(minimal_pretrain_flags(), {"--context-parallel-size", "4", "--tensor-model-parallel-size", "4",
                                                "--context-parallel-algo", "hybrid_cp_algo", "--ulysses-degree-in-cp",
                                                "2", "--seq-length", "32"}), 16)
                .message(),
            "--context-parallel-algo hybrid_cp_algo splits the heads over TP x U: --num-attention-heads 4 must be "
            "divisible by --tensor-model-parallel-size 4 x --ulysses-degree-in-cp 2 = 8");
  Cli hybrid_groups;
  EXPECT_EQ(hybrid_groups.parse(with(minimal_pretrain_flags(), {"--context-parallel-size", "4", "--context-parallel-algo",
                                                 "hybrid_cp_algo", "--ulysses-degree-in-cp", "2", "--seq-length", "32",
                                                 "--num-attention-heads", "6", "--hidden-size", "48",
                                                 "--group-query-attention", "--num-query-groups", "3"}), 4)
                .message(),
            "--context-parallel-algo hybrid_cp_algo splits the query groups over TP x U: --num-query-groups 3 must "
            "be divisible by --tensor-model-parallel-size 1 x --ulysses-degree-in-cp 2 = 2, or by TP with "
            "--ulysses-degree-in-cp a multiple of the 3 groups per TP rank");
  // Reached through Megatron's --cp-comm-type, the same rules name that flag.
  Cli a2a_heads;
  EXPECT_EQ(a2a_heads.parse(with(minimal_pretrain_flags(), {"--context-parallel-size", "4", "--tensor-model-parallel-size",
                                                            "2", "--cp-comm-type", "a2a", "--seq-length", "32"}), 8)
                .message(),
            "--cp-comm-type a2a splits the heads over TP x CP: --num-attention-heads 4 must be divisible by "
            "--tensor-model-parallel-size 2 x --context-parallel-size 4 = 8");
  Cli a2a_p2p_heads;
  EXPECT_EQ(a2a_p2p_heads.parse(with(minimal_pretrain_flags(), {"--context-parallel-size", "4",
                                                                "--tensor-model-parallel-size", "4", "--cp-comm-type",
                                                                "a2a+p2p", "--hierarchical-context-parallel-sizes", "2",
                                                                "2", "--seq-length", "32"}), 16)
                .message(),
            "--cp-comm-type a2a+p2p splits the heads over TP x U: --num-attention-heads 4 must be divisible by "
            "--tensor-model-parallel-size 4 x the first --hierarchical-context-parallel-sizes 2 = 8");
  Cli hybrid_allgather;
  EXPECT_EQ(hybrid_allgather.parse(with(minimal_pretrain_flags(), {"--context-parallel-size", "4", "--context-parallel-algo",
                                                    "hybrid_cp_algo", "--ulysses-degree-in-cp", "2", "--seq-length",
                                                    "32", "--cp-comm-type", "allgather"}), 4)
                .message(),
            "--context-parallel-algo hybrid_cp_algo runs ring attention across its Ulysses groups: expected "
            "--cp-comm-type p2p, found 'allgather'");
  Cli sp;
  EXPECT_EQ(sp.parse(with(minimal_pretrain_flags(), {"--context-parallel-size", "4", "--tensor-model-parallel-size", "4",
                                      "--sequence-parallel", "--seq-length", "24"}), 16)
                .message(),
            "--seq-length 24 / --context-parallel-size 4 = 6 must be divisible by --tensor-model-parallel-size 4 with "
            "--sequence-parallel");
}

TEST(Arguments, LayoutErrors) {
  Cli c;
  EXPECT_EQ(c.parse(with(minimal_pretrain_flags(), {"--tensor-model-parallel-size", "3"}), 4).message(),
            "world size 4 is not divisible by --tensor-model-parallel-size 3 x --pipeline-model-parallel-size 1 x "
            "--context-parallel-size 1 = 3");
}

}  // namespace
}  // namespace gale
