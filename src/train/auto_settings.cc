// `gale pretrain --auto-settings`: profile, fit, search, report (see the header).
#include "train/auto_settings.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/log.h"
#include "core/status.h"
#include "features/registry.h"
#include "train/auto_settings_model.h"
#include "train/auto_settings_profile.h"
#include "train/auto_settings_search.h"

#ifndef GALE_DEFAULT_MPIEXEC
#define GALE_DEFAULT_MPIEXEC "mpiexec"
#endif

namespace gale {

namespace {

constexpr int kProfileIters = 4, kProfileMicroBatches = 2;
constexpr const char* kResultMagic = "gale-auto-settings";
constexpr int kResultVersion = 1;

bool starts_with_dashes(const std::string& t) { return t.size() > 2 && t[0] == '-' && t[1] == '-'; }

// The flags of auto settings itself, dropped from the profiling runs and the printed command line.
const std::vector<std::string>& auto_settings_flags() {
  static const std::vector<std::string> flags = {
      "--auto-settings", "--auto-settings-type", "--auto-settings-work-dir", "--auto-settings-ranks",
      "--auto-settings-log-level", "--target-nnodes", "--nproc-per-node", "--auto-settings-memory-limit-gib",
      "--auto-settings-inter-node-bandwidth-ratio"};
  return flags;
}

int64_t launcher_world_size() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS"}) {
    const char* value = std::getenv(v);
    if (value && *value) return std::atoll(value);
  }
  return 1;
}

int64_t host_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
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

std::string layout_name(const AutoLayout& l) { return str_cat("tp=", l.tp, " cp=", l.cp, " pp=", l.pp, " dp=", l.dp); }

std::string fixed_str(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string gib(double bytes) { return fixed_str(bytes / (1024.0 * 1024.0 * 1024.0), 3) + " GiB"; }

Status unsupported_combinations(const Arguments& a) {
  if (a.moe.enabled())
    return Unimplemented("--auto-settings: not supported yet with --num-experts (Gale's search covers TP, CP, PP and DP "
                         "of dense models)");
  if (a.parallel.num_layers_per_virtual_pipeline_stage != kUnset)
    return Unimplemented("--auto-settings: not supported yet with --num-layers-per-virtual-pipeline-stage (the search "
                         "covers 1F1B without virtual stages)");
  if (!a.parallel.num_layer_list.empty() || !a.parallel.pipeline_model_parallel_layout.empty() ||
      a.parallel.decoder_first_pipeline_num_layers != kUnset)
    return Unimplemented("--auto-settings: not supported yet with an explicit pipeline split (--num-layer-list, "
                         "--pipeline-model-parallel-layout, --decoder-first-pipeline-num-layers)");
  if (!a.parallel.schedules_method.empty())
    return Unimplemented("--auto-settings: not supported yet with --schedules-method ", a.parallel.schedules_method);
  if (a.dpo.enabled()) return Unimplemented("--auto-settings: not supported yet with --stage dpo");
  return Status::Ok();
}

nlohmann::ordered_json fit_json(const SplitFit& f) { return {{"alpha", f.alpha}, {"beta", f.beta}}; }

nlohmann::ordered_json candidate_json(const AutoCandidate& c) {
  const AutoPrediction& p = c.prediction;
  return {{"tp", c.layout.tp}, {"cp", c.layout.cp}, {"pp", c.layout.pp}, {"dp", c.layout.dp}, {"fits", c.fits},
          {"peak_bytes", static_cast<int64_t>(p.peak_bytes)}, {"persistent_bytes", static_cast<int64_t>(p.persistent_bytes)},
          {"step_seconds", p.step_seconds},
          {"seconds", {{"compute", p.compute_seconds}, {"tp_cp_comm", p.tp_cp_comm_seconds}, {"pp_comm", p.pp_comm_seconds},
                       {"bubble", p.bubble_seconds}, {"optimizer", p.optimizer_seconds}, {"dp_comm", p.dp_comm_seconds}}},
          {"spans_nodes", {{"tp_cp", p.tp_cp_spans_nodes}, {"dp", p.dp_spans_nodes}, {"pp", p.pp_spans_nodes}}}};
}

}  // namespace

void remove_flag(std::vector<std::string>& tokens, const std::string& flag) {
  std::vector<std::string> out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i].rfind(flag + "=", 0) == 0) continue;
    if (tokens[i] != flag) {
      out.push_back(tokens[i]);
      continue;
    }
    while (i + 1 < tokens.size() && !starts_with_dashes(tokens[i + 1])) ++i;
  }
  tokens = std::move(out);
}

void set_flag(std::vector<std::string>& tokens, const std::string& flag, const std::string& value) {
  remove_flag(tokens, flag);
  tokens.push_back(flag);
  tokens.push_back(value);
}

