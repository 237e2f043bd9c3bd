// Philox-4x32-10 and the derived uniform/normal draws.
#include "core/rng.h"

#include <cmath>

#include "core/threads.h"

namespace gale {

namespace {
constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;

inline void mulhilo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  *lo = static_cast<uint32_t>(p);
}

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
}  // namespace

Philox4x32 philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo) {
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kPhiloxM0, c0, &hi0, &lo0);
    mulhilo(kPhiloxM1, c2, &hi1, &lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  return Philox4x32{{c0, c1, c2, c3}};
}

uint64_t mix_stream(uint64_t a, uint64_t b) { return splitmix64(splitmix64(a) ^ (b + 0x632BE59BD9B4E019ull)); }
uint64_t mix_stream(uint64_t a, uint64_t b, uint64_t c) { return mix_stream(mix_stream(a, b), c); }
uint64_t mix_stream(uint64_t a, uint64_t b, uint64_t c, uint64_t d) { return mix_stream(mix_stream(a, b, c), d); }

namespace {
inline float to_unit(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }
}  // namespace

float uniform_at(uint64_t seed, uint64_t stream, uint64_t index) {
  Philox4x32 r = philox4x32(seed, stream, index);
  return to_unit(r.v[0]);
}

float dropout_uniform_at(uint64_t seed, uint64_t stream, uint64_t index) {
  Philox4x32 r = philox4x32(seed, stream, index >> 2);
  return to_unit(r.v[index & 3]);
}

float normal_at(uint64_t seed, uint64_t stream, uint64_t index) {
  Philox4x32 r = philox4x32(seed, stream, index);
  // u1 in (0, 1] so log is finite.
  double u1 = (static_cast<double>(r.v[0]) + 1.0) * (1.0 / 4294967296.0);
  double u2 = static_cast<double>(r.v[1]) * (1.0 / 4294967296.0);
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

void fill_normal(float* out, int64_t n, float mean, float std, uint64_t seed, uint64_t stream, uint64_t offset) {
  parallel_for(n, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = mean + std * normal_at(seed, stream, offset + static_cast<uint64_t>(i));
  });
}

void fill_uniform(float* out, int64_t n, uint64_t seed, uint64_t stream, uint64_t offset) {
  parallel_for(n, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = uniform_at(seed, stream, offset + static_cast<uint64_t>(i));
  });
}

}  // namespace gale
