// The flows' log-determinant (zmat/flows.py, _log_det) as the fixed-atom forward (world.cpp) and
// inverse (fixed.cpp) sum it: each factor floored, in double for both dtypes, summed as the log of
// one product per structure.
#pragma once

#include <cmath>
#include <cstdint>

namespace zmat {

template <typename T>
inline double floor_abs(T v, T clamp) {  // max(|v|, clamp), in double
  const T a = std::fabs(v);
  return a < clamp ? clamp : a;
}

// A sum of logarithms as the log of a product: one log per structure, not two per atom. The
// product is kept in [2^-400, 2^400] by exact powers of two (frexp), so it neither overflows nor
// underflows; a factor above 2^400 (a bond of 1e60) adds its own log. Factors are floored
// (>= 1e-36) or NaN (which the product carries on). In double for both dtypes.
struct LogSum {
  double p = 1, extra = 0;
  int64_t e = 0;
  void add(double v) {
    if (v > 0x1p400) {
      extra += std::log(v);
      return;
    }
    p *= v;
    if (p > 0x1p400 || p < 0x1p-400) {
      int k;
      p = std::frexp(p, &k);
      e += k;
    }
  }
  double value() const { return std::log(p) + static_cast<double>(e) * 0.6931471805599453 + extra; }
};

template <typename T>
inline double power(double a, T w) {  // a^w, the log-det's weights being 2 and 1
  return w == T(2) ? a * a : (w == T(1) ? a : std::pow(a, static_cast<double>(w)));
}

}  // namespace zmat
