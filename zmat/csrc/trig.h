// sin and cos of doubles inline, from fdlibm's kernels (within ~2 ulp of the library's): the
// flows' forward takes two angles per atom, and two calls of the library's sincos cost more
// than the rest of the atom's arithmetic. Inputs they do not cover go to the library.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace zmat {

// sin x, cos x for |x| < 2^19 pi/2: reduced by pi/2 in three parts (exact there), then fdlibm's
// kernels on [-pi/4, pi/4]; no branch and no conversion, so that a loop of them vectorises.
inline void sin_cos_reduced(double x, double& s, double& c) {
  // x / (pi/2) to the nearest integer k, without a call (rounding by adding 1.5 * 2^52, whose
  // low mantissa bits are then k's in two's complement)
  const double shifted = x * 0.6366197723675814 + 6755399441055744.0, k = shifted - 6755399441055744.0;
  // k * p1, k * p2 are exact (p1, p2 have 33 bits, |k| < 2^20)
  const double r = ((x - k * 1.5707963267341256) - k * 6.077100506303966e-11) - k * 2.0222662487959506e-21;
  const double z = r * r;
  const double ps = 8.33333333332248946124e-03 +
                    z * (-1.98412698298579493134e-04 +
                         z * (2.75573137070700676789e-06 + z * (-2.50507602534068634195e-08 + z * 1.58969099521155010221e-10)));
  const double sn = r + r * z * (-1.66666666666666324348e-01 + z * ps);
  const double pc =
      z * (4.16666666666666019037e-02 +
           z * (-1.38888888888741095749e-03 +
                z * (2.48015872894767294178e-05 +
                     z * (-2.75573143513906633035e-07 + z * (2.08757232129817482790e-09 + z * -1.13596475577881948265e-11)))));
  const double hz = 0.5 * z, w = 1.0 - hz;
  const double cs = w + (((1.0 - w) - hz) + z * pc);
  // by the quadrant, without branches (random angles would mispredict): swap where odd, then signs
  uint64_t q, bs, bc, bsn, bcs;
  std::memcpy(&q, &shifted, 8), std::memcpy(&bsn, &sn, 8), std::memcpy(&bcs, &cs, 8);
  const uint64_t odd = 0 - (q & 1);
  bs = ((bsn & ~odd) | (bcs & odd)) ^ ((q & 2) << 62);
  bc = ((bcs & ~odd) | (bsn & odd)) ^ (((q + 1) & 2) << 62);
  std::memcpy(&s, &bs, 8), std::memcpy(&c, &bc, 8);
}

// sin x, cos x for any x: |x| >= 2^19 pi/2 and non-finite x by std::sin, std::cos
inline void sin_cos(double x, double& s, double& c) {
  if (std::fabs(x) < 823549.6) return sin_cos_reduced(x, s, c);  
  s = std::sin(x), c = std::cos(x);
}

// s[j], c[j] = sin x[j], cos x[j] for j < n: one vectorised pass where every x is covered
inline void sin_cos_n(const double* x, double* s, double* c, int64_t n) {
  bool covered = true;
  for (int64_t j = 0; j < n; ++j) covered &= std::fabs(x[j]) < 823549.6;
  if (covered)
    for (int64_t j = 0; j < n; ++j) sin_cos_reduced(x[j], s[j], c[j]);
  else
    for (int64_t j = 0; j < n; ++j) sin_cos(x[j], s[j], c[j]);
}

}  // namespace zmat
