// The host allocator's allocation history (--record-memory-history) and its JSON snapshot.
#include "core/memory_history.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/allocator.h"
#include "core/check.h"
#include "core/trace.h"

namespace gale {

MemoryHistory::~MemoryHistory() { detach(); }

void MemoryHistory::attach() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    live_ = peak_ = untracked_ = host_allocator().current_bytes();
  }
  GALE_CHECK(host_allocator().set_history(this)) << "a second memory history attached to the host allocator";
  set_trace_tags(true);
}

void MemoryHistory::detach() {
  if (host_allocator().history() != this) return;
  host_allocator().set_history(nullptr);
  set_trace_tags(false);
}

void MemoryHistory::push_event(MemoryEvent e) {
  ++events_total_;
  if (max_events_ == 0) return;
  if (ring_.size() < max_events_) {
    ring_.push_back(std::move(e));
    return;
  }
  ring_[ring_start_] = std::move(e);
  ring_start_ = (ring_start_ + 1) % max_events_;
}

void MemoryHistory::on_alloc(const void* ptr, size_t bytes) {
  const char* tag = current_trace_tag();
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t b = static_cast<int64_t>(bytes);
  live_ += b;
  peak_ = std::max(peak_, live_);
  const int64_t id = next_id_++;
  blocks_[ptr] = MemoryBlock{id, b, tag};
  push_event(MemoryEvent{true, id, b, live_, iteration_, tag});
}

void MemoryHistory::on_free(const void* ptr, size_t bytes) {
  const char* tag = current_trace_tag();
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t b = static_cast<int64_t>(bytes);
  live_ -= b;
  auto it = blocks_.find(ptr);
  int64_t id = -1;
  if (it != blocks_.end()) {
    id = it->second.id;
    blocks_.erase(it);
  } else {
    untracked_ -= b;
  }
  push_event(MemoryEvent{false, id, b, live_, iteration_, tag});
}

MemoryHistory::Totals MemoryHistory::totals() const {
  std::lock_guard<std::mutex> lock(mu_);
  Totals t;
  t.live_bytes = live_;
  t.peak_bytes = peak_;
  t.untracked_live_bytes = untracked_;
  t.tracked_blocks = static_cast<int64_t>(blocks_.size());
  t.events = events_total_;
  t.dropped_events = events_total_ - static_cast<int64_t>(ring_.size());
  return t;
}

std::string MemoryHistory::snapshot_json(int rank, int64_t iteration) const {
  const Allocator& a = host_allocator();
  std::lock_guard<std::mutex> lock(mu_);
  std::string out = "{\"magic\":\"gale-memory-snapshot\",\"version\":1";
  out += ",\"rank\":" + std::to_string(rank) + ",\"iteration\":" + std::to_string(iteration);
  out += ",\"allocator\":{\"current_bytes\":" + std::to_string(a.current_bytes()) +
         ",\"peak_bytes\":" + std::to_string(a.peak_bytes()) +
         ",\"reserved_bytes\":" + std::to_string(a.reserved_bytes()) +
         ",\"live_allocations\":" + std::to_string(a.live_allocations()) + "}";
  out += ",\"history\":{\"live_bytes\":" + std::to_string(live_) + ",\"peak_bytes\":" + std::to_string(peak_) +
         ",\"untracked_live_bytes\":" + std::to_string(untracked_) +
         ",\"max_events\":" + std::to_string(max_events_) + ",\"events_recorded\":" + std::to_string(events_total_) +
         ",\"events_dropped\":" + std::to_string(events_total_ - static_cast<int64_t>(ring_.size())) + "}";
  // Live blocks in allocation order.
  std::vector<const MemoryBlock*> live;
  live.reserve(blocks_.size());
  for (const auto& [ptr, b] : blocks_) live.push_back(&b);
  std::sort(live.begin(), live.end(), [](const MemoryBlock* x, const MemoryBlock* y) { return x->id < y->id; });
  out += ",\"blocks\":[";
  for (size_t i = 0; i < live.size(); ++i) {
    out += i ? ",\n" : "\n";
    out += "{\"id\":" + std::to_string(live[i]->id) + ",\"bytes\":" + std::to_string(live[i]->bytes) + ",\"tag\":";
    append_json_string(&out, live[i]->tag);
    out += "}";
  }
  out += "],\"events\":[";
  for (size_t k = 0; k < ring_.size(); ++k) {
    const MemoryEvent& e = ring_[(ring_start_ + k) % ring_.size()];
    out += k ? ",\n" : "\n";
    out += std::string("{\"action\":\"") + (e.alloc ? "alloc" : "free") + "\",\"id\":" + std::to_string(e.id) +
           ",\"bytes\":" + std::to_string(e.bytes) + ",\"live_bytes\":" + std::to_string(e.live_after) +
           ",\"iteration\":" + std::to_string(e.iteration) + ",\"tag\":";
    append_json_string(&out, e.tag);
    out += "}";
  }
  out += "]}\n";
  return out;
}

Status MemoryHistory::write_snapshot(const std::string& path, int rank, int64_t iteration) const {
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) return InvalidArgument("--memory-snapshot-path: cannot create the directory of ", path, ": ", ec.message());
  const std::string text = snapshot_json(rank, iteration);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return InvalidArgument("--memory-snapshot-path: cannot write ", path);
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    if (!f) return InvalidArgument("--memory-snapshot-path: cannot write ", path);
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) return InvalidArgument("--memory-snapshot-path: cannot write ", path, ": ", ec.message());
  return Status::Ok();
}

}  // namespace gale
