// MMLU-style multiple-choice files and prompts for `gale evaluate`.
#include "train/evaluate_tasks.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include "data/csv.h"

namespace gale {

StatusOr<std::vector<McQuestion>> read_mc_csv(const std::string& path) {
  GALE_ASSIGN_OR_RETURN(std::vector<CsvRow> rows, read_csv_file(path));
  std::vector<McQuestion> out;
  for (size_t r = 0; r < rows.size(); ++r) {
    const CsvRow& row = rows[r];
    if (row.size() < 4)
      return InvalidArgument(path, ": row ", r + 1, ": expected a question, at least two choices and the answer's letter, found ",
                             row.size(), " column(s)");
    if (row.size() != rows[0].size())
      return InvalidArgument(path, ": row ", r + 1, ": expected ", rows[0].size(), " columns as in row 1, found ", row.size());
    McQuestion q;
    q.question = row[0];
    q.choices.assign(row.begin() + 1, row.end() - 1);
    const std::string& answer = row.back();
    const int n = static_cast<int>(q.choices.size());
    if (answer.size() != 1 || answer[0] < 'A' || answer[0] >= 'A' + n)
      return InvalidArgument(path, ": row ", r + 1, ": expected the answer as a letter A-", static_cast<char>('A' + n - 1),
                             ", found \"", answer, "\"");
    q.answer = answer[0] - 'A';
    out.push_back(std::move(q));
  }
  return out;
}

StatusOr<std::vector<McSubject>> read_mc_subjects(const std::string& dir, int64_t shots) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return NotFound("--task-data-path ", dir, ": not a directory (expected one holding <subject>_test.csv files)");
  std::map<std::string, std::string> tests, devs;  // subject -> path
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file()) continue;
    const std::string file = it->path().filename().string();
    for (auto [suffix, table] : {std::pair{"_test.csv", &tests}, std::pair{"_dev.csv", &devs}}) {
      const std::string s = suffix;
      if (file.size() > s.size() && file.compare(file.size() - s.size(), s.size(), s) == 0) {
        const std::string subject = file.substr(0, file.size() - s.size());
        if (table->count(subject))
          return InvalidArgument("--task-data-path ", dir, ": two files for subject ", subject, ": ", (*table)[subject],
                                 " and ", it->path().string());
        (*table)[subject] = it->path().string();
      }
    }
  }
  if (ec) return NotFound("--task-data-path ", dir, ": ", ec.message());
  if (tests.empty()) return NotFound("--task-data-path ", dir, ": no <subject>_test.csv file found");
  std::vector<McSubject> subjects;
  for (const auto& [name, path] : tests) {
    McSubject s;
    s.name = name;
    s.test_path = path;
    GALE_ASSIGN_OR_RETURN(s.test, read_mc_csv(path));
    if (shots > 0) {
      auto dev = devs.find(name);
      if (dev == devs.end())
        return NotFound("--shots ", shots, ": no ", name, "_dev.csv under ", dir, " for the examples of ", path,
                        " (use --shots 0 for zero-shot)");
      GALE_ASSIGN_OR_RETURN(s.dev, read_mc_csv(dev->second));
      if (static_cast<int64_t>(s.dev.size()) < shots)
        return InvalidArgument("--shots ", shots, ": ", dev->second, " holds only ", s.dev.size(), " example(s)");
    }
    subjects.push_back(std::move(s));
  }
  return subjects;
}

std::string subject_title(const std::string& subject) {
  std::string t = subject;
  std::replace(t.begin(), t.end(), '_', ' ');
  return t;
}

std::string choice_continuation(int index) { return std::string(" ") + static_cast<char>('A' + index); }

std::string format_mc_question(const McQuestion& q, bool with_answer) {
  std::string s = q.question;
  for (size_t i = 0; i < q.choices.size(); ++i) s += str_cat("\n", static_cast<char>('A' + i), ". ", q.choices[i]);
  s += "\nAnswer:";
  if (with_answer) s += choice_continuation(q.answer) + "\n\n";
  return s;
}

std::string mc_prompt(const McSubject& subject, int64_t shots, const McQuestion& q) {
  std::string s = str_cat("The following are multiple choice questions (with answers) about ", subject_title(subject.name), ".\n\n");
  for (int64_t i = 0; i < shots && i < static_cast<int64_t>(subject.dev.size()); ++i) s += format_mc_question(subject.dev[i], true);
  return s + format_mc_question(q, false);
}

int argmax_choice(const std::vector<double>& scores) {
  return static_cast<int>(std::max_element(scores.begin(), scores.end()) - scores.begin());
}

}  // namespace gale
