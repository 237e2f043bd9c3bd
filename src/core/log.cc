// Rank-aware printing.
#include "core/log.h"

#include "core/datetime.h"

#include <chrono>
#include <cstdio>
#include <ctime>

namespace gale {

namespace {
int g_rank = 0;
int g_world = 1;
}  // namespace

void set_log_identity(int global_rank, int world_size) {
  g_rank = global_rank;
  g_world = world_size;
}
int log_rank() { return g_rank; }
int log_world_size() { return g_world; }
bool is_first_rank() { return g_rank == 0; }
bool is_last_rank() { return g_rank == g_world - 1; }

// Megatron main's print_datetime: "[what] datetime: YYYY-mm-dd HH:MM:SS.ffffff ".
void print_datetime(const std::string& what) { print_rank0("[" + what + "] datetime: " + datetime_now_micros() + " "); }

namespace {
// `text` and a newline on stdout, `prefix` before its first line, one write per line (each line is
// flushed): under mpirun, another rank's output then falls between whole lines of a long report.
void write_lines(const char* prefix, const std::string& text) {
  size_t begin = 0;
  do {
    const size_t end = text.find('\n', begin);
    if (begin == 0) std::fputs(prefix, stdout);
    std::fwrite(text.data() + begin, 1, (end == std::string::npos ? text.size() : end) - begin, stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    begin = end == std::string::npos ? std::string::npos : end + 1;
  } while (begin != std::string::npos);
}
}  // namespace

void print_rank0(const std::string& line) {
  if (is_first_rank()) write_lines("", line);
}

void print_rank_last(const std::string& line) {
  if (is_last_rank()) write_lines("", line);
}

void print_all(const std::string& line) {
  char prefix[32] = "";
  if (g_world > 1) std::snprintf(prefix, sizeof prefix, "[rank %d] ", g_rank);
  write_lines(prefix, line);
}

void print_here(const std::string& line) { write_lines("", line); }

void warn_rank0(const std::string& line) {
  if (!is_first_rank()) return;
  std::fprintf(stderr, "WARNING: %s\n", line.c_str());
  std::fflush(stderr);
}

std::string timestamp_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.2f %s" : "%.0f %s", v, units[u]);
  return buf;
}

}  // namespace gale
