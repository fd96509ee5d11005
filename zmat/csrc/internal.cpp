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
#include "log_sum.h"
#include "parallel.h"
#include "row_geometry.h"
#include "vec3.h"

namespace {

using zmat::cross;
using zmat::dot;
using zmat::Row;
using zmat::safe_sqrt;

struct Rows {
  int64_t m;
  const int64_t *d, *a, *b, *i;  // (M,) each, atoms of P
  const uint8_t* flags;          // (M,)
};

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
    for (int64_t j = 0; j < m; ++j, o += 3)
      zmat::row_entries(ps_, ps[1], ps[2], q.d[j], q.a[j], q.b[j], q.i[j], q.flags[j], tiny, o,
                        [](A y, A x) { return std::atan2(y, x); }, [](A, A) {});
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
// one walk in placement order (``order``) resolves every axis to a signed source
// (an own normal or an end) and gives each row's values as it goes. The dihedral
// phi = atan2((b2 x m) . nh, |b2| m . nh) against m, the axis of slot ref[i]
// (nerf rows: their end), 0 where nh is undefined.
// Backward: the geometry walk, then one walk in reverse placement order: every
// row that takes an atom's normal (or its position) as a reference follows it,
// so when the walk reaches atom i the gradient of its normal is complete and
// goes through nh = n / |n| into b2, b3 at once (ends: returned).
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

// One atom's row geometry and resolved axis: one record (a cache line in float) per atom.
template <typename A>
struct Geo {
  A b2[3], b3[3], nh[3];
  A s, is, nb, r;  // |n|, 1 / |n| where defined (else 1), |b2|, |b3| (each 0 below tiny on its square)
  A sgn;           // the sign of the axis' source
  int32_t src;     // the source of atom i's axis: j < N own normal, N + e an end
  bool def;        // nh is the unit normal
};

// Positions of one structure: x (strides s1 atoms, s2 components), e (ends, strides e1, e2).
template <typename T>
struct View {
  const T* x;
  int64_t s1, s2;
  const T* e;
  int64_t e1, e2;
};

inline int64_t slot_atom(int64_t r, int64_t n) { return r >= n ? r - n : r; }  // (no division)

template <typename T, typename A>
inline void geo_fill(const Carried& q, const View<T>& v, int64_t i, A tiny, A c, Geo<A>* w) {
  // named scalars, the record written once: arrays here become partial vector stores read
  // back across their seams, which stalls the walk (store forwarding)
  const int64_t ia = q.a[i], ib = q.b[i];
  auto at = [&](int64_t j, int k) { return j < 0 ? A(0) : A(v.x[j * v.s1 + k * v.s2]); };
  const A xb0 = at(ib, 0), xb1 = at(ib, 1), xb2 = at(ib, 2);
  const A u0 = xb0 - at(ia, 0), u1 = xb1 - at(ia, 1), u2 = xb2 - at(ia, 2);  // b2
  const A w0 = at(i, 0) - xb0, w1 = at(i, 1) - xb1, w2 = at(i, 2) - xb2;     // b3
  const A n0 = u1 * w2 - u2 * w1, n1 = u2 * w0 - u0 * w2, n2 = u0 * w1 - u1 * w0;
  const A s = safe_sqrt(n0 * n0 + n1 * n1 + n2 * n2, tiny), nb = safe_sqrt(u0 * u0 + u1 * u1 + u2 * u2, tiny);
  const A r = safe_sqrt(w0 * w0 + w1 * w1 + w2 * w2, tiny);
  const bool def = s > c * nb * r;
  const A is = def ? A(1) / s : A(1);  // one division, not three
  Geo<A>& g = w[i];
  g.b2[0] = u0, g.b2[1] = u1, g.b2[2] = u2, g.b3[0] = w0, g.b3[1] = w1, g.b3[2] = w2;
  g.nh[0] = n0 * is, g.nh[1] = n1 * is, g.nh[2] = n2 * is;
  g.s = s, g.is = is, g.nb = nb, g.r = r, g.def = def;
  const uint8_t md = q.mode[i];
  if (def || (md & 8)) {
    const bool end = (md & 1) || ((md & 2) && !def);
    g.src = static_cast<int32_t>(end ? q.n + q.eslot[i] : i);
    g.sgn = A(1);
  } else {
    const Geo<A>& k = w[slot_atom(q.ref[i], q.n)];
    g.src = k.src;
    g.sgn = q.ref[i] >= q.n ? -k.sgn : k.sgn;
  }
}

// The axis m of row i (signed), its source and sign.
template <typename T, typename A>
inline void row_axis(const Carried& q, const View<T>& v, const Geo<A>* w, int64_t i, A* m, int64_t* so, A* sg) {
  if (q.mode[i] & 4) {
    *so = q.n + q.eslot[i], *sg = A(1);
  } else {
    const Geo<A>& k = w[slot_atom(q.ref[i], q.n)];
    *so = k.src, *sg = q.ref[i] >= q.n ? -k.sgn : k.sgn;
  }
  const int64_t s = *so;
  for (int c = 0; c < 3; ++c) m[c] = *sg * (s < q.n ? w[s].nh[c] : A(v.e[(s - q.n) * v.e1 + c * v.e2]));
}

template <typename A>
constexpr int64_t padded(int64_t m) {  // m rounded up to 16 bytes of A
  return (m + 16 / sizeof(A) - 1) / (16 / sizeof(A)) * (16 / sizeof(A));
}

// One structure's rows into out (N, 3), the geometry into w (N records), the angles' (y, x)
// into yx (2 padded(2 N)): the walk first, then every atan2 in one loop of its own (short and branch-free:
// the compiler vectorises it, and no walk waits on its latency).
template <typename T, typename A>
void carried_rows(const Carried& q, const View<T>& v, A tiny, A c, Geo<A>* w, A* yx, T* out) {
  const int64_t n = q.n;
  const int64_t pad = padded<A>(2 * n);
  A *ys = yx, *xs = yx + pad;
  for (int64_t j = 2 * n; j < pad; ++j) ys[j] = xs[j] = A(0);
  for (int64_t j = 0; j < n; ++j) {
    const int64_t i = q.order[j];
    geo_fill(q, v, i, tiny, c, w);  // (a row referring to its own axis finds it resolved)
    const uint8_t f = q.flags[i];
    T* o = out + 3 * i;
    ys[2 * i] = xs[2 * i] = ys[2 * i + 1] = xs[2 * i + 1] = A(0);  // atan2's zero test: 0
    if (f & 8) {
      for (int k = 0; k < 3; ++k) o[k] = v.x[i * v.s1 + k * v.s2];
      continue;
    }
    const Geo<A>& g = w[i];
    o[0] = f & 1 ? static_cast<T>(g.r) : T(0);  // (the same tiny)
    if (f & 2) ys[2 * i] = g.s, xs[2 * i] = -dot(g.b2, g.b3);
    if ((f & 4) && g.def) {
      A m[3], t[3], sg;
      int64_t so;
      row_axis(q, v, w, i, m, &so, &sg);
      cross(g.b2, m, t);
      ys[2 * i + 1] = dot(t, g.nh), xs[2 * i + 1] = g.nb * dot(m, g.nh);
    }
  }
  zmat::atan2_all(ys, xs, ys, 2 * n, tiny);  // (2 n rounded up, the rest zeros)
  for (int64_t i = 0; i < n; ++i)
    if (!(q.flags[i] & 8)) out[3 * i + 1] = static_cast<T>(ys[2 * i]), out[3 * i + 2] = static_cast<T>(ys[2 * i + 1]);
}

// One structure's gradient: gin(i, k) the cotangent of entry k of row i; gx (N, 3) and
// ge (L, 3) written; w (N records) and buf (9 N + 3 L) scratch. Short loops, one part of
// the chain rule each (rows are independent but for the sums into the axes' sources), so
// that the processor overlaps rows instead of waiting on each row's divisions in turn.
template <typename T, typename A, typename G>
void carried_grad(const Carried& q, const View<T>& v, const G& gin, A tiny, A c, Geo<A>* w, A* buf, T* gx, T* ge) {
  const int64_t n = q.n;
  A *G2 = buf, *G3 = buf + 3 * n, *gV = buf + 6 * n;  // (N, 3), (N, 3), (N + L, 3)
  for (int64_t j = 0; j < n; ++j) geo_fill(q, v, q.order[j], tiny, c, w);
  for (int64_t j = 0; j < 3 * (n + q.l); ++j) gV[j] = A(0);
  for (int64_t i = 0; i < n; ++i) {  // r and theta
    const uint8_t f = q.flags[i];
    const Geo<A>& g = w[i];
    A g2[3] = {0, 0, 0}, g3[3] = {0, 0, 0}, t[3], u[3];
    if ((f & 1) && !(f & 8) && g.r != A(0)) {  // r = |b3| (0 where |b3|^2 <= tiny: no gradient)
      const A wr = gin(i, 0) / g.r;
      for (int k = 0; k < 3; ++k) g3[k] += wr * g.b3[k];
    }
    if ((f & 2) && !(f & 8)) {  // theta = atan2(y = |n|, x = -b2 . b3)
      const A gt = gin(i, 1), y = g.s, x = -dot(g.b2, g.b3), h = x * x + y * y;
      if (!(h <= tiny)) {
        const A ih = A(1) / h, gy = gt * x * ih, gx_ = -gt * y * ih;
        if (y > A(0)) {  // dy = nh . (db2 x b3 + b2 x db3), nh unit where defined, else n
          const A wy = g.def ? gy : gy / y;
          cross(g.b3, g.nh, t);
          cross(g.nh, g.b2, u);
          for (int k = 0; k < 3; ++k) g2[k] += wy * t[k], g3[k] += wy * u[k];
        }
        for (int k = 0; k < 3; ++k) g2[k] -= gx_ * g.b3[k], g3[k] -= gx_ * g.b2[k];  // dx = -(db2 . b3 + b2 . db3)
      }
    }
    for (int k = 0; k < 3; ++k) G2[3 * i + k] = g2[k], G3[3 * i + k] = g3[k];
  }
  for (int64_t i = 0; i < n; ++i) {  // phi = atan2(Y = (b2 x m) . nh, X = |b2| m . nh)
    const uint8_t f = q.flags[i];
    const Geo<A>& g = w[i];
    if (!(f & 4) || (f & 8) || !g.def) continue;
    A m[3], t[3], u[3], sg;
    int64_t so;
    row_axis(q, v, w, i, m, &so, &sg);
    cross(g.b2, m, t);
    const A nb = g.nb, mn = dot(m, g.nh), y = dot(t, g.nh), x = nb * mn, h = x * x + y * y;
    if (h <= tiny) continue;
    const A gh = gin(i, 2) / h, gy = gh * x, gx_ = -gh * y;
    A* g2 = G2 + 3 * i;
    A* gm = gV + 3 * so;
    A* gn = gV + 3 * i;
    cross(m, g.nh, u);  // dY = db2 . (m x nh) + dm . (nh x b2) + dnh . (b2 x m)
    for (int k = 0; k < 3; ++k) g2[k] += gy * u[k], gn[k] += gy * t[k];
    cross(g.nh, g.b2, u);
    for (int k = 0; k < 3; ++k) gm[k] += sg * (gy * u[k] + gx_ * nb * g.nh[k]);
    if (nb > A(0)) {  // dX = d|b2| m . nh + |b2| (dm . nh + m . dnh)
      const A wb = gx_ * mn / nb;
      for (int k = 0; k < 3; ++k) g2[k] += wb * g.b2[k];
    }
    for (int k = 0; k < 3; ++k) gn[k] += gx_ * nb * m[k];
  }
  for (int64_t i = 0; i < n; ++i) {  // own normals: nh = n / |n| (defined), else n
    const A* gv = gV + 3 * i;
    if (gv[0] == A(0) && gv[1] == A(0) && gv[2] == A(0)) continue;
    const Geo<A>& g = w[i];
    A gn[3], t[3], u[3];
    const A pr = g.def ? dot(g.nh, gv) : A(0);
    for (int k = 0; k < 3; ++k) gn[k] = (gv[k] - pr * g.nh[k]) * g.is;
    cross(g.b3, gn, t);  // dn = db2 x b3 + b2 x db3
    cross(gn, g.b2, u);
    for (int k = 0; k < 3; ++k) G2[3 * i + k] += t[k], G3[3 * i + k] += u[k];
  }
  for (int64_t j = 0; j < 3 * n; ++j) gx[j] = T(0);
  for (int64_t i = 0; i < n; ++i) {  // b2 = b - a, b3 = i - b
    const A *g2 = G2 + 3 * i, *g3 = G3 + 3 * i;
    const int64_t ia = q.a[i], ib = q.b[i];
    if (q.flags[i] & 8)
      for (int k = 0; k < 3; ++k) gx[3 * i + k] += static_cast<T>(gin(i, k));
    for (int k = 0; k < 3; ++k) {
      if (ia >= 0) gx[3 * ia + k] -= static_cast<T>(g2[k]);
      if (ib >= 0) gx[3 * ib + k] += static_cast<T>(g2[k] - g3[k]);
      gx[3 * i + k] += static_cast<T>(g3[k]);
    }
  }
  for (int64_t j = 0; j < 3 * q.l; ++j) ge[j] = static_cast<T>(gV[3 * n + j]);
}

template <typename A>
struct Scratch {  // per thread, kept: no allocation per call
  std::vector<Geo<A>> w;
  std::vector<A> buf;  // the backward's 9 N + 3 L, the forward's 4 N
};

template <typename A>
Scratch<A>& scratch(const Carried& q) {
  thread_local Scratch<A> s;
  if (static_cast<int64_t>(s.w.size()) < q.n) s.w.resize(q.n);
  const int64_t size = 9 * q.n + 3 * q.l + 8;  // (+ 8: the forward's padding)
  if (static_cast<int64_t>(s.buf.size()) < size) s.buf.resize(size);
  return s;
}

template <typename T, typename A = T>
void carried_forward(const T* p, int64_t bn, const int64_t* ps, const T* e, const int64_t* es, const Carried& q,
                     T* out, A tiny, A c, int64_t threads) {
  zmat::parallel_for(bn, threads, [&](int64_t s) {
    const View<T> v{p + s * ps[0], ps[1], ps[2], e + s * es[0], es[1], es[2]};
    Scratch<A>& sc = scratch<A>(q);
    carried_rows(q, v, tiny, c, sc.w.data(), sc.buf.data(), out + s * 3 * q.n);
  });
}

// gx (B, N, 3), ge (B, L, 3) contiguous: the gradients of sum g . out.
template <typename T, typename A = T>
void carried_backward(const T* p, int64_t bn, const int64_t* ps, const T* e, const int64_t* es, const Carried& q,
                      const T* g, const int64_t* gs, T* gx, T* ge, A tiny, A c, int64_t threads) {
  zmat::parallel_for(bn, threads, [&](int64_t s) {
    const View<T> v{p + s * ps[0], ps[1], ps[2], e + s * es[0], es[1], es[2]};
    const T* gp = g + s * gs[0];
    auto gin = [gp, gs](int64_t i, int k) { return A(gp[i * gs[1] + k * gs[2]]); };
    Scratch<A>& sc = scratch<A>(q);
    carried_grad(q, v, gin, tiny, c, sc.w.data(), sc.buf.data(), gx + s * 3 * q.n, ge + s * 3 * q.l);
  });
}

}  // namespace

