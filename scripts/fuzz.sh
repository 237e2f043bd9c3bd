#!/usr/bin/env bash
# Build the libFuzzer targets (fuzz/) with clang + AddressSanitizer + UBSan in build-fuzz/ and run
# each for a bounded time from its seed corpus. Fails on any crash, leak or sanitizer report.
# Usage: scripts/fuzz.sh [seconds per target, default 20]   (6 targets: idx, tokenizer_json, jsonl, pretokenizer, csv, torch_file)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Release -DGALE_FUZZ=ON \
  -DGALE_BUILD_TESTS=OFF -DGALE_BUILD_BENCH=OFF -DGALE_WITH_CUDA=OFF >/dev/null
ninja -C build-fuzz fuzz
mkdir -p build-fuzz/artifacts
status=0
for target in idx tokenizer_json jsonl pretokenizer csv torch_file; do
  work=$(mktemp -d)
  cp -r "fuzz/corpus/$target/." "$work/"
  echo "fuzz_$target: ${secs}s"
  if ! build-fuzz/fuzz/fuzz_$target "$work" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 \
      -max_len=262144 -artifact_prefix=build-fuzz/artifacts/"$target"- -print_final_stats=1 2>build-fuzz/fuzz_$target.log; then
    echo "fuzz_$target FAILED; see build-fuzz/fuzz_$target.log and build-fuzz/artifacts/"
    tail -40 build-fuzz/fuzz_$target.log
    status=1
  else
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" build-fuzz/fuzz_$target.log | tr '\n' ' '
    echo
  fi
  rm -rf "$work"
done
exit $status
