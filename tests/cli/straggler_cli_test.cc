// `gale pretrain --log-straggler` under mpirun at DP 2: rank 0 prints Megatron's straggler line
// after every log line, over both ranks; --disable-straggler-on-startup prints none; bad values
// are refused by name.
#include <gtest/gtest.h>
#include <unistd.h>

#include <regex>
#include <string>
#include <vector>

#include "cli/mpi_cli.h"
#include "subprocess.h"

namespace gale {
namespace {

using testing::kMpiEnv;
using testing::tiny_gpt_pretrain;

int port() { return 40000 + static_cast<int>(::getpid() % 20000); }

TEST(StragglerCli, RankZeroReportsBothRanksAtEveryLogLine) {
  test::RunResult r = test::run_with_timeout(
      tiny_gpt_pretrain(2, 4, {"--log-interval", "2", "--log-straggler", "--straggler-ctrlr-port", std::to_string(port())},
                        {}),
      kMpiEnv, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Controller ready to recv commands on port " + std::to_string(port()) + ". Current state ON"),
            std::string::npos)
      << r.output;
  const std::regex line(
      R"(\] \| MnRtt/Rnk: ([0-9.]+)ms/([01]) \| MxRtt/Rnk: ([0-9.]+)ms/([01]) \| MnPwr/Rnk: .* \| MnEtpt/Rnk: ([0-9.]+)TF/([01]) \| MxEtpt/Rnk: ([0-9.]+)TF/([01]))");
  int lines = 0;
  for (std::sregex_iterator it(r.output.begin(), r.output.end(), line), end; it != end; ++it) {
    ++lines;
    const std::smatch& m = *it;
    const double min_rtt = std::stod(m[1]), max_rtt = std::stod(m[3]);
    const double min_etpt = std::stod(m[5]), max_etpt = std::stod(m[7]);
    EXPECT_GT(min_rtt, 0.0);
    EXPECT_LE(min_rtt, max_rtt);
    EXPECT_LE(min_etpt, max_etpt);
    // Both ranks ran the same model on the same batch sizes: the slowest forward is the rank of the
    // lowest estimated throughput, unless the two are equal at the printed precision.
    if (m[2] != m[4]) EXPECT_EQ(m[4].str(), m[6].str()) << m[0];
  }
  EXPECT_EQ(lines, 2) << r.output;  // iterations 2 and 4, printed once (rank 0)
}

TEST(StragglerCli, StartsOffAndRefusesBadValues) {
  test::RunResult off = test::run_with_timeout(
      tiny_gpt_pretrain(1, 2, {"--log-interval", "1", "--log-straggler", "--disable-straggler-on-startup",
                               "--straggler-ctrlr-port", std::to_string(port() + 1)},
                        {}),
      kMpiEnv, 300);
  ASSERT_EQ(off.exit_code, 0) << off.output;
  EXPECT_NE(off.output.find("Current state OFF"), std::string::npos) << off.output;
  EXPECT_EQ(off.output.find("MnRtt/Rnk"), std::string::npos) << off.output;

  test::RunResult bad =
      test::run_with_timeout(tiny_gpt_pretrain(1, 2, {"--log-straggler", "--straggler-ctrlr-port", "70000"}, {}), kMpiEnv, 60);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--straggler-ctrlr-port: expected a TCP port in [1, 65535], found 70000"), std::string::npos)
      << bad.output;
  bad = test::run_with_timeout(tiny_gpt_pretrain(1, 2, {"--straggler-minmax-count", "0"}, {}), kMpiEnv, 60);
  EXPECT_NE(bad.output.find("--straggler-minmax-count: expected a positive integer, found 0"), std::string::npos)
      << bad.output;
}

}  // namespace
}  // namespace gale
