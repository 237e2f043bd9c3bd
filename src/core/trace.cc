// The --profile trace recorder, its scopes and its Chrome trace-event JSON.
#include "core/trace.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/allocator.h"
#include "core/check.h"

namespace gale {

namespace trace_internal {
std::atomic<uint32_t> g_categories{0};
std::atomic<bool> g_tags{false};
std::atomic<TraceRecorder*> g_recorder{nullptr};
}  // namespace trace_internal

namespace {

using trace_internal::g_categories;
using trace_internal::g_recorder;
using trace_internal::g_tags;

thread_local const char* t_tag = nullptr;

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A small id per thread, in the order threads first record (the first is usually the main thread).
int thread_index() {
  static std::atomic<int> next{0};
  thread_local int id = next.fetch_add(1, std::memory_order_relaxed);
  return id;
}

const char* category_name(TraceCategory c) {
  switch (c) {
    case TraceCategory::kStep: return "step";
    case TraceCategory::kKernel: return "kernel";
    case TraceCategory::kComm: return "comm";
  }
  return "other";
}

// Microseconds with three decimals (the trace format's unit; nanosecond resolution kept).
void append_us(std::string* out, int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld.%03lld", static_cast<long long>(ns / 1000), static_cast<long long>(ns % 1000));
  out->append(buf);
}

}  // namespace

void append_json_string(std::string* out, std::string_view s) {
  out->push_back('"');
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(ch);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out->append(buf);
    } else {
      out->push_back(ch);
    }
  }
  out->push_back('"');
}

TraceRecorder::TraceRecorder(TraceOptions options, int rank)
    : options_(options), rank_(rank), origin_ns_(steady_ns()) {}

TraceRecorder::~TraceRecorder() {
  if (window_open()) close_window();
}

void TraceRecorder::open_window() {
  TraceRecorder* none = nullptr;
  GALE_CHECK(g_recorder.compare_exchange_strong(none, this) || none == this)
      << "a second trace window opened while another recorder's is open";
  g_categories.store(options_.categories, std::memory_order_relaxed);
}

void TraceRecorder::close_window() {
  if (g_recorder.load() != this) return;
  g_categories.store(0, std::memory_order_relaxed);
  g_recorder.store(nullptr);
}

bool TraceRecorder::window_open() const { return g_recorder.load() == this; }

int64_t TraceRecorder::now_ns() const { return steady_ns() - origin_ns_; }

void TraceRecorder::record(TraceEvent event) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::move(event));
}

std::vector<TraceEvent> TraceRecorder::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

size_t TraceRecorder::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.size();
}

std::string TraceRecorder::to_json() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out = "{\"traceEvents\":[\n";
  const std::string pid = std::to_string(rank_);
  // Metadata: the process and thread names Perfetto shows.
  out += "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" + pid + ",\"tid\":0,\"args\":{\"name\":\"rank " + pid +
         "\"}}";
  int max_tid = 0;
  for (const TraceEvent& e : events_) max_tid = std::max(max_tid, e.tid);
  for (int t = 0; t <= max_tid; ++t)
    out += ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" + pid + ",\"tid\":" + std::to_string(t) +
           ",\"args\":{\"name\":\"" + (t == 0 ? std::string("main") : "thread " + std::to_string(t)) + "\"}}";
  for (const TraceEvent& e : events_) {
    out += ",\n{\"ph\":\"";
    out.push_back(e.ph);
    out += "\",\"cat\":\"";
    out += category_name(e.cat);
    out += "\",\"name\":";
    append_json_string(&out, e.name);
    out += ",\"pid\":" + pid + ",\"tid\":" + std::to_string(e.tid) + ",\"ts\":";
    append_us(&out, e.ts_ns);
    if (e.ph == 'X') {
      out += ",\"dur\":";
      append_us(&out, e.dur_ns);
    }
    if (e.ph == 'i') out += ",\"s\":\"t\"";
    if (!e.args.empty() || !e.text_key.empty()) {
      out += ",\"args\":{";
      bool first = true;
      if (!e.text_key.empty()) {
        append_json_string(&out, e.text_key);
        out += ":";
        append_json_string(&out, e.text);
        first = false;
      }
      for (const TraceArg& a : e.args) {
        if (!first) out += ",";
        first = false;
        append_json_string(&out, a.key);
        out += ":" + std::to_string(a.value);
      }
      out += "}";
    }
    out += "}";
  }
  out += "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"gale\",\"format_version\":1,\"rank\":" + pid +
         ",\"categories\":[";
  bool first = true;
  for (TraceCategory c : {TraceCategory::kStep, TraceCategory::kKernel, TraceCategory::kComm}) {
    if (!(options_.categories & static_cast<uint32_t>(c))) continue;
    out += first ? "\"" : ",\"";
    out += category_name(c);
    out += "\"";
    first = false;
  }
  out += std::string("],\"record_shapes\":") + (options_.shapes ? "true" : "false") +
         ",\"with_memory\":" + (options_.memory ? "true" : "false") + "}}\n";
  return out;
}

