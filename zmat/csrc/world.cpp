// The normalizing flows' forward with fixed atoms (zmat/flows.py, _world): every atom placed in
// world coordinates in one pass over an order where references come first, and the
// log-determinant summed in the same pass. No frames, no copies: the references of an atom are
// already at their world positions, fixed or placed.
//   CART     x_i = q_i (a fixed atom or a free tree's root);
//   SECOND   x_i = x_root + r u,  u = (sin b cos a, sin b sin a, cos b), q_i = (r, cos b, a);
//   THIRD    x_i = x_b + r (-cos t e1 + sin t e2), e1 = +-u (b the second atom: +), e2 = M e_x,
//            M = Rz(a) Ry(b) Rz(g) (the tree's orientation; a, cos b from its second atom's row,
//            q_i = (r, t, g));
//   NERF     x_i = x_b + r (-cos t e1 + sin t cos p e2 + sin t sin p e3), e1 = unit(x_b - x_a),
//            e3 = unit((x_a - x_d) x e1), e2 = e3 x e1 (zmat._geometry.nerf_anchor's frame and
//            degenerate rules without the sibling plane: e1 = +x at a zero bond, e3 =
//            any_perpendicular(e1) where d, a, b are collinear).
// Angles are q * scale + shift (normalize_angles), cos b clamped to [-1, 1] (zero gradient
// outside), sin b = sqrt((1 - c)(1 + c)) (0, zero gradient, at the poles). Log-det: 2 log|r| on
// every free atom and log|sin t| on THIRD and NERF atoms, each floored at `clamp` (zero gradient).
// Forward: per chunk of atoms, first what needs q alone (no atom waits on another: fixed atoms,
// sines and cosines, coefficients, log-det factors), then the placement (place_all).
// Backward: the chain rule in reverse order into every reference, per structure (the same bits
// on any number of threads). Arithmetic in the tensors' dtype, as the torch path's (sines and
// cosines in double).
#include <cmath>
#include <cstdint>
#include <vector>

#include "log_sum.h"
#include "parallel.h"
#include "trig.h"
#include "vec3.h"

