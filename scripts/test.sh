#!/usr/bin/env bash
# Install dependencies, build, and run the whole test suite (what .ci/run calls).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
(cd build && ctest --output-on-failure -j "$(nproc)" --timeout 1800)
# libFuzzer targets of the data pipeline (.idx, tokenizer.json, jsonl, pre-tokenizer), 20 s each.
scripts/fuzz.sh 20
