// Byte-plane split + zstd: the in-memory lossless codec of the compression features.
#include "core/plane_codec.h"

#include <zstd.h>
#include <zstd_errors.h>

#include <bit>
#include <cstring>
#include <utility>

#include "core/check.h"
#include "core/threads.h"

namespace gale {

namespace {

constexpr int kZstdLevel = 1;
// The word loads below take byte b of an element as bits [8b, 8b + 8).
static_assert(std::endian::native == std::endian::little, "plane_codec assumes a little-endian host");

// One compression / decompression context per thread, kept for the process.
ZSTD_CCtx* cctx() {
  thread_local struct Holder {
    ZSTD_CCtx* ctx = ZSTD_createCCtx();
    ~Holder() { ZSTD_freeCCtx(ctx); }
  } h;
  return h.ctx;
}
ZSTD_DCtx* dctx() {
  thread_local struct Holder {
    ZSTD_DCtx* ctx = ZSTD_createDCtx();
    ~Holder() { ZSTD_freeDCtx(ctx); }
  } h;
  return h.ctx;
}

// Byte `byte` of every element into `plane`: whole-word loads and shifts, so that the loop
// vectorises (a strided byte loop is several times slower).
template <class W>
void gather_words(const uint8_t* in, int64_t numel, int byte, uint8_t* plane) {
  const int shift = 8 * byte;
#pragma omp simd
  for (int64_t i = 0; i < numel; ++i) {
    W w;
    std::memcpy(&w, in + i * static_cast<int64_t>(sizeof(W)), sizeof(W));
    plane[i] = static_cast<uint8_t>(w >> shift);
  }
}

// The reverse: byte `byte` of every element of `out` replaced by the plane's.
template <class W>
void scatter_words(const uint8_t* plane, int64_t numel, int byte, uint8_t* out) {
  const int shift = 8 * byte;
  const W keep = static_cast<W>(~(static_cast<W>(0xff) << shift));
#pragma omp simd
  for (int64_t i = 0; i < numel; ++i) {
    W w;
    std::memcpy(&w, out + i * static_cast<int64_t>(sizeof(W)), sizeof(W));
    w = static_cast<W>((w & keep) | (static_cast<W>(plane[i]) << shift));
    std::memcpy(out + i * static_cast<int64_t>(sizeof(W)), &w, sizeof(W));
  }
}

void gather_plane(const uint8_t* in, int64_t numel, int width, int byte, uint8_t* plane) {
  switch (width) {
    case 1: std::memcpy(plane, in, static_cast<size_t>(numel)); return;
    case 2: gather_words<uint16_t>(in, numel, byte, plane); return;
    case 4: gather_words<uint32_t>(in, numel, byte, plane); return;
    case 8: gather_words<uint64_t>(in, numel, byte, plane); return;
    default:
      for (int64_t i = 0; i < numel; ++i) plane[i] = in[i * width + byte];
  }
}

void scatter_plane(const uint8_t* plane, int64_t numel, int width, int byte, uint8_t* out) {
  switch (width) {
    case 1: std::memcpy(out, plane, static_cast<size_t>(numel)); return;
    case 2: scatter_words<uint16_t>(plane, numel, byte, out); return;
    case 4: scatter_words<uint32_t>(plane, numel, byte, out); return;
    case 8: scatter_words<uint64_t>(plane, numel, byte, out); return;
    default:
      for (int64_t i = 0; i < numel; ++i) out[i * width + byte] = plane[i];
  }
}

}  // namespace

int64_t CompressedPlanes::stored_bytes() const {
  int64_t n = 0;
  for (const Tensor& p : planes) n += p.defined() ? static_cast<int64_t>(p.nbytes()) : 0;
  return n;
}

namespace {

// Plane `plane` (numel bytes) zstd-coded into `frame` (numel bytes): the stored plane,
// coded where that is smaller, else a copy of the raw bytes.
std::pair<Tensor, bool> store_plane(const uint8_t* plane, int64_t numel, bool code, uint8_t* frame, int64_t frame_bytes) {
  if (code && numel > 0) {
    // `frame` has numel bytes: a frame that does not fit is no smaller than the raw plane.
    const size_t n = ZSTD_compressCCtx(cctx(), frame, static_cast<size_t>(frame_bytes), plane,
                                       static_cast<size_t>(numel), kZstdLevel);
    GALE_CHECK(!ZSTD_isError(n) || ZSTD_getErrorCode(n) == ZSTD_error_dstSize_tooSmall)
        << "zstd: " << ZSTD_getErrorName(n);
    if (!ZSTD_isError(n) && static_cast<int64_t>(n) < numel) {
      Tensor stored = Tensor::empty({static_cast<int64_t>(n)}, DType::kU8);
      std::memcpy(stored.raw(), frame, n);
      return {std::move(stored), true};
    }
  }
  Tensor stored = Tensor::empty({numel}, DType::kU8);
  if (numel > 0) std::memcpy(stored.raw(), plane, static_cast<size_t>(numel));
  return {std::move(stored), false};
}

// Plane k of `c` into `out` (numel bytes): decoded, or its raw bytes copied.
void load_plane(const CompressedPlanes& c, int k, uint8_t* out) {
  const Tensor& p = c.planes[static_cast<size_t>(k)];
  if (!c.coded[static_cast<size_t>(k)]) {
    GALE_CHECK_EQ(p.numel(), c.numel);
    if (c.numel > 0) std::memcpy(out, p.raw(), static_cast<size_t>(c.numel));
    return;
  }
  const size_t n = ZSTD_decompressDCtx(dctx(), out, static_cast<size_t>(c.numel), p.raw(), static_cast<size_t>(p.numel()));
  GALE_CHECK(!ZSTD_isError(n) && static_cast<int64_t>(n) == c.numel)
      << "decompress_planes: plane " << k << ": " << (ZSTD_isError(n) ? ZSTD_getErrorName(n) : "wrong size") << " ("
      << c.numel << " bytes expected)";
}

// With several threads the planes are coded at once, each on its own thread (and the byte split
// runs over element ranges), from one scratch of every plane: numel · width bytes (plus the zstd
// frames when compressing). One thread works plane by plane with one plane of scratch.
bool parallel_planes(int width) { return width > 1 && num_threads() > 1; }

}  // namespace

CompressedPlanes compress_planes(const void* data, int64_t numel, int width, int coded_planes) {
  GALE_CHECK(width >= 1 && width <= 8) << "compress_planes: element width " << width;
  GALE_CHECK(numel >= 0) << "compress_planes: " << numel << " elements";
  CompressedPlanes c;
  c.numel = numel;
  c.width = width;
  if (coded_planes < 0 || coded_planes > width) coded_planes = width;
  const uint8_t* in = static_cast<const uint8_t*>(data);
  const int64_t bound = numel;  // frame capacity: larger frames are stored raw anyway
  c.planes.resize(static_cast<size_t>(width));
  c.coded.assign(static_cast<size_t>(width), false);
  if (!parallel_planes(width)) {
    Tensor plane = Tensor::empty({numel}, DType::kU8);
    Tensor frame = coded_planes > 0 ? Tensor::empty({bound}, DType::kU8) : Tensor();
    for (int k = 0; k < width; ++k) {
      gather_plane(in, numel, width, width - 1 - k, plane.data<uint8_t>());
      auto [stored, coded] = store_plane(plane.data<uint8_t>(), numel, k < coded_planes,
                                         frame.defined() ? frame.data<uint8_t>() : nullptr, bound);
      c.planes[static_cast<size_t>(k)] = std::move(stored);
      c.coded[static_cast<size_t>(k)] = coded;
    }
    return c;
  }
  Tensor planes = Tensor::empty({numel * width}, DType::kU8);
  Tensor frames = coded_planes > 0 ? Tensor::empty({bound * coded_planes}, DType::kU8) : Tensor();
  uint8_t* pl = planes.data<uint8_t>();
  parallel_for(numel, 1 << 16, [&](int64_t b, int64_t e) {
    for (int k = 0; k < width; ++k)
      gather_plane(in + b * width, e - b, width, width - 1 - k, pl + k * numel + b);
  });
  uint8_t coded[8] = {};  // not c.coded: std::vector<bool>'s elements share words, so threads may not write them
  parallel_for(width, 1, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      const bool code = k < coded_planes;
      auto [stored, is_coded] = store_plane(pl + k * numel, numel, code,
                                            code ? frames.data<uint8_t>() + k * bound : nullptr, bound);
      c.planes[static_cast<size_t>(k)] = std::move(stored);
      coded[k] = is_coded ? 1 : 0;
    }
  });
  for (int k = 0; k < width; ++k) c.coded[static_cast<size_t>(k)] = coded[k] != 0;
  return c;
}