namespace {

enum : uint8_t { CART = 0, SECOND = 1, THIRD_ON_SECOND = 2, THIRD_ON_ROOT = 3, NERF = 4 };

using zmat::cross;
using zmat::dot;
using zmat::floor_abs;
using zmat::LogSum;
using zmat::power;

template <typename T>
inline void sin_cos(T x, T& s, T& c) {  // zmat::sin_cos in double, for both dtypes
  double a, b;
  zmat::sin_cos(static_cast<double>(x), a, b);
  s = static_cast<T>(a), c = static_cast<T>(b);
}

struct Plan {
  int64_t n;
  const int64_t *atom, *b, *a, *d;  // (N,) each, in placement order (THIRD: d is the second atom)
  const uint8_t* kind;
};

template <typename T>
struct Consts {
  T tiny, collinear, clamp;
  const T *scale, *shift;  // (N, 3) contiguous, or null (radians)
};

// q of one structure: its entries, scaled
template <typename T>
struct Q {
  const T* q;
  int64_t s1, s2;
  const Consts<T>& k;
  T raw(int64_t i, int c) const { return q[i * s1 + c * s2]; }
  T val(int64_t i, int c) const { return k.scale ? raw(i, c) * k.scale[3 * i + c] + k.shift[3 * i + c] : raw(i, c); }
};

// A tree's orientation from its second atom's row: cos b (clamped), sin b, d sin b / d cos b, a.
template <typename T>
struct Pose {
  T c, s, ds, ca, sa;
  bool inside;  // cos b in [-1, 1]: the clamp passes the gradient
  Pose(const Q<T>& q, int64_t second) {
    const T c0 = q.raw(second, 1), al = q.val(second, 2);
    inside = c0 >= T(-1) && c0 <= T(1);
    c = c0 < T(-1) ? T(-1) : (c0 > T(1) ? T(1) : c0);
    const T s2 = (1 - c) * (1 + c);
    const bool ok = s2 > q.k.tiny;
    s = ok ? std::sqrt(s2) : T(0);
    ds = ok ? -c / s : T(0);
    sin_cos(al, sa, ca);
  }
  void u(T* o) const { o[0] = s * ca, o[1] = s * sa, o[2] = c; }
  // gradient g of u into (g cos b, g a)
  void u_backward(const T* g, T& gc, T& ga) const {
    ga += s * (ca * g[1] - sa * g[0]);
    gc += g[2] + ds * (ca * g[0] + sa * g[1]);
  }
};

// M e_x and its gradient, M = Rz(a) Ry(b) Rz(g)
template <typename T>
inline void e2_of(const Pose<T>& p, T cg, T sg, T* o) {
  o[0] = p.ca * p.c * cg - p.sa * sg;
  o[1] = p.sa * p.c * cg + p.ca * sg;
  o[2] = -p.s * cg;
}
template <typename T>
inline void e2_backward(const Pose<T>& p, T cg, T sg, const T* g, T& gc, T& ga, T& gg) {
  ga += g[0] * (-p.sa * p.c * cg - p.ca * sg) + g[1] * (p.ca * p.c * cg - p.sa * sg);
  gc += g[0] * p.ca * cg + g[1] * p.sa * cg - g[2] * cg * p.ds;
  gg += g[0] * (-p.ca * p.c * sg - p.sa * cg) + g[1] * (-p.sa * p.c * sg + p.ca * cg) + g[2] * p.s * sg;
}

// The NeRF frame of (d, a, b) from world positions x (3 per atom, contiguous).
template <typename T>
struct Frame {
  T e1[3], e2[3], e3[3], v[3], w[3], axis[3], nw, nn;
  bool zero_bond, straight, tiny_perp;
  Frame(const T* x, int64_t b, int64_t a, int64_t d, const Consts<T>& k) {
    for (int c = 0; c < 3; ++c) w[c] = x[3 * b + c] - x[3 * a + c], v[c] = x[3 * a + c] - x[3 * d + c];
    const T sw = dot(w, w);
    zero_bond = sw <= k.tiny;
    nw = zero_bond ? T(1) : std::sqrt(sw);
    const T iw = T(1) / nw;  // (one division, not three)
    for (int c = 0; c < 3; ++c) e1[c] = zero_bond ? T(c == 0) : w[c] * iw;
    T n[3];
    cross(v, e1, n);
    const T sn = dot(n, n);
    straight = sn <= k.collinear * dot(v, v) || sn <= k.tiny;
    tiny_perp = false;
    if (straight) {  // zmat._geometry.any_perpendicular(e1)
      const T a0 = std::fabs(e1[0]), a1 = std::fabs(e1[1]), a2 = std::fabs(e1[2]);
      const T low = (a0 < a1 ? (a0 < a2 ? a0 : a2) : (a1 < a2 ? a1 : a2)) + T(1e-6);
      const bool ex = a0 <= low, ey = !ex && a1 <= low;
      axis[0] = T(ex), axis[1] = T(ey), axis[2] = T(!ex && !ey);
      cross(e1, axis, n);
      const T sm = dot(n, n);
      tiny_perp = sm <= k.tiny;
      nn = std::sqrt(tiny_perp ? k.tiny : sm);
    } else {
      nn = std::sqrt(sn);
    }
    const T in = T(1) / nn;
    for (int c = 0; c < 3; ++c) e3[c] = n[c] * in;
    cross(e3, e1, e2);
  }
  // gradients of e1, e2, e3 (ge1, ge3 changed) into the positions' gradient gx
  void backward(T* ge1, const T* ge2, T* ge3, T* gx, int64_t b, int64_t a, int64_t d) const {
    T t[3];
    cross(e1, ge2, t);  // e2 = e3 x e1
    for (int c = 0; c < 3; ++c) ge3[c] += t[c];
    cross(ge2, e3, t);
    for (int c = 0; c < 3; ++c) ge1[c] += t[c];
    T gn[3];
    const T p = tiny_perp ? T(0) : dot(e3, ge3);  // (unit's gradient; a floored norm is a scale)
    for (int c = 0; c < 3; ++c) gn[c] = (ge3[c] - e3[c] * p) / nn;
    if (straight) {  // n = e1 x axis
      cross(axis, gn, t);
      for (int c = 0; c < 3; ++c) ge1[c] += t[c];
    } else {  // n = v x e1
      cross(e1, gn, t);
      for (int c = 0; c < 3; ++c) gx[3 * a + c] += t[c], gx[3 * d + c] -= t[c];
      cross(gn, v, t);
      for (int c = 0; c < 3; ++c) ge1[c] += t[c];
    }
    if (zero_bond) return;
    const T q = dot(e1, ge1);
    for (int c = 0; c < 3; ++c) {
      const T gw = (ge1[c] - e1[c] * q) / nw;
      gx[3 * b + c] += gw, gx[3 * a + c] -= gw;
    }
  }
};

template <typename T>
inline T dlog_floor(T v, T clamp) {  // d log max(|v|, clamp) / dv
  return std::fabs(v) >= clamp ? T(1) / v : T(0);
}

// What atom p (not CART) of one structure's placement order needs of q alone (no atom waits on
// another for it), from sin, cos of its angle and dihedral (sn, cs; THIRD and NERF): the log-det
// factor it returns, and o: SECOND, THIRD its offset from x_b; NERF the components
// (-cos t, sin t cos p, sin t sin p) of its offset's direction along the frame's e1, e2, e3, and r.
template <typename T>
inline double coefficients(const Q<T>& qq, const Plan& pl, int64_t p, const double* sn, const double* cs, T* o) {
  const Consts<T>& k = qq.k;
  const int64_t i = pl.atom[p];
  const uint8_t kind = pl.kind[p];
  const T r = qq.val(i, 0);
  const double r2 = floor_abs(r, k.clamp) * floor_abs(r, k.clamp);
  if (kind == SECOND) {
    T u[3];
    Pose<T>(qq, i).u(u);
    for (int c = 0; c < 3; ++c) o[c] = r * u[c];
    return r2;
  }
  const T st = static_cast<T>(sn[0]), ct = static_cast<T>(cs[0]);
  const T sp = static_cast<T>(sn[1]), cp = static_cast<T>(cs[1]);
  if (kind == NERF) {
    o[0] = -ct, o[1] = st * cp, o[2] = st * sp, o[3] = r;
  } else {
    const Pose<T> pose(qq, pl.d[p]);
    T u[3], e2[3];
    pose.u(u);
    e2_of(pose, cp, sp, e2);
    const T sign = kind == THIRD_ON_SECOND ? T(1) : T(-1);
    for (int c = 0; c < 3; ++c) o[c] = r * (-ct * sign * u[c] + st * e2[c]);
  }
  return r2 * floor_abs(st, k.clamp);
}

// x_i = x_b + o[3] (o[0] e1 + o[1] e2 + o[2] e3) in the NeRF frame of (d, a, b). Where the frame is regular,
// e1 = w/|w|, e3 = m/|m|, e2 = (m x w)/(|m||w|) with m = v x w: both norms at once, so an atom waits
// on one square root and one division instead of two of each; else Frame's degenerate rules.
template <typename T>
inline void place_nerf(T* xs, int64_t i, int64_t b, int64_t a, int64_t d, const T* o, const Consts<T>& k) {
  T w[3], v[3], m[3], mw[3];
  for (int c = 0; c < 3; ++c) w[c] = xs[3 * b + c] - xs[3 * a + c], v[c] = xs[3 * a + c] - xs[3 * d + c];
  cross(v, w, m);
  const T sw = dot(w, w), sm = dot(m, m);
  // Frame's tests (|w|^2 <= tiny, |v x e1|^2 <= collinear |v|^2 or <= tiny) times |w|^2; a NaN fails
  if (sw > k.tiny && sm > k.collinear * dot(v, v) * sw && sm > k.tiny * sw) {
    cross(m, w, mw);
    const T iw = T(1) / std::sqrt(sw), im = T(1) / std::sqrt(sm);
    const T a1 = o[0] * iw, a2 = o[1] * (im * iw), a3 = o[2] * im;
    for (int c = 0; c < 3; ++c) xs[3 * i + c] = xs[3 * b + c] + o[3] * (a1 * w[c] + a2 * mw[c] + a3 * m[c]);
    return;
  }
  const Frame<T> f(xs, b, a, d, k);
  for (int c = 0; c < 3; ++c) xs[3 * i + c] = xs[3 * b + c] + o[3] * (o[0] * f.e1[c] + o[1] * f.e2[c] + o[2] * f.e3[c]);
}

// S structures (q, positions xs, log-dets ld), their atoms in chunks. In each chunk: the fixed
// atoms (CART: no reference, so before the others); then for the placed ones their sines and
// cosines (one vectorised pass), their coefficients (independent atoms), and their placement (each
// atom after its references), the S structures' atoms in turn, so that their waits overlap. The
// atoms of each kind are listed first: no branch per atom on which kind it is.
template <typename T, int S>
inline void place_all(const Q<T>* qq, T* const* xs, const Plan& pl, double* ld) {
  constexpr int64_t chunk = 256;
  T o[S][4 * chunk];
  double ang[2 * chunk], sn[2 * chunk], cs[2 * chunk];
  int64_t cart[chunk], placed[chunk];
  LogSum sum[S];
  for (int64_t p0 = 0; p0 < pl.n; p0 += chunk) {
    const int64_t p1 = p0 + chunk < pl.n ? p0 + chunk : pl.n;
    int64_t nc = 0, m = 0;
    for (int64_t p = p0; p < p1; ++p) {
      const bool fixed = pl.kind[p] == CART;
      cart[nc] = placed[m] = p, nc += fixed, m += !fixed;
    }
    for (int s = 0; s < S; ++s) {
      for (int64_t j = 0; j < nc; ++j) {
        const int64_t i = pl.atom[cart[j]];
        for (int c = 0; c < 3; ++c) xs[s][3 * i + c] = qq[s].raw(i, c);
      }
      for (int64_t j = 0; j < m; ++j) {
        const int64_t p = placed[j], i = pl.atom[p];
        const bool angles = pl.kind[p] >= THIRD_ON_SECOND;
        ang[2 * j] = angles ? static_cast<double>(qq[s].val(i, 1)) : 0.0;
        ang[2 * j + 1] = angles ? static_cast<double>(qq[s].val(i, 2)) : 0.0;
      }
      zmat::sin_cos_n(ang, sn, cs, 2 * m);
      for (int64_t j = 0; j < m; ++j)
        sum[s].add(coefficients(qq[s], pl, placed[j], sn + 2 * j, cs + 2 * j, o[s] + 4 * j));
    }
    for (int64_t j = 0; j < m; ++j) {
      const int64_t p = placed[j], i = pl.atom[p], b = pl.b[p];
      const bool nerf = pl.kind[p] == NERF;
      for (int s = 0; s < S; ++s) {
        const T* op = o[s] + 4 * j;
        if (nerf)
          place_nerf(xs[s], i, b, pl.a[p], pl.d[p], op, qq[s].k);
        else
          for (int c = 0; c < 3; ++c) xs[s][3 * i + c] = xs[s][3 * b + c] + op[c];
      }
    }
  }
  for (int s = 0; s < S; ++s) ld[s] = sum[s].value();
}

template <typename T>
void forward(const T* q, int64_t bn, const int64_t* qs, const Plan& pl, const Consts<T>& k, T* x, T* ld,
             int64_t threads) {
  const int64_t n = pl.n;
  zmat::parallel_for((bn + 1) / 2, threads, [&](int64_t u) {  // units of two structures (four: slower)
    const int64_t s = 2 * u;
    const bool pair = s + 1 < bn;
    const Q<T> qq[2] = {{q + s * qs[0], qs[1], qs[2], k}, {q + (pair ? s + 1 : s) * qs[0], qs[1], qs[2], k}};
    T* const xs[2] = {x + s * 3 * n, x + (s + 1) * 3 * n};
    double v[2];
    if (pair)
      place_all<T, 2>(qq, xs, pl, v);
    else
      place_all<T, 1>(qq, xs, pl, v);
    for (int j = 0; j < 1 + pair && ld; ++j) ld[s + j] = static_cast<T>(v[j]);
  });
}

// gx (B, N, 3), gld (B,) with strides (either null); x the forward's output (contiguous);
// gq (B, N, 3) contiguous.
template <typename T>
void backward(const T* q, int64_t bn, const int64_t* qs, const Plan& pl, const Consts<T>& k, const T* x,
              const T* gx, const int64_t* gs, const T* gld, int64_t gl, T* gq, int64_t threads) {
  const int64_t n = pl.n;
  zmat::parallel_for(bn, threads, [&](int64_t s) {
    const Q<T> qq{q + s * qs[0], qs[1], qs[2], k};
    const T* xs = x + s * 3 * n;
    const T gl_s = gld ? gld[s * gl] : T(0);
    std::vector<T> gX(3 * n, T(0));
    T* gQ = gq + s * 3 * n;
    for (int64_t j = 0; j < 3 * n; ++j) gQ[j] = T(0);
    if (gx)
      for (int64_t i = 0; i < n; ++i)
        for (int c = 0; c < 3; ++c) gX[3 * i + c] = gx[s * gs[0] + i * gs[1] + c * gs[2]];
    for (int64_t p = n - 1; p >= 0; --p) {
      const int64_t i = pl.atom[p], b = pl.b[p];
      const uint8_t kind = pl.kind[p];
      const T* g = gX.data() + 3 * i;
      T* gi = gQ + 3 * i;
      if (kind == CART) {
        for (int c = 0; c < 3; ++c) gi[c] += g[c];
        continue;
      }
      const T r = qq.val(i, 0);
      gi[0] += 2 * gl_s * dlog_floor(r, k.clamp);
      for (int c = 0; c < 3; ++c) gX[3 * b + c] += g[c];
      if (kind == SECOND) {
        const Pose<T> pose(qq, i);
        T u[3], gu[3];
        pose.u(u);
        gi[0] += dot(g, u);
        for (int c = 0; c < 3; ++c) gu[c] = r * g[c];
        pose.u_backward(gu, gi[1], gi[2]);
        if (!pose.inside) gi[1] = T(0);  // (every use of cos b is summed by now: its third comes later)
        continue;
      }
      const T t = qq.val(i, 1), ph = qq.val(i, 2);
      T ct, st, cp, sp;
      sin_cos(t, st, ct);
      sin_cos(ph, sp, cp);
      gi[1] += gl_s * ct * dlog_floor(st, k.clamp);
      if (kind == NERF) {
        const Frame<T> f(xs, b, pl.a[p], pl.d[p], k);
        T ge1[3], ge2[3], ge3[3];
        for (int c = 0; c < 3; ++c) {
          gi[0] += g[c] * (-ct * f.e1[c] + st * cp * f.e2[c] + st * sp * f.e3[c]);
          gi[1] += r * g[c] * (st * f.e1[c] + ct * cp * f.e2[c] + ct * sp * f.e3[c]);
          gi[2] += r * st * g[c] * (-sp * f.e2[c] + cp * f.e3[c]);
          ge1[c] = -r * ct * g[c], ge2[c] = r * st * cp * g[c], ge3[c] = r * st * sp * g[c];
        }
        f.backward(ge1, ge2, ge3, gX.data(), b, pl.a[p], pl.d[p]);
        continue;
      }
      const int64_t second = pl.d[p];
      const Pose<T> pose(qq, second);
      T u[3], e2[3], gu[3], ge2[3];
      pose.u(u);
      e2_of(pose, cp, sp, e2);
      const T sign = kind == THIRD_ON_SECOND ? T(1) : T(-1);
      for (int c = 0; c < 3; ++c) {
        gi[0] += g[c] * (-ct * sign * u[c] + st * e2[c]);
        gi[1] += r * g[c] * (st * sign * u[c] + ct * e2[c]);
        gu[c] = -r * ct * sign * g[c], ge2[c] = r * st * g[c];
      }
      T* g2 = gQ + 3 * second;
      pose.u_backward(gu, g2[1], g2[2]);
      e2_backward(pose, cp, sp, ge2, g2[1], g2[2], gi[2]);
    }
    if (k.scale)
      for (int64_t j = 0; j < 3 * n; ++j) gQ[j] *= k.scale[j];
  });
}

// The log-determinant alone (zmat/flows.py, _log_det): sum_i w_i log|r_i| + w'_i log|sin t_i|,
// w (N, 2) the weights (0: not read), r, t the scaled q; and its gradient gq (B, N, 3).
template <typename T>
void log_det(const T* q, int64_t bn, const int64_t* qs, int64_t n, const T* w, const Consts<T>& k, T* ld,
             const T* gld, int64_t gl, T* gq, int64_t threads) {
  zmat::parallel_for(bn, threads, [&](int64_t s) {
    const Q<T> qq{q + s * qs[0], qs[1], qs[2], k};
    if (!gq) {  // the value
      LogSum sum;
      for (int64_t i = 0; i < n; ++i) {
        double v = 1;
        if (w[2 * i] != T(0)) v = power(floor_abs(qq.val(i, 0), k.clamp), w[2 * i]);
        if (w[2 * i + 1] != T(0)) {
          T st, ct;
          sin_cos(qq.val(i, 1), st, ct);
          v *= power(floor_abs(st, k.clamp), w[2 * i + 1]);
        }
        sum.add(v);
      }
      ld[s] = static_cast<T>(sum.value());
      return;
    }
    const T g = gld[s * gl];
    T* gs = gq + s * 3 * n;
    for (int64_t i = 0; i < n; ++i) {
      T gr = 0, gt = 0;
      if (w[2 * i] != T(0)) gr = g * w[2 * i] * dlog_floor(qq.val(i, 0), k.clamp);
      if (w[2 * i + 1] != T(0)) {
        T st, ct;
        sin_cos(qq.val(i, 1), st, ct);
        gt = g * w[2 * i + 1] * ct * dlog_floor(st, k.clamp);
      }
      gs[3 * i] = k.scale ? gr * k.scale[3 * i] : gr;
      gs[3 * i + 1] = k.scale ? gt * k.scale[3 * i + 1] : gt;
      gs[3 * i + 2] = T(0);
    }
  });
}

}  // namespace

