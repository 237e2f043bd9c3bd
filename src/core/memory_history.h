// Megatron's --record-memory-history for the host allocator: every allocation and free of tensor
// storage with its size and tag, and a snapshot of it as Gale's JSON (docs/formats/memory-snapshot.md).
//
// While a MemoryHistory is attached (`attach()`), the allocator (core/allocator.h) reports each
// allocate / deallocate to it: one relaxed load and a branch otherwise. It keeps:
//   - the live bytes, starting from the allocator's at attach() (blocks allocated before are
//     "untracked": their frees lower `untracked_live_bytes`), and their high-water mark — the same
//     accounting as the allocator's current_bytes() / peak_bytes() after a reset_peak() at attach();
//   - every tracked live block (an id in allocation order, bytes, tag);
//   - the last `max_events` alloc/free events (Megatron keeps 100,000: trace_alloc_max_entries),
//     older ones counted as dropped.
// A tag is the innermost open trace scope on the allocating thread (core/trace.h: the step phase,
// e.g. forward-compute or optimizer-inner-step; a kernel's name inside a --profile window), "" outside.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"

namespace gale {

struct MemoryEvent {
  bool alloc = true;
  int64_t id = 0;     // the block's allocation number (0, 1, ...); -1: a block allocated before attach()
  int64_t bytes = 0;  // as asked for (the allocator's accounting)
  int64_t live_after = 0;  // live bytes after the event
  int64_t iteration = 0;   // the training iteration when it happened (set_iteration)
  std::string tag;
};

struct MemoryBlock {
  int64_t id = 0;
  int64_t bytes = 0;
  std::string tag;
};

class MemoryHistory {
 public:
  static constexpr size_t kDefaultMaxEvents = 100000;
  explicit MemoryHistory(size_t max_events = kDefaultMaxEvents) : max_events_(max_events) {}
  ~MemoryHistory();
  MemoryHistory(const MemoryHistory&) = delete;
  MemoryHistory& operator=(const MemoryHistory&) = delete;

  // Starts recording the host allocator (one history at a time; GALE_CHECKed) and turns the trace
  // scopes' tags on; detach() stops (the destructor too).
  void attach();
  void detach();
  // The iteration recorded with later events (the trainer's completed iterations).
  void set_iteration(int64_t iteration) { iteration_ = iteration; }

  // The allocator's hooks (thread-safe).
  void on_alloc(const void* ptr, size_t bytes);
  void on_free(const void* ptr, size_t bytes);

  struct Totals {
    int64_t live_bytes = 0;            // tracked blocks plus untracked_live_bytes
    int64_t peak_bytes = 0;            // the high-water mark of live_bytes since attach()
    int64_t untracked_live_bytes = 0;  // of the blocks live at attach(), those not freed since
    int64_t tracked_blocks = 0;
    int64_t events = 0, dropped_events = 0;
  };
  Totals totals() const;

  // The snapshot JSON (docs/formats/memory-snapshot.md); `allocator_*` are the allocator's own
  // figures at the time, written beside the history's for comparison.
  std::string snapshot_json(int rank, int64_t iteration) const;
  // Writes snapshot_json() to `path` (atomically: a temporary then a rename); an error names the path.
  Status write_snapshot(const std::string& path, int rank, int64_t iteration) const;

 private:
  size_t max_events_;
  mutable std::mutex mu_;
  int64_t iteration_ = 0;
  int64_t next_id_ = 0;
  int64_t live_ = 0, peak_ = 0, untracked_ = 0;
  int64_t events_total_ = 0;
  std::unordered_map<const void*, MemoryBlock> blocks_;
  std::vector<MemoryEvent> ring_;  // the last max_events_ events, oldest at ring_start_
  size_t ring_start_ = 0;
  void push_event(MemoryEvent e);
};

}  // namespace gale
