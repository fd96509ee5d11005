// One row (d, a, b, i)'s geometry and its (r, theta, phi), as zmat.to_internal: with the bonds
// b1 = a - d, b2 = b - a, b3 = i - b and n1 = b1 x b2, n2 = b2 x b3,
//   r = |b3|,  theta = atan2(|n2|, -b2 . b3),  phi = atan2(|b2| b1 . n2, n1 . n2),
// each norm 0 below `tiny` on its square, each atan2 0 where x^2 + y^2 <= tiny. Shared by
// internal.cpp (forward and backward) and fixed.cpp (the inverse with fixed atoms).
#pragma once

#include <cmath>
#include <cstdint>

#include "vec3.h"

namespace zmat {

template <typename A>
inline A safe_sqrt(A sq, A tiny) {
  return sq <= tiny ? A(0) : std::sqrt(sq);
}

// One row's geometry from positions p (strides s1 atoms, s2 components).
template <typename T, typename A = T>
struct Row {
  A b1[3], b2[3], b3[3], n1[3], n2[3];
  Row(const T* p, int64_t s1, int64_t s2, int64_t d, int64_t a, int64_t b, int64_t i) {
    for (int c = 0; c < 3; ++c) {
      const A xd = p[d * s1 + c * s2], xa = p[a * s1 + c * s2], xb = p[b * s1 + c * s2],
              xi = p[i * s1 + c * s2];
      b1[c] = xa - xd;
      b2[c] = xb - xa;
      b3[c] = xi - xb;
    }
    cross(b1, b2, n1);
    cross(b2, b3, n2);
  }
};

// A row's entries into o[3] by its flags f (bit 0: r, 1: theta, 2: phi, the others 0; bit 3: the
// position of atom i itself), each atan2 by `atan2`; where theta is defined, `on_theta(y, x)`
// with its arguments (fixed.cpp's sin theta).
template <typename T, typename A, typename Atan2, typename OnTheta>
inline void row_entries(const T* p, int64_t s1, int64_t s2, int64_t d, int64_t a, int64_t b, int64_t i,
                        uint8_t f, A tiny, T* o, Atan2 atan2, OnTheta on_theta) {
  if (f & 8) {
    for (int c = 0; c < 3; ++c) o[c] = p[i * s1 + c * s2];
    return;
  }
  o[0] = o[1] = o[2] = T(0);
  if (!(f & 7)) return;
  const Row<T, A> r(p, s1, s2, d, a, b, i);
  if (f & 1) o[0] = static_cast<T>(safe_sqrt(dot(r.b3, r.b3), tiny));
  if (f & 4) {
    const A y = safe_sqrt(dot(r.b2, r.b2), tiny) * dot(r.b1, r.n2), x = dot(r.n1, r.n2);
    o[2] = static_cast<T>(x * x + y * y <= tiny ? A(0) : atan2(y, x));
  }
  if (f & 2) {
    const A y = safe_sqrt(dot(r.n2, r.n2), tiny), x = -dot(r.b2, r.b3);
    const bool zero = x * x + y * y <= tiny;
    o[1] = static_cast<T>(zero ? A(0) : atan2(y, x));
    if (!zero) on_theta(y, x);
  }
}

}  // namespace zmat
