// What --auto-settings and --auto-parallel share (see the header).
#include "train/auto_settings_run.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/log.h"
#include "features/registry.h"
#include "train/auto_settings.h"

#ifndef GALE_DEFAULT_MPIEXEC
#define GALE_DEFAULT_MPIEXEC "mpiexec"
#endif

namespace gale {

namespace {

constexpr int kProfileIters = 4, kProfileMicroBatches = 2;

int64_t launcher_world_size() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS"}) {
    const char* value = std::getenv(v);
    if (value && *value) return std::atoll(value);
  }
  return 1;
}

int64_t host_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (in >> key >> kib >> unit)
    if (key == "MemTotal:") return kib * 1024;
  return 0;
}

// Runs argv with stdout and stderr into `log`; the exit status (-1: not started / killed).
int run_logged(const std::vector<std::string>& argv, const std::string& log) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    std::vector<char*> ptrs;
    for (const std::string& a : argv) ptrs.push_back(const_cast<char*>(a.c_str()));
    ptrs.push_back(nullptr);
    execvp(ptrs[0], ptrs.data());
    std::fprintf(stderr, "cannot start %s\n", ptrs[0]);
    _exit(127);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string self_executable(const char* argv0) {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(argv0) : p.string();
}

Status unsupported_combinations(const std::string& flag, const Arguments& a) {
  if (a.moe.enabled())
    return Unimplemented(flag, ": not supported yet with --num-experts (Gale's search covers TP, CP, PP and DP of dense "
                         "models)");
  if (a.parallel.num_layers_per_virtual_pipeline_stage != kUnset)
    return Unimplemented(flag, ": not supported yet with --num-layers-per-virtual-pipeline-stage (the search covers 1F1B "
                         "without virtual stages)");
  if (!a.parallel.num_layer_list.empty() || !a.parallel.pipeline_model_parallel_layout.empty() ||
      a.parallel.decoder_first_pipeline_num_layers != kUnset)
    return Unimplemented(flag, ": not supported yet with an explicit pipeline split (--num-layer-list, "
                         "--pipeline-model-parallel-layout, --decoder-first-pipeline-num-layers)");
  if (!a.parallel.schedules_method.empty())
    return Unimplemented(flag, ": not supported yet with --schedules-method ", a.parallel.schedules_method);
  if (a.dpo.enabled()) return Unimplemented(flag, ": not supported yet with --stage dpo");
  return Status::Ok();
}

nlohmann::ordered_json fit_json(const SplitFit& f) { return {{"alpha", f.alpha}, {"beta", f.beta}}; }

}  // namespace

std::string auto_fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string layout_name(const AutoLayout& l) { return str_cat("tp=", l.tp, " cp=", l.cp, " pp=", l.pp, " dp=", l.dp); }

std::string gib(double bytes) { return auto_fixed(bytes / (1024.0 * 1024.0 * 1024.0), 3) + " GiB"; }

