// Console output for a (possibly multi-rank) job: which rank prints, and timestamps.
//
// Megatron prints start-up information on rank 0 and the training log line on the last rank;
// `set_log_identity` is called once by the launcher code with this process's global rank.
#pragma once

#include <cstdint>
#include <string>

namespace gale {

void set_log_identity(int global_rank, int world_size);
int log_rank();
int log_world_size();
bool is_first_rank();
bool is_last_rank();

// Print a line (newline added) to stdout when this process is rank 0 / the last rank / any rank.
// A text of several lines goes out one flushed line at a time: mpirun forwards each rank's output
// in chunks of its own and cuts a long write, so another rank's line then falls between whole lines.
void print_rank0(const std::string& line);
void print_rank_last(const std::string& line);
void print_all(const std::string& line);  // prefixed "[rank N] " when world > 1
void print_here(const std::string& line);  // this rank, unprefixed (the line names its rank itself)
void warn_rank0(const std::string& line);  // "WARNING: ..." on stderr, rank 0 only

// "2025-05-20 15:48:49" in local time, as Megatron's log line shows it.
std::string timestamp_now();

// Megatron's print_datetime on rank 0: "[<what>] datetime: 2025-05-20 15:48:49 ".
void print_datetime(const std::string& what);

// Monotonic seconds since an arbitrary origin.
double now_seconds();

// Human-readable byte count: "1.23 GiB".
std::string format_bytes(int64_t bytes);

}  // namespace gale
