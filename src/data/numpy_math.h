// The few floating-point operations of NumPy/Python that Megatron's dataset code depends on,
// reproduced bit for bit: numpy.sum (pairwise summation), weight normalisation and Python's
// round (half to even).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace gale {

// numpy.sum of a contiguous float64 array (pairwise summation with 8 accumulators).
double numpy_sum(std::span<const double> a);

// megatron.core.datasets.utils.normalize: numpy float64 w / numpy.sum(w).
std::vector<double> numpy_normalize(std::span<const double> w);

// Python's round(x) for a finite double: nearest integer, ties to even.
int64_t python_round(double x);

}  // namespace gale