int prepare_auto_run(const char* flag, int64_t world, const ArgParser& parser, Arguments& args, FeatureRegistry& registry,
                     int argc, char** argv, AutoRun* run) {
  const AutoSettingsArgs& as = args.auto_settings;
  auto usage = [](const Status& s) {
    std::fprintf(stderr, "gale pretrain: error: %s\n", s.message().c_str());
    return 2;
  };
  if (launcher_world_size() > 1)
    return usage(InvalidArgument(flag, ": run it as one process (it starts its runs with mpiexec itself); found a "
                                 "launcher world of ", launcher_world_size(), " ranks"));
  // The command line as the target would run it: its layout against the target's world.
  Status st = validate_all_pretrain_args(args, parser, world);
  if (!st.ok()) return usage(st);
  std::vector<std::string> notices;
  st = registry.resolve(make_feature_context(args, parser, registry), &notices);
  if (!st.ok()) return usage(st);
  st = unsupported_combinations(flag, args);
  if (!st.ok()) return usage(st);
  run->flag = flag;
  run->work_dir = as.auto_settings_work_dir.empty() ? std::filesystem::current_path().string() : as.auto_settings_work_dir;
  std::error_code ec;
  std::filesystem::create_directories(run->work_dir, ec);
  if (ec || !std::filesystem::is_directory(run->work_dir))
    return usage(InvalidArgument("--auto-settings-work-dir ", run->work_dir, ": cannot create the directory"));
  run->local_ranks = as.nproc_per_node;
  run->threads = args.training.num_threads > 0
                     ? args.training.num_threads
                     : std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()) / as.nproc_per_node);
  run->memory_limit = as.auto_settings_memory_limit_gib > 0.0
                          ? as.auto_settings_memory_limit_gib * 1024.0 * 1024.0 * 1024.0
                          : static_cast<double>(host_memory_bytes()) / static_cast<double>(as.nproc_per_node);
  run->verbose = as.auto_settings_log_level != "warning";
  run->exe = self_executable(argv[0]);
  const char* mpiexec_env = std::getenv("GALE_MPIEXEC");
  run->mpiexec = mpiexec_env && *mpiexec_env ? mpiexec_env : GALE_DEFAULT_MPIEXEC;
  run->base.assign(argv + 1, argv + argc);
  for (const std::string& f : auto_flags()) remove_flag(run->base, f);
  return 0;
}

std::vector<std::string> with_layout(std::vector<std::string> tokens, const AutoLayout& l) {
  set_flag(tokens, "--tensor-model-parallel-size", std::to_string(l.tp));
  set_flag(tokens, "--context-parallel-size", std::to_string(l.cp));
  set_flag(tokens, "--pipeline-model-parallel-size", std::to_string(l.pp));
  return tokens;
}

int run_pretrain_logged(const AutoRun& run, int64_t np, const std::vector<std::string>& tokens, const std::string& log) {
  std::vector<std::string> cmd;
  if (np > 1) cmd = {run.mpiexec, "-np", std::to_string(np)};
  cmd.push_back(run.exe);
  cmd.push_back("pretrain");
  cmd.insert(cmd.end(), tokens.begin(), tokens.end());
  return run_logged(cmd, log);
}

