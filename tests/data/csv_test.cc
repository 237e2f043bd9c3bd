// RFC 4180 CSV: quoted fields with commas, doubled quotes and line breaks; errors with line numbers.
#include "data/csv.h"

#include <gtest/gtest.h>

namespace gale {
namespace {

TEST(Csv, PlainQuotedAndEmptyFields) {
  StatusOr<std::vector<CsvRow>> rows =
      parse_csv("a,b,c\n\"x, y\",\"say \"\"hi\"\"\",\n\n\"two\nlines\",,\"\"\r\nlast,row", "t.csv");
  ASSERT_TRUE(rows.ok()) << rows.status().message();
  const std::vector<CsvRow> want = {
      {"a", "b", "c"}, {"x, y", "say \"hi\"", ""}, {"two\nlines", "", ""}, {"last", "row"}};
  EXPECT_EQ(rows.value(), want);
}

TEST(Csv, CarriageReturnInsideAFieldIsKeptWhenNotALineEnd) {
  StatusOr<std::vector<CsvRow>> rows = parse_csv("a\rb,c\n", "t.csv");
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(rows.value(), (std::vector<CsvRow>{{"a\rb", "c"}}));
}

TEST(Csv, ErrorsNameTheSourceAndLine) {
  struct Case {
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {"ok,row\nab\"c,d\n", "t.csv:2: a quote inside an unquoted field"},
      {"\"closed\"x,y\n", "t.csv:1: expected ',' or a line break after a closing quote, found 'x'"},
      {"a,b\n\"open\nstill open", "t.csv:2: a quoted field is not closed before the end of the file"},
  };
  for (const Case& c : cases) {
    StatusOr<std::vector<CsvRow>> rows = parse_csv(c.text, "t.csv");
    ASSERT_FALSE(rows.ok()) << c.text;
    EXPECT_NE(rows.status().message().find(c.message), std::string::npos) << rows.status().message();
  }
}

TEST(Csv, MissingFileIsNamed) {
  StatusOr<std::vector<CsvRow>> rows = read_csv_file("/nonexistent/x_test.csv");
  ASSERT_FALSE(rows.ok());
  EXPECT_NE(rows.status().message().find("/nonexistent/x_test.csv: cannot open the file"), std::string::npos);
}

}  // namespace
}  // namespace gale
