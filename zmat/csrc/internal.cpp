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
#include <type_traits>
#include <vector>

#include "atan.h"
#include "parallel.h"
#include "vec3.h"

namespace {

using zmat::cross;
using zmat::dot;

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

// theta = atan2(y = |n|, x = -b2 . b3), n = b2 x b3: g times its gradient, into g2 (b2), g3 (b3).
template <typename A>
inline void theta_backward(A g, const A* b2, const A* b3, const A* n, A tiny, A* g2, A* g3) {
  const A sq = dot(n, n), y = safe_sqrt(sq, tiny), x = -dot(b2, b3), h = x * x + y * y;
  if (h <= tiny) return;
  const A gy = g * x / h, gx = -g * y / h;
  A t[3], u[3];
  if (!(sq <= tiny)) {  // dy = n^ . (db2 x b3 + b2 x db3)
    const A w = gy / y;
    cross(b3, n, t);
    cross(n, b2, u);
    for (int c = 0; c < 3; ++c) g2[c] += w * t[c], g3[c] += w * u[c];
  }
  for (int c = 0; c < 3; ++c) g2[c] -= gx * b3[c], g3[c] -= gx * b2[c];  // dx = -(db2 . b3 + b2 . db3)
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
      if (f & 2) theta_backward(gt, r.b2, r.b3, r.n2, tiny, G2, G3);
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

// ---------------------------------------------------------------------------
// Every row of a table against the axes to_xyz carries through straight angles
// (zmat/_carried.py, internal_coordinates: the same formulas, thresholds and
// degenerate values). Atom i's row (b, a, d) gives b2 = b - a, b3 = i - b (a
// missing reference is the origin), n = b2 x b3, its own normal nh = n / |n|
// where defined (|n| > c |b2| |b3|, c = sqrt(_COLLINEAR)), else n itself.
// Atom i's axis: an end E (the fallback axes the caller computes, differentiably,
// for ROOT/BOND rows always and for planar/nerf rows where nh is undefined), nh
// where defined or the row is a chain end, else its reference's axis (signed
// slot ref[i] in [0, 2N): N + j is -axis_j). References precede their rows, so
// one walk in placement order (``order``) resolves every axis to a signed source (an own normal
// or an end). The dihedral phi = atan2((b2 x m) . nh, |b2| m . nh) against m,
// the axis of slot ref[i] (nerf rows: their end), 0 where nh is undefined.
// Backward: the chain rule into b2, b3 of every row, the gradient of an axis
// summed into its source (own normals: through nh = n / |n|; ends: returned).
namespace {

struct Carried {
  int64_t n, l;            // atoms, ends
  const int64_t *a, *b;    // (N,) each, -1: the origin
  const int64_t* ref;      // (N,) signed slots
  const int64_t* eslot;    // (N,) row of E, or -1
  const uint8_t* mode;     // bit 0: axis is E; 1: E where nh undefined; 2: m is E; 3: chain end
  const uint8_t* flags;    // bits 0-2 r, theta, phi present, 3 Cartesian (the position itself)
  const int64_t* order;    // (N,) atoms, every reference (and reference axis) before its row
};

// Per structure: geometry and resolved axes of every atom.
template <typename A>
struct Walk {
  std::vector<A> b2, b3, n, nh, s, nb;  // 3 N, 3 N, 3 N, 3 N, N, N
  std::vector<int64_t> src;            // (N,) source of atom i's axis: j < N own normal, N + e an end
  std::vector<int8_t> sgn;             // (N,) its sign
  std::vector<uint8_t> def;            // (N,)
  template <typename T>
  void fill(const Carried& q, const T* p, int64_t s1, int64_t s2, A c) {  // kept per thread: no allocation
    for (auto* v : {&b2, &b3, &n, &nh}) v->resize(3 * q.n);
    s.resize(q.n), nb.resize(q.n), src.resize(q.n), sgn.resize(q.n), def.resize(q.n);
    auto at = [&](int64_t j, int k) { return j < 0 ? A(0) : A(p[j * s1 + k * s2]); };
    for (int64_t o = 0; o < q.n; ++o) {
      const int64_t i = q.order[o];
      A* B2 = &b2[3 * i];
      A* B3 = &b3[3 * i];
      for (int k = 0; k < 3; ++k) {
        const A xb = at(q.b[i], k);
        B2[k] = xb - at(q.a[i], k);
        B3[k] = at(i, k) - xb;
      }
      cross(B2, B3, &n[3 * i]);
      const A tiny_ = std::is_same<A, float>::value ? A(1e-12f) : A(1e-24);
      s[i] = safe_sqrt(dot(&n[3 * i], &n[3 * i]), tiny_);
      nb[i] = safe_sqrt(dot(B2, B2), tiny_);
      const A r = safe_sqrt(dot(B3, B3), tiny_);
      def[i] = s[i] > c * nb[i] * r;
      for (int k = 0; k < 3; ++k) nh[3 * i + k] = def[i] ? n[3 * i + k] / s[i] : n[3 * i + k];
      const uint8_t md = q.mode[i];
      if (def[i] || (md & 8)) {
        const bool end = (md & 1) || ((md & 2) && !def[i]);
        src[i] = end ? q.n + q.eslot[i] : i;
        sgn[i] = 1;
      } else {
        const int64_t k = q.ref[i] % q.n;
        src[i] = src[k];
        sgn[i] = static_cast<int8_t>(q.ref[i] >= q.n ? -sgn[k] : sgn[k]);
      }
    }
  }
  // The axis m of row i (signed), into m.
  template <typename T>
  void axis_of_row(const Carried& q, int64_t i, const T* e, int64_t e1, int64_t e2, A* m, int64_t* where,
                   A* sign) const {
    int64_t so;
    A sg;
    if (q.mode[i] & 4) {
      so = q.n + q.eslot[i], sg = 1;
    } else {
      const int64_t k = q.ref[i] % q.n;
      so = src[k], sg = (q.ref[i] >= q.n ? -1 : 1) * sgn[k];
    }
    for (int c = 0; c < 3; ++c)
      m[c] = sg * (so < q.n ? nh[3 * so + c] : A(e[(so - q.n) * e1 + c * e2]));
    *where = so, *sign = sg;
  }
};

template <typename T, typename A = T>
void carried_forward(const T* p, int64_t bn, const int64_t* ps, const T* e, const int64_t* es, const Carried& q,
                     T* out, A tiny, A c, int64_t threads) {
  zmat::parallel_for(bn, threads, [&](int64_t s) {
    const T* p_ = p + s * ps[0];
    const T* e_ = e + s * es[0];
    thread_local Walk<A> w;
    w.fill(q, p_, ps[1], ps[2], c);
    T* o = out + s * 3 * q.n;
    for (int64_t i = 0; i < q.n; ++i, o += 3) {
      const uint8_t f = q.flags[i];
      if (f & 8) {
        for (int k = 0; k < 3; ++k) o[k] = p_[i * ps[1] + k * ps[2]];
        continue;
      }
      o[0] = o[1] = o[2] = T(0);
      const A *b2 = &w.b2[3 * i], *b3 = &w.b3[3 * i], *nh = &w.nh[3 * i];
      if (f & 1) o[0] = static_cast<T>(safe_sqrt(dot(b3, b3), tiny));
      if (f & 2) {
        const A y = w.s[i], x = -dot(b2, b3);
        o[1] = static_cast<T>(x * x + y * y <= tiny ? A(0) : zmat::fast_atan2(y, x));
      }
      if ((f & 4) && w.def[i]) {
        A m[3], t[3], sg;
        int64_t so;
        w.axis_of_row(q, i, e_, es[1], es[2], m, &so, &sg);
        cross(b2, m, t);
        const A y = dot(t, nh), x = w.nb[i] * dot(m, nh);
        o[2] = static_cast<T>(x * x + y * y <= tiny ? A(0) : zmat::fast_atan2(y, x));
      }
    }
  });
}

// gx (B, N, 3), ge (B, L, 3) contiguous: the gradients of sum g . out.
template <typename T, typename A = T>
void carried_backward(const T* p, int64_t bn, const int64_t* ps, const T* e, const int64_t* es, const Carried& q,
                      const T* g, const int64_t* gs, T* gx, T* ge, A tiny, A c, int64_t threads) {
  const int64_t n = q.n;
  zmat::parallel_for(bn, threads, [&](int64_t s) {
    const T* p_ = p + s * ps[0];
    const T* e_ = e + s * es[0];
    const T* gp = g + s * gs[0];
    thread_local Walk<A> w;
    thread_local std::vector<A> G2, G3, gV;
    w.fill(q, p_, ps[1], ps[2], c);
    G2.assign(3 * n, A(0)), G3.assign(3 * n, A(0)), gV.assign(3 * (n + q.l), A(0));
    T* ox = gx + s * 3 * n;
    for (int64_t j = 0; j < 3 * n; ++j) ox[j] = T(0);
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t f = q.flags[i];
      const A gr = gp[i * gs[1]], gt = gp[i * gs[1] + gs[2]], gf = gp[i * gs[1] + 2 * gs[2]];
      if (f & 8) {
        ox[3 * i] += static_cast<T>(gr), ox[3 * i + 1] += static_cast<T>(gt), ox[3 * i + 2] += static_cast<T>(gf);
        continue;
      }
      const A *b2 = &w.b2[3 * i], *b3 = &w.b3[3 * i], *nh = &w.nh[3 * i], *nn = &w.n[3 * i];
      A *g2 = &G2[3 * i], *g3 = &G3[3 * i], t[3], u[3];
      if (f & 1) {  // r = |b3|
        const A sq = dot(b3, b3);
        if (!(sq <= tiny))
          for (int k = 0; k < 3; ++k) g3[k] += gr / std::sqrt(sq) * b3[k];
      }
      if (f & 2) theta_backward(gt, b2, b3, nn, tiny, g2, g3);
      if ((f & 4) && w.def[i]) {  // phi = atan2(Y = (b2 x m) . nh, X = |b2| m . nh)
        A m[3], sg;
        int64_t so;
        w.axis_of_row(q, i, e_, es[1], es[2], m, &so, &sg);
        cross(b2, m, t);
        const A nb = w.nb[i], mn = dot(m, nh), y = dot(t, nh), x = nb * mn, h = x * x + y * y;
        if (!(h <= tiny)) {
          const A gy = gf * x / h, gx_ = -gf * y / h;
          A* gm = &gV[3 * so];
          A* gn = &gV[3 * i];
          cross(m, nh, u);  // dY = db2 . (m x nh) + dm . (nh x b2) + dnh . (b2 x m)
          for (int k = 0; k < 3; ++k) g2[k] += gy * u[k], gn[k] += gy * t[k];
          cross(nh, b2, u);
          for (int k = 0; k < 3; ++k) gm[k] += sg * (gy * u[k] + gx_ * nb * nh[k]);
          if (nb > A(0))  // dX = d|b2| m . nh + |b2| (dm . nh + m . dnh)
            for (int k = 0; k < 3; ++k) g2[k] += gx_ * mn / nb * b2[k];
          for (int k = 0; k < 3; ++k) gn[k] += gx_ * nb * m[k];
        }
      }
    }
    for (int64_t i = 0; i < n; ++i) {  // own normals: nh = n / |n| (defined), else n
      const A* gv = &gV[3 * i];
      if (gv[0] == A(0) && gv[1] == A(0) && gv[2] == A(0)) continue;
      const A *nh = &w.nh[3 * i], *b2 = &w.b2[3 * i], *b3 = &w.b3[3 * i];
      A gn[3], t[3];
      const A pr = w.def[i] ? dot(nh, gv) : A(0), sc = w.def[i] ? w.s[i] : A(1);
      for (int k = 0; k < 3; ++k) gn[k] = (gv[k] - pr * nh[k]) / sc;
      cross(b3, gn, t);  // dn = db2 x b3 + b2 x db3
      for (int k = 0; k < 3; ++k) G2[3 * i + k] += t[k];
      cross(gn, b2, t);
      for (int k = 0; k < 3; ++k) G3[3 * i + k] += t[k];
    }
    for (int64_t i = 0; i < n; ++i) {  // b2 = b - a, b3 = i - b
      const A *g2 = &G2[3 * i], *g3 = &G3[3 * i];
      for (int k = 0; k < 3; ++k) {
        if (q.a[i] >= 0) ox[3 * q.a[i] + k] -= static_cast<T>(g2[k]);
        if (q.b[i] >= 0) ox[3 * q.b[i] + k] += static_cast<T>(g2[k] - g3[k]);
        ox[3 * i + k] += static_cast<T>(g3[k]);
      }
    }
    T* oe = ge + s * 3 * q.l;
    for (int64_t j = 0; j < 3 * q.l; ++j) oe[j] = static_cast<T>(gV[3 * n + j]);
  });
}

}  // namespace

// x (B, N, 3) and ends e (B, L, 3) with element strides; plan arrays (N,) each
// (a, b, ref, eslot, order int64; mode, flags uint8); out, gx (B, N, 3), ge (B, L, 3) contiguous.
#define ZMAT_CARRIED(T, SUFFIX, TINY, C)                                                                      \
  extern "C" void zmat_carried_forward_##SUFFIX(                                                             \
      const T* p, int64_t b, int64_t p0, int64_t p1, int64_t p2, const T* e, int64_t e0, int64_t e1,         \
      int64_t e2, int64_t n, int64_t l, const int64_t* ab, const int64_t* ref, const int64_t* eslot,          \
      const uint8_t* mode, const uint8_t* flags, const int64_t* order, T* out, int64_t threads) {                                  \
    const int64_t ps[3] = {p0, p1, p2}, es[3] = {e0, e1, e2};                                                \
    carried_forward<T>(p, b, ps, e, es, Carried{n, l, ab, ab + n, ref, eslot, mode, flags, order}, out, TINY, C,    \
                       threads);                                                                             \
  }                                                                                                          \
  extern "C" void zmat_carried_backward_##SUFFIX(                                                            \
      const T* p, int64_t b, int64_t p0, int64_t p1, int64_t p2, const T* e, int64_t e0, int64_t e1,         \
      int64_t e2, int64_t n, int64_t l, const int64_t* ab, const int64_t* ref, const int64_t* eslot,          \
      const uint8_t* mode, const uint8_t* flags, const int64_t* order, const T* g, int64_t g0, int64_t g1, int64_t g2, T* gx,      \
      T* ge, int64_t threads) {                                                                              \
    const int64_t ps[3] = {p0, p1, p2}, es[3] = {e0, e1, e2}, gs[3] = {g0, g1, g2};                          \
    carried_backward<T>(p, b, ps, e, es, Carried{n, l, ab, ab + n, ref, eslot, mode, flags, order}, g, gs, gx, ge,  \
                        TINY, C, threads);                                                                   \
  }