StatusOr<std::vector<RunProfile>> run_profiling(const Arguments& args, AutoRun& run) {
  const ModelArgs& model = args.model;
  std::vector<std::pair<int64_t, int64_t>> pairs = {{1, 1}};
  if (run.local_ranks >= 2) {
    if (model.num_attention_heads % 2 == 0 && model.num_kv_heads % 2 == 0 && model.ffn_hidden_size % 2 == 0)
      pairs.push_back({2, 1});
    const bool ulysses = args.parallel.context_parallel_algo == "ulysses_cp_algo";
    if (ulysses ? model.num_attention_heads % 2 == 0 : model.seq_length % 4 == 0) pairs.push_back({1, 2});
  }
  std::vector<std::string> base = run.base;
  for (const char* f : {"--save", "--load", "--save-interval", "--tensorboard-dir", "--exit-interval",
                        "--exit-duration-in-mins", "--train-samples", "--rampup-batch-size", "--eval-interval",
                        "--prof-file", "--wandb-project", "--log-progress"})
    remove_flag(base, f);
  // (TP, CP, PP, layers): the pairs at 1 and 2 layers, then PP 2 at 2 layers with 2 local ranks.
  std::vector<std::array<int64_t, 4>> runs;
  for (const auto& [tp, cp] : pairs)
    for (int64_t layers : {1, 2}) runs.push_back({tp, cp, 1, layers});
  if (run.local_ranks >= 2) runs.push_back({1, 1, 2, 2});
  if (run.verbose)
    print_rank0(str_cat(run.flag.substr(2), ": profiling ", runs.size(), " runs in ", run.work_dir, " (", run.threads,
                        " threads per rank)"));
  std::vector<RunProfile> profiles;
  for (const auto& [tp, cp, pp, layers] : runs) {
    const std::string stem = pp == 1 ? str_cat(run.work_dir, "/profile_tp", tp, "_cp", cp, "_l", layers)
                                     : str_cat(run.work_dir, "/profile_pp", pp, "_l", layers);
    std::vector<std::string> tokens = with_layout(base, AutoLayout{tp, cp, pp, 1});
    set_flag(tokens, "--num-layers", std::to_string(layers));
    set_flag(tokens, "--global-batch-size", std::to_string(args.training.micro_batch_size * kProfileMicroBatches));
    set_flag(tokens, "--train-iters", std::to_string(kProfileIters));
    set_flag(tokens, "--eval-iters", "0");
    set_flag(tokens, "--log-interval", std::to_string(kProfileIters + 1));
    set_flag(tokens, "--timing-log-level", "1");
    set_flag(tokens, "--num-threads", std::to_string(run.threads));
    set_flag(tokens, "--prof-file", stem + ".json");
    std::error_code ec;
    std::filesystem::remove(stem + ".json", ec);
    const int rc = run_pretrain_logged(run, tp * cp * pp, tokens, stem + ".log");
    if (rc != 0)
      return InvalidArgument(run.flag, ": profiling run tp=", tp, " cp=", cp, " pp=", pp, " layers=", layers,
                             " failed (exit ", rc, "); its output is in ", stem, ".log");
    GALE_ASSIGN_OR_RETURN(RunProfile p, read_profile(stem + ".json"));
    if (run.verbose)
      print_rank0(str_cat("  profiled tp=", tp, " cp=", cp, " pp=", pp, " layers=", layers, ": step ",
                          auto_fixed(p.step_seconds, 4), " s, peak ", p.max_peak_bytes(), " bytes"));
    run.profiles.push_back({{"file", stem + ".json"}, {"tp", tp}, {"cp", cp}, {"pp", pp}, {"num_layers", layers},
                            {"step_seconds", p.step_seconds}, {"peak_bytes", p.max_peak_bytes()}});
    profiles.push_back(std::move(p));
  }
  return profiles;
}

AutoTarget make_auto_target(const Arguments& args, int64_t ranks, int64_t nnodes, double inter_node_ratio) {
  AutoTarget t;
  t.num_layers = args.model.num_layers;
  t.micro_batch_size = args.training.micro_batch_size;
  t.global_batch_size = args.training.global_batch_size;
  t.seq_length = args.model.seq_length;
  t.hidden_size = args.model.hidden_size;
  t.tied_embeddings = !args.model.untie_embeddings_and_output_weights;
  t.distributed_optimizer = args.parallel.use_distributed_optimizer;
  t.sequence_parallel = args.parallel.sequence_parallel;
  t.shardable_bytes_per_param = args.training.optimizer == "sgd" ? (args.training.sgd_momentum > 0.0 ? 4.0 : 0.0) : 8.0;
  t.ranks_per_node = ranks / nnodes;
  t.inter_node_bandwidth_ratio = inter_node_ratio;
  return t;
}

AutoSearchSpace make_auto_space(const Arguments& args, int64_t world, double memory_limit) {
  AutoSearchSpace s;
  s.world_size = world;
  s.num_layers = args.model.num_layers;
  s.num_attention_heads = args.model.num_attention_heads;
  s.num_query_groups = args.model.num_kv_heads;
  s.ffn_hidden_size = args.model.ffn_hidden_size;
  s.seq_length = args.model.seq_length;
  s.micro_batch_size = args.training.micro_batch_size;
  s.global_batch_size = args.training.global_batch_size;
  s.cp_algo = args.parallel.context_parallel_algo;
  s.memory_limit_bytes = memory_limit;
  return s;
}

