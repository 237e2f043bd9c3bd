// MMLU-style files and prompts of `gale evaluate`: the exact prompt text, file discovery, errors.
#include "train/evaluate_tasks.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "data/data_test_util.h"

namespace gale {
namespace {

using testing::TempDir;
using testing::write_file;

TEST(EvaluateTasks, PromptIsMmlusFormat) {
  McSubject s;
  s.name = "high_school_physics";
  s.dev = {{"What is g?", {"9.8", "1.6"}, 0}, {"Unused?", {"x", "y"}, 1}};
  const McQuestion q{"Which is heavier, a kilo of lead or a kilo of feathers?", {"lead", "feathers", "neither"}, 2};
  EXPECT_EQ(mc_prompt(s, 1, q),
            "The following are multiple choice questions (with answers) about high school physics.\n\n"
            "What is g?\nA. 9.8\nB. 1.6\nAnswer: A\n\n"
            "Which is heavier, a kilo of lead or a kilo of feathers?\nA. lead\nB. feathers\nC. neither\nAnswer:");
  EXPECT_EQ(mc_prompt(s, 0, q).find("What is g?"), std::string::npos);
  EXPECT_EQ(choice_continuation(3), " D");
  EXPECT_EQ(argmax_choice({-3.0, -1.0, -1.0, -2.0}), 1);  // the first of a tie
}

TEST(EvaluateTasks, FindsSubjectsInSubdirectoriesWithTheirExamples) {
  TempDir dir;
  std::filesystem::create_directories(dir.file("test"));
  std::filesystem::create_directories(dir.file("dev"));
  write_file(dir.file("test/b_subject_test.csv"), "Q1?,x,y,z,w,D\n\"Q2, long\",x,y,z,w,A\n");
  write_file(dir.file("test/a_subject_test.csv"), "Q?,x,y,B\n");
  write_file(dir.file("dev/a_subject_dev.csv"), "E?,x,y,A\n");
  write_file(dir.file("dev/b_subject_dev.csv"), "E?,x,y,z,w,C\n");
  write_file(dir.file("notes.txt"), "ignored");
  StatusOr<std::vector<McSubject>> subjects = read_mc_subjects(dir.path(), 1);
  ASSERT_TRUE(subjects.ok()) << subjects.status().message();
  ASSERT_EQ(subjects.value().size(), 2u);
  const McSubject& a = subjects.value()[0];
  const McSubject& b = subjects.value()[1];
  EXPECT_EQ(a.name, "a_subject");
  EXPECT_EQ(b.name, "b_subject");
  ASSERT_EQ(b.test.size(), 2u);
  EXPECT_EQ(b.test[1].question, "Q2, long");
  EXPECT_EQ(b.test[1].answer, 0);
  EXPECT_EQ(b.test[0].answer, 3);
  ASSERT_EQ(a.test[0].choices.size(), 2u);
  ASSERT_EQ(a.dev.size(), 1u);
  EXPECT_EQ(b.dev[0].answer, 2);
}

TEST(EvaluateTasks, ErrorsNameTheFileAndWhatIsWrong) {
  TempDir dir;
  write_file(dir.file("x_test.csv"), "Q?,a,b,A\nQ2?,a,b,c,A\n");
  write_file(dir.file("y_test.csv"), "Q?,a,b,E\n");
  write_file(dir.file("z_test.csv"), "Q?,a,B\n");
  struct Case {
    std::string file, message;
  };
  const Case cases[] = {
      {"x_test.csv", "x_test.csv: row 2: expected 4 columns as in row 1, found 5"},
      {"y_test.csv", "y_test.csv: row 1: expected the answer as a letter A-B, found \"E\""},
      {"z_test.csv", "z_test.csv: row 1: expected a question, at least two choices and the answer's letter, found 3 column(s)"},
  };
  for (const Case& c : cases) {
    StatusOr<std::vector<McQuestion>> q = read_mc_csv(dir.file(c.file));
    ASSERT_FALSE(q.ok()) << c.file;
    EXPECT_NE(q.status().message().find(c.message), std::string::npos) << q.status().message();
  }
  TempDir good;
  write_file(good.file("s_test.csv"), "Q?,a,b,A\n");
  StatusOr<std::vector<McSubject>> s = read_mc_subjects(good.path(), 5);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("--shots 5: no s_dev.csv under"), std::string::npos) << s.status().message();
  write_file(good.file("s_dev.csv"), "E?,a,b,B\n");
  s = read_mc_subjects(good.path(), 5);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("s_dev.csv holds only 1 example(s)"), std::string::npos) << s.status().message();
  EXPECT_TRUE(read_mc_subjects(good.path(), 1).ok());
  TempDir empty;
  s = read_mc_subjects(empty.path(), 0);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("no <subject>_test.csv file found"), std::string::npos);
  s = read_mc_subjects(empty.file("missing"), 0);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("not a directory"), std::string::npos);
}

}  // namespace
}  // namespace gale
