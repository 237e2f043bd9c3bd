// CPU feature detection with cpuid and XGETBV, and the GALE_MAX_ISA environment cap.
#include "kernels/cpu/isa.h"

#include <cpuid.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace gale {

namespace {

uint64_t read_xcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
  f.fma = (c >> 12) & 1;
  f.f16c = (c >> 29) & 1;
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = read_xcr0();
  f.os_ymm = (xcr0 & 0x6) == 0x6;
  f.os_zmm = f.os_ymm && (xcr0 & 0xE0) == 0xE0;
  f.os_amx = (xcr0 & 0x60000) == 0x60000;
  unsigned max_leaf = __get_cpuid_max(0, nullptr);
  if (max_leaf < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  f.avx2 = (b >> 5) & 1;
  f.avx512f = (b >> 16) & 1;
  f.avx512dq = (b >> 17) & 1;
  f.avx512bw = (b >> 30) & 1;
  f.avx512vl = (b >> 31) & 1;
  f.amx_bf16 = (d >> 22) & 1;
  f.amx_tile = (d >> 24) & 1;
  const unsigned subleaves = a;
  if (subleaves >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    f.avx512_bf16 = (a >> 5) & 1;
  }
  return f;
}

Isa hardware_level(const CpuFeatures& f) {
  const bool avx2 = f.os_ymm && f.avx2 && f.fma && f.f16c;
  if (!avx2) return Isa::kScalar;
  if (f.os_zmm && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq) return Isa::kAvx512;
  return Isa::kAvx2;
}

std::atomic<bool> warned_bad_env{false};

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "unknown";
}

StatusOr<Isa> parse_isa(const std::string& text, const std::string& what) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char ch) { return std::tolower(ch); });
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512})
    if (lower == isa_name(isa)) return isa;
  return InvalidArgument(what, ": expected scalar, avx2 or avx512, found '", text, "'");
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

Isa hardware_isa() {
  static const Isa level = hardware_level(cpu_features());
  return level;
}

Status validate_isa_environment() {
  const char* env = std::getenv("GALE_MAX_ISA");
  if (env == nullptr || *env == '\0') return Status::Ok();
  return parse_isa(env, "GALE_MAX_ISA").status();
}

Isa detected_isa() {
  const char* env = std::getenv("GALE_MAX_ISA");
  if (env == nullptr || *env == '\0') return hardware_isa();
  StatusOr<Isa> cap = parse_isa(env, "GALE_MAX_ISA");
  if (!cap.ok()) {
    if (!warned_bad_env.exchange(true))
      std::fprintf(stderr, "WARNING: %s (ignored)\n", cap.status().message().c_str());
    return hardware_isa();
  }
  return min_isa(*cap, hardware_isa());
}

std::string isa_report() {
  const CpuFeatures& f = cpu_features();
  std::string cpu = isa_name(hardware_isa());
  if (f.avx512_bf16) cpu += " +avx512-bf16";
  if (f.amx_tile) cpu += f.os_amx ? " +amx-tile" : " +amx-tile(not enabled by the OS)";
  const char* env = std::getenv("GALE_MAX_ISA");
  std::string cap = env && *env ? str_cat("GALE_MAX_ISA=", env) : std::string("GALE_MAX_ISA unset");
  return str_cat(isa_name(detected_isa()), " (cpu: ", cpu, "; ", cap, ")");
}

}  // namespace gale
