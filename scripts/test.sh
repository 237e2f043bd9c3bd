#!/usr/bin/env bash
# Install dependencies, build, and run the whole test suite (what .ci/run calls).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
# The suite runs two tests at a time, many of them mpirun jobs of 2-8 ranks on 2 cores. When at most
# kMaxRerun tests fail, they are run once more, one at a time: the first run's output stays above,
# a "passed on rerun" line names each that then passed, and any that fails again fails the run.
kMaxRerun=2
status=0
(cd build && ctest --output-on-failure -j "$(nproc)" --timeout 1800) || status=$?
if [ "$status" -ne 0 ]; then
  failed_log=build/Testing/Temporary/LastTestsFailed.log
  failed=$(wc -l < "$failed_log" 2>/dev/null || echo 0)
  if [ "$failed" -eq 0 ] || [ "$failed" -gt "$kMaxRerun" ]; then
    echo "scripts/test.sh: $failed test(s) failed (more than $kMaxRerun, or none recorded): not rerun" >&2
    exit "$status"
  fi
  echo "scripts/test.sh: rerunning the $failed failed test(s) alone:"
  sed 's/^/  /' "$failed_log"
  cp "$failed_log" build/first_run_failures.log
  (cd build && ctest --rerun-failed --output-on-failure -j 1 --timeout 1800)
  sed 's/^[0-9]*:/scripts\/test.sh: passed on rerun (failed in the parallel run): /' build/first_run_failures.log
fi
# libFuzzer targets of the data pipeline (.idx, tokenizer.json, jsonl, pre-tokenizer), 20 s each.
scripts/fuzz.sh 20