Status TraceRecorder::write(const std::string& path) const {
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) return InvalidArgument("cannot create the directory of the trace ", path, ": ", ec.message());
  const std::string text = to_json();
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return InvalidArgument("cannot write the trace ", path);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  if (!f) return InvalidArgument("cannot write the trace ", path);
  return Status::Ok();
}

void set_trace_tags(bool on) { g_tags.store(on, std::memory_order_relaxed); }

const char* current_trace_tag() { return t_tag ? t_tag : ""; }

void TraceScope::open(TraceCategory cat, const char* name, std::initializer_list<TraceArg> args) {
  opened_ = true;
  cat_ = cat;
  name_ = name;
  parent_tag_ = t_tag;
  t_tag = name;
  TraceRecorder* rec = active_trace();
  recording_ = rec != nullptr && trace_active(cat);
  if (!recording_) return;
  args_.assign(args.begin(), args.end());
  if (rec->options().memory) start_live_ = host_allocator().current_bytes();
  start_ns_ = rec->now_ns();
}

void TraceScope::add_arg(const char* key, int64_t value) {
  if (recording_) args_.push_back({key, value});
}

void TraceScope::close() {
  opened_ = false;
  t_tag = parent_tag_;
  if (!recording_) return;
  recording_ = false;
  TraceRecorder* rec = active_trace();
  if (rec == nullptr) return;  // the window closed inside the span: it is left out
  TraceEvent e;
  e.ph = 'X';
  e.cat = cat_;
  e.tid = thread_index();
  e.ts_ns = start_ns_;
  e.dur_ns = rec->now_ns() - start_ns_;
  e.name = name_;
  e.args = std::move(args_);
  if (rec->options().memory) {
    const int64_t live = host_allocator().current_bytes();
    e.args.push_back({"live_bytes", live});
    e.args.push_back({"live_bytes_change", live - start_live_});
    TraceEvent c;
    c.ph = 'C';
    c.cat = cat_;
    c.tid = e.tid;
    c.ts_ns = e.ts_ns + e.dur_ns;
    c.name = "host memory";
    c.args.push_back({"live_bytes", live});
    rec->record(std::move(e));
    rec->record(std::move(c));
    return;
  }
  rec->record(std::move(e));
}

void trace_instant(TraceCategory cat, std::string_view name, std::initializer_list<TraceArg> args,
                   std::string_view text_key, std::string_view text) {
  if (!trace_active(cat)) return;
  TraceRecorder* rec = active_trace();
  if (rec == nullptr) return;
  TraceEvent e;
  e.ph = 'i';
  e.cat = cat;
  e.tid = thread_index();
  e.ts_ns = rec->now_ns();
  e.name = name;
  e.text_key = text_key;
  e.text = text;
  e.args.assign(args.begin(), args.end());
  rec->record(std::move(e));
}

void trace_complete_ending_now(TraceCategory cat, std::string_view name, double seconds,
                               std::initializer_list<TraceArg> args, std::string_view text_key,
                               std::string_view text) {
  if (!trace_active(cat)) return;
  TraceRecorder* rec = active_trace();
  if (rec == nullptr) return;
  TraceEvent e;
  e.ph = 'X';
  e.cat = cat;
  e.tid = thread_index();
  const int64_t end = rec->now_ns();
  e.dur_ns = std::min<int64_t>(end, static_cast<int64_t>(seconds * 1e9));
  e.ts_ns = end - e.dur_ns;
  e.name = name;
  e.text_key = text_key;
  e.text = text;
  e.args.assign(args.begin(), args.end());
  rec->record(std::move(e));
}

}  // namespace gale
