// Cartesian -> internal coordinates of rows (d, a, b, i), the inverse of the
// normalizing flows' transform (zmat/flows.py, _internal: the same formulas
// and degenerate values as zmat.to_internal), and its exact gradient.
// With the bonds b1 = a - d, b2 = b - a, b3 = i - b and n1 = b1 x b2,
// n2 = b2 x b3:
//   r = |b3|,  theta = atan2(|n2|, -b2 . b3),  phi = atan2(|b2| b1 . n2, n1 . n2),
// each norm 0 (zero gradient) below `tiny` on its square, each atan2 0 (zero
// gradient) where x^2 + y^2 <= tiny. A row's flags say which entries its table
// uses (bit 0: r, 1: theta, 2: phi; the others are 0 with zero gradient) or
// that the row is the position of atom i itself (bit 3). Arithmetic in the
// tensors' dtype, as the torch path's.
// Backward: the chain rule of those formulas, summed into the four atoms in
// row order per structure (the same bits on any number of threads).
#include <cmath>
#include <cstdint>

#include "parallel.h"

namespace {

template <typename A>
inline void cross(const A* u, const A* v, A* o) {
  o[0] = u[1] * v[2] - u[2] * v[1];
  o[1] = u[2] * v[0] - u[0] * v[2];
  o[2] = u[0] * v[1] - u[1] * v[0];
}
template <typename A>
inline A dot(const A* u, const A* v) {
  return u[0] * v[0] + u[1] * v[1] + u[2] * v[2];
}

struct Rows {
  int64_t m;
  const int64_t *d, *a, *b, *i;  // (M,) each, atoms of P
  const uint8_t* flags;          // (M,)
};

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

template <typename A>
inline A safe_sqrt(A sq, A tiny) {
  return sq <= tiny ? A(0) : std::sqrt(sq);
}

template <typename T, typename A = T>
void forward(const T* p, int64_t bn, const int64_t* ps, const Rows& q, T* out, A tiny, int64_t threads) {
  const int64_t m = q.m;
  zmat::parallel_for(bn, threads, [&](int64_t s) {
    const T* ps_ = p + s * ps[0];
    T* o = out + s * 3 * m;
    for (int64_t j = 0; j < m; ++j, o += 3) {
      const uint8_t f = q.flags[j];
      if (f & 8) {
        for (int c = 0; c < 3; ++c) o[c] = ps_[q.i[j] * ps[1] + c * ps[2]];
        continue;
      }
      o[0] = o[1] = o[2] = T(0);
      if (!(f & 7)) continue;
      const Row<T> r(ps_, ps[1], ps[2], q.d[j], q.a[j], q.b[j], q.i[j]);
      if (f & 1) o[0] = static_cast<T>(safe_sqrt(dot(r.b3, r.b3), tiny));
      if (f & 2) {
        const A y = safe_sqrt(dot(r.n2, r.n2), tiny), x = -dot(r.b2, r.b3);
        o[1] = static_cast<T>(x * x + y * y <= tiny ? A(0) : std::atan2(y, x));
      }
      if (f & 4) {
        const A y = safe_sqrt(dot(r.b2, r.b2), tiny) * dot(r.b1, r.n2), x = dot(r.n1, r.n2);
        o[2] = static_cast<T>(x * x + y * y <= tiny ? A(0) : std::atan2(y, x));
      }
    }
  });
}

// grad (B, K, 3) contiguous, k atoms: the gradient of sum g . out.
template <typename T, typename A = T>
void backward(const T* p, int64_t bn, const int64_t* ps, const Rows& q, const T* g, const int64_t* gs, T* grad,
              int64_t k, A tiny, int64_t threads) {
  const int64_t m = q.m;
  zmat::parallel_for(bn, threads, [&](int64_t s) {
    const T* ps_ = p + s * ps[0];
    const T* gp = g + s * gs[0];
    T* out = grad + s * 3 * k;
    for (int64_t j = 0; j < 3 * k; ++j) out[j] = T(0);
    for (int64_t j = 0; j < m; ++j) {
      const uint8_t f = q.flags[j];
      const A gr = gp[j * gs[1]], gt = gp[j * gs[1] + gs[2]], gf = gp[j * gs[1] + 2 * gs[2]];
      if (f & 8) {
        T* oi = out + 3 * q.i[j];
        oi[0] += static_cast<T>(gr);
        oi[1] += static_cast<T>(gt);
        oi[2] += static_cast<T>(gf);
        continue;
      }
      if (!(f & 7)) continue;
      const Row<T> r(ps_, ps[1], ps[2], q.d[j], q.a[j], q.b[j], q.i[j]);
      A G1[3] = {0, 0, 0}, G2[3] = {0, 0, 0}, G3[3] = {0, 0, 0}, t[3], u[3];
      if (f & 1) {  // r = |b3|
        const A sq = dot(r.b3, r.b3);
        if (!(sq <= tiny)) {
          const A w = gr / std::sqrt(sq);
          for (int c = 0; c < 3; ++c) G3[c] += w * r.b3[c];
        }
      }
      if (f & 2) {  // theta = atan2(y = |n2|, x = -b2 . b3)
        const A sq = dot(r.n2, r.n2), y = safe_sqrt(sq, tiny), x = -dot(r.b2, r.b3), h = x * x + y * y;
        if (!(h <= tiny)) {
          const A gy = gt * x / h, gx = -gt * y / h;
          if (!(sq <= tiny)) {  // dy = n2^ . (db2 x b3 + b2 x db3)
            const A w = gy / y;
            cross(r.b3, r.n2, t);
            cross(r.n2, r.b2, u);
            for (int c = 0; c < 3; ++c) {
              G2[c] += w * t[c];
              G3[c] += w * u[c];
            }
          }
          for (int c = 0; c < 3; ++c) {  // dx = -(db2 . b3 + b2 . db3)
            G2[c] -= gx * r.b3[c];
            G3[c] -= gx * r.b2[c];
          }
        }
      }
      if (f & 4) {  // phi = atan2(Y = |b2| b1 . n2, X = n1 . n2)
        const A sq = dot(r.b2, r.b2), nb = safe_sqrt(sq, tiny), e = dot(r.b1, r.n2);
        const A y = nb * e, x = dot(r.n1, r.n2), h = x * x + y * y;
        if (!(h <= tiny)) {
          const A gy = gf * x / h, gx = -gf * y / h;
          if (!(sq <= tiny))  // d|b2| = b2^ . db2
            for (int c = 0; c < 3; ++c) G2[c] += gy * e / nb * r.b2[c];
          // d(b1 . n2) = db1 . n2 + db2 . (b3 x b1) + db3 . n1
          cross(r.b3, r.b1, t);
          for (int c = 0; c < 3; ++c) {
            G1[c] += gy * nb * r.n2[c];
            G2[c] += gy * nb * t[c];
            G3[c] += gy * nb * r.n1[c];
          }
          // d(n1 . n2) = db1 . (b2 x n2) + db2 . (n2 x b1 + b3 x n1) + db3 . (n1 x b2)
          cross(r.b2, r.n2, t);
          for (int c = 0; c < 3; ++c) G1[c] += gx * t[c];
          cross(r.n2, r.b1, t);
          cross(r.b3, r.n1, u);
          for (int c = 0; c < 3; ++c) G2[c] += gx * (t[c] + u[c]);
          cross(r.n1, r.b2, t);
          for (int c = 0; c < 3; ++c) G3[c] += gx * t[c];
        }
      }
      T *od = out + 3 * q.d[j], *oa = out + 3 * q.a[j], *ob = out + 3 * q.b[j], *oi = out + 3 * q.i[j];
      for (int c = 0; c < 3; ++c) {  // b1 = a - d, b2 = b - a, b3 = i - b
        od[c] -= static_cast<T>(G1[c]);
        oa[c] += static_cast<T>(G1[c] - G2[c]);
        ob[c] += static_cast<T>(G2[c] - G3[c]);
        oi[c] += static_cast<T>(G3[c]);
      }
    }
  });
}

}  // namespace

