// CLI test helper: a 6-iteration `gale pretrain` against the same run stopped after iteration 3
// (saved) and resumed, which must log the uninterrupted run's last three losses exactly.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/cli_test_util.h"
#include "cli/log_line.h"

namespace gale::testing {

// `flags` is everything after `pretrain` but --train-iters and the checkpoint flags; checkpoints go
// to `dir`/ckpt. Returns the uninterrupted run's output (for the caller's own checks), empty when it
// failed. A resumed run must not requantise loaded states ("quantised again").
inline std::string expect_resumes_exactly(const std::string& flags, const std::string& dir) {
  const std::string ckpt = dir + "/ckpt";
  CommandResult whole = run_gale("pretrain " + flags + " --train-iters 6", dir);
  EXPECT_EQ(whole.exit_code, 0) << whole.out << whole.err;
  if (whole.exit_code != 0) return "";
  CommandResult first =
      run_gale("pretrain " + flags + " --train-iters 6 --exit-interval 3 --save-interval 100 --save " + ckpt, dir);
  EXPECT_EQ(first.exit_code, 0) << first.out << first.err;
  CommandResult second = run_gale("pretrain " + flags + " --train-iters 6 --load " + ckpt, dir);
  EXPECT_EQ(second.exit_code, 0) << second.out << second.err;
  EXPECT_EQ(second.out.find("quantised again"), std::string::npos) << second.out;
  const std::vector<double> a = logged_values(whole.out, "lm loss"), b = logged_values(second.out, "lm loss");
  EXPECT_EQ(a.size(), 6u);
  EXPECT_EQ(b.size(), 3u);
  for (size_t i = 0; i < 3 && a.size() == 6 && b.size() == 3; ++i) EXPECT_EQ(b[i], a[3 + i]) << "iteration " << 4 + i;
  return whole.out;
}

}  // namespace gale::testing