std::string shell_join(const std::vector<std::string>& tokens) {
  std::string out;
  for (const std::string& t : tokens) {
    if (!out.empty()) out += ' ';
    const bool plain = !t.empty() && t.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                                                         "-_./=:,+@%") == std::string::npos;
    if (plain) {
      out += t;
      continue;
    }
    out += '\'';
    for (char c : t) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    out += '\'';
  }
  return out;
}

int auto_settings_main(const ArgParser& parser, Arguments& args, FeatureRegistry& registry, int argc, char** argv) {
  const AutoSettingsArgs& as = args.auto_settings;
  auto usage = [](const Status& s) {
    std::fprintf(stderr, "gale pretrain: error: %s\n", s.message().c_str());
    return 2;
  };
  if (launcher_world_size() > 1)
    return usage(InvalidArgument("--auto-settings: run it as one process (it starts its profiling runs with mpiexec "
                                 "itself); found a launcher world of ", launcher_world_size(), " ranks"));
  // The command line as the target would run it: its layout against --auto-settings-ranks.
  Status st = validate_all_pretrain_args(args, parser, as.auto_settings_ranks);
  if (!st.ok()) return usage(st);
  std::vector<std::string> notices;
  st = registry.resolve(make_feature_context(args, parser, registry), &notices);
  if (!st.ok()) return usage(st);
  st = unsupported_combinations(args);
  if (!st.ok()) return usage(st);

  const std::string work_dir = as.auto_settings_work_dir.empty() ? std::filesystem::current_path().string()
                                                                  : as.auto_settings_work_dir;
  std::error_code ec;
  std::filesystem::create_directories(work_dir, ec);
  if (ec || !std::filesystem::is_directory(work_dir))
    return usage(InvalidArgument("--auto-settings-work-dir ", work_dir, ": cannot create the directory"));
  const ModelArgs& model = args.model;
  const int64_t mbs = args.training.micro_batch_size;
  const int64_t threads = args.training.num_threads > 0
                              ? args.training.num_threads
                              : std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()) / as.nproc_per_node);
  const double memory_limit = as.auto_settings_memory_limit_gib > 0.0
                                  ? as.auto_settings_memory_limit_gib * 1024.0 * 1024.0 * 1024.0
                                  : static_cast<double>(host_memory_bytes()) / static_cast<double>(as.nproc_per_node);
  const bool verbose = as.auto_settings_log_level != "warning";

  // ---- (1) profiling runs ----
  std::vector<std::pair<int64_t, int64_t>> pairs = {{1, 1}};
  if (as.nproc_per_node >= 2) {
    if (model.num_attention_heads % 2 == 0 && model.num_kv_heads % 2 == 0 && model.ffn_hidden_size % 2 == 0)
      pairs.push_back({2, 1});
    const bool ulysses = args.parallel.context_parallel_algo == "ulysses_cp_algo";
    if (ulysses ? model.num_attention_heads % 2 == 0 : model.seq_length % 4 == 0) pairs.push_back({1, 2});
  }
  std::vector<std::string> base(argv + 1, argv + argc);
  for (const std::string& f : auto_settings_flags()) remove_flag(base, f);
  for (const char* f : {"--save", "--load", "--save-interval", "--tensorboard-dir", "--exit-interval",
                        "--exit-duration-in-mins", "--train-samples", "--rampup-batch-size", "--eval-interval",
                        "--prof-file", "--wandb-project", "--log-progress"})
    remove_flag(base, f);
  const std::string exe = self_executable(argv[0]);
  const char* mpiexec_env = std::getenv("GALE_MPIEXEC");
  const std::string mpiexec = mpiexec_env && *mpiexec_env ? mpiexec_env : GALE_DEFAULT_MPIEXEC;
  if (verbose)
    print_rank0(str_cat("auto settings: profiling ", pairs.size() * 2, " runs in ", work_dir, " (", threads,
                        " threads per rank)"));
  std::vector<RunProfile> profiles;
  nlohmann::ordered_json profile_list = nlohmann::ordered_json::array();
  for (const auto& [tp, cp] : pairs) {
    for (int64_t layers : {1, 2}) {
      const std::string stem = str_cat(work_dir, "/profile_tp", tp, "_cp", cp, "_l", layers);
      std::vector<std::string> run = base;
      set_flag(run, "--num-layers", std::to_string(layers));
      set_flag(run, "--tensor-model-parallel-size", std::to_string(tp));
      set_flag(run, "--context-parallel-size", std::to_string(cp));
      set_flag(run, "--pipeline-model-parallel-size", "1");
      set_flag(run, "--global-batch-size", std::to_string(mbs * kProfileMicroBatches));
      set_flag(run, "--train-iters", std::to_string(kProfileIters));
      set_flag(run, "--eval-iters", "0");
      set_flag(run, "--log-interval", std::to_string(kProfileIters + 1));
      set_flag(run, "--timing-log-level", "1");
      set_flag(run, "--num-threads", std::to_string(threads));
      set_flag(run, "--prof-file", stem + ".json");
      std::vector<std::string> cmd;
      if (tp * cp > 1) cmd = {mpiexec, "-np", std::to_string(tp * cp)};
      cmd.push_back(exe);
      cmd.push_back("pretrain");
      cmd.insert(cmd.end(), run.begin(), run.end());
      std::filesystem::remove(stem + ".json", ec);
      const int rc = run_logged(cmd, stem + ".log");
      if (rc != 0) {
        std::fprintf(stderr, "gale pretrain: error: --auto-settings: profiling run tp=%lld cp=%lld layers=%lld failed "
                     "(exit %d); its output is in %s.log\n", static_cast<long long>(tp), static_cast<long long>(cp),
                     static_cast<long long>(layers), rc, stem.c_str());
        return 1;
      }
      StatusOr<RunProfile> p = read_profile(stem + ".json");
      if (!p.ok()) {
        std::fprintf(stderr, "gale pretrain: error: --auto-settings: %s\n", p.status().message().c_str());
        return 1;
      }
      if (verbose)
        print_rank0(str_cat("  profiled tp=", tp, " cp=", cp, " layers=", layers, ": step ",
                            fixed_str(p.value().step_seconds, 4), " s, peak ", p.value().max_peak_bytes(), " bytes"));
      profile_list.push_back({{"file", stem + ".json"}, {"tp", tp}, {"cp", cp}, {"num_layers", layers},
                              {"step_seconds", p.value().step_seconds}, {"peak_bytes", p.value().max_peak_bytes()}});
      profiles.push_back(std::move(p).value());
    }
  }

  // ---- (2) models ----
  AutoTarget target;
  target.num_layers = model.num_layers;
  target.micro_batch_size = mbs;
  target.global_batch_size = args.training.global_batch_size;
  target.seq_length = model.seq_length;
  target.hidden_size = model.hidden_size;
  target.tied_embeddings = !model.untie_embeddings_and_output_weights;
  target.distributed_optimizer = args.parallel.use_distributed_optimizer;
  target.sequence_parallel = args.parallel.sequence_parallel;
  target.shardable_bytes_per_param =
      args.training.optimizer == "sgd" ? (args.training.sgd_momentum > 0.0 ? 4.0 : 0.0) : 8.0;
  target.ranks_per_node = as.auto_settings_ranks / as.target_nnodes;
  target.inter_node_bandwidth_ratio = as.auto_settings_inter_node_bandwidth_ratio;
  StatusOr<AutoModels> fitted = fit_auto_models(profiles, target);
  if (!fitted.ok()) {
    std::fprintf(stderr, "gale pretrain: error: %s\n", fitted.status().message().c_str());
    return 1;
  }
  const AutoModels& m = fitted.value();

  // ---- (3) search ----
  AutoSearchSpace space;
  space.world_size = as.auto_settings_ranks;
  space.num_layers = model.num_layers;
  space.num_attention_heads = model.num_attention_heads;
  space.num_query_groups = model.num_kv_heads;
  space.ffn_hidden_size = model.ffn_hidden_size;
  space.seq_length = model.seq_length;
  space.micro_batch_size = mbs;
  space.global_batch_size = args.training.global_batch_size;
  space.cp_algo = args.parallel.context_parallel_algo;
  space.memory_limit_bytes = memory_limit;
  const AutoSearchResult found = search_layouts(m, space);

  // ---- (4) result ----
  std::vector<std::string> best_cmd;
  if (!found.ranked.empty()) {
    const AutoLayout& b = found.ranked.front().layout;
    std::vector<std::string> tokens(argv + 1, argv + argc);
    for (const std::string& f : auto_settings_flags()) remove_flag(tokens, f);
    set_flag(tokens, "--tensor-model-parallel-size", std::to_string(b.tp));
    set_flag(tokens, "--context-parallel-size", std::to_string(b.cp));
    set_flag(tokens, "--pipeline-model-parallel-size", std::to_string(b.pp));
    best_cmd = {"mpiexec", "-np", std::to_string(as.auto_settings_ranks), "gale", "pretrain"};
    best_cmd.insert(best_cmd.end(), tokens.begin(), tokens.end());
  }
  nlohmann::ordered_json j;
  j["magic"] = kResultMagic;
  j["version"] = kResultVersion;
  j["type"] = as.auto_settings_type;
  j["target"] = {{"ranks", as.auto_settings_ranks}, {"nnodes", as.target_nnodes}, {"ranks_per_node", target.ranks_per_node},
                 {"memory_limit_bytes", static_cast<int64_t>(memory_limit)}};
  j["profiles"] = profile_list;
  nlohmann::ordered_json pairs_json = nlohmann::ordered_json::array();
  for (const PairMeasure& p : m.pairs)
    pairs_json.push_back({{"tp", p.tp}, {"cp", p.cp}, {"layer_params", p.layer_params}, {"fixed_params", p.fixed_params},
                          {"layer_activation_bytes", p.layer_activation}, {"fixed_activation_bytes", p.fixed_activation},
                          {"layer_seconds", p.layer_seconds}, {"fixed_seconds", p.fixed_seconds},
                          {"layer_comm_bytes", p.layer_comm_bytes}});
  j["models"] = {{"bytes_per_param", m.bytes_per_param}, {"persistent_intercept_bytes", m.persistent_intercept},
                 {"shardable_bytes_per_param", target.shardable_bytes_per_param},
                 {"layer_params", fit_json(m.layer_params)}, {"fixed_params", fit_json(m.fixed_params)},
                 {"layer_activation_bytes", fit_json(m.layer_activation)},
                 {"fixed_activation_bytes", fit_json(m.fixed_activation)}, {"fixed_seconds", fit_json(m.fixed_seconds)},
                 {"layer_seconds_tp1", m.layer_seconds_1}, {"layer_comm_bytes", m.layer_comm_bytes},
                 {"intra_node_bandwidth", m.intra_bandwidth}, {"bandwidth_measured", m.bandwidth_measured},
                 {"inter_node_bandwidth", m.intra_bandwidth * target.inter_node_bandwidth_ratio},
                 {"optimizer_seconds_per_param", m.optimizer_seconds_per_param}, {"pairs", pairs_json}};
  nlohmann::ordered_json cands = nlohmann::ordered_json::array();
  for (const AutoCandidate& c : found.ranked) cands.push_back(candidate_json(c));
  for (const AutoCandidate& c : found.over_memory) cands.push_back(candidate_json(c));
  j["candidates"] = cands;
  j["excluded"] = found.excluded;
  if (!best_cmd.empty()) {
    const AutoLayout& b = found.ranked.front().layout;
    j["best"] = {{"tp", b.tp}, {"cp", b.cp}, {"pp", b.pp}, {"dp", b.dp}, {"command", shell_join(best_cmd)}};
  } else {
    j["best"] = nullptr;
  }
  const std::string result_path = work_dir + "/auto_settings.json";
  {
    std::ofstream out(result_path, std::ios::binary | std::ios::trunc);
    out << j.dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "gale pretrain: error: --auto-settings-work-dir: cannot write %s\n", result_path.c_str());
      return 1;
    }
  }
  if (verbose) {
    print_rank0(str_cat("auto settings: ", found.ranked.size(), " layouts of ", as.auto_settings_ranks, " ranks (",
                        as.target_nnodes, " nodes) fit ", gib(memory_limit), " per rank; ", found.over_memory.size(),
                        " do not; ", found.excluded.size(), " cannot run this model"));
    const size_t shown = as.auto_settings_log_level == "debug" ? found.ranked.size() : std::min<size_t>(3, found.ranked.size());
    for (size_t i = 0; i < shown; ++i) {
      const AutoCandidate& c = found.ranked[i];
      print_rank0(str_cat("  #", i + 1, " ", layout_name(c.layout), ": step ", fixed_str(c.prediction.step_seconds, 4),
                          " s, peak ", gib(c.prediction.peak_bytes)));
    }
    if (as.auto_settings_log_level == "debug")
      for (const AutoCandidate& c : found.over_memory)
        print_rank0(str_cat("  over memory: ", layout_name(c.layout), ": peak ", gib(c.prediction.peak_bytes)));
  }
  print_rank0(str_cat("auto settings: result written to ", result_path));
  if (best_cmd.empty()) {
    std::fprintf(stderr, "gale pretrain: error: --auto-settings: no layout of %lld ranks fits %s per rank (the smallest "
                 "predicted peak is %s)\n", static_cast<long long>(as.auto_settings_ranks), gib(memory_limit).c_str(),
                 found.over_memory.empty() ? "none" : gib(found.over_memory.front().prediction.peak_bytes).c_str());
    return 1;
  }
  print_rank0(str_cat("auto settings: best layout ", layout_name(found.ranked.front().layout), ":"));
  print_rank0(shell_join(best_cmd));
  return 0;
}

}  // namespace gale
