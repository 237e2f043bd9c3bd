// --profile's trace recorder (core/trace.h): events only inside a window and of its categories,
// the timers' scopes as step spans with their arguments, the memory option, valid Chrome JSON; the
// op table's tracing wrappers (kernels/op_trace.h) with their sizes; and the allocator's memory
// history (core/memory_history.h): its totals are the allocator's own accounting.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/allocator.h"
#include "core/memory_history.h"
#include "core/tensor.h"
#include "core/timers.h"
#include "core/trace.h"
#include "kernels/flop_counter.h"
#include "kernels/op_trace.h"

namespace gale {
namespace {

uint32_t bits(std::initializer_list<TraceCategory> cs) {
  uint32_t b = 0;
  for (TraceCategory c : cs) b |= static_cast<uint32_t>(c);
  return b;
}

std::vector<std::string> names(const TraceRecorder& r) {
  std::vector<std::string> out;
  for (const TraceEvent& e : r.events()) out.push_back(e.name);
  return out;
}

TEST(Trace, RecordsOnlyInsideTheWindowAndItsCategories) {
  TraceRecorder rec(TraceOptions{bits({TraceCategory::kStep, TraceCategory::kKernel}), false, false}, 3);
  { TraceScope before(TraceCategory::kStep, "before"); }
  EXPECT_FALSE(trace_active(TraceCategory::kStep));
  rec.open_window();
  EXPECT_TRUE(rec.window_open());
  EXPECT_TRUE(trace_active(TraceCategory::kKernel));
  EXPECT_FALSE(trace_active(TraceCategory::kComm));
  {
    TraceScope outer(TraceCategory::kStep, "outer", {{"microbatch", 2}});
    EXPECT_STREQ(current_trace_tag(), "outer");
    {
      TraceScope inner(TraceCategory::kKernel, "inner");
      EXPECT_STREQ(current_trace_tag(), "inner");
    }
    EXPECT_STREQ(current_trace_tag(), "outer");
    TraceScope comm(TraceCategory::kComm, "not recorded");
    trace_instant(TraceCategory::kComm, "all_reduce", {{"bytes", 8}}, "group", "dp");  // not recorded either
    trace_instant(TraceCategory::kKernel, "mark", {{"n", 1}});
  }
  EXPECT_STREQ(current_trace_tag(), "");
  rec.close_window();
  { TraceScope after(TraceCategory::kStep, "after"); }
  EXPECT_EQ(names(rec), (std::vector<std::string>{"inner", "mark", "outer"}));  // in the order they ended
  const std::vector<TraceEvent> ev = rec.events();
  EXPECT_EQ(ev[2].args.size(), 1u);
  EXPECT_STREQ(ev[2].args[0].key, "microbatch");
  EXPECT_EQ(ev[2].args[0].value, 2);
  // The inner span lies inside the outer one.
  EXPECT_GE(ev[0].ts_ns, ev[2].ts_ns);
  EXPECT_LE(ev[0].ts_ns + ev[0].dur_ns, ev[2].ts_ns + ev[2].dur_ns);
  EXPECT_EQ(ev[1].ph, 'i');
}

TEST(Trace, ChromeJsonWithMetadataAndEscapes) {
  TraceRecorder rec(TraceOptions{bits({TraceCategory::kComm}), false, false}, 1);
  rec.open_window();
  trace_instant(TraceCategory::kComm, "all_reduce", {{"bytes", 4096}}, "group", "dp \"x\"\n");
  trace_complete_ending_now(TraceCategory::kComm, "all_reduce wait", 1e-6, {{"bytes", 4096}});
  rec.close_window();
  const nlohmann::json j = nlohmann::json::parse(rec.to_json());
  const auto& ev = j.at("traceEvents");
  ASSERT_EQ(ev.size(), 4u);  // process name, thread name, two events
  EXPECT_EQ(ev[0].at("ph"), "M");
  EXPECT_EQ(ev[0].at("args").at("name"), "rank 1");
  EXPECT_EQ(ev[2].at("name"), "all_reduce");
  EXPECT_EQ(ev[2].at("cat"), "comm");
  EXPECT_EQ(ev[2].at("pid"), 1);
  EXPECT_EQ(ev[2].at("args").at("group"), "dp \"x\"\n");
  EXPECT_EQ(ev[2].at("args").at("bytes"), 4096);
  EXPECT_EQ(ev[3].at("ph"), "X");
  // 1 µs ending now, cut at the recorder's origin when it was made less than 1 µs before.
  EXPECT_LE(ev[3].at("dur").get<double>(), 1.0);
  EXPECT_GE(ev[3].at("ts").get<double>(), 0.0);
  EXPECT_EQ(j.at("otherData").at("categories"), nlohmann::json::array({"comm"}));
}

TEST(Trace, TimersScopesAreStepSpansWhateverTheirLevel) {
  Timers timers(0, TimingLogOption::kMinMax);  // level 0: the level-2 timer below is a dummy
  TraceRecorder rec(TraceOptions{bits({TraceCategory::kStep}), false, true}, 0);
  rec.open_window();
  {
    ScopedTimer t(&timers, "forward-compute", 2, false, {{"microbatch", 1}, {"chunk", 0}});
    Tensor x = Tensor::zeros({1024});  // 4 KiB live at the span's end
  }
  { ScopedTimer none(nullptr, "untimed", 2); }  // no timers: neither timed nor traced
  rec.close_window();
  const std::vector<TraceEvent> ev = rec.events();
  ASSERT_EQ(ev.size(), 2u);  // the span and its memory counter
  EXPECT_EQ(ev[0].name, "forward-compute");
  ASSERT_EQ(ev[0].args.size(), 4u);
  EXPECT_STREQ(ev[0].args[1].key, "chunk");
  EXPECT_STREQ(ev[0].args[2].key, "live_bytes");
  EXPECT_STREQ(ev[0].args[3].key, "live_bytes_change");
  EXPECT_EQ(ev[0].args[3].value, 0);  // the tensor was freed inside the span
  EXPECT_EQ(ev[1].ph, 'C');
  EXPECT_EQ(ev[1].name, "host memory");
}

TEST(OpTrace, EveryCallIsAKernelSpanWithItsSizes) {
  OpTable ops = reference_ops();
  install_op_tracing(&ops);
  EXPECT_TRUE(traces_ops(ops));
  EXPECT_FALSE(traces_ops(reference_ops()));
  std::vector<float> a(6 * 4, 1.0f), b(4 * 5, 1.0f), c(6 * 5, 0.0f);
  ops.gemm(false, false, 6, 5, 4, 1.0f, a.data(), 4, b.data(), 5, 0.0f, c.data(), 5);  // outside: not recorded
  TraceRecorder rec(TraceOptions{bits({TraceCategory::kStep, TraceCategory::kKernel}), true, false}, 0);
  rec.open_window();
  ops.gemm(false, false, 6, 5, 4, 1.0f, a.data(), 4, b.data(), 5, 0.0f, c.data(), 5);
  const double ss = ops.sum_of_squares(c.data(), 30);
  rec.close_window();
  EXPECT_FLOAT_EQ(c[0], 4.0f);  // the wrapped kernel ran
  EXPECT_DOUBLE_EQ(ss, 30 * 16.0);
  const std::vector<TraceEvent> ev = rec.events();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].name, "gemm");
  std::map<std::string, int64_t> args;
  for (const TraceArg& x : ev[0].args) args[x.key] = x.value;
  EXPECT_EQ(args, (std::map<std::string, int64_t>{
                      {"M", 6}, {"N", 5}, {"K", 4}, {"trans_a", 0}, {"trans_b", 0}, {"flops", 2 * 6 * 5 * 4}}));
  EXPECT_EQ(ev[1].name, "sum_of_squares");
  ASSERT_EQ(ev[1].args.size(), 1u);
  EXPECT_STREQ(ev[1].args[0].key, "n0");
  EXPECT_EQ(ev[1].args[0].value, 30);
}

