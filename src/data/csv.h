// Comma-separated values as RFC 4180 writes them (quoted fields may hold commas, quotes doubled,
// and line breaks); the format of benchmark files such as MMLU's.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace gale {

using CsvRow = std::vector<std::string>;

// Parses `text` into rows of fields. Lines end with "\n" or "\r\n"; a final line break is
// optional; empty lines are skipped. Errors name `source` and the line: a quote inside an unquoted
// field, text after a closing quote, a quoted field still open at the end.
StatusOr<std::vector<CsvRow>> parse_csv(std::string_view text, const std::string& source);

// Reads and parses the file at `path` (errors name it).
StatusOr<std::vector<CsvRow>> read_csv_file(const std::string& path);

}  // namespace gale
