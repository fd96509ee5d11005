// atan2 in one division and a few multiplications (Cephes' atan and atanf: the
// ratio reduced to |t| <= tan(pi/8) (0.66 in double: Cephes' split) as one
// quotient, t = ay / ax, (ay - ax) / (ay + ax) or -ax / ay, chosen without
// branches, then a rational, resp. polynomial, approximation): within 2 ulp
// (double), 3 ulp (float) of std::atan2 for finite arguments, several times
// faster than libm's (the carried walk's dihedrals and angles are its cost).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace zmat {

// atan(x) - x: for |x| <= 0.66 (double; x = tan(3 pi / 8) reduced) and |x| <= tan(pi / 8) (float),
// written once for a scalar or a vector of lanes V (atan2_all), the tag naming the precision.
template <typename V>
inline V atan_poly_lanes(V x, double) {
  const V z = x * x;
  const V p = (((-8.750608600031904122785e-1 * z - 1.615753718733365076637e1) * z -
                7.500855792314704667340e1) * z - 1.228866684490136173410e2) * z -
              6.485021904942025371773e1;
  const V q = ((((z + 2.485846490142306297962e1) * z + 1.650270098316988542046e2) * z +
                4.328810604912902668951e2) * z + 4.853903996359136964868e2) * z +
              1.945506571482613964425e2;
  return x * (z * p / q);
}

template <typename V>
inline V atan_poly_lanes(V x, float) {
  const V z = x * x;
  return (((8.05374449538e-2f * z - 1.38776856032e-1f) * z + 1.99777106478e-1f) * z - 3.33329491539e-1f) * z * x;
}

inline double atan_poly(double x) { return atan_poly_lanes(x, 0.0); }

inline float atan_poly(float x) { return atan_poly_lanes(x, 0.0f); }

template <typename T>
struct AtanSplit;  // the thresholds on ay / ax, and pi/2, pi/4 in two parts (double: Cephes' m)
template <>
struct AtanSplit<double> {
  static constexpr double hi = 2.41421356237309504880, lo = 0.66, m = 6.123233995736765886130e-17;
};
template <>
struct AtanSplit<float> {
  static constexpr float hi = 2.414213562373095f, lo = 0.4142135623730950f, m = 0.0f;
};

template <typename T>
inline T fast_atan2(T y, T x) {
  using S = AtanSplit<T>;
  const T ax = std::abs(x), ay = std::abs(y);
  const bool big = ay > S::hi * ax, mid = !big && ay > S::lo * ax;  // (NaN: neither)
  const T num = big ? -ax : (mid ? ay - ax : ay), den = big ? ay : (mid ? ay + ax : ax);
  const T t = num / den;
  const T y0 = big ? T(1.57079632679489661923) : (mid ? T(0.78539816339744830962) : T(0));
  const T m = big ? S::m : (mid ? T(0.5) * S::m : T(0));
  T a = y0 + ((atan_poly(t) + m) + t);
  if (x < T(0)) a = T(3.14159265358979323846) - a;
  return std::signbit(y) ? -a : a;
}

// out[j] = fast_atan2(y[j], x[j]), 0 where x^2 + y^2 <= tiny, for j < n, n a multiple of 16
// bytes of T (the caller pads): the same operations in the same order on 16-byte vectors
// (the compiler keeps the scalar form's branches, so it would not vectorise that).
#if defined(__GNUC__)
template <typename T>
inline void atan2_all(const T* y, const T* x, T* out, int64_t n, T tiny) {
  using I = std::conditional_t<sizeof(T) == 4, int32_t, int64_t>;
  typedef T V __attribute__((vector_size(16)));
  typedef I M __attribute__((vector_size(16)));
  using S = AtanSplit<T>;
  constexpr int k = 16 / sizeof(T);
  const V zero = {}, half_pi = zero + T(1.57079632679489661923);
  const V quarter_pi = zero + T(0.78539816339744830962), pi = zero + T(3.14159265358979323846);
  const M sign = M{} + static_cast<I>(std::make_unsigned_t<I>(1) << (8 * sizeof(T) - 1));  // the sign bit
  auto sel = [](M m, V a, V b) { return (V)(((M)a & m) | ((M)b & ~m)); };
  for (int64_t j = 0; j < n; j += k) {
    V vy, vx;
    __builtin_memcpy(&vy, y + j, 16);
    __builtin_memcpy(&vx, x + j, 16);
    const V ax = (V)((M)vx & ~sign), ay = (V)((M)vy & ~sign);
    const M big = ay > (zero + S::hi) * ax, mid = ~big & (ay > (zero + S::lo) * ax);
    const V num = sel(big, -ax, sel(mid, ay - ax, ay)), den = sel(big, ay, sel(mid, ay + ax, ax));
    const V t = num / den;
    const V y0 = sel(big, half_pi, sel(mid, quarter_pi, zero));
    const V m = sel(big, zero + S::m, sel(mid, zero + T(0.5) * S::m, zero));
    V a = y0 + ((atan_poly_lanes(t, T(0)) + m) + t);
    a = sel(vx < zero, pi - a, a);
    a = sel(((M)vy & sign) != 0, -a, a);
    a = sel(vx * vx + vy * vy <= zero + tiny, zero, a);
    __builtin_memcpy(out + j, &a, 16);
  }
}
#else
template <typename T>
inline void atan2_all(const T* y, const T* x, T* out, int64_t n, T tiny) {
  for (int64_t j = 0; j < n; ++j) out[j] = x[j] * x[j] + y[j] * y[j] <= tiny ? T(0) : fast_atan2(y[j], x[j]);
}
#endif

}  // namespace zmat
