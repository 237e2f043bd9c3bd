// Megatron's "%Y-%m-%d %H:%M:%S.%f" timestamp (training_log's line, print_datetime).
#include "core/datetime.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <ctime>
#include <regex>

namespace gale {
namespace {

// Golden values from Python: datetime.fromtimestamp(us / 1e6).strftime('%Y-%m-%d %H:%M:%S.%f')
// under TZ=UTC (the format of Megatron main's training_log and print_datetime).
TEST(Datetime, MicrosecondsAsPythonsPercentF) {
  setenv("TZ", "UTC", 1);
  tzset();
  EXPECT_EQ(datetime_micros(1747756129123456), "2025-05-20 15:48:49.123456");
  EXPECT_EQ(datetime_micros(1747756129000007), "2025-05-20 15:48:49.000007");  // six digits, zero-padded
  EXPECT_EQ(datetime_micros(-1), "1969-12-31 23:59:59.999999");
  EXPECT_TRUE(std::regex_match(datetime_now_micros(), std::regex(R"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6})")));
}

}  // namespace
}  // namespace gale
