# Batch-size ramp-up: re-derives the expected values of tests/train/batch_size_rampup_test.cc and
# tests/cli/batch_size_rampup_cli_test.cc from Megatron's formulas (num_microbatches_calculator.py's
# RampupBatchsizeNumMicroBatchesCalculator.update and training.py's update_train_iters), written out
# again here in plain Python so that the float arithmetic is Python's own.
#
#   /usr/bin/python3 tools/reference/batch_size_rampup.py     # prints; writes nothing
import sys


def global_batch_size(consumed, start, increment, samples, final):
    if consumed > samples:
        return final
    per_increment = samples / ((final - start) // increment)  # true division: a float
    return start + int(consumed / per_increment) * increment


def train_iters(train_samples, start, increment, samples, final):
    iterations = consumed = 0
    while consumed <= samples and consumed <= train_samples:
        consumed += global_batch_size(consumed, start, increment, samples, final)
        iterations += 1
    if train_samples > consumed:
        iterations += (train_samples - consumed) // final
    return iterations


def schedule(iterations, start, increment, samples, final):
    consumed, out = 0, []
    for _ in range(iterations):
        g = global_batch_size(consumed, start, increment, samples, final)
        consumed += g
        out.append((g, consumed))
    return out


def main():
    ramp = (4, 4, 100, 16)
    print("4 -> 16 by 4 over 100:",
          {c: global_batch_size(c, *ramp) for c in (0, 33, 34, 66, 67, 99, 100, 101)})
    print("  train iters for 1000, 1015, 1016, 50:", [train_iters(t, *ramp) for t in (1000, 1015, 1016, 50)])
    print("1 -> 2 by 1 over 3, train iters for 3:", train_iters(3, 1, 1, 3, 2))
    print("1 -> 8 by 1 over 9:", {c: global_batch_size(c, 1, 1, 9, 8) for c in (8, 9, 10)})
    print("4 -> 8 by 2 over 20:", {c: global_batch_size(c, 4, 2, 20, 8) for c in (0, 10, 21)})
    cli = (2, 1, 8, 4)
    n = train_iters(24, *cli)
    print("CLI 2 -> 4 by 1 over 8, 24 samples:", n, "iterations (batch, consumed):", schedule(n, *cli))
    dp = (2, 2, 8, 6)
    n = train_iters(26, *dp)
    print("CLI DP 2 -> 6 by 2 over 8, 26 samples:", n, "iterations (batch, consumed):", schedule(n, *dp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
