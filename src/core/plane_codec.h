// Lossless compression of tensors in memory: a byte-plane split of the elements, then zstd
// (--compress-optimizer, --compress-activation, --compress-dense).
//
// MindSpeed's compression features call an Ascend lossless entropy coder (npu_hans_encode /
// npu_hans_decode, an ANS coder on the vector units) that codes the exponent byte of each bf16/fp16
// element with a probability table and keeps the mantissa bytes as they are. Gale does the same
// thing on the CPU with a well-kept library: the elements' bytes are split into planes by
// significance (plane 0 the most significant byte of every element: for f32 and bf16 the sign and
// the high exponent bits, where the redundancy of trained values is; the last plane the least
// significant mantissa byte), and each coded plane is compressed on its own with zstd (Debian's
// libzstd, level 1: LZ matching with Huffman-coded literals and FSE, a tabled ANS coder, for the
// sequences). A plane that zstd does not shrink is stored raw, so the compressed size is never more
// than the input plus a few bytes per plane. Decoding gives the input back bit for bit (NaN
// payloads, infinities, denormals and negative zeros included); nothing is written to disk.
//
// Every stored plane is a u8 Tensor of its exact size, so the allocator's byte count (core/allocator.h)
// shows the compressed footprint. With one thread, encoding and decoding work plane by plane with
// scratch tensors of one plane's size; with several (core/threads.h), the planes are coded at once,
// one per thread, from a scratch of every plane (the input's size, plus as much again for the zstd
// frames when encoding). The coded bytes are the same either way.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace gale {

// Plane k of `numel` elements of `width` bytes (1..8) is byte width−1−k of each little-endian
// element. `coded_planes` of them, from plane 0, are zstd-coded (or raw where that is smaller); the
// others are stored raw. −1 codes every plane.
struct CompressedPlanes {
  int64_t numel = 0;
  int width = 0;
  std::vector<Tensor> planes;  // width u8 tensors of numel bytes or fewer
  std::vector<bool> coded;     // whether plane k holds a zstd frame (else its raw bytes)

  // Bytes held by the planes (what the allocator counts for them, less its 64-byte rounding).
  int64_t stored_bytes() const;
  int64_t raw_bytes() const { return numel * width; }
  bool empty() const { return planes.empty(); }
};

// Compresses `numel` elements of `width` bytes at `data`.
CompressedPlanes compress_planes(const void* data, int64_t numel, int width, int coded_planes = -1);
// Writes the elements back to `out` (numel · width bytes). A corrupt plane stops the job (the
// planes never leave the process, so that is an invariant, not a user error).
void decompress_planes(const CompressedPlanes& c, void* out);

// A tensor compressed with compress_planes (its dtype's width), with its shape and dtype.
struct CompressedTensor {
  Shape shape;
  DType dtype = DType::kF32;
  CompressedPlanes planes;

  static CompressedTensor encode(const Tensor& t, int coded_planes = -1);
  Tensor decode() const;
  int64_t stored_bytes() const { return planes.stored_bytes(); }
  int64_t raw_bytes() const { return planes.raw_bytes(); }
};

}  // namespace gale
