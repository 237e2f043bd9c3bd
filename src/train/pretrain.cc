// The pretrain driver: wires arguments, features, data, engine, checkpoints and the trainer.
#include "train/pretrain.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <cstdlib>

#include "comm/fake_communicator.h"
#include "core/allocator.h"
#include "core/log.h"
#include "core/tensorboard_writer.h"
#include "core/wandb_writer.h"
#include "core/threads.h"
#include "core/timers.h"
#include "features/registry.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"
#include "kernels/op_trace.h"
#include "parallel/rank_grid.h"
#include "parallel/tp2d_groups.h"
#include "train/arg_parser.h"
#include "train/logits_kd_hooks.h"
#include "train/arguments.h"
#include "train/arguments_fake_process_group.h"
#include "train/auto_parallel.h"
#include "train/auto_settings.h"
#include "train/auto_settings_profile.h"
#include "train/automated_pipeline.h"
#include "train/checkpoint_args.h"
#include "train/checkpointing.h"
#include "train/config_logger.h"
#include "train/fsdp2_config.h"
#include "train/ckpt_convert.h"
#include "train/data_setup.h"
#include "train/dist_train_config.h"
#include "train/engine.h"
#include "train/param_group_map.h"
#include "train/exit_signal.h"
#include "features/feature_grpo.h"
#include "train/grpo.h"
#include "train/memory_report.h"
#include "train/model_setup.h"
#include "train/profiler.h"
#include "train/progress_log.h"
#include "train/ft_integration.h"
#include "train/straggler_detector.h"
#include "train/timers_log.h"
#include "train/training_log.h"
#include "train/phase_transitions.h"
#include "train/trainer.h"
#include "train/wandb_log.h"
#include "train/yaml_cfg.h"

namespace gale {

namespace {

// `v` with `digits` decimals.
std::string fixed_str(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

}  // namespace

namespace {

// Rank of this process from the launcher's environment (before MPI is up), for error printing.
bool env_says_not_rank0() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"}) {
    const char* value = std::getenv(v);
    if (value && *value) return std::atoi(value) != 0;
  }
  return false;
}

// --perform-rl-step's PretrainData: the tokenizer alone, no datasets.
StatusOr<PretrainData> rl_tokenizer_only(const Arguments& args) {
  PretrainData data;
  GALE_ASSIGN_OR_RETURN(data.tokenizer, build_pretrain_tokenizer(args));
  data.vocab_size = data.tokenizer->vocab_size();
  data.eod = data.tokenizer->eod();
  print_rank0(str_cat("> tokenizer: ", data.tokenizer->describe()));
  return data;
}

int usage_error(const Status& s) {
  if (!env_says_not_rank0()) std::fprintf(stderr, "gale pretrain: error: %s\n", s.message().c_str());
  return 2;
}

[[noreturn]] void run_error(const Status& s) { fatal_exit(1, str_cat("gale pretrain: error: ", s.message())); }

void print_banner(const ArgParser& p, const Arguments& args, const Comm& world) {
  print_rank0(str_cat("Gale ", GALE_VERSION, " pretrain: world size ", world->size(), " (", world->backend(),
                      "), ", num_threads(), " compute threads per process"));
  print_rank0(str_cat("GEMM: ", gemm_backend_description()));
  if (args.training.bf16) print_rank0(str_cat("GEMM (--bf16): ", bf16_gemm_description()));
  if (args.training.fp16)
    print_rank0("GEMM (--fp16): f16 inputs widened to f32 for sgemm (exact products, f32 accumulation; oneDNN has "
                "no f16 matmul without AVX512-FP16)");
  print_rank0(str_cat("CPU: ", isa_report()));
  print_rank0("------------------------ arguments ------------------------");
  for (const std::string& flag : p.given_flags()) print_rank0(str_cat("  ", flag));
  print_rank0("-------------------- end of arguments ---------------------");
}

void print_active_features(const FeatureRegistry& registry, const FeatureContext& ctx, const OpTable& ops) {
  print_rank0(str_cat("features: optimization level ", ctx.optimization_level, ", CPU ISA ", ctx.cpu_isa));
  for (size_t i = 0; i < registry.features().size(); ++i) {
    if (!registry.statuses()[i].active) continue;
    const Feature& f = *registry.features()[i];
    print_rank0(str_cat("  active: ", f.name(), " (", feature_module_name(f.module()), ", level ", f.level(), ")"));
  }
  std::string kernels;
  for (const auto& [op, impl] : ops.impl) kernels += str_cat(kernels.empty() ? "" : ", ", op, "=", impl);
  print_rank0(str_cat("  kernels: ", kernels));
}

}  // namespace

