// Loads a CBLAS library (OpenBLAS, BLIS) at run time, privately, so several can be compared in one process.
//
// Each library is opened with dlopen(RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND): its symbols stay
// out of the global namespace (OpenBLAS and BLIS both export cblas_sgemm and sgemm_) and it binds
// to its own copies first. None of them is linked into libgale. OpenBLAS chooses its kernels once,
// when it is loaded, from OPENBLAS_CORETYPE or the CPUID; to load a second instance with another
// core type the file is first copied (glibc would otherwise hand back the instance it already
// has, matched by device and inode).
#pragma once

#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace gale::bench {

// CBLAS enum values (cblas.h), so that no library's header is needed.
enum : int { kCblasRowMajor = 101, kCblasNoTrans = 111, kCblasTrans = 112 };

using CblasSgemmFn = void (*)(int layout, int trans_a, int trans_b, int M, int N, int K, float alpha, const float* A,
                              int lda, const float* B, int ldb, float beta, float* C, int ldc);

enum class BlasKind { kOpenBlas, kBlis };

struct BlasLibrary {
  std::string name;  // "openblas-pthread", "blis-openmp", ...
  std::string path;
  std::string error;  // non-empty when it could not be loaded
  void* handle = nullptr;
  BlasKind kind = BlasKind::kOpenBlas;
  CblasSgemmFn sgemm = nullptr;
  void (*openblas_set_num_threads)(int) = nullptr;
  const char* (*openblas_get_corename)() = nullptr;
  int (*openblas_get_parallel)() = nullptr;  // 0 sequential, 1 pthreads, 2 OpenMP
  int (*openblas_get_num_threads)() = nullptr;
  void (*bli_thread_set_num_threads)(long) = nullptr;  // dim_t is a signed 64-bit integer
  long (*bli_thread_get_num_threads)() = nullptr;
  int (*bli_arch_query_id)() = nullptr;
  const char* (*bli_arch_string)(int) = nullptr;
  const char* (*bli_info_get_version_str)() = nullptr;

  bool ok() const { return sgemm != nullptr; }

  void set_threads(int n) const {
    if (openblas_set_num_threads) openblas_set_num_threads(n);
    if (bli_thread_set_num_threads) bli_thread_set_num_threads(n);
  }

  // "OpenBLAS core Cooperlake, pthreads, 2 threads" / "BLIS 0.9.0 config haswell, 2 threads".
  std::string description() const {
    if (!ok()) return "not loaded: " + error;
    if (kind == BlasKind::kOpenBlas) {
      int par = openblas_get_parallel ? openblas_get_parallel() : -1;
      const char* model = par == 0 ? "sequential" : par == 1 ? "pthreads" : par == 2 ? "OpenMP" : "?";
      return std::string("OpenBLAS core ") + openblas_get_corename() + ", " + model + " threading, " +
             std::to_string(openblas_get_num_threads()) + " threads";
    }
    return std::string("BLIS ") + bli_info_get_version_str() + " config " + bli_arch_string(bli_arch_query_id()) +
           ", " + std::to_string(bli_thread_get_num_threads()) + " threads";
  }
};

namespace detail {

template <class Fn>
void bind(void* handle, const char* symbol, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(handle, symbol));
}

// dlopen's a private copy of `path` (see the header comment) and removes the file again; the
// mapping stays valid after the unlink.
inline void* dlopen_private_copy(const std::string& path, const std::string& tag, std::string* error) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path dir = fs::temp_directory_path(ec);
  if (ec) dir = "/tmp";
  fs::path copy =
      dir / ("gale_bench_" + std::to_string(getpid()) + "_" + tag + "_" + fs::path(path).filename().string());
  fs::copy_file(path, copy, fs::copy_options::overwrite_existing, ec);
  if (ec) {
    *error = "cannot copy " + path + " to " + copy.string() + ": " + ec.message();
    return nullptr;
  }
  void* h = dlopen(copy.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (!h) *error = dlerror();
  fs::remove(copy, ec);
  return h;
}

}  // namespace detail

// Loads the library at `path` under `name`. With a non-empty `openblas_coretype` the library is
// loaded as a private copy with OPENBLAS_CORETYPE set to it during the load (the variable is
// restored afterwards). Check `ok()` / `error` on the result.
inline BlasLibrary load_blas(const std::string& name, const std::string& path, BlasKind kind,
                             const std::string& openblas_coretype = "") {
  BlasLibrary lib;
  lib.name = name;
  lib.path = path;
  lib.kind = kind;
  if (access(path.c_str(), R_OK) != 0) {
    lib.error = path + " not found (install it: scripts/install-deps.sh --bench)";
    return lib;
  }
  const char* old = std::getenv("OPENBLAS_CORETYPE");
  std::string saved = old ? old : "";
  if (openblas_coretype.empty()) {
    unsetenv("OPENBLAS_CORETYPE");
    lib.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (!lib.handle) lib.error = dlerror();
  } else {
    setenv("OPENBLAS_CORETYPE", openblas_coretype.c_str(), 1);
    lib.handle = detail::dlopen_private_copy(path, name, &lib.error);
  }
  if (old)
    setenv("OPENBLAS_CORETYPE", saved.c_str(), 1);
  else
    unsetenv("OPENBLAS_CORETYPE");
  if (!lib.handle) return lib;

  detail::bind(lib.handle, "cblas_sgemm", lib.sgemm);
  if (kind == BlasKind::kOpenBlas) {
    detail::bind(lib.handle, "openblas_set_num_threads", lib.openblas_set_num_threads);
    detail::bind(lib.handle, "openblas_get_corename", lib.openblas_get_corename);
    detail::bind(lib.handle, "openblas_get_parallel", lib.openblas_get_parallel);
    detail::bind(lib.handle, "openblas_get_num_threads", lib.openblas_get_num_threads);
    if (!lib.openblas_set_num_threads || !lib.openblas_get_corename || !lib.openblas_get_parallel ||
        !lib.openblas_get_num_threads)
      lib.sgemm = nullptr;
  } else {
    detail::bind(lib.handle, "bli_thread_set_num_threads", lib.bli_thread_set_num_threads);
    detail::bind(lib.handle, "bli_thread_get_num_threads", lib.bli_thread_get_num_threads);
    detail::bind(lib.handle, "bli_arch_query_id", lib.bli_arch_query_id);
    detail::bind(lib.handle, "bli_arch_string", lib.bli_arch_string);
    detail::bind(lib.handle, "bli_info_get_version_str", lib.bli_info_get_version_str);
    if (!lib.bli_thread_set_num_threads || !lib.bli_thread_get_num_threads || !lib.bli_arch_query_id ||
        !lib.bli_arch_string || !lib.bli_info_get_version_str)
      lib.sgemm = nullptr;
  }
  if (!lib.sgemm) lib.error = path + " lacks cblas_sgemm or its threading/info functions";
  return lib;
}

}  // namespace gale::bench