// path (4, M): the atoms d, a, b, i of every row; positions p (B, K, 3) with
// element strides p0, p1, p2; out (B, M, 3) contiguous; grad (B, K, 3) contiguous.
#define ZMAT_INTERNAL(T, SUFFIX, TINY)                                                                       \
  extern "C" void zmat_internal_forward_##SUFFIX(const T* p, int64_t b, int64_t p0, int64_t p1, int64_t p2, \
                                                 int64_t m, const int64_t* path, const uint8_t* flags,      \
                                                 T* out, int64_t threads) {                                 \
    const int64_t ps[3] = {p0, p1, p2};                                                                     \
    forward<T>(p, b, ps, Rows{m, path, path + m, path + 2 * m, path + 3 * m, flags}, out, TINY, threads);   \
  }                                                                                                         \
  extern "C" void zmat_internal_backward_##SUFFIX(                                                          \
      const T* p, int64_t b, int64_t p0, int64_t p1, int64_t p2, int64_t k, int64_t m, const int64_t* path, \
      const uint8_t* flags, const T* g, int64_t g0, int64_t g1, int64_t g2, T* grad, int64_t threads) {     \
    const int64_t ps[3] = {p0, p1, p2}, gs[3] = {g0, g1, g2};                                               \
    backward<T>(p, b, ps, Rows{m, path, path + m, path + 2 * m, path + 3 * m, flags}, g, gs, grad, k, TINY, \
                threads);                                                                                   \
  }

ZMAT_INTERNAL(float, f32, 1e-12f)
ZMAT_INTERNAL(double, f64, 1e-24)
