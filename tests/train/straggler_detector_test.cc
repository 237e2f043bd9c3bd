// --log-straggler's detector (train/straggler_detector.h): Megatron's report lines from gathered
// readings, the interval arithmetic (forward compute less the get_batch inside it, the longest
// get_batch, the estimated TFLOP/s), and the TCP controller that toggles collection.
#include "train/straggler_detector.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace gale {
namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(StragglerReport, MegatronsLinesFromGatheredReadings) {
  // rank: rtt, batch, temp, power, util, clock, etpt
  std::vector<StragglerSample> s = {{10, 1, 40, 50, 90, 2000, 3.0},
                                    {12, 4, 41, 55, 80, 2100, 2.5},
                                    {9, 2, 39, 45, 95, 1900, 3.5},
                                    {12, 1, 42, 60, 85, 2000, 2.5}};
  std::vector<std::string> lines = straggler_report_lines(s, 2, "[T]");
  ASSERT_EQ(lines.size(), 3u);
  // Ties go to the first rank, as Python's min() and max() pick them.
  EXPECT_EQ(lines[0],
            "[T] | MnRtt/Rnk: 9.00ms/2 | MxRtt/Rnk: 12.00ms/1 | MnPwr/Rnk: 45.00W/2 | MxPwr/Rnk: 60.00W/3 | "
            "MnTmp/Rnk: 39.00C/2 | MxTmp/Rnk: 42.00C/3 | MnUtl/Rnk: 80.00%/1 | MxUtl/Rnk: 95.00%/2 | "
            "MnClk/Rnk: 1900.00MHz/2 | MxClk/Rnk: 2100.00MHz/1 | MnDRtt/Rnk: 1.00ms/0 | MxDRtt/Rnk: 4.00ms/1 | "
            "MnEtpt/Rnk: 2.50TF/1 | MxEtpt/Rnk: 3.50TF/2");
  EXPECT_EQ(lines[1], "^^^^ Bottom 2 Ranks with lowest  Etpt(TF): 2.50/1, 2.50/3,");
  EXPECT_EQ(lines[2], "^^^^ Top    2 Ranks with highest Etpt(TF): 3.00/0, 3.50/2,");
  // The rank lists only for 1 < count < world size.
  EXPECT_EQ(straggler_report_lines(s, 1, "[T]").size(), 1u);
  EXPECT_EQ(straggler_report_lines(s, 4, "[T]").size(), 1u);
}

int test_port(int offset) { return 20000 + static_cast<int>(::getpid() % 20000) + offset; }

TEST(StragglerDetector, ForwardComputeLessItsGetBatchAndTheLongestGetBatch) {
  StragglerDetector d(make_self_communicator(), StragglerOptions{true, test_port(0), 1, 1});
  ASSERT_TRUE(d.enabled());
  // A forward scope with get_batch inside (schedules.cc), a forward added without a scope (an
  // overlapped step), and a get_batch outside any forward (pipeline schedules load first).
  d.scope_begin("forward-compute");
  d.scope_begin("batch-generator");
  d.scope_end("batch-generator", 0.1);
  d.scope_end("forward-compute", 0.5);
  d.scope_end("forward-compute", 0.3);
  d.scope_begin("batch-generator");
  d.scope_end("batch-generator", 0.2);
  d.scope_begin("backward-compute");
  d.scope_end("backward-compute", 9.0);  // not counted
  const double flops = 6e12;             // two iterations
  std::vector<std::string> lines = d.report(flops, 2);
  ASSERT_EQ(lines.size(), 1u);
  // Rtt = (0.5 - 0.1 + 0.3) / 2 s = 350 ms; Etpt = 3e12 / (0.35 s) / 3 = 2.857 TFLOP/s.
  EXPECT_TRUE(contains(lines[0], "MnRtt/Rnk: 350.00ms/0 | MxRtt/Rnk: 350.00ms/0")) << lines[0];
  EXPECT_TRUE(contains(lines[0], "MnDRtt/Rnk: 200.00ms/0")) << lines[0];
  EXPECT_TRUE(contains(lines[0], "MnEtpt/Rnk: 2.86TF/0 | MxEtpt/Rnk: 2.86TF/0")) << lines[0];
  // The next interval starts from zero; no FLOPs (or no interval) reports nothing.
  EXPECT_TRUE(d.report(0.0, 2).empty());
  d.scope_end("forward-compute", 0.2);
  lines = d.report(flops, 1);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(contains(lines[0], "MnRtt/Rnk: 200.00ms/0")) << lines[0];
}

std::string request(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return "connect failed";
  }
  const char get[] = "GET / HTTP/1.0\r\n\r\n";
  (void)::send(fd, get, sizeof get - 1, 0);
  std::string reply;
  char buf[256];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) reply.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return reply;
}

TEST(StragglerDetector, ControllerTogglesAtTheNextReport) {
  StragglerDetector d(make_self_communicator(), StragglerOptions{false, test_port(1), 1, 1});
  ASSERT_EQ(d.bound_port(), test_port(1));
  EXPECT_FALSE(d.enabled());
  d.scope_end("forward-compute", 1.0);  // off: not collected
  EXPECT_TRUE(d.report(1e12, 1).empty());

  const std::string reply = request(test_port(1));
  EXPECT_TRUE(contains(reply, "HTTP/1.0 200 OK")) << reply;
  EXPECT_TRUE(contains(reply, "Will turn StragglerDetector ON at next logging interval")) << reply;
  EXPECT_FALSE(d.enabled());  // applied at the next report only
  std::vector<std::string> lines = d.report(1e12, 1);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "Toggling StragglerDetector State ON");
  EXPECT_TRUE(d.enabled());

  d.scope_end("forward-compute", 0.5);
  lines = d.report(1.5e12, 1);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(contains(lines[0], "MnRtt/Rnk: 500.00ms/0")) << lines[0];
  EXPECT_TRUE(contains(lines[0], "MnEtpt/Rnk: 1.00TF/0")) << lines[0];

  EXPECT_TRUE(contains(request(test_port(1)), "Will turn StragglerDetector OFF"));
  lines = d.report(1e12, 1);  // the last interval's line, then the toggle
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[1], "Toggling StragglerDetector State OFF");
  EXPECT_FALSE(d.enabled());
}

TEST(StragglerDetector, APortInUseLeavesItUncontrolledButCollecting) {
  StragglerDetector first(make_self_communicator(), StragglerOptions{true, test_port(2), 1, 1});
  ASSERT_EQ(first.bound_port(), test_port(2));
  StragglerDetector second(make_self_communicator(), StragglerOptions{true, test_port(2), 1, 1});
  EXPECT_EQ(second.bound_port(), 0);
  second.scope_end("forward-compute", 0.25);
  std::vector<std::string> lines = second.report(1e12, 1);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(contains(lines[0], "MnRtt/Rnk: 250.00ms/0")) << lines[0];
}

}  // namespace
}  // namespace gale
