// --profile's trace: a recorder of what this rank does (step phases, kernels, communication) as
// Chrome trace events, written as one JSON file (docs/formats/trace.md) that Perfetto and
// chrome://tracing open.
//
// One recorder per process records at a time: `TraceRecorder::open_window()` makes it the active
// one and `close_window()` stops it (train/profiler.h opens it for --profile-step-start ..
// --profile-step-end). Instrumented code asks `trace_active(category)`, a relaxed load of one
// process-wide word, and records only when it says yes: outside a window, or without --profile,
// an instrumented call costs that load and a branch, and allocates nothing.
//
// Events carry a category, which --profile-level selects (train/profiler.h):
//   kStep    the training step's phases: iteration, forward-compute / backward-compute per
//            micro-batch and model chunk, the gradient reductions, the optimizer (core/timers.h's
//            scopes) — every level;
//   kKernel  every op-table call, GEMMs included (kernels/op_trace.h) — level0 and up;
//   kComm    every collective and point-to-point call with its bytes, and the time waited for it
//            (comm/communicator.h) — level1 and up.
// Options: `shapes` (--profile-record-shapes; always at level2) adds each kernel call's sizes to its
// arguments, `memory` (--profile-with-memory) adds the allocator's live bytes at a span's end and
// their change over it, and a "host memory" counter track.
//
// The recorder also keeps the current scope's name per thread (`current_trace_tag()`), the tag the
// allocator's memory history (core/memory_history.h) gives each allocation; scopes maintain it
// while a window is open or a memory history records.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace gale {

enum class TraceCategory : uint32_t { kStep = 1, kKernel = 2, kComm = 4 };

// One integer argument of an event ("microbatch": 3, "bytes": 4096, ...); `key` has static storage.
struct TraceArg {
  const char* key = nullptr;
  int64_t value = 0;
};

struct TraceOptions {
  uint32_t categories = static_cast<uint32_t>(TraceCategory::kStep);  // bitwise or of TraceCategory
  bool shapes = false;  // kernel calls' sizes as arguments
  bool memory = false;  // live bytes at each span's end, their change over it, and a counter track
};

// A recorded event. ph: 'X' complete (ts, dur), 'i' instant, 'C' counter (args are the series).
struct TraceEvent {
  char ph = 'X';
  TraceCategory cat = TraceCategory::kStep;
  int tid = 0;
  int64_t ts_ns = 0, dur_ns = 0;  // since the recorder's origin
  std::string name;
  std::string text_key, text;  // one optional string argument (the communicator's group)
  std::vector<TraceArg> args;
};

class TraceRecorder {
 public:
  TraceRecorder(TraceOptions options, int rank);
  ~TraceRecorder();
  TraceRecorder(const TraceRecorder&) = delete;
  TraceRecorder& operator=(const TraceRecorder&) = delete;

  const TraceOptions& options() const { return options_; }
  int rank() const { return rank_; }
  // Starts recording into this recorder (the process's active one: GALE_CHECKs that no other is
  // open) and stops it; events recorded so far are kept.
  void open_window();
  void close_window();
  bool window_open() const;

  // Nanoseconds since this recorder was made (the events' clock: steady_clock).
  int64_t now_ns() const;
  // Thread-safe. Called by the scopes below; tests may call it directly.
  void record(TraceEvent event);
  std::vector<TraceEvent> events() const;
  size_t size() const;

  // The Chrome trace-event JSON ("traceEvents" plus Gale's "otherData": rank, options).
  std::string to_json() const;
  // Writes to_json() to `path` (creating its directory); an error names the path.
  Status write(const std::string& path) const;

 private:
  TraceOptions options_;
  int rank_;
  int64_t origin_ns_;
  mutable std::mutex mu_;
  std::vector<TraceEvent> events_;
};

namespace trace_internal {
// Bits of TraceCategory while a window is open (0 otherwise), and whether scopes keep tags.
extern std::atomic<uint32_t> g_categories;
extern std::atomic<bool> g_tags;
extern std::atomic<TraceRecorder*> g_recorder;
}  // namespace trace_internal

// Whether events of `cat` are being recorded now.
inline bool trace_active(TraceCategory cat) {
  return (trace_internal::g_categories.load(std::memory_order_relaxed) & static_cast<uint32_t>(cat)) != 0;
}
// The open recorder (null outside a window).
inline TraceRecorder* active_trace() { return trace_internal::g_recorder.load(std::memory_order_relaxed); }
// Turns the per-thread scope tags on or off (core/memory_history.h while it records).
void set_trace_tags(bool on);
// The innermost open scope's name on this thread ("" when none, or when tags are off).
const char* current_trace_tag();

// A span from construction to destruction (or finish()): recorded as an 'X' event when `cat` is
// active, with `args` (and, with the memory option, the live bytes). `name` must outlive the scope
// (string literals, timer names). Also the thread's tag while open.
class TraceScope {
 public:
  TraceScope(TraceCategory cat, const char* name, std::initializer_list<TraceArg> args = {}) {
    if (trace_internal::g_categories.load(std::memory_order_relaxed) != 0 ||
        trace_internal::g_tags.load(std::memory_order_relaxed))
      open(cat, name, args);
  }
  ~TraceScope() { finish(); }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;
  void finish() {
    if (opened_) close();
  }
  // Adds an argument to the span (recorded at its end); nothing when it does not record.
  void add_arg(const char* key, int64_t value);

 private:
  void open(TraceCategory cat, const char* name, std::initializer_list<TraceArg> args);
  void close();
  bool opened_ = false;
  bool recording_ = false;
  TraceCategory cat_ = TraceCategory::kStep;
  const char* name_ = nullptr;
  const char* parent_tag_ = nullptr;
  int64_t start_ns_ = 0;
  int64_t start_live_ = 0;
  std::vector<TraceArg> args_;
};

// An instant event ('i') of `cat` now, when `cat` is active.
void trace_instant(TraceCategory cat, std::string_view name, std::initializer_list<TraceArg> args = {},
                   std::string_view text_key = {}, std::string_view text = {});
// A complete event of `cat` that ended now and lasted `seconds`, when `cat` is active.
void trace_complete_ending_now(TraceCategory cat, std::string_view name, double seconds,
                               std::initializer_list<TraceArg> args = {}, std::string_view text_key = {},
                               std::string_view text = {});

// Appends `s` as a JSON string literal (quotes, backslashes and control characters escaped;
// other bytes as they are). The trace and the memory snapshot (core/memory_history.h) write with it.
void append_json_string(std::string* out, std::string_view s);

}  // namespace gale