int pretrain_main(int argc, char** argv) {
  double job_start = wall_seconds();  // Megatron's _TRAIN_START_TIME (--log-progress)
  const char* kDescription = "Pretrain a GPT/LLaMA-style model with Megatron-LM's pretrain_gpt.py flags.";
  // --yaml-cfg (train/yaml_cfg.h): as Megatron, the command line is parsed first, then the file's
  // arguments replace it; `yaml_argv` is the command line the file stands for.
  const std::string yaml_cfg = find_yaml_cfg(argc, argv);
  std::vector<std::string> yaml_argv, yaml_ignored, yaml_notes;
  std::vector<char*> yaml_ptrs;
  if (!yaml_cfg.empty()) {
    ArgParser cli("gale pretrain", kDescription);
    Arguments cli_args;
    add_all_pretrain_args(cli, cli_args);
    FakeProcessGroupArgs cli_fake;
    add_fake_process_group_args(cli, cli_fake);
    auto cli_registry = make_feature_registry();
    cli_registry->register_args(cli);
    Status parsed = cli.parse(argc, argv);
    if (!parsed.ok()) return usage_error(parsed);
    if (cli.help_requested()) {
      std::printf("%s", cli.help_text().c_str());
      return 0;
    }
    for (const std::string& flag : cli.given_flags())
      if (flag != "--yaml-cfg") yaml_ignored.push_back(flag);
    StatusOr<YamlCfgArgs> from_file = yaml_cfg_to_args(yaml_cfg, cli);
    if (!from_file.ok()) return usage_error(from_file.status());
    yaml_argv = {argv[0]};
    yaml_argv.insert(yaml_argv.end(), from_file->argv.begin(), from_file->argv.end());
    yaml_notes = from_file->notes;
    for (std::string& a : yaml_argv) yaml_ptrs.push_back(a.data());
    argc = static_cast<int>(yaml_ptrs.size());
    argv = yaml_ptrs.data();
  }
  ArgParser parser("gale pretrain", kDescription);
  Arguments args;
  add_all_pretrain_args(parser, args);
  FakeProcessGroupArgs fake_args;  // beside Arguments (train/arguments_fake_process_group.h)
  add_fake_process_group_args(parser, fake_args);
  auto registry = make_feature_registry();
  registry->register_args(parser);
  const std::vector<std::string> parsed_argv(argv + 1, argv + argc);  // --wandb-project's config
  Status st = parser.parse(argc, argv);
  if (!st.ok() && !yaml_cfg.empty()) st = Status(st.code(), str_cat("--yaml-cfg ", yaml_cfg, ": ", st.message()));
  if (!st.ok()) return usage_error(st);
  if (parser.help_requested()) {
    std::printf("%s", parser.help_text().c_str());
    return 0;
  }
  // --perform-rl-step (train/grpo.h): the prompts come from --langrl-env-config; the mock dataset
  // only stands for Megatron's placeholder datasets of train_rl.py.
  const GrpoArgs& grpo = grpo_args(*registry);
  if (grpo.perform_rl_step && args.data.data_path.empty() && args.data.data_args_path.empty() &&
      args.data.train_data_path.empty() && args.data.per_split_data_args_path.empty())
    args.data.mock_data = true;
  // MindSpeed's --auto-settings / --auto-parallel: profile, model and search instead of training
  // (train/auto_settings.h, train/auto_parallel.h).
  // --fake-process-group: Megatron's checks and Gale's refusals come first (auto-settings too).
  st = validate_fake_process_group(fake_args, args, parser);
  if (!st.ok()) return usage_error(st);
  if (args.auto_settings.auto_settings) return auto_settings_main(parser, args, *registry, argc, argv);
  if (args.auto_settings.auto_parallel) return auto_parallel_main(parser, args, *registry, argc, argv);
  // Before MPI_Init and the OpenMP threads: they inherit SIGTERM blocked (train/exit_signal.h).
  if (args.training.exit_signal_handler) install_exit_signal_handler();
  // --fake-process-group (comm/fake_communicator.h): rank $RANK of $WORLD_SIZE, nothing communicates,
  // whatever --distributed-backend says (Megatron's fake backend replaces it likewise).
  const bool fake = fake_args.fake_process_group;
  StatusOr<Comm> world_or =
      fake ? init_fake_world()
           : init_world(args.parallel.distributed_backend, static_cast<double>(args.parallel.distributed_timeout_minutes));
  if (!world_or.ok()) return usage_error(world_or.status());
  Comm world = world_or.value();
  // A fake run's process is alone: it prints what rank 0 and the last rank print (its own values).
  if (fake) set_log_identity(0, 1);
  else set_log_identity(world->rank(), world->size());
  StatusOr<std::vector<std::string>> from_checkpoint = apply_checkpoint_args(args, parser);  // --use-checkpoint-args
  if (!from_checkpoint.ok()) return usage_error(from_checkpoint.status());
  for (const std::string& line : from_checkpoint.value()) print_rank0(line);
  if (!yaml_cfg.empty())  // Megatron's validate_yaml caps TP and PP at the world size
    apply_yaml_cfg_world_caps(world->size(), &args.parallel.tensor_model_parallel_size,
                              &args.parallel.pipeline_model_parallel_size);
  const bool dist_muon = args.training.optimizer == "dist_muon";  // validation turns it into muon
  st = validate_all_pretrain_args(args, parser, world->size(), world->rank());
  if (!st.ok() && !yaml_cfg.empty()) st = Status(st.code(), str_cat("--yaml-cfg ", yaml_cfg, ": ", st.message()));
  if (!st.ok()) return usage_error(st);
  st = validate_isa_environment();  // a GALE_MAX_ISA value that names no ISA
  if (!st.ok()) return usage_error(st);
  st = validate_bf16_gemm_environment();  // a GALE_BF16_GEMM value that names no path
  if (!st.ok()) return usage_error(st);
  st = validate_grpo_args(grpo, args, parser);  // the RL flags without --perform-rl-step too
  if (!st.ok()) return usage_error(st);
  FeatureContext fctx = make_feature_context(args, parser, *registry);
  std::vector<std::string> notices;
  st = registry->resolve(fctx, &notices);
  if (!st.ok()) return usage_error(st);
  // Off below level 2 or without an instruction dataset (a notice below says why).
  args.data.variable_seq_lengths = registry->active("variable-seq-lengths");
  // Off below level 2 (a notice below says so).
  args.training.reuse_fp32_param = registry->active("reuse-fp32-param");
  args.training.swap_optimizer = registry->active("swap-optimizer");
  args.training.swap_attention = registry->active("swap-attention");
  if (!registry->active("qat")) args.model.qat_scheme.clear();  // below level 2: no QAT (a notice says so)
  args.model.recompute_in_advance = registry->active("recompute-in-advance");
  args.model.recompute_in_bubble = registry->active("recompute-in-bubble");
  args.model.enable_recompute_layers_per_pp_rank = registry->active("enable-recompute-layers-per-pp-rank");
  args.training.swap_layer_input = registry->active("swap-layer-input");
  args.training.smart_swap = registry->active("smart-swap");
  args.training.compress_optimizer = registry->active("compress-optimizer");  // off below level 2, as the swaps
  if (!registry->active("compress-activation")) args.training.compress_activation.clear();
  if (!registry->active("compress-dense")) args.training.compress_dense = "disable";
  args.parallel.reset_bucket_group_order = registry->active("reset-bucket-group-order");
  args.parallel.optimize_send_recv_comm = registry->active("optimize-send-recv-comm");
  args.parallel.use_multiparameter_pipeline_model_parallel =
      registry->active("use-multiparameter-pipeline-model-parallel");
  if (!registry->active("fix-sub-seq-length")) args.data.fix_sub_seq_length = -1;  // the documents
  if (!registry->active("param-and-grad-buffer-pad")) args.parallel.param_and_grad_buffer_pad = kUnset;
  args.parallel.automated_pipeline = registry->active("automated-pipeline");  // below level 2: the flags' split
  args.parallel.layerzero = registry->active("layerzero");  // below level 2: plain data parallelism, as MindSpeed
  args.parallel.use_torch_fsdp2 = registry->active("torch-fsdp2");  // likewise (MindSpeed level 2)
  // The log-line features the trainer reads (their flags belong to the features).
  args.logging.op_cal_tflops = registry->active("op-cal-tflops");
  args.logging.async_log_allreduce = registry->active("async-log-allreduce");
  if (args.training.num_threads > 0) {
    set_num_threads(args.training.num_threads);
  } else if (!std::getenv("OMP_NUM_THREADS")) {
    set_num_threads(default_threads_per_process());  // cores / ranks on this node
  }
  print_banner(parser, args, world);
  for (const std::string& w : gemm_startup_check(local_process_count())) warn_rank0(w);
  for (const std::string& n : notices) warn_rank0(n);
  if (!yaml_cfg.empty()) {
    std::string ignored;
    for (const std::string& f : yaml_ignored) ignored += (ignored.empty() ? ": " : ", ") + f;
    warn_rank0(str_cat("--yaml-cfg ", yaml_cfg, ": the arguments come from the file (Megatron's experimental YAML "
                       "arguments); the command line's other flags are ignored",
                       ignored));
    for (const std::string& n : yaml_notes) warn_rank0(str_cat("--yaml-cfg ", yaml_cfg, ": ", n));
  }
  for (const std::string& n : parser.compat_notices()) warn_rank0("accepted without effect: " + n);
  if (dist_muon)  // Megatron warns alike
    warn_rank0("--optimizer dist_muon is deprecated: use --optimizer muon --use-distributed-optimizer (the same run)");
  if (parser.was_set("--hybrid-override-pattern"))  // Megatron main warns alike
    warn_rank0("--hybrid-override-pattern is deprecated. Use --hybrid-layer-pattern instead.");
  if (!args.training.no_weight_decay_cond_type.empty())  // Megatron warns alike
    warn_rank0("--no-weight-decay-cond-type is deprecated: use --apply-wd-to-qk-layernorm instead (set)");
  if (!args.training.fp16) {
    for (const char* flag : {"--loss-scale", "--initial-loss-scale", "--min-loss-scale", "--loss-scale-window", "--hysteresis"})
      if (parser.was_set(flag)) warn_rank0(str_cat("accepted without effect: ", flag, ": loss scaling only applies with --fp16"));
  } else if (unset(args.training.loss_scale)) {
    warn_rank0("--fp16 with dynamic loss scaling: --check-for-nan-in-loss-and-grad is off, since non-finite gradients "
                "are the loss scaler's signal (such iterations are skipped and counted)");
  }
  if (parser.was_set("--ckpt-format"))
    warn_rank0(str_cat("accepted without effect: --ckpt-format ", args.checkpoint.ckpt_format,
                       ": Gale always writes its own sharded safetensors format (docs/formats/checkpoint.md)"));
  // Megatron's --ckpt-convert-format: --load rewritten in Megatron's format, then the run ends.
  if (!args.checkpoint.ckpt_convert_format.empty()) {
    std::string converted;
    st = convert_checkpoint_for_megatron(args, world, &converted);
    if (!st.ok()) run_error(st);
    print_rank0(converted);
    return 0;
  }
  if (args.model.recompute_granularity == "selective" && args.model.recompute_modules == std::vector<std::string>{"core_attn"})
    warn_rank0("--recompute-granularity selective (--recompute-modules core_attn): nothing to do; Gale never keeps "
               "attention scores or probabilities for backward (both attention kernels recompute them from the "
               "log-sum-exp)");

  // ---- --log-progress: progress.txt in --save, started by the earliest rank's start time ----
  std::unique_ptr<ProgressLog> progress;
  if (args.logging.log_progress) {
    world->all_reduce(&job_start, 1, DType::kF64, ReduceOp::kMin);
    progress = std::make_unique<ProgressLog>(args.checkpoint.save, world, job_start);
    st = progress->start_job();
    if (!st.ok()) run_error(st);
  }
  // ---- --enable-ft-package: the "setup" section and the watchdog start here, as in Megatron ----
  std::unique_ptr<FtIntegration> ft;
  if (args.ft.enable_ft_package) {
    StatusOr<std::unique_ptr<FtIntegration>> ft_or =
        FtIntegration::setup(args.ft, args.checkpoint.save, args.checkpoint.async_save, world);
    if (!ft_or.ok()) run_error(ft_or.status());
    ft = std::move(ft_or).value();
  }

  // ---- layout ----
  if (args.parallel.dist_train) {  // --dist-train: each sub-world has its own grid
    print_rank0(render_dist_train_layout(args.parallel.dist_train_layout));
  } else {
    StatusOr<RankLayout> layout = compute_rank_layout(parallel_sizes_from_args(args, world->size()));
    if (!layout.ok()) return usage_error(layout.status());
    print_rank0(render_rank_layout(layout.value()));
    if (args.parallel.tp_2d) print_rank0(render_tp2d_groups(layout.value(), args.parallel.tp_x));
  }

  // ---- TensorBoard: the last rank writes, as Megatron's ----
  std::unique_ptr<TensorBoardWriter> tensorboard;
  if (!args.logging.tensorboard_dir.empty() && is_last_rank()) {
    print_rank_last("> setting tensorboard ...");
    StatusOr<std::unique_ptr<TensorBoardWriter>> w =
        TensorBoardWriter::open(args.logging.tensorboard_dir, args.logging.tensorboard_queue_size);
    if (!w.ok()) run_error(InvalidArgument("--tensorboard-dir: ", w.status().message()));
    tensorboard = std::move(w.value());
  }
  // ---- Weights & Biases: the last rank writes an offline run (Megatron's _set_wandb_writer) ----
  std::unique_ptr<WandbWriter> wandb;
  std::unique_ptr<WandbScalarMirror> wandb_mirror;
  if (!args.logging.wandb_project.empty() && is_last_rank()) {
    const LoggingArgs& l = args.logging;
    const std::string dir = !l.wandb_save_dir.empty() ? l.wandb_save_dir : (std::filesystem::path(args.checkpoint.save) / "wandb").string();
    WandbItems config = wandb_config_items(parsed_argv);
    config.emplace_back("rank", std::to_string(world->rank()));  // two of Megatron's derived args
    config.emplace_back("world_size", std::to_string(world->size()));
    StatusOr<std::unique_ptr<WandbWriter>> w = WandbWriter::open(dir, l.wandb_project, l.wandb_exp_name, config);
    if (!w.ok()) run_error(InvalidArgument("--wandb-save-dir: ", w.status().message()));
    wandb = std::move(w.value());
    print_rank_last(str_cat("> W&B offline run ", wandb->run_dir(), " (upload it with: wandb sync ", wandb->run_dir(),
                            ")"));
    if (tensorboard) {
      wandb_mirror = std::make_unique<WandbScalarMirror>(wandb.get());
      tensorboard->set_scalar_observer([m = wandb_mirror.get()](std::string_view tag, double v, int64_t step) {
        (*m)(tag, v, step);
      });
    } else {
      print_rank_last("> W&B: without --tensorboard-dir Megatron logs only iteration-time and throughput "
                      "(--log-timers-to-tensorboard) to W&B; so does Gale");
    }
  }

  // ---- Megatron's timers (--timing-log-level, --timing-log-option; core/timers.h) ----
  Timers timers(static_cast<int>(args.logging.timing_log_level),
                parse_timing_log_option(args.logging.timing_log_option).value());  // a choice flag
  timers.set_barrier([world] { world->barrier(); });
  timers.set_barrier_with_level1(args.logging.barrier_with_l1_time);

  // ---- data ----
  timers("train/valid/test-data-iterators-setup", 0).start(/*barrier=*/true);
  // --perform-rl-step: only the tokenizer (the prompts come from --langrl-env-config; no dataset is read).
  // --phase-transition-iterations: the training dataset of the phase of the checkpoint to resume from.
  if (!args.data.phase_transitions.empty()) {
    StatusOr<int64_t> resume = phase_resume_iteration_hint(args);
    if (!resume.ok()) run_error(resume.status());
    args.data.phase_resume_iteration = *resume;
  }
  StatusOr<PretrainData> data_or = grpo.perform_rl_step ? rl_tokenizer_only(args) : build_pretrain_data(args);
  if (!data_or.ok()) run_error(data_or.status());
  timers("train/valid/test-data-iterators-setup", 0).stop();
  PretrainData& data = data_or.value();
  // --dist-train: one padded vocabulary for every sub-world (the embedding and the output layer are
  // split over different TP sizes), padded for the least common multiple of their TP sizes.
  args.model.padded_vocab_size = pad_vocab_size(data.vocab_size, args.model.make_vocab_size_divisible_by,
                                                args.parallel.dist_train ? dist_train_vocab_tp(args.parallel.dist_train_layout)
                                                                         : args.parallel.tensor_model_parallel_size);
  print_rank0(str_cat(" > padded vocab (size: ", data.vocab_size, ") with ",
                      args.model.padded_vocab_size - data.vocab_size, " dummy tokens (new size: ",
                      args.model.padded_vocab_size, ")"));

  // ---- engine: features, model chunks, optimizer (and the checkpoint below, as Megatron's setup) ----
  timers("model-and-optimizer-setup", 0).start(/*barrier=*/true);
  OpTable ops = reference_ops();
  EngineOptions engine_options;
  EngineSetup setup{&ops, &engine_options.recompute};
  st = registry->apply(fctx, setup);
  if (!st.ok()) run_error(st);
  apply_recompute_modules(args.model, &engine_options.recompute);
  print_active_features(*registry, fctx, ops);
  // --profile / --record-memory-history (train/profiler.h): a rank that records a trace traces its
  // op table's calls (nothing is wrapped on the others).
  Profiler profiler(args, world->rank(), world->size());
  if (profiler.traces()) install_op_tracing(&ops);
  AutomatedPipelineStage autopipe;
  if (args.parallel.automated_pipeline) {  // MindSpeed's: profile (or read) the policy, then build with it
    StatusOr<AutomatedPipelineStage> a = run_automated_pipeline(args, world, ops, engine_options, data.train.get());
    if (!a.ok()) run_error(a.status());
    autopipe = a.value();
  }
  std::unique_ptr<ConfigLogger> config_logger;  // --config-logger-dir; outlives the engine's forwards
  StatusOr<std::unique_ptr<Engine>> engine_or = build_engine(args, world, ops, engine_options);
  if (!engine_or.ok()) run_error(engine_or.status());
  Engine& engine = *engine_or.value();
  engine.timers = &timers;
  // --dump-param-to-param-group-map: Megatron writes it when it builds the optimizer (train/param_group_map.h).
  st = dump_param_group_map(engine, args, world);
  if (!st.ok()) run_error(st);
  if (!args.logging.config_logger_dir.empty()) {  // Megatron's get_all_ranks(): tp_dp_cp_pp_ep
    const RankCoords& c = engine.ps.coords();
    config_logger = std::make_unique<ConfigLogger>(args.logging.config_logger_dir,
                                                   str_cat(c.tp, "_", c.dp, "_", c.cp, "_", c.pp, "_", c.ep));
    st = start_config_logger(args, parsed_argv, engine, config_logger.get());
    if (!st.ok()) run_error(st);
  }
  int64_t params = 0, trainable = 0, padding = 0;
  for (const auto& c : engine.chunks) {
    padding += c->params().padding_numel();
    params += c->params().numel() - c->params().padding_numel();
    trainable += c->params().trainable_numel() - c->params().padding_numel();
  }
  if (args.parallel.param_and_grad_buffer_pad > 0)
    print_all(str_cat(" > --param-and-grad-buffer-pad ", args.parallel.param_and_grad_buffer_pad, ": rank ",
                      world->rank(), " pads its parameter and gradient buffers with ", padding, " elements (",
                      padding * 8, " bytes: 4 of f32 value and 4 of f32 gradient each)"));
  if (fake) {
    const RankCoords& c = engine.ps.coords();
    print_rank0(str_cat("> --fake-process-group: this process plays rank ", world->rank(), " of ", world->size(),
                        " (tensor ", c.tp, ", pipeline ", c.pp, ", data ", c.dp, ", context ", c.cp, ", expert ", c.ep,
                        "); every communication is skipped (all-reduce and broadcast leave the local values, "
                        "all-gather copies them, receives are zeros): the losses are not a real run's, the "
                        "memory is rank ", world->rank(), "'s"));
  }
  print_all(str_cat(" > number of parameters on (tensor, pipeline) model parallel rank (", engine.ps.coords().tp, ", ",
                    engine.ps.coords().pp, "): ", params));
  if (args.model.is_hybrid_model && !engine.chunks.empty()) {  // Megatron's allocation report
    const std::string& layers = engine.chunks.front()->config().hybrid.layers;
    const int64_t moe = std::count(layers.begin(), layers.end(), 'E');  // named only in MoE models
    const int64_t gdn = std::count(layers.begin(), layers.end(), 'G');  // named only with GDN layers
    print_rank0(str_cat("Hybrid allocation (M is mamba, * is attention, - is mlp", moe > 0 ? ", E is moe" : "",
                        gdn > 0 ? ", G is gdn" : "", "): ", layers, " (", std::count(layers.begin(), layers.end(), '*'),
                        " attention, ", std::count(layers.begin(), layers.end(), '-'), " mlp, ",
                        moe > 0 ? str_cat(moe, " moe, ") : std::string(), gdn > 0 ? str_cat(gdn, " gdn, ") : std::string(),
                        std::count(layers.begin(), layers.end(), 'M'), " mamba layers)"));
  }
  if (args.training.reuse_fp32_param) {
    int64_t bytes = 0;
    for (const auto& c : engine.chunks) bytes += c->params().value_bytes();
    print_all(str_cat(" > --reuse-fp32-param: parameter values on rank ", world->rank(), " take ", bytes,
                      " bytes (a plain --bf16 run: ", params * 6, ", 4 per f32 master + 2 per bf16 copy)"));
  }
  for (const auto& c : engine.chunks) {  // ZeRO-3 (optim/zero3_sync.h)
    const ParamBuffer& pb = c->params();
    if (!pb.sharded()) continue;
    if (args.parallel.use_torch_fsdp2)
      print_rank0(str_cat(" > FSDP2: sharding_size ", args.parallel.fsdp2_sharding_size, " of DP ",
                          args.parallel.data_parallel_size,
                          args.parallel.fsdp2_sharding_size < args.parallel.data_parallel_size ? " (HSDP)" : "",
                          ", reshard_after_forward ", args.parallel.fsdp2_reshard_after_forward ? "true" : "false",
                          ", num_to_forward_prefetch ", args.parallel.fsdp2_forward_prefetch, ", root units: ",
                          args.parallel.fsdp2_wrap_embedding ? "" : "embedding ",
                          args.parallel.fsdp2_wrap_layers ? "" : "layers ", args.parallel.fsdp2_wrap_head ? "" : "head",
                          (args.parallel.fsdp2_wrap_embedding && args.parallel.fsdp2_wrap_layers &&
                           args.parallel.fsdp2_wrap_head)
                              ? "none"
                              : ""));
    if (args.parallel.use_torch_fsdp2) {  // FSDP2's mixed precision (train/fsdp2_config.h)
      StatusOr<Fsdp2Precision> mp = resolve_fsdp2_precision(args);
      if (mp.ok() && (mp->param_bf16 || mp->reduce_bf16))
        print_rank0(str_cat(" > FSDP2 mixed precision: param_dtype ", mp->param_bf16 ? "bf16" : "fp32",
                            mp->param_bf16 ? " (linear weights all-gathered as bf16 from the f32 shards)" : "",
                            ", reduce_dtype ", mp->reduce_bf16 ? "bf16" : "fp32"));
    }
    print_all(str_cat(pb.values_sharded() ? " > ZeRO-3: rank " : " > ZeRO-2: rank ", world->rank(),
                      " keeps its shards of ", pb.num_units(), " units: ", pb.shard_bytes(),
                      pb.values_sharded() ? " bytes of parameter values and gradients (whole: " : " bytes of gradients (whole: ",
                      (pb.values_sharded() ? 8 : 4) * pb.numel(), ")"));
  }
  if (engine.smart_swap) {
    const SmartSwapConfig& c = engine.smart_swap->config();
    print_rank0(str_cat(" > --smart-swap: ", c.warmup_iters, " iteration(s) without swapping, the last one sampled; then the "
                        "policy for a peak ", c.target_bytes > 0 ? str_cat("of at most ", c.target_bytes, " bytes")
                                                               : str_cat(c.reduction_bytes, " bytes lower"),
                        " applies to the rest of training"));
  }
  const OptimizerStateSwap* swap = engine.optimizer->swap();
  if (swap && !swap->compressed())
    print_all(str_cat(" > --swap-optimizer: optimizer state of rank ", world->rank(), ": ", swap->file_bytes(),
                      " bytes in ", swap->path(), " (unlinked), ", swap->staging_bytes(), " bytes resident (",
                      swap->num_chunks(), " chunks)"));
  if (engine.optimizer->quantised()) {
    int64_t owned = 0;
    for (size_t c = 0; c < engine.optimizer->num_buffers(); ++c)
      for (const Optimizer::Segment& seg : engine.optimizer->segments(c)) owned += seg.numel;
    const std::string what = args.training.quant_states.empty()
                                 ? "--use-precision-aware-optimizer " + engine.optimizer->state_format()
                                 : "--quant-states " + args.training.quant_states;
    print_all(str_cat(" > ", what, ": optimizer state of rank ", world->rank(), ": ",
                      engine.optimizer->state_bytes(), " bytes for ", owned, " elements (f32 moments: ",
                      8 * owned, " bytes)"));
  }
  if (!engine.quant_grads.empty()) {  // --quant-grads: the FP16 main gradients and their f32 scratch
    int64_t held = 0, resident = 0, scratch = 0, full = 0;
    for (size_t c = 0; c < engine.quant_grads.size(); ++c) {
      held += engine.quant_grads[c]->bytes();
      resident += engine.quant_grads[c]->resident_numel();
      scratch += engine.quant_grads[c]->scratch_numel();
      full += 4 * engine.chunks[c]->params().trainable_numel();
    }
    print_all(str_cat(" > --quant-grads: gradients of rank ", world->rank(), ": FP16 codes and scales ", held,
                      " bytes, f32 ", 4 * (resident + scratch), " bytes (resident ", resident, " and scratch ", scratch,
                      " elements; a whole f32 gradient buffer: ", full, " bytes)"));
  }
  if (args.lora.enabled()) {
    char pct[32];
    std::snprintf(pct, sizeof pct, "%.4f%%", 100.0 * static_cast<double>(trainable) / static_cast<double>(params));
    print_rank0(str_cat(" > LoRA: trainable parameters ", trainable, " of ", params, " (", pct, "); optimizer state ",
                        format_bytes(engine.optimizer->state_bytes()), ", gradient buffer ",
                        format_bytes(trainable * static_cast<int64_t>(sizeof(float)))));
  }
  Trainer trainer(args, &engine, data.train.get(), data.valid.get(), data.test.get());
  trainer.set_tensorboard_writer(tensorboard.get());
  trainer.set_wandb_writer(wandb.get());
  if (!args.training.rampup_batch_size.empty()) {  // Megatron's start-up lines of the ramp-up
    const std::vector<std::string>& r = args.training.rampup_batch_size;
    print_rank0(str_cat("will use batch size rampup starting from global batch size ", r[0], " to global batch size ",
                        args.training.global_batch_size, " with batch size increments ", r[1], " over ", r[2],
                        " samples."));
  }
  if (args.training.train_samples != kUnset)
    print_rank0(str_cat("setting training iterations to ", trainer.train_iters()));

  // ---- checkpoints ----
  if (!args.checkpoint.load.empty() || !args.checkpoint.pretrained_checkpoint.empty() || !args.lora.lora_load.empty()) {
    bool loaded = false;
    timers("load-checkpoint", 0).start(/*barrier=*/true);
    st = args.moe.moe_use_upcycling ? upcycle_checkpoint(args, engine, trainer.state())
                                     : load_checkpoint(args, engine, trainer.state(), &loaded);
    if (!st.ok()) run_error(st);
    // Megatron's on_checkpoint_loaded: only a persistent checkpoint's load tells the setup time (Gale
    // cannot tell which one --non-persistent-ckpt-type local loaded, so none counts then).
    if (ft && loaded) ft->on_checkpoint_loaded(args.checkpoint.non_persistent_ckpt_type == "local");
    timers("load-checkpoint", 0).stop(/*barrier=*/true);
    log_timers(timers, {"load-checkpoint"}, *world);
  }
  // --phase-transition-iterations (Megatron's consumed_train_samples_in_current_phase): the loaded
  // iteration's phase reads its own training dataset from sample (iteration - phase start) x GBS.
  if (!args.data.phase_transitions.empty() && !grpo.perform_rl_step) {
    const TrainerState& s = trainer.state();
    const int64_t gbs = args.training.global_batch_size, total = args.training.train_samples;
    const std::vector<int64_t>& transitions = args.data.phase_transitions;
    const PhaseSpan phase = phase_at(transitions, s.iteration, gbs, total);
    if (phase.first_sample != phase_at(transitions, args.data.phase_resume_iteration, gbs, total).first_sample) {
      args.data.phase_resume_iteration = s.iteration;  // another phase than expected: its own dataset
      StatusOr<PretrainData> rebuilt = build_pretrain_data(args);
      if (!rebuilt.ok()) run_error(rebuilt.status());
      data.train = std::move(rebuilt->train);
    }
    const int64_t offset = phase_sample_offset(transitions, s.iteration, s.consumed_train_samples, gbs);
    trainer.set_train_phase(data.train.get(), offset);
    print_rank0(str_cat("> phase transitions at iterations ", args.data.phase_transition_iterations,
                        ": this phase starts at iteration ", phase.first_iteration, "; its training dataset holds ",
                        phase.samples(), " samples, read from sample ", s.consumed_train_samples - offset));
  }
  // --stage dpo: the frozen reference model, a second copy of the model loaded from --ref-model
  // (default --load), run forward only (MindSpeed-LLM's DPOTrainer). With LoRA it is the base model
  // without the adapters (the --load checkpoint holds no adapter weights). Under pipeline
  // parallelism each rank holds the reference's chunks of its own virtual stages, as the policy's.
  std::vector<std::unique_ptr<GPTModel>> reference;
  if (args.dpo.enabled()) {
    std::vector<GPTModel*> chunks;
    for (const auto& policy : engine.chunks) {
      ModelConfig reference_config = policy->config();
      reference_config.lora = LoraConfig{};
      reference_config.reuse_fp32_param = false;  // never stepped: plain f32 values and their bf16 copy
      reference.push_back(std::make_unique<GPTModel>(reference_config, policy->partition(), &engine.ops));
      chunks.push_back(reference.back().get());
    }
    const bool own = !args.dpo.ref_model.empty();
    const std::string& ref_dir = own ? args.dpo.ref_model : args.checkpoint.load;
    std::string note;
    StatusOr<int64_t> ref_iteration = dpo_reference_iteration(args.dpo, ref_dir, &note);
    if (!ref_iteration.ok()) run_error(ref_iteration.status());
    if (!note.empty()) print_rank0(str_cat(" > ", note));
    st = load_model_weights(own ? "--ref-model" : "--load", ref_dir, chunks, "reference model", ref_iteration.value());
    if (!st.ok()) run_error(st);
    trainer.set_dpo_reference(chunks);
  }
  // --qad-enable: the frozen teacher, a second copy of the model without QAT loaded from
  // --qad-teacher-load, run forward only by the student's head (GPTModel::set_distillation). Under
  // pipeline parallelism the last stage holds the whole teacher (every layer, one chunk with this
  // rank's tensor-parallel group) and the other stages none.
  std::unique_ptr<GPTModel> teacher;
  if (args.qad.qad_enable && engine.chunks.size() > 1)  // virtual stages from --pipeline-model-parallel-layout
    run_error(Unimplemented("--qad-enable with an interleaved pipeline (", engine.chunks.size(),
                            " model chunks per rank): not supported yet"));
  if (args.qad.qad_enable && engine.chunks.back()->partition().post_process) {
    GPTModel& student = *engine.chunks.back();
    ModelConfig teacher_config = student.config();
    teacher_config.qat = QatConfig{};           // the full-precision teacher
    teacher_config.fp8 = Fp8Config{};
    teacher_config.lora = LoraConfig{};
    teacher_config.reuse_fp32_param = false;    // never stepped: plain f32 values and their bf16 copy
    ModelPartition whole = student.partition();
    whole.first_layer = 0;
    whole.num_layers = teacher_config.num_layers;
    whole.pre_process = whole.post_process = true;
    teacher = std::make_unique<GPTModel>(teacher_config, whole, &engine.ops);
    st = load_model_weights("--qad-teacher-load", args.qad.qad_teacher_load, {teacher.get()}, "QAD teacher model");
    if (!st.ok()) run_error(st);
    GPTModel::Distillation d;
    d.teacher = teacher.get();
    d.temperature = args.qad.kl_temperature;
    d.weight = args.qad.kl_loss_weight;
    d.reduction = args.qad.kl_loss_reduction == "sum" ? KlReduction::kSum : KlReduction::kMean;
    student.set_distillation(d);
  }
  // --logits-save-dir / --logits-load-dir (Megatron main's offline distillation,
  // train/logits_kd_hooks.h): the teacher's saver or the student's KD loss on the head's chunk.
  std::unique_ptr<LogitsSaverHook> logits_saver;
  std::unique_ptr<CachedLogitsKdHook> logits_kd;
  const LogitsKdArgs& lkd = args.logits_kd;
  // Megatron attaches them on the last pipeline stage only (its last virtual chunk): the chunk
  // holding the output layer (pipeline rank 0's under DualPipeV); the other stages have none.
  GPTModel* head_chunk = nullptr;
  for (auto& chunk : engine.chunks)
    if (chunk->partition().post_process) head_chunk = chunk.get();
  if (grpo.perform_rl_step && (!lkd.logits_save_dir.empty() || !lkd.logits_load_dir.empty()))
    run_error(Unimplemented(lkd.logits_save_dir.empty() ? "--logits-load-dir" : "--logits-save-dir",
                            " with --perform-rl-step: not supported"));
  if (head_chunk != nullptr && (!lkd.logits_save_dir.empty() || !lkd.logits_load_dir.empty())) {
    StatusOr<LogitsDatasetIdentity> id = logits_dataset_identity(args);
    if (!id.ok()) run_error(id.status());
    GPTModel& head = *head_chunk;
    const RankCoords& rc = engine.ps.coords();
    IterationFn iteration = [&trainer] { return trainer.state().iteration; };
    if (!lkd.logits_save_dir.empty()) {
      LogitsSaverSettings s;
      s.k = lkd.logits_save_top_k;
      if (parser.was_set("--logits-save-top-p")) s.p = lkd.logits_save_top_p;
      s.min_k = lkd.logits_save_top_p_min_k;
      StatusOr<LogitsSaveDtype> dtype = parse_logits_save_dtype(lkd.logits_save_dtype);
      if (!dtype.ok()) run_error(dtype.status());
      s.dtype = dtype.value();
      logits_saver = std::make_unique<LogitsSaverHook>(lkd.logits_save_dir, s, id.value(), rc.cp, rc.dp,
                                                       head.partition().tp.get(), iteration);
      head.set_head_logits_hook(logits_saver.get());
    } else {
      StatusOr<CachedLogitsReader> reader = CachedLogitsReader::open(
          lkd.logits_load_dir, rc.cp, rc.dp, engine.ps.dp_size(), cached_logits_dataset_hash(id.value()),
          engine.ps.cp_size());
      if (!reader.ok()) run_error(reader.status());
      const int saved_dp = reader.value().saved_dp_size();
      logits_kd = std::make_unique<CachedLogitsKdHook>(std::move(reader).value(), lkd.logits_load_kd_loss_alpha,
                                                       lkd.logits_load_ignore_errors, head.partition().tp.get(),
                                                       iteration);
      head.set_head_logits_hook(logits_kd.get());
      print_rank0(str_cat("> offline distillation from ", lkd.logits_load_dir, " (saved at data-parallel size ",
                          saved_dp, "), loss = ", lkd.logits_load_kd_loss_alpha,
                          " * kd + ", 1.0 - lkd.logits_load_kd_loss_alpha, " * lm"));
    }
  }
  timers("model-and-optimizer-setup", 0).stop();
  // --async-save: the save in flight outlives the trainer's run() only until its blocking finalisation.
  std::unique_ptr<AsyncCheckpointSaves> async_saves;
  if (!args.checkpoint.save.empty() && args.checkpoint.async_save) {
    async_saves = std::make_unique<AsyncCheckpointSaves>(*engine.ps.world());
    trainer.set_finalize_saves_fn([&](bool blocking) { return async_saves->maybe_finalize(blocking); });
  }
  // --log-progress: the floating-point operations when this job started (from its checkpoint).
  const double job_start_flops = trainer.state().floating_point_operations_so_far;
  if (!args.checkpoint.save.empty())
    trainer.set_save_fn([&](const TrainerState& s) -> Status {
      GALE_RETURN_IF_ERROR(save_checkpoint(args, engine, s, async_saves.get()));
      if (logits_saver) GALE_RETURN_IF_ERROR(logits_saver->flush());  // Megatron's flush point
      if (!progress || args.training.freeze_all_layers) return Status::Ok();  // nothing saved: no line
      return progress->saved_checkpoint(s.iteration, s.floating_point_operations_so_far, job_start_flops,
                                        s.consumed_train_samples * args.model.seq_length, args.checkpoint.async_save);
    });
  // Megatron's non-persistent saves (no --log-progress line for them, as Megatron).
  if (!args.checkpoint.save.empty() && args.checkpoint.non_persistent_save_interval != kUnset)
    trainer.set_non_persistent_save_fn([&](const TrainerState& s) -> Status {
      return save_non_persistent_checkpoint(args, engine, s, async_saves.get());
    });

  world->barrier();  // Megatron's timers.log(..., barrier=True)
  log_timers(timers, {"model-and-optimizer-setup", "train/valid/test-data-iterators-setup"}, *world);
  // --prof-file: this run's profile (train/auto_settings_profile.h).
  std::unique_ptr<ProfileRecorder> profile;
  if (!args.auto_settings.prof_file.empty()) {
    profile = std::make_unique<ProfileRecorder>(&timers, &engine.ps, args.logging.log_interval);
    trainer.set_step_observer([&profile](int64_t iteration, double seconds) { profile->on_step(iteration, seconds); });
  }
  print_rank0("training ...");
  host_allocator().reset_peak();
  trainer.set_profiler(&profiler);
  std::unique_ptr<StragglerDetector> straggler;
  if (args.logging.log_straggler) {  // Megatron configures it as training starts
    const LoggingArgs& l = args.logging;
    straggler = std::make_unique<StragglerDetector>(
        world, StragglerOptions{!l.disable_straggler_on_startup, static_cast<int>(l.straggler_ctrlr_port),
                                static_cast<int>(l.straggler_minmax_count), num_threads()});
    timers.set_scope_observer(straggler.get());
    trainer.set_straggler_detector(straggler.get());
  }
  trainer.set_ft(ft.get());
  profiler.start_training();
  GrpoSaves grpo_saves;  // --perform-rl-step --save: the checkpoints of the RL loop (no --log-progress line)
  if (grpo.perform_rl_step && !args.checkpoint.save.empty()) {
    grpo_saves.save = [&](const TrainerState& s) { return save_checkpoint(args, engine, s, async_saves.get()); };
    if (args.checkpoint.non_persistent_save_interval != kUnset)
      grpo_saves.non_persistent = [&](const TrainerState& s) {
        return save_non_persistent_checkpoint(args, engine, s, async_saves.get());
      };
    if (async_saves) grpo_saves.finalize = [&](bool blocking) { return async_saves->maybe_finalize(blocking); };
  }
  st = grpo.perform_rl_step ? run_grpo_training(args, grpo, engine, *data.tokenizer, &trainer.state(), grpo_saves)
                            : trainer.run();
  if (st.ok() && logits_saver) st = logits_saver->flush();  // what the last checkpoint save did not write
  if (st.ok() && ft) st = ft->shutdown();  // the last timeout update (a collective), then the watchdog stops
  timers.set_scope_observer(nullptr);
  straggler.reset();
  tensorboard.reset();  // the last records reach the file even when the run failed
  if (wandb) {  // Megatron's wandb_writer.finish(); a failed run exits with 1
    Status fin = wandb->finish(st.ok() ? trainer.exit_code() : 1);
    if (st.ok() && !fin.ok()) st = IOError("--wandb-save-dir: ", fin.message());
    wandb.reset();
  }
  if (!st.ok()) run_error(st);
  if (trainer.exit_code() != 0) return trainer.exit_code();  // --rerun-mode validate_results (Megatron's sys.exit)
  if (profile) {
    const RunProfile p = profile->finish(  // a collective
        args, engine, num_floating_point_operations(trainer.flops_model(), args.training.global_batch_size));
    if (world->rank() == 0) {
      st = write_profile(p, args.auto_settings.prof_file);
      if (!st.ok()) run_error(st);
      print_rank0(str_cat(" > --prof-file: profile written to ", args.auto_settings.prof_file));
    }
  }
  print_rank0(str_cat("[after training] peak memory: ", format_bytes(host_allocator().peak_bytes()),
                      " in tensors (exact: ", host_allocator().peak_bytes(), " bytes), ",
                      format_bytes(peak_rss_bytes()), " process peak RSS"));
  // Every rank's exact bytes (train/memory_report.h); a fake run's for the rank it plays.
  print_all(str_cat(format_rank_memory(world->rank(), rank_memory(engine)),
                    fake ? str_cat(" (--fake-process-group: rank ", world->rank(), " of ", world->size(), ")") : ""));
  if (args.parallel.automated_pipeline)  // the memory model against the allocator, per stage
    print_all(str_cat(" > --automated-pipeline: rank ", world->rank(), " (pipeline stage ", engine.ps.coords().pp,
                      ", ", args.parallel.pipeline_layers.at(static_cast<size_t>(engine.ps.coords().pp)).at(0),
                      " layers, the first ",
                      args.parallel.recompute_layers_per_stage.at(static_cast<size_t>(engine.ps.coords().pp)),
                      " recomputed): peak ", host_allocator().peak_bytes(), " bytes in tensors (predicted ",
                      autopipe.predicted_bytes, autopipe.even_peak_bytes >= 0
                          ? str_cat("; ", autopipe.even_peak_bytes, " in the profiling iterations at the even split")
                          : std::string(), ")"));
  if (engine.smart_swap && engine.smart_swap->policy())
    print_all(str_cat(" > --smart-swap: peak memory since the policy applied: ", engine.smart_swap->stable_peak(),
                      " bytes in tensors (predicted ", engine.smart_swap->policy()->predicted_peak, ")"));
  // --compress-optimizer / --compress-activation / --compress-dense: what the codec holds and did.
  if (swap && swap->compressed())
    print_all(str_cat(" > --compress-optimizer: optimizer state of rank ", world->rank(), ": ", swap->raw_bytes(),
                      " bytes held as ", swap->compressed_bytes(), " compressed (ratio ",
                      fixed_str(static_cast<double>(swap->compressed_bytes()) / std::max<int64_t>(swap->raw_bytes(), 1), 4),
                      ") + ", swap->staging_bytes(), " bytes of staging (", swap->num_chunks(), " chunks), encode ",
                      fixed_str(swap->encode_seconds(), 3), " s, decode ", fixed_str(swap->decode_seconds(), 3), " s"));
  CompressStats act;
  for (const auto& c : engine.chunks) act.add(c->activation_compress_stats());
  if (act.tensors > 0)
    print_all(str_cat(" > ", !args.training.compress_activation.empty() ? "--compress-activation" : "--compress-dense",
                      ": rank ", world->rank(), " compressed ", act.tensors, " tensors, ", act.raw_bytes, " -> ",
                      act.stored_bytes, " bytes in memory", act.file_bytes > 0 ? str_cat(" + ", act.file_bytes, " in the file") : "",
                      " (ratio ", fixed_str(static_cast<double>(act.stored_bytes + act.file_bytes) / act.raw_bytes, 4),
                      "), encode ", fixed_str(act.encode_seconds, 3), " s, decode ", fixed_str(act.decode_seconds, 3), " s"));
  return 0;
}

}  // namespace gale
