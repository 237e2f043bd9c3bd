// Byte-plane split + zstd: the in-memory lossless codec of the compression features.
#include "core/plane_codec.h"

#include <zstd.h>

#include <cstring>

#include "core/check.h"

namespace gale {

namespace {

constexpr int kZstdLevel = 1;

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

// Byte `byte` of every element into `plane`.
void gather_plane(const uint8_t* in, int64_t numel, int width, int byte, uint8_t* plane) {
  if (width == 1) {
    std::memcpy(plane, in, static_cast<size_t>(numel));
    return;
  }
  const uint8_t* p = in + byte;
  for (int64_t i = 0; i < numel; ++i) plane[i] = p[i * width];
}

// The reverse of gather_plane.
void scatter_plane(const uint8_t* plane, int64_t numel, int width, int byte, uint8_t* out) {
  if (width == 1) {
    std::memcpy(out, plane, static_cast<size_t>(numel));
    return;
  }
  uint8_t* p = out + byte;
  for (int64_t i = 0; i < numel; ++i) p[i * width] = plane[i];
}

}  // namespace

int64_t CompressedPlanes::stored_bytes() const {
  int64_t n = 0;
  for (const Tensor& p : planes) n += p.defined() ? static_cast<int64_t>(p.nbytes()) : 0;
  return n;
}

CompressedPlanes compress_planes(const void* data, int64_t numel, int width, int coded_planes) {
  GALE_CHECK(width >= 1 && width <= 8) << "compress_planes: element width " << width;
  GALE_CHECK(numel >= 0) << "compress_planes: " << numel << " elements";
  CompressedPlanes c;
  c.numel = numel;
  c.width = width;
  if (coded_planes < 0 || coded_planes > width) coded_planes = width;
  const uint8_t* in = static_cast<const uint8_t*>(data);
  Tensor plane = Tensor::empty({numel}, DType::kU8);
  Tensor frame;
  if (coded_planes > 0) frame = Tensor::empty({static_cast<int64_t>(ZSTD_compressBound(static_cast<size_t>(numel)))}, DType::kU8);
  for (int k = 0; k < width; ++k) {
    gather_plane(in, numel, width, width - 1 - k, plane.data<uint8_t>());
    if (k < coded_planes && numel > 0) {
      const size_t n = ZSTD_compressCCtx(cctx(), frame.data<uint8_t>(), static_cast<size_t>(frame.numel()),
                                         plane.data<uint8_t>(), static_cast<size_t>(numel), kZstdLevel);
      GALE_CHECK(!ZSTD_isError(n)) << "zstd: " << ZSTD_getErrorName(n);
      if (static_cast<int64_t>(n) < numel) {
        Tensor stored = Tensor::empty({static_cast<int64_t>(n)}, DType::kU8);
        std::memcpy(stored.raw(), frame.raw(), n);
        c.planes.push_back(std::move(stored));
        c.coded.push_back(true);
        continue;
      }
    }
    c.planes.push_back(plane.clone());
    c.coded.push_back(false);
  }
  return c;
}

void decompress_planes(const CompressedPlanes& c, void* out) {
  GALE_CHECK(static_cast<int>(c.planes.size()) == c.width && c.coded.size() == c.planes.size())
      << "decompress_planes: " << c.planes.size() << " planes for width " << c.width;
  uint8_t* o = static_cast<uint8_t*>(out);
  Tensor plane;
  for (int k = 0; k < c.width; ++k) {
    const Tensor& p = c.planes[static_cast<size_t>(k)];
    const uint8_t* bytes = p.numel() > 0 ? p.data<uint8_t>() : nullptr;
    if (c.coded[static_cast<size_t>(k)]) {
      if (!plane.defined()) plane = Tensor::empty({c.numel}, DType::kU8);
      const size_t n = ZSTD_decompressDCtx(dctx(), plane.data<uint8_t>(), static_cast<size_t>(c.numel), bytes,
                                           static_cast<size_t>(p.numel()));
      GALE_CHECK(!ZSTD_isError(n) && static_cast<int64_t>(n) == c.numel)
          << "decompress_planes: plane " << k << ": "
          << (ZSTD_isError(n) ? ZSTD_getErrorName(n) : "wrong size") << " (" << c.numel << " bytes expected)";
      bytes = plane.data<uint8_t>();
    } else {
      GALE_CHECK_EQ(p.numel(), c.numel);
    }
    if (c.numel > 0) scatter_plane(bytes, c.numel, c.width, c.width - 1 - k, o);
  }
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