void decompress_planes(const CompressedPlanes& c, void* out) {
  GALE_CHECK(static_cast<int>(c.planes.size()) == c.width && c.coded.size() == c.planes.size())
      << "decompress_planes: " << c.planes.size() << " planes for width " << c.width;
  uint8_t* o = static_cast<uint8_t*>(out);
  const int64_t numel = c.numel;
  const int width = c.width;
  if (!parallel_planes(width)) {
    Tensor plane = Tensor::empty({numel}, DType::kU8);
    for (int k = 0; k < width; ++k) {
      load_plane(c, k, plane.data<uint8_t>());
      if (numel > 0) scatter_plane(plane.data<uint8_t>(), numel, width, width - 1 - k, o);
    }
    return;
  }
  Tensor planes = Tensor::empty({numel * width}, DType::kU8);
  uint8_t* pl = planes.data<uint8_t>();
  parallel_for(width, 1, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) load_plane(c, static_cast<int>(k), pl + k * numel);
  });
  // Element ranges, each word written by one thread.
  parallel_for(numel, 1 << 16, [&](int64_t b, int64_t e) {
    for (int k = 0; k < width; ++k) scatter_plane(pl + k * numel + b, e - b, width, width - 1 - k, o + b * width);
  });
}

CompressedTensor CompressedTensor::encode(const Tensor& t, int coded_planes) {
  CompressedTensor c;
  c.shape = t.shape();
  c.dtype = t.dtype();
  c.planes = compress_planes(t.raw(), t.numel(), dtype_size(t.dtype()), coded_planes);
  return c;
}

Tensor CompressedTensor::decode() const {
  Tensor t = Tensor::empty(shape, dtype);
  decompress_planes(planes, t.raw());
  return t;
}

}  // namespace gale
