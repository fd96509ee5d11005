// The normalizing flows' inverse with fixed atoms (zmat/flows.py, _fixed_inverse): every row's
// (r, theta, phi) from positions, as internal.cpp's forward (the same formulas and degenerate
// values; a row's flags as there), its atan2 inline (atan.h: within 3 ulp of the library's,
// which was most of the pass), and in the same pass minus the log-determinant of the forward,
// -sum_i log(max(|r_i|, c)^w_i max(sin theta_i, c)^w'_i) (log_sum.h), sin theta from the row's
// geometry (no sine of theta: equal to world.cpp's log_det of these rows to rounding), and where
// asked its gradient in the rows (the backward then a product, no trigonometry). The rows'
// gradient is internal.cpp's backward.
#include <cmath>
#include <cstdint>

#include "atan.h"
#include "log_sum.h"
#include "parallel.h"
#include "vec3.h"

namespace {

using zmat::cross;
using zmat::dot;

template <typename T>
inline T angle(T y, T x, T tiny) {  // atan2, 0 where x^2 + y^2 <= tiny
  return x * x + y * y <= tiny ? T(0) : zmat::fast_atan2(y, x);
}

// One row (d, a, b, i) of structure p (strides s1 atoms, s2 components) into o[3], and sin theta,
// cos theta (|n2|, -b2 . b3 over their norm, in double; 0 where theta is) into sin_t, cos_t where
// the row has theta.
template <typename T>
inline void row(const T* p, int64_t s1, int64_t s2, int64_t d, int64_t a, int64_t b, int64_t i, uint8_t f,
                T tiny, T* o, double& sin_t, double& cos_t) {
  if (f & 8) {
    for (int c = 0; c < 3; ++c) o[c] = p[i * s1 + c * s2];
    return;
  }
  o[0] = o[1] = o[2] = T(0);
  if (!(f & 7)) return;
  T b1[3], b2[3], b3[3], n1[3], n2[3];
  for (int c = 0; c < 3; ++c) {
    const T xd = p[d * s1 + c * s2], xa = p[a * s1 + c * s2], xb = p[b * s1 + c * s2], xi = p[i * s1 + c * s2];
    b1[c] = xa - xd, b2[c] = xb - xa, b3[c] = xi - xb;
  }
  cross(b1, b2, n1);
  cross(b2, b3, n2);
  const auto norm = [tiny](T sq) { return sq <= tiny ? T(0) : std::sqrt(sq); };
  if (f & 1) o[0] = norm(dot(b3, b3));
  if (f & 4) o[2] = angle(norm(dot(b2, b2)) * dot(b1, n2), dot(n1, n2), tiny);
  if (f & 2) {
    const T y = norm(dot(n2, n2)), x = -dot(b2, b3), h = x * x + y * y;
    o[1] = h <= tiny ? T(0) : zmat::fast_atan2(y, x);
    if (h <= tiny) return;
    const double norm_h = std::sqrt(static_cast<double>(x) * x + static_cast<double>(y) * y);
    sin_t = y / norm_h, cos_t = x / norm_h;
  }
}

// path (4, M) the atoms d, a, b, i of every row; w (M, 2) the log-det's weights; out (B, M, 3),
// ld (B,) contiguous; gl (B, M, 3) contiguous or null: the gradient of ld in the rows,
// -w / r and -w' cot theta (0 where floored), cot theta = cos theta / sin theta from the geometry.
template <typename T>
void inverse(const T* p, int64_t bn, const int64_t* ps, int64_t m, const int64_t* path, const uint8_t* flags,
             const T* w, T* out, T* ld, T* gl, T tiny, T clamp, int64_t threads) {
  const int64_t *d = path, *a = path + m, *b = path + 2 * m, *i = path + 3 * m;
  zmat::parallel_for(bn, threads, [&](int64_t s) {
    const T* x = p + s * ps[0];
    T* o = out + s * 3 * m;
    T* g = gl ? gl + s * 3 * m : nullptr;
    zmat::LogSum sum;
    for (int64_t j = 0; j < m; ++j, o += 3) {
      double sin_t = 0, cos_t = 0;
      row(x, ps[1], ps[2], d[j], a[j], b[j], i[j], flags[j], tiny, o, sin_t, cos_t);
      const T w0 = w[2 * j], w1 = w[2 * j + 1];
      if (g) {
        g[0] = w0 != T(0) && o[0] >= clamp ? -w0 / o[0] : T(0);
        g[1] = w1 != T(0) && sin_t >= clamp ? static_cast<T>(-w1 * cos_t / sin_t) : T(0);
        g[2] = T(0);
        g += 3;
      }
      if (w0 == T(0) && w1 == T(0)) continue;
      double v = w0 != T(0) ? zmat::power(zmat::floor_abs(o[0], clamp), w0) : 1.0;
      if (w1 != T(0)) v *= zmat::power(sin_t < clamp ? static_cast<double>(clamp) : sin_t, w1);
      sum.add(v);
    }
    ld[s] = -static_cast<T>(sum.value());
  });
}

}  // namespace

// positions p (B, K, 3) with element strides p0, p1, p2; the rest as inverse's.
#define ZMAT_FIXED_INVERSE(T, SUFFIX, TINY, CLAMP)                                                          \
  extern "C" void zmat_fixed_inverse_##SUFFIX(const T* p, int64_t b, int64_t p0, int64_t p1, int64_t p2,   \
                                              int64_t m, const int64_t* path, const uint8_t* flags,        \
                                              const T* w, T* out, T* ld, T* gl, int64_t threads) {         \
    const int64_t ps[3] = {p0, p1, p2};                                                                    \
    inverse<T>(p, b, ps, m, path, flags, w, out, ld, gl, TINY, CLAMP, threads);                            \
  }

ZMAT_FIXED_INVERSE(float, f32, 1e-12f, 1e-6f)
ZMAT_FIXED_INVERSE(double, f64, 1e-24, 1e-12)
