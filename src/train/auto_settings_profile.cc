// The profile of a training run (--prof-file): recorder, JSON form, file I/O.
#include "train/auto_settings_profile.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/allocator.h"
#include "core/threads.h"
#include "core/timers.h"
#include "parallel/parallel_state.h"
#include "train/arguments.h"
#include "train/engine.h"

namespace gale {

namespace {

const char* const kTimerNames[2] = {"forward-backward", "optimizer"};

int64_t max_of(const std::vector<int64_t>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }

int64_t group_bytes(const Comm& c) { return c ? c->stats().total_bytes() : 0; }

}  // namespace

int64_t RunProfile::max_peak_bytes() const { return max_of(peak_bytes); }
int64_t RunProfile::max_persistent_bytes() const { return max_of(persistent_bytes); }
int64_t RunProfile::max_param_elems() const { return max_of(param_elems); }

ProfileRecorder::ProfileRecorder(Timers* timers, const ParallelState* ps, int64_t log_interval)
    : timers_(timers && timers->log_level() >= 1 ? timers : nullptr), ps_(ps), log_interval_(std::max<int64_t>(1, log_interval)) {}

// Seconds timer `which` gained since the last call. The training log resets the timers after
// the iterations that are multiples of --log-interval (after this observer ran).
double ProfileRecorder::timer_delta(int which) {
  if (!timers_ || !timers_->has(kTimerNames[which])) return 0.0;
  const double now = (*timers_)(kTimerNames[which], 1).elapsed(/*reset=*/false);
  const bool reset_since = last_iteration_ > 0 && last_iteration_ % log_interval_ == 0;
  const double delta = reset_since ? now : now - last_[which];
  last_[which] = now;
  return delta;
}

void ProfileRecorder::on_step(int64_t iteration, double seconds) {
  const double fb = timer_delta(0), opt = timer_delta(1);
  last_iteration_ = iteration;
  ++steps_;
  if (steps_ == 1) {  // warm-up: counters start after it
    ps_->reset_stats();
    return;
  }
  // The fastest measured iteration: the one least disturbed by other processes on the host.
  step_min_ = measured_ == 0 ? seconds : std::min(step_min_, seconds);
  fb_min_ = measured_ == 0 ? fb : std::min(fb_min_, fb);
  opt_min_ = measured_ == 0 ? opt : std::min(opt_min_, opt);
  ++measured_;
}

RunProfile ProfileRecorder::finish(const Arguments& args, const Engine& engine, double flops_per_iteration) {
  const Comm& world = ps_->world();
  RunProfile p;
  p.world_size = ps_->world_size();
  p.tp = ps_->tp_size();
  p.cp = ps_->cp_size();
  p.pp = ps_->pp_size();
  p.dp = ps_->dp_size();
  p.vpp = static_cast<int64_t>(engine.chunks.size());
  p.micro_batch_size = args.training.micro_batch_size;
  p.global_batch_size = args.training.global_batch_size;
  p.num_micro_batches = args.training.global_batch_size / std::max<int64_t>(1, args.training.micro_batch_size * p.dp);
  p.num_layers = args.model.num_layers;
  p.seq_length = args.model.seq_length;
  p.hidden_size = args.model.hidden_size;
  p.num_threads = num_threads();
  p.sequence_parallel = args.parallel.sequence_parallel;
  p.distributed_optimizer = args.parallel.use_distributed_optimizer;
  p.measured_iterations = measured_;
  p.flops_per_iteration = flops_per_iteration;
  const bool timed = timers_ != nullptr && measured_ > 0;
  double times[3] = {measured_ > 0 ? step_min_ : -1.0, timed ? fb_min_ : -1.0, timed ? opt_min_ : -1.0};
  world->all_reduce(times, 3, DType::kF64, ReduceOp::kMax);
  p.step_seconds = times[0];
  p.forward_backward_seconds = times[1];
  p.optimizer_seconds = times[2];
  int64_t params = 0;
  for (const auto& c : engine.chunks) params += c->params().numel();
  const int size = ps_->world_size(), rank = ps_->world_rank();
  std::vector<int64_t> mine(3 * static_cast<size_t>(size), 0);
  mine[static_cast<size_t>(rank)] = host_allocator().peak_bytes();
  mine[static_cast<size_t>(size + rank)] = host_allocator().current_bytes();
  mine[static_cast<size_t>(2 * size + rank)] = params;
  world->all_reduce(mine.data(), static_cast<int64_t>(mine.size()), DType::kI64, ReduceOp::kSum);
  p.peak_bytes.assign(mine.begin(), mine.begin() + size);
  p.persistent_bytes.assign(mine.begin() + size, mine.begin() + 2 * size);
  p.param_elems.assign(mine.begin() + 2 * size, mine.end());
  const int64_t per = std::max<int64_t>(1, measured_);
  int64_t comm[4] = {group_bytes(ps_->tp()) / per, group_bytes(ps_->cp()) / per, group_bytes(ps_->dp_cp()) / per,
                     group_bytes(ps_->pp()) / per};
  world->all_reduce(comm, 4, DType::kI64, ReduceOp::kMax);
  p.tp_comm_bytes = comm[0];
  p.cp_comm_bytes = comm[1];
  p.dp_comm_bytes = comm[2];
  p.pp_comm_bytes = comm[3];
  return p;
}

std::string profile_to_json(const RunProfile& p) {
  nlohmann::ordered_json j;
  j["magic"] = kProfileMagic;
  j["version"] = kProfileVersion;
  j["layout"] = {{"world_size", p.world_size}, {"tp", p.tp}, {"cp", p.cp}, {"pp", p.pp}, {"dp", p.dp}, {"vpp", p.vpp},
                 {"sequence_parallel", p.sequence_parallel}, {"distributed_optimizer", p.distributed_optimizer}};
  j["run"] = {{"micro_batch_size", p.micro_batch_size}, {"global_batch_size", p.global_batch_size},
              {"num_micro_batches", p.num_micro_batches}, {"num_layers", p.num_layers},
              {"seq_length", p.seq_length}, {"hidden_size", p.hidden_size}, {"num_threads", p.num_threads}};
  j["measured_iterations"] = p.measured_iterations;
  j["seconds"] = {{"step", p.step_seconds}, {"forward_backward", p.forward_backward_seconds},
                  {"optimizer", p.optimizer_seconds}};
  j["flops_per_iteration"] = p.flops_per_iteration;
  j["bytes"] = {{"peak", p.peak_bytes}, {"persistent", p.persistent_bytes}};
  j["param_elems"] = p.param_elems;
  j["comm_bytes_per_iteration"] = {
      {"tp", p.tp_comm_bytes}, {"cp", p.cp_comm_bytes}, {"dp", p.dp_comm_bytes}, {"pp", p.pp_comm_bytes}};
  return j.dump(2) + "\n";
}

StatusOr<RunProfile> profile_from_json(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument("not JSON");
  if (j.value("magic", std::string()) != kProfileMagic)
    return InvalidArgument("expected magic \"", kProfileMagic, "\", found ", j.contains("magic") ? j["magic"].dump() : "none");
  if (j.value("version", 0) != kProfileVersion)
    return InvalidArgument("expected version ", kProfileVersion, ", found ", j.contains("version") ? j["version"].dump() : "none");
  try {
    RunProfile p;
    const auto& l = j.at("layout");
    p.world_size = l.at("world_size");
    p.tp = l.at("tp");
    p.cp = l.at("cp");
    p.pp = l.at("pp");
    p.dp = l.at("dp");
    p.vpp = l.at("vpp");
    p.sequence_parallel = l.at("sequence_parallel");
    p.distributed_optimizer = l.at("distributed_optimizer");
    const auto& r = j.at("run");
    p.micro_batch_size = r.at("micro_batch_size");
    p.global_batch_size = r.at("global_batch_size");
    p.num_micro_batches = r.at("num_micro_batches");
    p.num_layers = r.at("num_layers");
    p.seq_length = r.at("seq_length");
    p.hidden_size = r.at("hidden_size");
    p.num_threads = r.at("num_threads");
    p.measured_iterations = j.at("measured_iterations");
    const auto& s = j.at("seconds");
    p.step_seconds = s.at("step");
    p.forward_backward_seconds = s.at("forward_backward");
    p.optimizer_seconds = s.at("optimizer");
    p.flops_per_iteration = j.at("flops_per_iteration");
    p.peak_bytes = j.at("bytes").at("peak").get<std::vector<int64_t>>();
    p.persistent_bytes = j.at("bytes").at("persistent").get<std::vector<int64_t>>();
    p.param_elems = j.at("param_elems").get<std::vector<int64_t>>();
    const auto& c = j.at("comm_bytes_per_iteration");
    p.tp_comm_bytes = c.at("tp");
    p.cp_comm_bytes = c.at("cp");
    p.dp_comm_bytes = c.at("dp");
    p.pp_comm_bytes = c.at("pp");
    if (static_cast<int64_t>(p.peak_bytes.size()) != p.world_size ||
        static_cast<int64_t>(p.persistent_bytes.size()) != p.world_size ||
        static_cast<int64_t>(p.param_elems.size()) != p.world_size)
      return InvalidArgument("expected one peak, persistent and param_elems value per rank (", p.world_size, ")");
    return p;
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument("malformed profile: ", e.what());
  }
}

Status write_profile(const RunProfile& p, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return InvalidArgument("--prof-file ", path, ": cannot open it for writing");
  out << profile_to_json(p);
  out.close();
  if (!out) return InvalidArgument("--prof-file ", path, ": write failed");
  return Status::Ok();
}

StatusOr<RunProfile> read_profile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgument(path, ": cannot open the profile");
  std::stringstream ss;
  ss << in.rdbuf();
  StatusOr<RunProfile> p = profile_from_json(ss.str());
  if (!p.ok()) return InvalidArgument(path, ": ", p.status().message());
  return p;
}

}  // namespace gale