nlohmann::ordered_json models_json(const AutoModels& m) {
  nlohmann::ordered_json pairs = nlohmann::ordered_json::array();
  for (const PairMeasure& p : m.pairs)
    pairs.push_back({{"tp", p.tp}, {"cp", p.cp}, {"layer_params", p.layer_params}, {"fixed_params", p.fixed_params},
                     {"layer_activation_bytes", p.layer_activation}, {"fixed_activation_bytes", p.fixed_activation},
                     {"layer_seconds", p.layer_seconds}, {"fixed_seconds", p.fixed_seconds},
                     {"layer_comm_bytes", p.layer_comm_bytes}});
  return {{"bytes_per_param", m.bytes_per_param}, {"persistent_intercept_bytes", m.persistent_intercept},
          {"shardable_bytes_per_param", m.target.shardable_bytes_per_param},
          {"layer_params", fit_json(m.layer_params)}, {"fixed_params", fit_json(m.fixed_params)},
          {"layer_activation_bytes", fit_json(m.layer_activation)}, {"fixed_activation_bytes", fit_json(m.fixed_activation)},
          {"fixed_seconds", fit_json(m.fixed_seconds)}, {"flops_per_second", m.flops_per_second},
          {"layer_seconds_tp1", m.layer_seconds_1}, {"layer_comm_bytes", m.layer_comm_bytes},
          {"intra_node_bandwidth", m.intra_bandwidth}, {"bandwidth_measured", m.bandwidth_measured},
          {"inter_node_bandwidth", m.intra_bandwidth * m.target.inter_node_bandwidth_ratio},
          {"optimizer_seconds_per_param", m.optimizer_seconds_per_param},
          {"stages", {{"measured", m.stage_shares}, {"first_param_share", m.first_param_share},
                      {"last_param_share", m.last_param_share}, {"first_activation_share", m.first_activation_share},
                      {"last_activation_share", m.last_activation_share}}},
          {"pairs", pairs}};
}

nlohmann::ordered_json candidate_json(const AutoCandidate& c) {
  const AutoPrediction& p = c.prediction;
  return {{"tp", c.layout.tp}, {"cp", c.layout.cp}, {"pp", c.layout.pp}, {"dp", c.layout.dp}, {"fits", c.fits},
          {"peak_bytes", static_cast<int64_t>(p.peak_bytes)}, {"persistent_bytes", static_cast<int64_t>(p.persistent_bytes)},
          {"step_seconds", p.step_seconds},
          {"seconds", {{"compute", p.compute_seconds}, {"tp_cp_comm", p.tp_cp_comm_seconds}, {"pp_comm", p.pp_comm_seconds},
                       {"bubble", p.bubble_seconds}, {"optimizer", p.optimizer_seconds}, {"dp_comm", p.dp_comm_seconds}}},
          {"spans_nodes", {{"tp_cp", p.tp_cp_spans_nodes}, {"dp", p.dp_spans_nodes}, {"pp", p.pp_spans_nodes}}}};
}

nlohmann::ordered_json search_result_json(const std::string& magic, int version, const std::string& type,
                                          nlohmann::ordered_json target, const AutoRun& run, const AutoModels& m,
                                          const AutoSearchResult& found) {
  nlohmann::ordered_json j;
  j["magic"] = magic;
  j["version"] = version;
  if (!type.empty()) j["type"] = type;
  target["memory_limit_bytes"] = static_cast<int64_t>(run.memory_limit);
  j["target"] = std::move(target);
  j["profiles"] = run.profiles;
  j["models"] = models_json(m);
  nlohmann::ordered_json cands = nlohmann::ordered_json::array();
  for (const AutoCandidate& c : found.ranked) cands.push_back(candidate_json(c));
  for (const AutoCandidate& c : found.over_memory) cands.push_back(candidate_json(c));
  j["candidates"] = cands;
  j["excluded"] = found.excluded;
  return j;
}

bool write_result_json(const std::string& work_dir, const std::string& name, const nlohmann::ordered_json& result,
                       std::string* path) {
  *path = work_dir + "/" + name;
  std::ofstream out(*path, std::ios::binary | std::ios::trunc);
  out << result.dump(2) << "\n";
  if (out) return true;
  std::fprintf(stderr, "gale pretrain: error: --auto-settings-work-dir: cannot write %s\n", path->c_str());
  return false;
}

}  // namespace gale
