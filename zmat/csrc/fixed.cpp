// The normalizing flows' inverse with fixed atoms (zmat/flows.py, _fixed_inverse): every row's
// (r, theta, phi) from positions by internal.cpp's forward (row_geometry.h: the same formulas,
// degenerate values and flags), its atan2 inline (atan.h: within 3 ulp of the library's,
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
#include "row_geometry.h"

namespace {

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
    const auto atan2 = [](T y, T x) { return zmat::fast_atan2(y, x); };
    for (int64_t j = 0; j < m; ++j, o += 3) {
      double sin_t = 0, cos_t = 0;  // |n2|, -b2 . b3 over their norm, in double, where theta is defined
      zmat::row_entries(x, ps[1], ps[2], d[j], a[j], b[j], i[j], flags[j], tiny, o, atan2, [&](T ty, T tx) {
        const double h = std::sqrt(static_cast<double>(tx) * tx + static_cast<double>(ty) * ty);
        sin_t = ty / h, cos_t = tx / h;
      });
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
