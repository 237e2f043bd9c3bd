// Which vector instruction set the CPU kernels may use: cpuid/XGETBV detection and the GALE_MAX_ISA cap.
//
// Gale's library is compiled for baseline x86-64; kernels that use AVX2 or AVX-512 live in files
// named *_avx2.cc / *_avx512.cc (compiled with the matching -m flags) and are only ever called
// after `detected_isa()` says the CPU and the OS support them:
//   kAvx2   = AVX2 + FMA + F16C, with the OS saving YMM state (XCR0 bits 1-2);
//   kAvx512 = kAvx2 + AVX-512 F/BW/VL/DQ, with the OS saving opmask and ZMM state (XCR0 bits 5-7).
// The environment variable GALE_MAX_ISA=scalar|avx2|avx512 caps the level (tests and benchmarks use
// it to exercise every tier on one machine); it never raises the level above the hardware's.
//
// Rule for ISA files: they must not instantiate inline library code that baseline files may also
// instantiate (std::vector<float>, std::max<float>, ...): the linker keeps one copy of such
// functions, and an AVX-512 copy would then run on CPUs without AVX-512. Keep ISA code in
// templates over the ISA's vector type or in anonymous namespaces, and take scratch memory from
// kernels/cpu/scratch.h.
#pragma once

#include <string>

#include "core/status.h"

namespace gale {

enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

// "scalar", "avx2", "avx512".
const char* isa_name(Isa isa);
// Parses the names above (case-insensitive). Errors name `what` (e.g. "GALE_MAX_ISA").
StatusOr<Isa> parse_isa(const std::string& text, const std::string& what);

// CPU features found by cpuid + XGETBV, independent of GALE_MAX_ISA.
struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, avx512_bf16 = false;
  bool os_ymm = false, os_zmm = false;      // XCR0 says the OS saves YMM / opmask+ZMM state
  bool amx_tile = false, amx_bf16 = false;  // cpuid bits
  bool os_amx = false;                      // XCR0 bits 17-18 (tile config and data) enabled
};
const CpuFeatures& cpu_features();

// Highest level the hardware and OS support.
Isa hardware_isa();
// hardware_isa(), capped by GALE_MAX_ISA when it is set (read at each call). An unparsable value
// is reported once on stderr and ignored; call validate_isa_environment() at start-up to turn it
// into an error instead.
Isa detected_isa();
Status validate_isa_environment();

// min(a, b).
inline Isa min_isa(Isa a, Isa b) { return static_cast<int>(a) < static_cast<int>(b) ? a : b; }

// One line for start-up reports: "avx512 (cpu: avx512 +bf16 +amx-tile(os off); GALE_MAX_ISA unset)".
std::string isa_report();

}  // namespace gale
