#!/usr/bin/python3
# Fits the polynomial coefficients of Gale's vectorised erf (src/kernels/cpu/simd_math.h).
#
# Run with Debian's Python (/usr/bin/python3: python3-numpy, python3-mpmath). Prints the two
# coefficient tables as C++ initialisers, highest degree first (Horner order), and the fit's
# maximum errors in double precision:
#   |x| <= 1 :  erf(x)  = c0*x + x^3 * P(x^2)              (relative error of the fit)
#   1 < |x|  :  erf(x)  = 1 - exp(-x^2) * Q(1/|x|),  |x| clamped to 4 (erf(4) rounds to 1.0f)
# Least squares on Chebyshev nodes (close to minimax), reference values from mpmath at 30 digits.
import mpmath
import numpy as np

mpmath.mp.dps = 30


def cheb_nodes(a, b, n):
    k = np.arange(n)
    return (a + b) / 2 + (b - a) / 2 * np.cos((2 * k + 1) * np.pi / (2 * n))


def fit_small(degree):
    x = cheb_nodes(0.0, 1.0, 600)
    y = np.array([float(mpmath.erf(v) / v) for v in x])
    c = np.polyfit(x * x, y, degree)
    xs = np.linspace(1e-4, 1.0, 20001)
    ref = np.array([float(mpmath.erf(v)) for v in xs])
    return c, np.max(np.abs(xs * np.polyval(c, xs * xs) - ref) / ref)


def fit_large(degree):
    x = cheb_nodes(1.0, 4.0, 600)
    y = np.array([float(mpmath.erfc(v) * mpmath.exp(v * v)) for v in x])
    c = np.polyfit(1.0 / x, y, degree)
    xs = np.linspace(1.0, 4.0, 20001)
    ref = np.array([float(mpmath.erfc(v)) for v in xs])
    return c, np.max(np.abs(np.exp(-xs * xs) * np.polyval(c, 1.0 / xs) - ref))


def cpp(name, coeffs):
    body = ", ".join("%.9ef" % v for v in coeffs)
    return "constexpr float %s[%d] = {%s};" % (name, len(coeffs), body)


small, small_err = fit_small(6)
large, large_err = fit_large(8)
print(cpp("kErfSmall", small[:-1]))
print("constexpr float kErfSmallC0 = %.9ef;  // leading coefficient: erf(x) = c0*x + x^3*P(x^2)" % small[-1])
print(cpp("kErfcLarge", large))
print("# max relative error of x*P(x^2) on (0, 1]: %.3g" % small_err)
print("# max absolute error of exp(-x^2)*Q(1/x) on [1, 4]: %.3g" % large_err)