// x (B, N, 3) and ends e (B, L, 3) with element strides; plan arrays (N,) each
// (a, b, ref, eslot, order int64; mode, flags uint8); out, gx (B, N, 3), ge (B, L, 3) contiguous.
#define ZMAT_CARRIED(T, SUFFIX, TINY, C)                                                                      \
  extern "C" void zmat_carried_forward_##SUFFIX(                                                             \
      const T* p, int64_t b, int64_t p0, int64_t p1, int64_t p2, const T* e, int64_t e0, int64_t e1,         \
      int64_t e2, int64_t n, int64_t l, const int64_t* ab, const int64_t* ref, const int64_t* eslot,          \
      const uint8_t* mode, const uint8_t* flags, const int64_t* order, T* out, int64_t threads) {            \
    const int64_t ps[3] = {p0, p1, p2}, es[3] = {e0, e1, e2};                                                \
    carried_forward<T>(p, b, ps, e, es, Carried{n, l, ab, ab + n, ref, eslot, mode, flags, order}, out, TINY, \
                       C, threads);                                                                          \
  }                                                                                                          \
  extern "C" void zmat_carried_backward_##SUFFIX(                                                            \
      const T* p, int64_t b, int64_t p0, int64_t p1, int64_t p2, const T* e, int64_t e0, int64_t e1,         \
      int64_t e2, int64_t n, int64_t l, const int64_t* ab, const int64_t* ref, const int64_t* eslot,          \
      const uint8_t* mode, const uint8_t* flags, const int64_t* order, const T* g, int64_t g0, int64_t g1,    \
      int64_t g2, T* gx, T* ge, int64_t threads) {                                                           \
    const int64_t ps[3] = {p0, p1, p2}, es[3] = {e0, e1, e2}, gs[3] = {g0, g1, g2};                          \
    carried_backward<T>(p, b, ps, e, es, Carried{n, l, ab, ab + n, ref, eslot, mode, flags, order}, g, gs, gx, \
                        ge, TINY, C, threads);                                                               \
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

// One tree's frame from positions x (strides s1, s2) and its atoms (o, a, b), with what
// the backward reuses.
template <typename T>
struct Pose {
  T d[3], w[3], u[3], v[3], e[3], perp0[3], wn[3];
  T sqd, sqp0, rp, h, sqw, alpha, ca, sa;
  const T* sel;  // v's fallback axis: perp0 = u x sel
  Pose(const T* x, int64_t s1, int64_t s2, int64_t o, int64_t a, int64_t b, T tiny) {
    static const T ex[3] = {T(1), T(0), T(0)}, ez[3] = {T(0), T(0), T(1)};
    for (int c = 0; c < 3; ++c) {
      const T xo = x[o * s1 + c * s2];
      d[c] = x[a * s1 + c * s2] - xo;
      w[c] = x[b * s1 + c * s2] - xo;
    }
    sqd = dot(d, d);
    unit_or(d, ex, tiny, u);
    sel = std::abs(u[2]) > T(0.9) ? ex : ez;
    cross(u, sel, perp0);
    sqp0 = dot(perp0, perp0);
    rp = T(1) / std::sqrt(sqp0 < tiny ? tiny : sqp0);
    T perp[3];
    for (int c = 0; c < 3; ++c) perp[c] = perp0[c] * rp;
    h = dot(w, u);
    for (int c = 0; c < 3; ++c) wn[c] = w[c] - h * u[c];
    sqw = dot(wn, wn);
    unit_or(wn, perp, tiny, v);
    cross(u, v, e);
    alpha = atan2_or_zero(u[1], u[0], tiny), ca = std::cos(alpha), sa = std::sin(alpha);
  }
  void chart(T tiny, T* q, int64_t stride) const {  // (alpha, cos beta, gamma), `stride` apart
    const T norm = sqd <= tiny ? T(0) : std::sqrt(sqd);
    q[0] = alpha;
    q[stride] = norm > T(0) ? d[2] / norm : u[2];
    q[2 * stride] = atan2_or_zero(ca * v[1] - sa * v[0], ca * e[1] - sa * e[0], tiny);
  }
  // The cotangents of the axes (gu, gv, ge, overwritten) and of the chart -> those of
  // d = a - o and w = b - o, into gd, gw (zeroed here).
  void backward(T* gu, T* gv, T* ge, T ga, T gcb, T gg, T tiny, T* gd, T* gw) const;
};

// g times the gradient of v / |v| (|v|^2 = sq > tiny), into gv.
template <typename T>
inline void unit_backward(const T* g, const T* v, T sq, T* gv) {
  const T r = T(1) / std::sqrt(sq), k = r * r * r * dot(v, g);
  for (int c = 0; c < 3; ++c) gv[c] += g[c] * r - k * v[c];
}

// The chain rule of the pose in reverse, through the fallbacks as autograd takes them (a
// fallback axis is a constant; the clamp on v's fallback passes the gradient where |perp|^2 >= tiny).
template <typename T>
void Pose<T>::backward(T* gu, T* gv, T* ge, T ga, T gcb, T gg, T tiny, T* gd, T* gw) const {
  T t[3], gca = T(0), gsa = T(0);
  for (int c = 0; c < 3; ++c) gd[c] = gw[c] = T(0);
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
}

// d = a - o, w = b - o: the tree's gradients into out (N, 3).
template <typename T>
inline void pose_scatter(const T* gd, const T* gw, int64_t o, int64_t a, int64_t b, T* out) {
  T *go = out + 3 * o, *ga = out + 3 * a, *gb = out + 3 * b;
  for (int c = 0; c < 3; ++c) go[c] -= gd[c] + gw[c], ga[c] += gd[c], gb[c] += gw[c];
}

template <typename T>
void pose_forward(const T* p, int64_t bn, const int64_t* ps, int64_t nt, const int64_t* atoms, T* R, T* E, T tiny,
                  int64_t threads) {
  zmat::parallel_for(bn, threads, [&](int64_t s) {
    const T* x = p + s * ps[0];
    for (int64_t j = 0; j < nt; ++j) {
      const Pose<T> f(x, ps[1], ps[2], atoms[j], atoms[nt + j], atoms[2 * nt + j], tiny);
      T* o = R + (s * nt + j) * 9;  // (3, 3), the axes as columns
      for (int c = 0; c < 3; ++c) o[3 * c] = f.u[c], o[3 * c + 1] = f.v[c], o[3 * c + 2] = f.e[c];
      f.chart(tiny, E + s * 3 * nt + j, nt);  // (3, T): alpha, cos beta, gamma
    }
  });
}

// gR (B, T, 3, 3) and gE (B, 3, T) with element strides -> gx (B, N, 3) contiguous.
template <typename T>
void pose_backward(const T* p, int64_t bn, const int64_t* ps, int64_t n, int64_t nt, const int64_t* atoms,
                   const T* gR, const int64_t* rs, const T* gE, const int64_t* es, T* gx, T tiny, int64_t threads) {
  zmat::parallel_for(bn, threads, [&](int64_t s) {
    const T* x = p + s * ps[0];
    T* out = gx + s * 3 * n;
    for (int64_t j = 0; j < 3 * n; ++j) out[j] = T(0);
    for (int64_t j = 0; j < nt; ++j) {
      const int64_t o = atoms[j], a = atoms[nt + j], b = atoms[2 * nt + j];
      const Pose<T> f(x, ps[1], ps[2], o, a, b, tiny);
      T gu[3], gv[3], ge[3], gd[3], gw[3];
      const T* gr = gR + s * rs[0] + j * rs[1];
      for (int c = 0; c < 3; ++c) {
        const T* row = gr + c * rs[2];  // (u, v, u x v)_c
        gu[c] = row[0], gv[c] = row[rs[3]], ge[c] = row[2 * rs[3]];
      }
      const T* gq = gE + s * es[0] + j * es[2];
      f.backward(gu, gv, ge, gq[0], gq[es[1]], gq[2 * es[1]], tiny, gd, gw);
      pose_scatter(gd, gw, o, a, b, out);
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

// ---------------------------------------------------------------------------
// The flows' global inverse in one pass per structure (zmat/_kernel.py,
// global_inverse): the trees' poses, the carried rows against their trees' +z
// (the chain ends: ends[e] = the third axis of tree zf[e]), the orientations
// (alpha, cos beta, gamma) into their entries (slots (3 T,): the flat (N, 3)
// entry of each, -1 none) and (q - shift) / scale (none where scale is null),
// the same values and sums as those calls apart (poses, carried rows, where,
// normalisation). Backward: the cotangent of the carried rows is g / scale off
// the orientation entries (orient (N, 3) bytes), the ends' summed into their
// trees' third axes in order, the pose's added last, as autograd adds it.
namespace {

struct Global {
  int64_t nt;
  const int64_t* atoms;   // (3 T,) as for the poses
  const int64_t* zf;      // (L,) the tree of each end
  const int64_t* slots;   // (3 T,)
  const uint8_t* orient;  // (N, 3)
};

template <typename T>
struct Trees {  // per thread, kept
  std::vector<Pose<T>> pose;
  std::vector<T> ends, gends, gz, part;  // (L, 3), (L, 3), (T, 3), (N, 3) kept zero
};

template <typename T>
Trees<T>& trees(const Carried& q, const Global& G) {
  thread_local Trees<T> t;
  t.pose.clear();
  t.ends.resize(3 * q.l), t.gends.resize(3 * q.l), t.gz.assign(3 * G.nt, T(0));
  if (static_cast<int64_t>(t.part.size()) < 3 * q.n) t.part.assign(3 * q.n, T(0));
  return t;
}

template <typename T>
void poses_and_ends(const Carried& q, const Global& G, const T* x, int64_t s1, int64_t s2, T tiny, Trees<T>& t) {
  const int64_t nt = G.nt;
  for (int64_t j = 0; j < nt; ++j) t.pose.emplace_back(x, s1, s2, G.atoms[j], G.atoms[nt + j], G.atoms[2 * nt + j], tiny);
  for (int64_t e = 0; e < q.l; ++e)
    for (int c = 0; c < 3; ++c) t.ends[3 * e + c] = t.pose[G.zf[e]].e[c];
}

// Minus the log-determinant of the rows o (radians; fixed.cpp's: each factor floored at clamp,
// one log of a product, sin theta from the geometry w), and where g is given its gradient in
// the rows (-w / r, -w' cot theta, 0 where floored).
template <typename T>
T inverse_log_det(const Carried& q, const Geo<T>* w, const T* o, const T* lw, T tiny, T clamp, T* g) {
  zmat::LogSum sum;
  for (int64_t i = 0; i < q.n; ++i) {
    const T w0 = lw[2 * i], w1 = lw[2 * i + 1];
    double sin_t = 0, cos_t = 0;
    if (w1 != T(0) && (q.flags[i] & 2) && !(q.flags[i] & 8)) {
      const T y = w[i].s, x = -dot(w[i].b2, w[i].b3), h = x * x + y * y;
      if (!(h <= tiny)) {
        const double norm_h = std::sqrt(static_cast<double>(x) * x + static_cast<double>(y) * y);
        sin_t = y / norm_h, cos_t = x / norm_h;
      }
    }
    if (g) {
      g[3 * i] = w0 != T(0) && o[3 * i] >= clamp ? -w0 / o[3 * i] : T(0);
      g[3 * i + 1] = w1 != T(0) && sin_t >= clamp ? static_cast<T>(-w1 * cos_t / sin_t) : T(0);
      g[3 * i + 2] = T(0);
    }
    if (w0 == T(0) && w1 == T(0)) continue;
    double v = w0 != T(0) ? zmat::power(zmat::floor_abs(o[3 * i], clamp), w0) : 1.0;
    if (w1 != T(0)) v *= zmat::power(sin_t < clamp ? static_cast<double>(clamp) : sin_t, w1);
    sum.add(v);
  }
  return -static_cast<T>(sum.value());
}

// lw (N, 2) the log-det's weights, ld (B,), gl (B, N, 3): with ld, minus the log-determinant of
// the rows (radians) per structure, with gl its gradient in them (radians; the caller scales).
template <typename T>
void global_forward(const T* p, int64_t bn, const int64_t* ps, const Carried& q, const Global& G, const T* scale,
                    const T* shift, T* out, const T* lw, T* ld, T* gl, T tiny, T c, T clamp, int64_t threads) {
  zmat::parallel_for(bn, threads, [&](int64_t s) {
    const T* x = p + s * ps[0];
    Trees<T>& t = trees<T>(q, G);
    poses_and_ends(q, G, x, ps[1], ps[2], tiny, t);
    T* o = out + s * 3 * q.n;
    Scratch<T>& sc = scratch<T>(q);
    carried_rows(q, View<T>{x, ps[1], ps[2], t.ends.data(), 3, 1}, tiny, c, sc.w.data(), sc.buf.data(), o);
    if (ld) ld[s] = inverse_log_det(q, sc.w.data(), o, lw, tiny, clamp, gl ? gl + s * 3 * q.n : nullptr);
    for (int64_t j = 0; j < G.nt; ++j) {
      T chart[3];
      t.pose[j].chart(tiny, chart, 1);
      for (int k = 0; k < 3; ++k)
        if (G.slots[k * G.nt + j] >= 0) o[G.slots[k * G.nt + j]] = chart[k];
    }
    if (scale)
      for (int64_t j = 0; j < 3 * q.n; ++j) o[j] = (o[j] - shift[j]) / scale[j];
  });
}

template <typename T>
void global_backward(const T* p, int64_t bn, const int64_t* ps, const Carried& q, const Global& G, const T* scale,
                     const T* g, const int64_t* gs, T* gx, T tiny, T c, int64_t threads) {
  zmat::parallel_for(bn, threads, [&](int64_t s) {
    const T* x = p + s * ps[0];
    const T* gp = g + s * gs[0];
    auto gq = [&](int64_t i, int k) {  // the cotangent of row i's entry k before the normalisation
      const T v = gp[i * gs[1] + k * gs[2]];
      return scale ? v / scale[3 * i + k] : v;
    };
    auto gin = [&](int64_t i, int k) { return G.orient[3 * i + k] ? T(0) : gq(i, k); };
    Trees<T>& t = trees<T>(q, G);
    poses_and_ends(q, G, x, ps[1], ps[2], tiny, t);
    Scratch<T>& sc = scratch<T>(q);
    T* o = gx + s * 3 * q.n;
    carried_grad(q, View<T>{x, ps[1], ps[2], t.ends.data(), 3, 1}, gin, tiny, c, sc.w.data(), sc.buf.data(), o,
                 t.gends.data());
    for (int64_t e = 0; e < q.l; ++e)
      for (int k = 0; k < 3; ++k) t.gz[3 * G.zf[e] + k] += t.gends[3 * e + k];
    const int64_t nt = G.nt;
    for (int64_t j = 0; j < nt; ++j) {
      T gu[3] = {T(0), T(0), T(0)}, gv[3] = {T(0), T(0), T(0)}, gd[3], gw[3], ga[3];
      for (int k = 0; k < 3; ++k) {
        const int64_t at = G.slots[k * nt + j];
        ga[k] = at >= 0 ? gq(at / 3, static_cast<int>(at % 3)) : T(0);
      }
      t.pose[j].backward(gu, gv, &t.gz[3 * j], ga[0], ga[1], ga[2], tiny, gd, gw);
      pose_scatter(gd, gw, G.atoms[j], G.atoms[nt + j], G.atoms[2 * nt + j], t.part.data());
    }
    for (int64_t j = 0; j < 3 * nt; ++j) {  // the pose's part, summed apart, then added (and zeroed)
      T* part = t.part.data() + 3 * G.atoms[j];
      for (int k = 0; k < 3; ++k) o[3 * G.atoms[j] + k] += part[k], part[k] = T(0);
    }
  });
}

}  // namespace

// x (B, N, 3) with element strides; the carried arrays as above, L = len(zf); the Global
// arrays; scale, shift (N, 3) contiguous or null; out, gx (B, N, 3) contiguous; g (B, N, 3) strided;
// lw (N, 2), ld (B,), gl (B, N, 3) contiguous, ld and gl null where not asked (see global_forward).
#define ZMAT_GLOBAL(T, SUFFIX, TINY, C, CLAMP)                                                                        \
  extern "C" void zmat_global_forward_##SUFFIX(                                                               \
      const T* p, int64_t b, int64_t p0, int64_t p1, int64_t p2, int64_t n, int64_t l, const int64_t* ab,     \
      const int64_t* ref, const int64_t* eslot, const uint8_t* mode, const uint8_t* flags, const int64_t* order, \
      int64_t nt, const int64_t* atoms, const int64_t* zf, const int64_t* slots, const uint8_t* orient,        \
      const T* scale, const T* shift, T* out, const T* lw, T* ld, T* gl, int64_t threads) {                    \
    const int64_t ps[3] = {p0, p1, p2};                                                                       \
    global_forward<T>(p, b, ps, Carried{n, l, ab, ab + n, ref, eslot, mode, flags, order},                    \
                      Global{nt, atoms, zf, slots, orient}, scale, shift, out, lw, ld, gl, TINY, C, CLAMP,   \
                      threads);                                                                               \
  }                                                                                                           \
  extern "C" void zmat_global_backward_##SUFFIX(                                                              \
      const T* p, int64_t b, int64_t p0, int64_t p1, int64_t p2, int64_t n, int64_t l, const int64_t* ab,     \
      const int64_t* ref, const int64_t* eslot, const uint8_t* mode, const uint8_t* flags, const int64_t* order, \
      int64_t nt, const int64_t* atoms, const int64_t* zf, const int64_t* slots, const uint8_t* orient,        \
      const T* scale, const T* g, int64_t g0, int64_t g1, int64_t g2, T* gx, int64_t threads) {               \
    const int64_t ps[3] = {p0, p1, p2}, gs[3] = {g0, g1, g2};                                                 \
    global_backward<T>(p, b, ps, Carried{n, l, ab, ab + n, ref, eslot, mode, flags, order},                   \
                       Global{nt, atoms, zf, slots, orient}, scale, g, gs, gx, TINY, C, threads);             \
  }

ZMAT_GLOBAL(float, f32, 1e-12f, 1e-5f, 1e-6f)
ZMAT_GLOBAL(double, f64, 1e-24, 1e-10, 1e-12)
