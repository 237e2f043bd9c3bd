// Megatron's straggler detector: interval readings, the gather to rank 0, the toggle controller.
#include "train/straggler_detector.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <sstream>

#include "core/log.h"
#include "core/status.h"

namespace gale {

namespace {

constexpr double kForwardShareOfFlops = 3.0;  // Megatron's amp: the timers see the forward only

std::string value_with_rank(double value, const char* unit, int rank) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f%s/%d", value, unit, rank);
  return buf;
}

double process_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double read_number(const std::string& path, double fallback) {
  std::ifstream in(path);
  double v;
  return in >> v ? v : fallback;
}

double hottest_thermal_zone_c() {
  double hottest = 0.0;
  if (DIR* d = ::opendir("/sys/class/thermal")) {
    while (dirent* e = ::readdir(d))
      if (std::strncmp(e->d_name, "thermal_zone", 12) == 0)
        hottest = std::max(hottest, read_number(std::string("/sys/class/thermal/") + e->d_name + "/temp", 0.0) / 1000.0);
    ::closedir(d);
  }
  return hottest;
}

double mean_core_mhz() {
  std::ifstream in("/proc/cpuinfo");
  double sum = 0.0;
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("cpu MHz", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    sum += std::atof(line.c_str() + colon + 1);
    ++n;
  }
  return n ? sum / n : 0.0;
}

}  // namespace

std::vector<std::string> straggler_report_lines(const std::vector<StragglerSample>& samples, int minmax_count,
                                                const std::string& now) {
  std::vector<std::string> lines;
  if (samples.empty()) return lines;
  const int world = static_cast<int>(samples.size());
  // The first rank of the least and of the greatest value (Python's min() and max()).
  auto extremes = [&](double StragglerSample::*field, const char* unit, const char* label) {
    int lo = 0, hi = 0;
    for (int r = 1; r < world; ++r) {
      if (samples[r].*field < samples[lo].*field) lo = r;
      if (samples[r].*field > samples[hi].*field) hi = r;
    }
    return str_cat("Mn", label, "/Rnk: ", value_with_rank(samples[lo].*field, unit, lo), " | Mx", label, "/Rnk: ",
                   value_with_rank(samples[hi].*field, unit, hi), " | ");
  };
  std::vector<int> by_etpt(static_cast<size_t>(world));
  std::iota(by_etpt.begin(), by_etpt.end(), 0);
  std::stable_sort(by_etpt.begin(), by_etpt.end(),
                   [&](int a, int b) { return samples[a].etpt_tflops < samples[b].etpt_tflops; });
  const int low = by_etpt.front(), high = by_etpt.back();
  lines.push_back(str_cat(now, " | ", extremes(&StragglerSample::rtt_ms, "ms", "Rtt"),
                          extremes(&StragglerSample::power_w, "W", "Pwr"), extremes(&StragglerSample::temp_c, "C", "Tmp"),
                          extremes(&StragglerSample::util_pct, "%", "Utl"),
                          extremes(&StragglerSample::clock_mhz, "MHz", "Clk"),
                          extremes(&StragglerSample::batch_ms, "ms", "DRtt"), "MnEtpt/Rnk: ",
                          value_with_rank(samples[low].etpt_tflops, "TF", low),
                          " | MxEtpt/Rnk: ", value_with_rank(samples[high].etpt_tflops, "TF", high)));
  if (minmax_count > 1 && minmax_count < world) {
    std::string bottom = str_cat("^^^^ Bottom ", minmax_count, " Ranks with lowest  Etpt(TF):");
    std::string top = str_cat("^^^^ Top    ", minmax_count, " Ranks with highest Etpt(TF):");
    for (int i = 0; i < minmax_count; ++i) {
      const int b = by_etpt[static_cast<size_t>(i)], t = by_etpt[static_cast<size_t>(world - minmax_count + i)];
      bottom += " " + value_with_rank(samples[b].etpt_tflops, "", b) + ",";
      top += " " + value_with_rank(samples[t].etpt_tflops, "", t) + ",";
    }
    lines.push_back(bottom);
    lines.push_back(top);
  }
  return lines;
}

StragglerDetector::StragglerDetector(Comm world, StragglerOptions options)
    : world_(std::move(world)), options_(options), off_(!options.enabled) {
  last_wall_ = now_seconds();
  last_cpu_ = process_cpu_seconds();
  last_energy_uj_ = read_number("/sys/class/powercap/intel-rapl:0/energy_uj", -1.0);
  if (world_->rank() != 0) return;
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(options_.port));
  if (listen_fd_ < 0 || ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listen_fd_, 128) != 0) {
    warn_rank0(str_cat("StragglerDetector cannot be controlled.. --straggler-ctrlr-port ", options_.port, ": ",
                       std::strerror(errno)));
    if (listen_fd_ >= 0) ::close(listen_fd_);
    listen_fd_ = -1;
    return;
  }
  bound_port_ = options_.port;
  print_rank0(str_cat("Controller ready to recv commands on port ", options_.port, ". Current state ",
                      off_ ? "OFF" : "ON"));
  server_ = std::thread([this] { serve(); });
}