// --op-cal-tflops with --profile: the tracing wrappers wrap the counting ones, and both still work.
TEST(OpTrace, WrapsTheFlopCounter) {
  OpTable ops = reference_ops();
  install_flop_counting(&ops);
  install_op_tracing(&ops);
  std::vector<float> a(6 * 4, 1.0f), b(4 * 5, 1.0f), c(6 * 5, 0.0f);
  TraceRecorder rec(TraceOptions{bits({TraceCategory::kKernel}), false, false}, 0);
  rec.open_window();
  flop_counter_start();
  ops.gemm(false, false, 6, 5, 4, 1.0f, a.data(), 4, b.data(), 5, 0.0f, c.data(), 5);
  flop_counter_stop();
  rec.close_window();
  EXPECT_EQ(flop_counter_counts().model, 2 * 6 * 5 * 4);
  ASSERT_EQ(rec.size(), 1u);
  EXPECT_EQ(rec.events()[0].name, "gemm");
}

TEST(MemoryHistory, TotalsAreTheAllocatorsAccounting) {
  Allocator& alloc = host_allocator();
  Tensor before = Tensor::zeros({100});  // allocated before: untracked
  alloc.reset_peak();
  MemoryHistory h(/*max_events=*/4);
  h.attach();
  {
    TraceScope tag(TraceCategory::kStep, "optimizer");  // tags are kept while a history records
    Tensor a = Tensor::zeros({1000});
    Tensor b = Tensor::zeros({50000});  // a cached-size block
    a = Tensor();
  }
  before = Tensor();
  Tensor kept = Tensor::zeros({7});
  const MemoryHistory::Totals t = h.totals();
  EXPECT_EQ(t.live_bytes, alloc.current_bytes());
  EXPECT_EQ(t.peak_bytes, alloc.peak_bytes());
  EXPECT_EQ(t.tracked_blocks, 1);
  EXPECT_EQ(t.events, 6);  // 3 allocations, 3 frees (one of them untracked)
  EXPECT_EQ(t.dropped_events, 2);
  const nlohmann::json j = nlohmann::json::parse(h.snapshot_json(0, 5));
  EXPECT_EQ(j.at("magic"), "gale-memory-snapshot");
  EXPECT_EQ(j.at("version"), 1);
  EXPECT_EQ(j.at("iteration"), 5);
  EXPECT_EQ(j.at("history").at("peak_bytes"), alloc.peak_bytes());
  EXPECT_EQ(j.at("allocator").at("current_bytes"), alloc.current_bytes());
  ASSERT_EQ(j.at("blocks").size(), 1u);
  EXPECT_EQ(j.at("blocks")[0].at("bytes"), 7 * 4);
  EXPECT_EQ(j.at("blocks")[0].at("tag"), "");
  int64_t live = 0;
  for (const auto& b : j.at("blocks")) live += b.at("bytes").get<int64_t>();
  EXPECT_EQ(live + j.at("history").at("untracked_live_bytes").get<int64_t>(), alloc.current_bytes());
  // The last 4 events, oldest first: b freed (tagged optimizer), `before` freed (untracked), kept.
  const auto& ev = j.at("events");
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[1].at("action"), "free");
  EXPECT_EQ(ev[1].at("bytes"), 50000 * 4);
  EXPECT_EQ(ev[1].at("tag"), "optimizer");
  EXPECT_EQ(ev[2].at("id"), -1);
  EXPECT_EQ(ev[3].at("action"), "alloc");
  EXPECT_EQ(ev[3].at("live_bytes"), alloc.current_bytes());
  h.detach();
  EXPECT_EQ(alloc.history(), nullptr);
  EXPECT_STREQ(current_trace_tag(), "");
}

}  // namespace
}  // namespace gale
