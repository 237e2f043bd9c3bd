// NumPy RandomState (MT19937) and default_rng (SeedSequence + PCG64) re-implemented.
#include "data/numpy_random.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "core/check.h"

namespace gale {

uint64_t NumpyRandomState::bounded(uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  mask |= mask >> 1;
  mask |= mask >> 2;
  mask |= mask >> 4;
  mask |= mask >> 8;
  mask |= mask >> 16;
  mask |= mask >> 32;
  uint64_t v;
  if (max <= 0xFFFFFFFFull) {
    while ((v = (next32() & mask)) > max) {
    }
  } else {
    // Arrays of more than 2^32 elements only; the high word is drawn first.
    do {
      uint64_t hi = next32();
      uint64_t lo = next32();
      v = ((hi << 32) | lo) & mask;
    } while (v > max);
  }
  return v;
}

double NumpyRandomState::random_sample() {
  const uint32_t a = next32() >> 5, b = next32() >> 6;
  return (a * 67108864.0 + b) / 9007199254740992.0;
}

namespace {

// numpy's random_binomial_inversion: walk the probability masses from X = 0 with one uniform
// draw; past `bound` start again with a new draw.
int64_t binomial_inversion(NumpyRandomState& rng, int64_t n, double p) {
  const double q = 1.0 - p;
  const double qn = std::exp(static_cast<double>(n) * std::log(q));
  const double np = static_cast<double>(n) * p;
  const int64_t bound = static_cast<int64_t>(std::min(static_cast<double>(n), np + 10.0 * std::sqrt(np * q + 1)));
  int64_t x = 0;
  double px = qn;
  double u = rng.random_sample();
  while (u > px) {
    ++x;
    if (x > bound) {
      x = 0;
      px = qn;
      u = rng.random_sample();
    } else {
      u -= px;
      px = (static_cast<double>(n - x + 1) * p * px) / (static_cast<double>(x) * q);
    }
  }
  return x;
}

}  // namespace

int64_t NumpyRandomState::binomial(int64_t n, double p) {
  if (n == 0 || p == 0.0) return 0;
  const double q = std::min(p, 1.0 - p);
  GALE_CHECK(q * static_cast<double>(n) <= 30.0)
      << "binomial(" << n << ", " << p << "): numpy's BTPE range (min(p, 1 - p)·n > 30) is not implemented";
  return p <= 0.5 ? binomial_inversion(*this, n, p) : n - binomial_inversion(*this, n, q);
}

namespace {

// numpy.random.SeedSequence constants.
constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875, kInitB = 0x8b51f9dd, kMultB = 0x58f38ded;
constexpr uint32_t kMixMultL = 0xca01f9dd, kMixMultR = 0x4973f715;
constexpr int kXShift = 16;

uint32_t hashmix(uint32_t value, uint32_t* hash_const) {
  value ^= *hash_const;
  *hash_const *= kMultA;
  value *= *hash_const;
  value ^= value >> kXShift;
  return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t r = kMixMultL * x - kMixMultR * y;
  r ^= r >> kXShift;
  return r;
}

// SeedSequence(entropy).generate_state(n_words32) with the default pool of 4 words.
std::vector<uint32_t> seed_sequence_state(const std::vector<uint32_t>& entropy, int n_words) {
  std::array<uint32_t, 4> pool{};
  uint32_t hc = kInitA;
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = hashmix(i < entropy.size() ? entropy[i] : 0u, &hc);
  for (size_t src = 0; src < pool.size(); ++src)
    for (size_t dst = 0; dst < pool.size(); ++dst)
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], &hc));
  for (size_t src = pool.size(); src < entropy.size(); ++src)
    for (size_t dst = 0; dst < pool.size(); ++dst) pool[dst] = mix(pool[dst], hashmix(entropy[src], &hc));
  std::vector<uint32_t> out(static_cast<size_t>(n_words));
  uint32_t hb = kInitB;
  for (int i = 0; i < n_words; ++i) {
    uint32_t v = pool[static_cast<size_t>(i) % pool.size()];
    v ^= hb;
    hb *= kMultB;
    v *= hb;
    v ^= v >> kXShift;
    out[static_cast<size_t>(i)] = v;
  }
  return out;
}

constexpr unsigned __int128 kPcgMultiplier =
    (static_cast<unsigned __int128>(0x2360ED051FC65DA4ull) << 64) | 0x4385DF649FCCF645ull;

}  // namespace

NumpyDefaultRng::NumpyDefaultRng(uint64_t seed) {
  std::vector<uint32_t> entropy;
  if (seed == 0) entropy.push_back(0);
  while (seed > 0) {
    entropy.push_back(static_cast<uint32_t>(seed & 0xFFFFFFFFu));
    seed >>= 32;
  }
  std::vector<uint32_t> w = seed_sequence_state(entropy, 8);  // 4 uint64 words, little-endian pairs
  auto word64 = [&w](int k) { return static_cast<uint64_t>(w[2 * k]) | (static_cast<uint64_t>(w[2 * k + 1]) << 32); };
  unsigned __int128 initstate = (static_cast<unsigned __int128>(word64(0)) << 64) | word64(1);
  unsigned __int128 initseq = (static_cast<unsigned __int128>(word64(2)) << 64) | word64(3);
  // pcg_setseq_128_srandom_r
  state_ = 0;
  inc_ = (initseq << 1) | 1;
  state_ = state_ * kPcgMultiplier + inc_;
  state_ += initstate;
  state_ = state_ * kPcgMultiplier + inc_;
}

uint64_t NumpyDefaultRng::next64() {
  state_ = state_ * kPcgMultiplier + inc_;
  uint64_t hi = static_cast<uint64_t>(state_ >> 64), lo = static_cast<uint64_t>(state_);
  unsigned rot = static_cast<unsigned>(state_ >> 122);
  uint64_t x = hi ^ lo;
  return (x >> rot) | (x << ((64 - rot) & 63));
}

uint32_t NumpyDefaultRng::next32() {
  if (has_uint32_) {
    has_uint32_ = false;
    return uinteger_;
  }
  uint64_t v = next64();
  has_uint32_ = true;
  uinteger_ = static_cast<uint32_t>(v >> 32);
  return static_cast<uint32_t>(v & 0xFFFFFFFFu);
}

std::vector<int32_t> NumpyDefaultRng::integers_int32(int32_t low, int32_t high, int64_t n) {
  std::vector<int32_t> out(static_cast<size_t>(n > 0 ? n : 0));
  uint32_t rng = static_cast<uint32_t>(static_cast<int64_t>(high) - low - 1);
  for (auto& o : out) {
    uint32_t r;
    if (rng == 0) {
      r = 0;
    } else if (rng == 0xFFFFFFFFu) {
      r = next32();
    } else {
      uint32_t rng_excl = rng + 1;
      uint64_t m = static_cast<uint64_t>(next32()) * rng_excl;
      uint32_t leftover = static_cast<uint32_t>(m);
      if (leftover < rng_excl) {
        uint32_t threshold = (0xFFFFFFFFu - rng) % rng_excl;
        while (leftover < threshold) {
          m = static_cast<uint64_t>(next32()) * rng_excl;
          leftover = static_cast<uint32_t>(m);
        }
      }
      r = static_cast<uint32_t>(m >> 32);
    }
    o = static_cast<int32_t>(static_cast<int64_t>(low) + r);
  }
  return out;
}

}  // namespace gale
