// `gale pretrain --profile` and `--record-memory-history` end to end on a tiny GPT: the trace is
// valid Chrome JSON with the step phases (forward, backward per micro-batch, optimizer), GEMMs and
// other kernels of the window's iterations only; --profile-level picks what it holds; the file
// goes to --profile-save-path, else --tensorboard-dir; only --profile-ranks write, and under mpirun
// at DP 2 the gradients' all-reduce carries the model's gradient bytes; the memory snapshot's
// totals are the allocator's peak accounting. No timing is compared.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/mpi_cli.h"
#include "subprocess.h"

namespace gale {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "gale_profile_" + std::to_string(getpid()) + "_" + name;
  fs::remove_all(dir);
  return dir;
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());  // throws (the test fails) on invalid JSON
}

// A tiny GPT for 4 iterations on `np` ranks, a log line every iteration, then `extra`.
test::RunResult run(int np, const std::vector<std::string>& extra) {
  const std::vector<std::string> argv = testing::tiny_gpt_pretrain(np, 4, {"--log-interval", "1"}, extra);
  return test::run_with_timeout(argv, testing::kMpiEnv, 300.0);
}

// The events of a trace, by name (metadata left out).
std::multimap<std::string, json> events_by_name(const json& trace) {
  std::multimap<std::string, json> out;
  for (const json& e : trace.at("traceEvents"))
    if (e.at("ph") != "M") out.emplace(e.at("name").get<std::string>(), e);
  return out;
}

int64_t exact_peak_bytes(const std::string& output) {
  std::smatch m;
  static const std::regex peak(R"(\[after training\] peak memory: .* \(exact: (\d+) bytes\))");
  EXPECT_TRUE(std::regex_search(output, m, peak)) << output;
  return m.empty() ? -1 : std::stoll(m[1]);
}

