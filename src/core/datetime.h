// Megatron's datetime stamp: local time with microseconds, as its log line and print_datetime print it.
#pragma once

#include <cstdint>
#include <string>

namespace gale {

// "YYYY-mm-dd HH:MM:SS.ffffff": Python's datetime.now().strftime('%Y-%m-%d %H:%M:%S.%f'), which
// Megatron main's training_log (" [<stamp>] iteration ...") and print_datetime ("[what] datetime:
// <stamp> ") use. `unix_micros` is microseconds since the epoch, formatted in local time.
std::string datetime_micros(int64_t unix_micros);
std::string datetime_now_micros();

}  // namespace gale
