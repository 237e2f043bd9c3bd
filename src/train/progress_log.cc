// Megatron's progress.txt (--log-progress).
#include "train/progress_log.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/log.h"

namespace gale {

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string part;
  std::istringstream in(s);
  while (std::getline(in, part, sep)) out.push_back(part);
  return out;
}

// The value of a "Name: value" field (Megatron's _get_field), or "" when it has none.
std::string field_value(const std::string& field) {
  const size_t colon = field.find(": ");
  return colon == std::string::npos ? "" : field.substr(colon + 2);
}

// "2026-12-01 10:00:00" (local time) in seconds since the epoch; nullopt when malformed.
std::optional<double> parse_local_time(const std::string& text) {
  std::tm tm{};
  if (std::sscanf(text.c_str(), "%d-%d-%d %d:%d:%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
                  &tm.tm_sec) != 6)
    return std::nullopt;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  tm.tm_isdst = -1;
  const std::time_t t = std::mktime(&tm);
  if (t == static_cast<std::time_t>(-1)) return std::nullopt;
  return static_cast<double>(t);
}

}  // namespace

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string progress_line(const std::string& time, const std::string& job_id, int64_t world_size,
                          const std::string& text) {
  return str_cat(time, "\tJob ID: ", job_id, "\t# GPUs: ", world_size, "\t", text);
}

std::string saved_checkpoint_text(bool async_save, int64_t iteration, double job_throughput,
                                  double cumulative_throughput, double floating_point_operations, int64_t tokens) {
  char numbers[256];
  std::snprintf(numbers, sizeof numbers,
                "Job throughput: %.1f TFLOP/s/GPU\tCumulative throughput: %.1f TFLOP/s/GPU\t"
                "Floating-point operations: %.2e\tTokens (in billions): %.2f",
                job_throughput, cumulative_throughput, floating_point_operations, static_cast<double>(tokens) / 1e9);
  return str_cat(async_save ? "Saving async checkpoint" : "Saved checkpoint", "\tIteration: ", iteration, "\t",
                 numbers);
}

std::optional<ProgressStart> progress_start(const std::string& contents, int64_t world_size) {
  std::optional<ProgressStart> start;
  double latest = 0.0;  // the floating-point operations of the last "Saved checkpoint" line so far
  for (const std::string& line : split(contents, '\n')) {
    const std::vector<std::string> tokens = split(line, '\t');
    if (tokens.size() < 4) continue;
    if (tokens[3] == "Saved checkpoint" && tokens.size() > 7) latest = std::strtod(field_value(tokens[7]).c_str(), nullptr);
    if (std::strtoll(field_value(tokens[2]).c_str(), nullptr, 10) != world_size) {
      start.reset();  // a job of another world size: start again after it
      continue;
    }
    if (tokens[3] == "Starting job" && !start) start = ProgressStart{tokens[0], latest};
  }
  return start;
}

ProgressLog::ProgressLog(std::string save_dir, Comm world, double job_start_seconds)
    : save_dir_(std::move(save_dir)), world_(std::move(world)), job_start_seconds_(job_start_seconds) {}

std::string ProgressLog::path() const {
  return save_dir_.empty() ? "" : (std::filesystem::path(save_dir_) / "progress.txt").string();
}

Status ProgressLog::append(const std::string& text) {
  if (save_dir_.empty()) return Status::Ok();
  world_->barrier();
  return world_->rank() == 0 ? write(text) : Status::Ok();
}

Status ProgressLog::write(const std::string& text) {
  std::error_code ec;
  std::filesystem::create_directories(save_dir_, ec);
  std::ofstream out(path(), std::ios::app);
  const char* job_id = std::getenv("SLURM_JOB_ID");
  out << progress_line(timestamp_now(), job_id ? job_id : "", world_->size(), text) << "\n";
  out.flush();
  if (!out) return IOError("--log-progress: cannot append to ", path());
  return Status::Ok();
}

Status ProgressLog::saved_checkpoint(int64_t iteration, double floating_point_operations_so_far,
                                     double job_start_floating_point_operations, int64_t tokens_so_far,
                                     bool async_save) {
  if (save_dir_.empty()) return Status::Ok();
  world_->barrier();
  if (world_->rank() != 0) return Status::Ok();  // rank 0 writes
  const double world = static_cast<double>(world_->size());
  const double now = wall_seconds();
  const double job_throughput = (floating_point_operations_so_far - job_start_floating_point_operations) /
                                ((now - job_start_seconds_) * 1e12 * world);
  std::ifstream in(path());
  std::stringstream contents;
  contents << in.rdbuf();
  const std::optional<ProgressStart> start = progress_start(contents.str(), world_->size());
  const std::optional<double> start_seconds = start ? parse_local_time(start->time) : std::nullopt;
  if (!start_seconds)
    return FailedPrecondition("--log-progress: ", path(), " holds no 'Starting job' line of a job with ",
                              world_->size(), " processes");
  // The file's times have whole seconds: a save within the job's first second reports 0.
  const double elapsed = now - *start_seconds;
  const double cumulative_throughput =
      elapsed >= 1.0 ? (floating_point_operations_so_far - start->floating_point_operations) / (elapsed * 1e12 * world)
                     : 0.0;
  return write(saved_checkpoint_text(async_save, iteration, job_throughput, cumulative_throughput,
                                     floating_point_operations_so_far, tokens_so_far));
}

}  // namespace gale
