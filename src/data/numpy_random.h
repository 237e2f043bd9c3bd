// Bit-exact re-implementations of the two NumPy generators Megatron's datasets use.
//
// * NumpyRandomState = numpy.random.RandomState(seed): MT19937 seeded with init_genrand (the
//   same state as std::mt19937(seed)) and its `shuffle`, which Megatron uses for the document
//   and sample shuffles (docs/data.md, megatron.md §3.3); `random_sample`, `randint` and
//   `binomial` (inversion range), which Megatron's FIM dataset draws (data/fim.h).
// * NumpyDefaultRng = numpy.random.default_rng(seed): SeedSequence -> PCG64 (XSL-RR 128/64) and
//   Generator.integers(low, high, dtype=int32), which MockGPTLowLevelDataset uses to draw its
//   document lengths.
// Both are checked against numpy 1.24 outputs committed under tests/data/numpy/.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace gale {

class NumpyRandomState {
 public:
  explicit NumpyRandomState(uint32_t seed) : mt_(seed) {}

  // A uniform integer in [0, max] (numpy's masked rejection sampling, `random_interval`).
  uint64_t bounded(uint64_t max);

  // numpy's RandomState.shuffle of a 1-D array: for i = n-1 .. 1, swap a[i] with a[bounded(i)].
  template <class T>
  void shuffle(T* a, int64_t n) {
    for (int64_t i = n - 1; i >= 1; --i) {
      int64_t j = static_cast<int64_t>(bounded(static_cast<uint64_t>(i)));
      std::swap(a[i], a[j]);
    }
  }

  uint32_t next32() { return static_cast<uint32_t>(mt_()); }

  // RandomState.random_sample(): 53 random bits from two draws, (a >> 5, b >> 6), in [0, 1).
  double random_sample();

  // RandomState.randint(low, high) for high - low below 2^32: low + bounded(high - low - 1); no
  // draw when high - low == 1. Requires low < high.
  int64_t randint(int64_t low, int64_t high) {
    return low + static_cast<int64_t>(bounded(static_cast<uint64_t>(high - low - 1)));
  }

  // RandomState.binomial(n, p) (numpy's legacy random_binomial) for 0 <= p <= 1, n >= 0, where it
  // uses the inversion algorithm: min(p, 1 - p) * n <= 30 (p > 0.5 draws n - X with X ~ B(n, 1 - p)).
  // Larger n * p, numpy's BTPE range, is not implemented: a CHECK failure (FIM draws n = 1).
  int64_t binomial(int64_t n, double p);

 private:
  std::mt19937 mt_;
};

class NumpyDefaultRng {
 public:
  // default_rng(seed) for a non-negative integer seed below 2^64.
  explicit NumpyDefaultRng(uint64_t seed);

  uint64_t next64();
  uint32_t next32();  // low half of a 64-bit draw first, then the high half (numpy's buffering)

  // Generator.integers(low, high, size=n, dtype=numpy.int32) with endpoint=False: Lemire's
  // bounded method on 32-bit draws.
  std::vector<int32_t> integers_int32(int32_t low, int32_t high, int64_t n);

 private:
  unsigned __int128 state_ = 0, inc_ = 0;
  bool has_uint32_ = false;
  uint32_t uinteger_ = 0;
};

}  // namespace gale