StragglerDetector::~StragglerDetector() {
  stop_ = true;
  if (server_.joinable()) server_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void StragglerDetector::serve() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const int conn = ::accept(listen_fd_, nullptr, nullptr);
    if (conn < 0) continue;
    char request[1024];
    (void)::recv(conn, request, sizeof request, 0);
    toggle_ = true;  // one pending toggle, however many requests (Megatron's flag)
    const std::string msg =
        str_cat("Will turn StragglerDetector ", off_ ? "ON" : "OFF", " at next logging interval");
    const std::string reply =
        str_cat("HTTP/1.0 200 OK\r\nConnection: Close\r\nContent-length: ", msg.size(), "\r\n\r\n", msg);
    (void)::send(conn, reply.data(), reply.size(), MSG_NOSIGNAL);
    ::close(conn);
    print_rank0(msg);
  }
}

void StragglerDetector::scope_begin(const char* name) {
  if (!off_ && std::strcmp(name, "forward-compute") == 0) ++forward_depth_;
}

void StragglerDetector::scope_end(const char* name, double seconds) {
  if (off_) return;
  if (std::strcmp(name, "batch-generator") == 0) {
    max_batch_s_ = std::max(max_batch_s_, seconds);
    if (forward_depth_ > 0) nested_batch_s_ += seconds;
  } else if (std::strcmp(name, "forward-compute") == 0) {
    compute_s_ += seconds;
    if (forward_depth_ > 0 && --forward_depth_ == 0) {
      compute_s_ -= nested_batch_s_;
      nested_batch_s_ = 0.0;
    }
  }
}

StragglerSample StragglerDetector::read_machine() {
  StragglerSample s;
  const double wall = now_seconds(), cpu = process_cpu_seconds();
  const double energy = read_number("/sys/class/powercap/intel-rapl:0/energy_uj", -1.0);
  const double dt = wall - last_wall_;
  if (dt > 0.0) {
    s.util_pct = 100.0 * (cpu - last_cpu_) / (dt * std::max(1, options_.num_threads));
    if (energy >= 0.0 && last_energy_uj_ >= 0.0 && energy >= last_energy_uj_)
      s.power_w = (energy - last_energy_uj_) * 1e-6 / dt;
  }
  last_wall_ = wall;
  last_cpu_ = cpu;
  last_energy_uj_ = energy;
  s.temp_c = hottest_thermal_zone_c();
  s.clock_mhz = mean_core_mhz();
  return s;
}

std::vector<std::string> StragglerDetector::report(double total_flops, int64_t log_interval) {
  std::vector<std::string> lines;
  if (!off_ && total_flops > 0.0 && log_interval > 0) {
    StragglerSample s = read_machine();
    const double interval = static_cast<double>(log_interval);
    s.rtt_ms = 1e3 * compute_s_ / interval;
    s.batch_ms = 1e3 * max_batch_s_;
    const double world = static_cast<double>(world_->size());
    if (s.rtt_ms > 0.0) s.etpt_tflops = total_flops / interval / (s.rtt_ms * 1e9 * world) / kForwardShareOfFlops;
    compute_s_ = nested_batch_s_ = max_batch_s_ = 0.0;
    const double mine[7] = {s.rtt_ms, s.batch_ms, s.temp_c, s.power_w, s.util_pct, s.clock_mhz, s.etpt_tflops};
    std::vector<double> all(7 * static_cast<size_t>(world_->size()));
    world_->all_gather(mine, all.data(), 7, DType::kF64);
    if (world_->rank() == 0) {
      std::vector<StragglerSample> samples(static_cast<size_t>(world_->size()));
      for (size_t r = 0; r < samples.size(); ++r) {
        const double* v = &all[7 * r];
        samples[r] = StragglerSample{v[0], v[1], v[2], v[3], v[4], v[5], v[6]};
      }
      lines = straggler_report_lines(samples, options_.minmax_count, "[" + timestamp_now() + "]");
    }
  }
  // Megatron's _check_toggle: rank 0's decision, broadcast.
  int64_t off = off_;
  if (world_->rank() == 0 && toggle_.exchange(false)) off = !off_;
  world_->broadcast(&off, 1, DType::kI64, 0);
  if ((off != 0) != off_) {
    off_ = off != 0;
    compute_s_ = nested_batch_s_ = max_batch_s_ = 0.0;
    forward_depth_ = 0;
    read_machine();  // the next interval's CPU readings start here
    if (world_->rank() == 0) lines.push_back(str_cat("Toggling StragglerDetector State ", off_ ? "OFF" : "ON"));
  }
  return lines;
}

}  // namespace gale