ZMAT_CARRIED(float, f32, 1e-12f, 1e-5f)
ZMAT_CARRIED(double, f64, 1e-24, 1e-10)

// The flows' tree poses (zmat/flows.py, _tree_pose_torch: _frame then
// _matrix_to_euler, the same formulas, fallbacks and dtype): per tree, from its
// root o, second atom a and third atom b, the axes u (along a - o), v (the unit
// part of b - o normal to u), u x v, and the ZYZ chart (alpha, cos beta, gamma).
// Forward only: the gradient is the torch reference's (zmat/_kernel.py, pose).
namespace {

template <typename T>
inline void unit_or(const T* v, const T* fallback, T tiny, T* out) {  // flows._unit
  const T sq = dot(v, v);
  if (sq <= tiny) {
    for (int c = 0; c < 3; ++c) out[c] = fallback[c];
    return;
  }
  const T r = T(1) / std::sqrt(sq);
  for (int c = 0; c < 3; ++c) out[c] = v[c] * r;
}

template <typename T>
inline T atan2_or_zero(T y, T x, T tiny) {  // zmat._geometry.safe_atan2
  return x * x + y * y <= tiny ? T(0) : std::atan2(y, x);
}

template <typename T>
void pose_forward(const T* p, int64_t bn, const int64_t* ps, int64_t nt, const int64_t* atoms, T* R, T* E, T tiny,
                  int64_t threads) {
  const T ex[3] = {T(1), T(0), T(0)}, ez[3] = {T(0), T(0), T(1)};
  zmat::parallel_for(bn, threads, [&](int64_t s) {
    const T* x = p + s * ps[0];
    for (int64_t j = 0; j < nt; ++j) {
      T d[3], w[3], u[3], v[3], e[3], perp[3], wn[3];
      for (int c = 0; c < 3; ++c) {
        const T xo = x[atoms[j] * ps[1] + c * ps[2]];
        d[c] = x[atoms[nt + j] * ps[1] + c * ps[2]] - xo;
        w[c] = x[atoms[2 * nt + j] * ps[1] + c * ps[2]] - xo;
      }
      unit_or(d, ex, tiny, u);
      cross(u, std::abs(u[2]) > T(0.9) ? ex : ez, perp);  // v's fallback: u x e
      T sq = dot(perp, perp);
      if (sq < tiny) sq = tiny;
      const T r = T(1) / std::sqrt(sq);
      for (int c = 0; c < 3; ++c) perp[c] *= r;
      const T h = dot(w, u);
      for (int c = 0; c < 3; ++c) wn[c] = w[c] - h * u[c];
      unit_or(wn, perp, tiny, v);
      cross(u, v, e);
      T* o = R + (s * nt + j) * 9;  // (3, 3), the axes as columns
      for (int c = 0; c < 3; ++c) o[3 * c] = u[c], o[3 * c + 1] = v[c], o[3 * c + 2] = e[c];
      const T alpha = atan2_or_zero(u[1], u[0], tiny), ca = std::cos(alpha), sa = std::sin(alpha);
      const T dd = dot(d, d), norm = dd <= tiny ? T(0) : std::sqrt(dd);
      T* q = E + s * 3 * nt + j;  // (3, T): alpha, cos beta, gamma
      q[0] = alpha;
      q[nt] = norm > T(0) ? d[2] / norm : u[2];
      q[2 * nt] = atan2_or_zero(ca * v[1] - sa * v[0], ca * e[1] - sa * e[0], tiny);
    }
  });
}

// g times the gradient of v / |v| (|v|^2 = sq > tiny), into gv.
template <typename T>
inline void unit_backward(const T* g, const T* v, T sq, T* gv) {
  const T r = T(1) / std::sqrt(sq), k = r * r * r * dot(v, g);
  for (int c = 0; c < 3; ++c) gv[c] += g[c] * r - k * v[c];
}

// gR (B, T, 3, 3) and gE (B, 3, T) with element strides -> gx (B, N, 3) contiguous: the chain
// rule of pose_forward in reverse, through the fallbacks as autograd takes them (a fallback
// axis is a constant; the clamp on v's fallback passes the gradient where |perp|^2 >= tiny).
template <typename T>
void pose_backward(const T* p, int64_t bn, const int64_t* ps, int64_t n, int64_t nt, const int64_t* atoms,
                   const T* gR, const int64_t* rs, const T* gE, const int64_t* es, T* gx, T tiny, int64_t threads) {
  const T ex[3] = {T(1), T(0), T(0)}, ez[3] = {T(0), T(0), T(1)};
  zmat::parallel_for(bn, threads, [&](int64_t s) {
    const T* x = p + s * ps[0];
    T* out = gx + s * 3 * n;
    for (int64_t j = 0; j < 3 * n; ++j) out[j] = T(0);
    for (int64_t j = 0; j < nt; ++j) {
      T d[3], w[3], u[3], v[3], e[3], perp0[3], perp[3], wn[3];
      for (int c = 0; c < 3; ++c) {
        const T xo = x[atoms[j] * ps[1] + c * ps[2]];
        d[c] = x[atoms[nt + j] * ps[1] + c * ps[2]] - xo;
        w[c] = x[atoms[2 * nt + j] * ps[1] + c * ps[2]] - xo;
      }
      const T sqd = dot(d, d);
      unit_or(d, ex, tiny, u);
      const T* sel = std::abs(u[2]) > T(0.9) ? ex : ez;
      cross(u, sel, perp0);
      const T sqp0 = dot(perp0, perp0), sqp = sqp0 < tiny ? tiny : sqp0, rp = T(1) / std::sqrt(sqp);
      for (int c = 0; c < 3; ++c) perp[c] = perp0[c] * rp;
      const T h = dot(w, u);
      for (int c = 0; c < 3; ++c) wn[c] = w[c] - h * u[c];
      const T sqw = dot(wn, wn);
      unit_or(wn, perp, tiny, v);
      cross(u, v, e);
      const T alpha = atan2_or_zero(u[1], u[0], tiny), ca = std::cos(alpha), sa = std::sin(alpha);
      // the cotangents
      T gu[3], gv[3], ge[3], gd[3] = {T(0), T(0), T(0)}, gw[3] = {T(0), T(0), T(0)}, t[3];
      const T* gr = gR + s * rs[0] + j * rs[1];
      for (int c = 0; c < 3; ++c) {
        const T* row = gr + c * rs[2];  // (u, v, u x v)_c
        gu[c] = row[0], gv[c] = row[rs[3]], ge[c] = row[2 * rs[3]];
      }
      const T* gq = gE + s * es[0] + j * es[2];
      T ga = gq[0], gcb = gq[es[1]], gg = gq[2 * es[1]], gca = T(0), gsa = T(0);
      {  // gamma = atan2(Y = ca v1 - sa v0, X = ca e1 - sa e0)
        const T Y = ca * v[1] - sa * v[0], X = ca * e[1] - sa * e[0], hh = X * X + Y * Y;
        if (!(hh <= tiny)) {
          const T gY = gg * X / hh, gX = -gg * Y / hh;
          gca += gY * v[1] + gX * e[1];
          gsa -= gY * v[0] + gX * e[0];
          gv[1] += ca * gY, gv[0] -= sa * gY, ge[1] += ca * gX, ge[0] -= sa * gX;
        }
      }
      ga += gca * -sa + gsa * ca;
      {  // alpha = atan2(u1, u0)
        const T hh = u[0] * u[0] + u[1] * u[1];
        if (!(hh <= tiny)) gu[1] += ga * u[0] / hh, gu[0] -= ga * u[1] / hh;
      }
      if (!(sqd <= tiny)) {  // cos beta = d2 / |d|
        const T norm = std::sqrt(sqd), gn = -gcb * d[2] / (norm * norm);
        gd[2] += gcb / norm;
        for (int c = 0; c < 3; ++c) gd[c] += gn * d[c] / norm;
      } else {
        gu[2] += gcb;
      }
      cross(v, ge, t);  // e = u x v
      for (int c = 0; c < 3; ++c) gu[c] += t[c];
      cross(ge, u, t);
      for (int c = 0; c < 3; ++c) gv[c] += t[c];
      if (!(sqw <= tiny)) {  // v = unit(w - (w . u) u)
        T gwn[3] = {T(0), T(0), T(0)};
        unit_backward(gv, wn, sqw, gwn);
        const T gh = -dot(gwn, u);
        for (int c = 0; c < 3; ++c) gw[c] += gwn[c] + gh * u[c], gu[c] += -h * gwn[c] + gh * w[c];
      } else {  // v = perp = perp0 / |perp0|, perp0 = u x sel
        T gp0[3];
        const T k = sqp0 >= tiny ? rp * rp * rp * dot(perp0, gv) : T(0);
        for (int c = 0; c < 3; ++c) gp0[c] = gv[c] * rp - k * perp0[c];
        cross(sel, gp0, t);
        for (int c = 0; c < 3; ++c) gu[c] += t[c];
      }
      if (!(sqd <= tiny)) unit_backward(gu, d, sqd, gd);
      T *go = out + 3 * atoms[j], *ga_ = out + 3 * atoms[nt + j], *gb = out + 3 * atoms[2 * nt + j];
      for (int c = 0; c < 3; ++c) go[c] -= gd[c] + gw[c], ga_[c] += gd[c], gb[c] += gw[c];
    }
  });
}

}  // namespace

