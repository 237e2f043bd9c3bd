// RFC 4180 CSV parsing.
#include "data/csv.h"

#include <fstream>
#include <sstream>

namespace gale {

StatusOr<std::vector<CsvRow>> parse_csv(std::string_view text, const std::string& source) {
  std::vector<CsvRow> rows;
  CsvRow row;
  std::string field;
  int64_t line = 1, row_line = 1;
  bool quoted = false;        // inside a quoted field
  bool after_quote = false;   // the quoted field just closed: only a separator may follow
  bool field_started = false; // the current line has content
  auto end_field = [&] {
    row.push_back(std::move(field));
    field.clear();
    after_quote = false;
  };
  auto end_row = [&] {
    if (field_started) {
      end_field();
      rows.push_back(std::move(row));
    }
    row.clear();
    field_started = false;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (quoted) {
      if (ch == '"') {
        if (i + 1 < text.size() && text[i + 1] == '"') {
          field += '"';
          ++i;
        } else {
          quoted = false;
          after_quote = true;
        }
      } else {
        if (ch == '\n') ++line;
        field += ch;
      }
      continue;
    }
    if (ch == ',') {
      field_started = true;
      end_field();
    } else if (ch == '\n' || (ch == '\r' && i + 1 < text.size() && text[i + 1] == '\n')) {
      if (ch == '\r') ++i;
      end_row();
      row_line = ++line;
    } else if (after_quote) {
      return InvalidArgument(source, ":", line, ": expected ',' or a line break after a closing quote, found '", ch, "'");
    } else if (ch == '"') {
      if (!field.empty())
        return InvalidArgument(source, ":", line, ": a quote inside an unquoted field (quote the whole field and double the quote)");
      quoted = field_started = true;
    } else {
      field += ch;
      field_started = true;
    }
  }
  if (quoted) return InvalidArgument(source, ":", row_line, ": a quoted field is not closed before the end of the file");
  end_row();
  return rows;
}

StatusOr<std::vector<CsvRow>> read_csv_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path, ": cannot open the file");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return DataLoss(path, ": read error");
  return parse_csv(ss.str(), path);
}

}  // namespace gale
