// libFuzzer target: the CSV parser of `gale evaluate` (never crashes; what it parses survives a round trip).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "data/csv.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto rows = gale::parse_csv(text, "fuzz.csv");
  if (!rows.ok()) return 0;
  std::string quoted;  // every field quoted, quotes doubled: must parse back to the same rows
  for (const gale::CsvRow& row : *rows) {
    if (row.empty()) std::abort();
    for (size_t i = 0; i < row.size(); ++i) {
      quoted += i ? ",\"" : "\"";
      for (char c : row[i]) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
      quoted += '"';
    }
    quoted += '\n';
  }
  auto again = gale::parse_csv(quoted, "fuzz-roundtrip.csv");
  if (!again.ok() || *again != *rows) std::abort();
  return 0;
}