TEST(ProfileCli, TraceOfTheWindowAndTheMemorySnapshot) {
  const std::string dir = fresh_dir("one");
  const test::RunResult r =
      run(1, {"--profile", "--profile-step-start", "1", "--profile-step-end", "3", "--profile-save-path", dir,
              "--record-memory-history", "--memory-snapshot-path", dir + "/snapshot.json"});
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(" > --profile: rank 0 records iterations 2 to 3 into " + dir + "/gale-trace-rank0.json"),
            std::string::npos)
      << r.output;
  const json trace = read_json(dir + "/gale-trace-rank0.json");
  EXPECT_EQ(trace.at("otherData").at("categories"), json::array({"step", "kernel"}));  // level0
  const std::multimap<std::string, json> ev = events_by_name(trace);
  // Only the window's iterations: the log line's 2 and 3.
  std::set<int64_t> iterations;
  double window_start = 1e300, window_end = 0.0;
  for (auto [it, end] = ev.equal_range("iteration"); it != end; ++it) {
    iterations.insert(it->second.at("args").at("iteration").get<int64_t>());
    window_start = std::min(window_start, it->second.at("ts").get<double>());
    window_end = std::max(window_end, it->second.at("ts").get<double>() + it->second.at("dur").get<double>());
  }
  EXPECT_EQ(iterations, (std::set<int64_t>{2, 3}));
  // The phases: 4 micro-batches per iteration (4 samples, micro-batches of 1), each forward and backward.
  EXPECT_EQ(ev.count("forward-compute"), 8u);
  EXPECT_EQ(ev.count("backward-compute"), 8u);
  std::set<int64_t> microbatches;
  for (auto [it, end] = ev.equal_range("forward-compute"); it != end; ++it) {
    microbatches.insert(it->second.at("args").at("microbatch").get<int64_t>());
    EXPECT_EQ(it->second.at("args").at("chunk"), 0);
  }
  EXPECT_EQ(microbatches, (std::set<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(ev.count("optimizer"), 2u);
  EXPECT_EQ(ev.count("all-grads-sync"), 2u);
  // Kernels and GEMMs, every one inside the window; no sizes without --profile-record-shapes.
  EXPECT_GT(ev.count("gemm"), 0u);
  EXPECT_GT(ev.count("norm_forward"), 0u);
  EXPECT_GT(ev.count("attention_backward"), 0u);
  for (const auto& [name, e] : ev) {
    if (e.at("ph") != "X") continue;
    EXPECT_GE(e.at("ts").get<double>(), window_start) << name;
    EXPECT_LE(e.at("ts").get<double>() + e.at("dur").get<double>(), window_end + 1e-3) << name;
    if (name == "gemm") EXPECT_FALSE(e.contains("args")) << e.dump();
    EXPECT_NE(e.at("cat"), "comm") << name;  // level0: no communication
  }
  // The snapshot (last rank = rank 0), written at the last log line and at the end: its peak is the
  // allocator's peak of the training run, its live bytes are the blocks it lists plus those from
  // before training (parameters, gradients, optimizer state), and replaying its events gives both.
  const json snap = read_json(dir + "/snapshot.json");
  EXPECT_EQ(snap.at("magic"), "gale-memory-snapshot");
  EXPECT_EQ(snap.at("version"), 1);
  EXPECT_EQ(snap.at("iteration"), 4);
  const json& h = snap.at("history");
  EXPECT_EQ(h.at("peak_bytes").get<int64_t>(), exact_peak_bytes(r.output));
  EXPECT_EQ(h.at("peak_bytes"), snap.at("allocator").at("peak_bytes"));
  EXPECT_EQ(h.at("live_bytes"), snap.at("allocator").at("current_bytes"));
  int64_t blocks = 0;
  for (const json& b : snap.at("blocks")) blocks += b.at("bytes").get<int64_t>();
  EXPECT_EQ(blocks + h.at("untracked_live_bytes").get<int64_t>(), h.at("live_bytes").get<int64_t>());
  ASSERT_EQ(h.at("events_dropped"), 0);
  const json& events = snap.at("events");
  ASSERT_FALSE(events.empty());
  int64_t live = events[0].at("live_bytes").get<int64_t>() - events[0].at("bytes").get<int64_t>(), peak = live;
  std::set<std::string> tags;
  for (const json& e : events) {
    live += (e.at("action") == "alloc" ? 1 : -1) * e.at("bytes").get<int64_t>();
    EXPECT_EQ(live, e.at("live_bytes").get<int64_t>());
    peak = std::max(peak, live);
    tags.insert(e.at("tag").get<std::string>());
  }
  EXPECT_EQ(peak, h.at("peak_bytes").get<int64_t>());
  EXPECT_EQ(live, h.at("live_bytes").get<int64_t>());
  EXPECT_TRUE(tags.count("forward-compute")) << snap.at("events").dump().substr(0, 400);
  // Some kernel allocates scratch inside the --profile window (which one depends on the kernels the
  // CPU runs): its allocations carry the kernel's name.
  bool kernel_tag = false;
  for (const std::string& t : tags)
    if (ev.count(t) && ev.find(t)->second.at("cat") == "kernel") kernel_tag = true;
  EXPECT_TRUE(kernel_tag);
  fs::remove_all(dir);
}

TEST(ProfileCli, LevelsShapesAndTheTensorBoardDirectory) {
  const std::string dir = fresh_dir("levels");
  // level_none into --tensorboard-dir: step phases only.
  test::RunResult r = run(1, {"--profile", "--profile-step-start", "0", "--profile-step-end", "1", "--profile-level",
                              "level_none", "--tensorboard-dir", dir + "/tb"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::multimap<std::string, json> ev = events_by_name(read_json(dir + "/tb/gale-trace-rank0.json"));
  EXPECT_EQ(ev.count("iteration"), 1u);
  EXPECT_EQ(ev.count("forward-compute"), 4u);
  EXPECT_EQ(ev.count("gemm"), 0u);
  // level2: sizes and FLOPs of every GEMM; with memory.
  r = run(1, {"--profile", "--profile-step-start", "3", "--profile-step-end", "4", "--profile-level", "level2",
              "--profile-with-memory", "--profile-save-path", dir + "/l2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ev = events_by_name(read_json(dir + "/l2/gale-trace-rank0.json"));
  ASSERT_GT(ev.count("gemm"), 0u);
  for (auto [it, end] = ev.equal_range("gemm"); it != end; ++it) {
    const json& a = it->second.at("args");
    EXPECT_EQ(a.at("flops").get<int64_t>(), 2 * a.at("M").get<int64_t>() * a.at("N").get<int64_t>() * a.at("K").get<int64_t>());
    EXPECT_TRUE(a.contains("live_bytes"));
  }
  EXPECT_GT(ev.count("host memory"), 0u);
  // A start iteration skipped (--iterations-to-skip): the window opens at the next step run.
  r = run(1, {"--profile", "--profile-step-start", "1", "--profile-step-end", "3", "--iterations-to-skip", "1",
              "--profile-level", "level_none", "--profile-save-path", dir + "/skip"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ev = events_by_name(read_json(dir + "/skip/gale-trace-rank0.json"));
  ASSERT_EQ(ev.count("iteration"), 1u);
  EXPECT_EQ(ev.find("iteration")->second.at("args").at("iteration"), 3);
  // A window the run never reaches writes nothing.
  r = run(1, {"--profile", "--profile-save-path", dir + "/none"});  // 10 .. 12, after the 4 iterations
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fs::exists(dir + "/none"));
  fs::remove_all(dir);
}

// DP 2: rank 1 only writes; at level1 its trace holds the data-parallel all-reduce of the gradients
// with their bytes (4 per parameter, as printed at start-up) and the time waited on it.
TEST(ProfileCli, DataParallelCollectivesOnTheListedRankOnly) {
  const std::string dir = fresh_dir("dp2");
  const test::RunResult r = run(2, {"--profile", "--profile-step-start", "1", "--profile-step-end", "2",
                                    "--profile-level", "level1", "--profile-ranks", "1", "--profile-save-path", dir});
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fs::exists(dir + "/gale-trace-rank0.json"));
  const std::multimap<std::string, json> ev = events_by_name(read_json(dir + "/gale-trace-rank1.json"));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex(R"(number of parameters on .*: (\d+))"))) << r.output;
  const int64_t grad_bytes = 4 * std::stoll(m[1]);
  int gradient_reductions = 0, waits = 0;
  for (auto [it, end] = ev.equal_range("all_reduce"); it != end; ++it) {
    const json& a = it->second.at("args");
    EXPECT_EQ(it->second.at("cat"), "comm");
    if (a.at("group_size") == 2 && a.at("bytes") == grad_bytes) ++gradient_reductions;
  }
  EXPECT_EQ(gradient_reductions, 1) << "one all-reduce of every gradient per iteration";
  for (auto [it, end] = ev.equal_range("all_reduce wait"); it != end; ++it)
    if (it->second.at("args").at("bytes") == grad_bytes) ++waits;
  // Blocked on it once (none if the group thread had finished it before the rank waited).
  EXPECT_LE(waits, 1);
  EXPECT_EQ(ev.count("iteration"), 1u);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gale
