#!/usr/bin/env bash
# Stands in for `gale pretrain` in `bench/train_step.py --self-test`: prints Megatron log lines with known values.
# --optimization-level 2 is rejected as Gale rejects unbuilt features; level 1 crashes (exit 3).
set -euo pipefail
[[ "${1:-}" == "pretrain" ]] || { echo "fake_gale: expected the pretrain subcommand" >&2; exit 2; }
shift
level=""
iters=0
while (($#)); do
  case "$1" in
    --optimization-level) level="$2"; shift ;;
    --train-iters) iters="$2"; shift ;;
  esac
  shift
done
if [[ "$level" == "2" ]]; then
  echo "error: --optimization-level 2: not supported yet" >&2
  exit 2
fi
if [[ "$level" == "1" ]]; then
  echo "CHECK failed: something at fake.cc:1" >&2
  exit 3
fi
echo "GEMM: fake sgemm (kernel ISA none, 2 threads)"
ms=(9000.0 5000.0 4000.0 4000.0 4400.0)
loss=(1.050000E+01 9.500000E+00 8.500000E+00 8.000000E+00 7.250000E+00)
for i in 0 1 2 3 4; do
  printf ' [2025-05-20 15:48:49.123456] iteration %8d/%8d | consumed samples: %12d | elapsed time per iteration (ms): %s | throughput per GPU (TFLOP/s/GPU): 0.2 | learning rate: 1.000000E-04 | global batch size:     4 | lm loss: %s | loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | number of nan iterations:   0 |\n' \
    $((i + 1)) "$iters" $((4 * (i + 1))) "${ms[$i]}" "${loss[$i]}"
done