// q (B, N, 3) with element strides; weights (N, 2), scale, shift (N, 3) (or null) contiguous;
// ld (B,) or gq (B, N, 3) (the backward, from gld with stride gl) contiguous.
#define ZMAT_LOG_DET(T, SUFFIX, CLAMP)                                                                      \
  extern "C" void zmat_log_det_##SUFFIX(const T* q, int64_t b, int64_t q0, int64_t q1, int64_t q2,          \
                                        int64_t n, const T* w, const T* scale, const T* shift, T* ld,       \
                                        const T* gld, int64_t gl, T* gq, int64_t threads) {                 \
    const int64_t qs[3] = {q0, q1, q2};                                                                    \
    log_det<T>(q, b, qs, n, w, Consts<T>{0, 0, CLAMP, scale, shift}, ld, gld, gl, gq, threads);             \
  }

ZMAT_LOG_DET(float, f32, 1e-6f)
ZMAT_LOG_DET(double, f64, 1e-12)

// q (B, N, 3) with element strides; plan arrays (N,) each (atom, b, a, d int64; kind uint8) in
// placement order; scale, shift (N, 3) or null; x (B, N, 3), ld (B,) (or null), gq contiguous.
#define ZMAT_WORLD(T, SUFFIX, TINY, COLLINEAR, CLAMP)                                                              \
  extern "C" void zmat_world_forward_##SUFFIX(                                                             \
      const T* q, int64_t b, int64_t q0, int64_t q1, int64_t q2, int64_t n, const int64_t* plan,            \
      const uint8_t* kind, const T* scale, const T* shift, T* x, T* ld, int64_t threads) {                  \
    const int64_t qs[3] = {q0, q1, q2};                                                                    \
    const Plan pl{n, plan, plan + n, plan + 2 * n, plan + 3 * n, kind};                                    \
    forward<T>(q, b, qs, pl, Consts<T>{TINY, COLLINEAR, CLAMP, scale, shift}, x, ld, threads);             \
  }                                                                                                        \
  extern "C" void zmat_world_backward_##SUFFIX(                                                            \
      const T* q, int64_t b, int64_t q0, int64_t q1, int64_t q2, int64_t n, const int64_t* plan,            \
      const uint8_t* kind, const T* scale, const T* shift, const T* x, const T* gx, int64_t g0,          \
      int64_t g1, int64_t g2, const T* gld, int64_t gl, T* gq, int64_t threads) {                          \
    const int64_t qs[3] = {q0, q1, q2}, gs[3] = {g0, g1, g2};                                              \
    const Plan pl{n, plan, plan + n, plan + 2 * n, plan + 3 * n, kind};                                    \
    backward<T>(q, b, qs, pl, Consts<T>{TINY, COLLINEAR, CLAMP, scale, shift}, x, gx, gs, gld, gl, gq,      \
                threads);                                                                                  \
  }

ZMAT_WORLD(float, f32, 1e-12f, 1e-10f, 1e-6f)
ZMAT_WORLD(double, f64, 1e-24, 1e-20, 1e-12)