// x (B, N, 3) with element strides; atoms (3 T,) int64: roots, second, third atoms;
// R (B, T, 3, 3), E (B, 3, T) contiguous; gR, gE as R, E with element strides; gx (B, N, 3).
#define ZMAT_POSE(T, SUFFIX, TINY)                                                                           \
  extern "C" void zmat_pose_forward_##SUFFIX(const T* p, int64_t b, int64_t p0, int64_t p1, int64_t p2,      \
                                             int64_t nt, const int64_t* atoms, T* R, T* E, int64_t threads) { \
    const int64_t ps[3] = {p0, p1, p2};                                                                      \
    pose_forward<T>(p, b, ps, nt, atoms, R, E, TINY, threads);                                              \
  }                                                                                                          \
  extern "C" void zmat_pose_backward_##SUFFIX(                                                               \
      const T* p, int64_t b, int64_t p0, int64_t p1, int64_t p2, int64_t n, int64_t nt, const int64_t* atoms, \
      const T* gR, int64_t r0, int64_t r1, int64_t r2, int64_t r3, const T* gE, int64_t e0, int64_t e1,       \
      int64_t e2, T* gx, int64_t threads) {                                                                  \
    const int64_t ps[3] = {p0, p1, p2}, rs[4] = {r0, r1, r2, r3}, es[3] = {e0, e1, e2};                      \
    pose_backward<T>(p, b, ps, n, nt, atoms, gR, rs, gE, es, gx, TINY, threads);                            \
  }

ZMAT_POSE(float, f32, 1e-12f)
ZMAT_POSE(double, f64, 1e-24)
