// Counter-based random numbers (Philox-4x32-10): the value at (seed, stream, index) is a pure
// function, so any rank can draw exactly its slice of a tensor, recomputation redraws the same
// dropout mask, and results do not depend on thread count or parallel layout.
//
// Streams name what is drawn (a parameter, a dropout site, a micro-batch); model/params.h and
// model/transformer_layer.h build the parameter and dropout streams. Parameter initialisation
// draws one Philox block per element (uniform_at, normal_at); dropout masks use all 4 words of
// each block (dropout_uniform_at).
#pragma once

#include <cstdint>

namespace gale {

struct Philox4x32 {
  uint32_t v[4];
};

// One Philox-4x32-10 block: 4 uniformly random 32-bit words for (key, counter).
Philox4x32 philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo);

// Mix several 64-bit values into one stream id (splitmix64-based; not cryptographic).
uint64_t mix_stream(uint64_t a, uint64_t b);
uint64_t mix_stream(uint64_t a, uint64_t b, uint64_t c);
uint64_t mix_stream(uint64_t a, uint64_t b, uint64_t c, uint64_t d);

// Uniform in [0, 1) with 24 random bits, element `index` of stream `stream` under `seed`.
float uniform_at(uint64_t seed, uint64_t stream, uint64_t index);
// Dropout masks' uniform (24 bits): word index & 3 of philox4x32(seed, stream, index >> 2).
float dropout_uniform_at(uint64_t seed, uint64_t stream, uint64_t index);
// Standard normal (Box-Muller on two uniforms), element `index` of the stream.
float normal_at(uint64_t seed, uint64_t stream, uint64_t index);

// Fill out[i] = mean + std * normal_at(seed, stream, offset + i) for i in [0, n) (parallel).
void fill_normal(float* out, int64_t n, float mean, float std, uint64_t seed, uint64_t stream, uint64_t offset);
// Fill out[i] = uniform_at(seed, stream, offset + i) (parallel).
void fill_uniform(float* out, int64_t n, uint64_t seed, uint64_t stream, uint64_t offset);

}  // namespace gale
