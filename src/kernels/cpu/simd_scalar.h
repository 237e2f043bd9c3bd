// One-lane "vector" type with the interface of simd_avx512.h: the baseline x86-64 build of the
// ISA-generic kernels (tiling and fusion without vector instructions), for CPUs without AVX2.
#pragma once

#include <cmath>
#include <cstdint>

namespace gale::simd {

struct Scalar {
  using F = float;
  using I = uint32_t;
  using M = bool;
  static constexpr int W = 1;
  static constexpr int kRegisters = 16;

  static F zero() { return 0.0f; }
  static F set1(float x) { return x; }
  static F load(const float* p) { return *p; }
  static void store(float* p, F v) { *p = v; }
  static M first(int64_t n) { return n > 0; }
  static F load_n(const float* p, int64_t n, float fill = 0.0f) { return n > 0 ? *p : fill; }
  static void store_n(float* p, F v, int64_t n) {
    if (n > 0) *p = v;
  }
  static F add(F a, F b) { return a + b; }
  static F sub(F a, F b) { return a - b; }
  static F mul(F a, F b) { return a * b; }
  static F div(F a, F b) { return a / b; }
  static F fmadd(F a, F b, F c) { return a * b + c; }
  static F fnmadd(F a, F b, F c) { return c - a * b; }
  // As the vector instructions: b when either operand is NaN.
  static F max(F a, F b) { return a > b ? a : b; }
  static F min(F a, F b) { return a < b ? a : b; }
  static F sqrt(F a) { return std::sqrt(a); }
  static F abs(F a) { return std::fabs(a); }
  static F round(F a) { return std::nearbyint(a); }
  static F copysign(F magnitude, F sign) { return std::copysign(magnitude, sign); }
  static F ldexp(F p, F n) { return std::ldexp(p, static_cast<int>(n)); }
  static float reduce_add(F a) { return a; }
  static float reduce_max(F a) { return a; }

  static M lt(F a, F b) { return a < b; }
  static M le(F a, F b) { return a <= b; }
  static M gt(F a, F b) { return a > b; }
  static M ge(F a, F b) { return a >= b; }
  static M eq(F a, F b) { return a == b; }
  static M is_nan(F a) { return a != a; }
  static M mask_and(M a, M b) { return a && b; }
  static M mask_or(M a, M b) { return a || b; }
  static M mask_andnot(M a, M b) { return !a && b; }
  static bool any(M m) { return m; }
  static F select(M m, F if_true, F if_false) { return m ? if_true : if_false; }
  static uint32_t mask_bits(M m) { return m ? 1u : 0u; }
  static M mask_from_bits(uint32_t bits) { return (bits & 1u) != 0; }

  static I iset1(uint32_t x) { return x; }
  static I iload(const int32_t* p) { return static_cast<uint32_t>(*p); }
  static I iload_n(const int32_t* p, int64_t n) { return n > 0 ? static_cast<uint32_t>(*p) : 0u; }
  static I iota() { return 0u; }
  static I iadd(I a, I b) { return a + b; }
  static I ixor(I a, I b) { return a ^ b; }
  static I iand(I a, I b) { return a & b; }
  static I ior(I a, I b) { return a | b; }
  template <int kBits>
  static I srli(I a) {
    return a >> kBits;
  }
  template <int kBits>
  static I slli(I a) {
    return a << kBits;
  }
  static I srlv(I a, I bits) { return a >> bits; }
  static M igt(I a, I b) { return static_cast<int32_t>(a) > static_cast<int32_t>(b); }
  static M ieq(I a, I b) { return a == b; }
  static M iult(I a, I b) { return a < b; }
  static I iselect(M m, I if_true, I if_false) { return m ? if_true : if_false; }
  static F to_float(I a) { return static_cast<float>(static_cast<int32_t>(a)); }
  static I imul(I a, I b) { return a * b; }
  static F gather_n(const float* base, I idx, int64_t n) { return n > 0 ? base[static_cast<int32_t>(idx)] : 0.0f; }
  static void mulhilo(I a, I b, I* hi, I* lo) {
    const uint64_t p = static_cast<uint64_t>(a) * b;
    *hi = static_cast<uint32_t>(p >> 32);
    *lo = static_cast<uint32_t>(p);
  }
};

}  // namespace gale::simd
