// Megatron's straggler detector (--log-straggler): per rank, the time of the model's forward
// compute and the longest get_batch of each logging interval; at every log line rank 0 prints the
// fastest and slowest rank of each reading and each rank's estimated throughput.
//
// As Megatron's StragglerDetector (megatron/core/utils.py, core_v0.12.1):
// - "Rtt" is the forward compute per iteration in ms (every forward-compute scope of the timers,
//   less the batch-generator scopes inside it: Megatron times `model(...)` in forward_step, not
//   get_batch); "DRtt" the longest single get_batch of the interval in ms;
// - "Etpt" is the interval's model FLOPs per iteration ÷ (Rtt × world size), in TFLOP/s, ÷ 3 (the
//   forward's share of forward + backward);
// - with --straggler-minmax-count K, 1 < K < world size, two more lines list the K ranks of
//   lowest and highest Etpt;
// - rank 0 listens on --straggler-ctrlr-port (default 65535): any TCP connection (e.g.
//   `curl host:port`) asks to toggle collection, which all ranks apply at the next log line
//   ("Toggling StragglerDetector State ON|OFF"); --disable-straggler-on-startup starts it off. A
//   port that cannot be bound leaves the detector uncontrollable, with a warning (as Megatron).
// Megatron's Pwr / Tmp / Utl / Clk are the GPU's. Gale reports this rank's CPUs instead:
// - the package power from the RAPL energy counter over the interval;
// - the hottest thermal zone;
// - the process's CPU time over wall time × threads;
// - the mean core clock of /proc/cpuinfo.
// A reading the machine does not expose (no RAPL or thermal zone, common in VMs) is 0.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "core/timers.h"

namespace gale {

struct StragglerOptions {
  bool enabled = true;   // not --disable-straggler-on-startup
  int port = 65535;      // --straggler-ctrlr-port
  int minmax_count = 1;  // --straggler-minmax-count
  int num_threads = 1;   // the process's compute threads (for the utilisation)
};

// One rank's readings of one interval.
struct StragglerSample {
  double rtt_ms = 0, batch_ms = 0, temp_c = 0, power_w = 0, util_pct = 0, clock_mhz = 0, etpt_tflops = 0;
};

// The lines rank 0 prints for the gathered samples (samples[r] is rank r's), as Megatron words them;
// `now` is the timestamp shown.
std::vector<std::string> straggler_report_lines(const std::vector<StragglerSample>& samples, int minmax_count,
                                                const std::string& now);

class StragglerDetector : public TimerScopeObserver {
 public:
  StragglerDetector(Comm world, StragglerOptions options);
  ~StragglerDetector() override;
  StragglerDetector(const StragglerDetector&) = delete;
  StragglerDetector& operator=(const StragglerDetector&) = delete;

  bool enabled() const { return !off_; }
  int bound_port() const { return bound_port_; }  // 0 when not listening (other ranks, bind failed)

  void scope_begin(const char* name) override;
  void scope_end(const char* name, double seconds) override;

  // Megatron's report(total_flops, log_interval), called by every rank at each log line with the
  // model FLOPs of the interval's iterations: gathers the readings (when on) and applies a pending
  // toggle. Returns the lines rank 0 prints (none on other ranks, or when off).
  std::vector<std::string> report(double total_flops, int64_t log_interval);

 private:
  void serve();  // rank 0's controller thread
  StragglerSample read_machine();

  Comm world_;
  StragglerOptions options_;
  std::atomic<bool> off_{true};  // read by the controller thread
  // This interval's readings (the training thread).
  double compute_s_ = 0, nested_batch_s_ = 0, max_batch_s_ = 0;
  int forward_depth_ = 0;
  // The CPU readings' previous values.
  double last_wall_ = 0, last_cpu_ = 0, last_energy_uj_ = -1;
  // The controller.
  int listen_fd_ = -1;
  int bound_port_ = 0;
  std::atomic<bool> toggle_{false};
  std::atomic<bool> stop_{false};
  std::thread server_;
};

}  // namespace gale
