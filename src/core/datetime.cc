// Megatron's "%Y-%m-%d %H:%M:%S.%f" timestamp.
#include "core/datetime.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>

namespace gale {

std::string datetime_micros(int64_t unix_micros) {
  int64_t seconds = unix_micros / 1000000, micros = unix_micros % 1000000;
  if (micros < 0) {  // before the epoch: floor, as Python's datetime
    micros += 1000000;
    --seconds;
  }
  const std::time_t t = static_cast<std::time_t>(seconds);
  std::tm tm{};
  localtime_r(&t, &tm);
  char date[32], out[48];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S", &tm);
  std::snprintf(out, sizeof out, "%s.%06lld", date, static_cast<long long>(micros));
  return out;
}

std::string datetime_now_micros() {
  using namespace std::chrono;
  return datetime_micros(duration_cast<microseconds>(system_clock::now().time_since_epoch()).count());
}

}  // namespace gale
