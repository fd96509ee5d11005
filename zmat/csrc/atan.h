// atan2 in a few multiplications (Cephes' atan and atanf: range reduction to
// |x| <= tan(pi/8) then a rational, resp. polynomial, approximation): within
// 2 ulp of std::atan2 for finite arguments, several times faster than libm's
// (the carried walk's dihedrals and angles are its cost).
#pragma once

#include <cmath>

namespace zmat {

inline double atan_pos(double x) {  // x >= 0
  double y = 0.0, m = 0.0;
  if (x > 2.41421356237309504880) {
    y = 1.57079632679489661923, m = 6.123233995736765886130e-17, x = -1.0 / x;
  } else if (x > 0.66) {
    y = 0.78539816339744830962, m = 0.5 * 6.123233995736765886130e-17, x = (x - 1.0) / (x + 1.0);
  }
  const double z = x * x;
  const double p = (((-8.750608600031904122785e-1 * z - 1.615753718733365076637e1) * z -
                     7.500855792314704667340e1) * z - 1.228866684490136173410e2) * z -
                   6.485021904942025371773e1;
  const double q = ((((z + 2.485846490142306297962e1) * z + 1.650270098316988542046e2) * z +
                     4.328810604912902668951e2) * z + 4.853903996359136964868e2) * z +
                   1.945506571482613964425e2;
  return y + ((x * (z * p / q) + m) + x);
}

inline float atan_pos(float x) {  // x >= 0
  float y = 0.0f;
  if (x > 2.414213562373095f) {
    y = 1.5707963267948966f, x = -1.0f / x;
  } else if (x > 0.4142135623730950f) {
    y = 0.7853981633974483f, x = (x - 1.0f) / (x + 1.0f);
  }
  const float z = x * x;
  return y + ((((8.05374449538e-2f * z - 1.38776856032e-1f) * z + 1.99777106478e-1f) * z - 3.33329491539e-1f) *
                  z * x + x);
}

template <typename T>
inline T fast_atan2(T y, T x) {
  const T ax = std::abs(x), ay = std::abs(y);
  T a = atan_pos(ay / ax);
  if (x < T(0)) a = T(3.14159265358979323846) - a;
  return std::signbit(y) ? -a : a;
}

}  // namespace zmat
