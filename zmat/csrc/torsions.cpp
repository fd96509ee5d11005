// Torsion updates of molecules (TorsionSpace.to_xyz, method="rigid"; see
// zmat/rdkit.py): the moving side of every rotatable bond is a rigid body.
// Per structure, torsions in nesting order (parents first):
//   R_k = Rodrigues(delta_k = t_k - t0_k about the unit axis u_k through p_k),
//   M_k = M_parent(k) o (x -> R_k (x - p_k) + p_k),
// and every atom is x_i = M_slot(i) x0_i (the conformer where it has no slot).
// Backward (as the Abe-Go backward of rigid_forest.cpp): rotating torsion k by
// d delta moves every atom of its side by w_k x (x_i - q_k), w_k = R_k u_k and
// q_k = M_k p_k its axis and point now, so
//   dL/d t_k = w_k . (sum_i x_i x g_i - q_k x sum_i g_i)
// over the atoms of its side: per-slot sums of g and x x g, added into the
// parents in reverse order. Motions and positions are recomputed, not saved.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "parallel.h"

namespace {

using A = double;

// The plan, in the torsions' nesting order: col (K,) the torsion's column in
// the input, parent (K,) (-1: none, else an earlier index), t0 (K,), u and p
// (K, 3); atoms: x0 (N, 3), slot (N,) (-1: none). Geometry in float64.
struct Plan {
  int64_t k, n;
  const int64_t *col, *parent, *slot;
  const double *t0, *u, *p, *x0;
};

// Motions M (K, 12) ([R | t] row-major) of one structure's torsions t (stride ts).
template <typename T>
void motions(const Plan& q, const T* t, int64_t ts, A* m) {
  for (int64_t s = 0; s < q.k; ++s) {
    const A d = A(t[q.col[s] * ts]) - q.t0[s];
    const A c = std::cos(d), sn = std::sin(d), v = 1 - c;
    const A* u = q.u + 3 * s;
    const A* p = q.p + 3 * s;
    // Rodrigues: R = c I + sn [u]x + v u u^T
    const A r[9] = {c + v * u[0] * u[0],        v * u[0] * u[1] - sn * u[2], v * u[0] * u[2] + sn * u[1],
                    v * u[1] * u[0] + sn * u[2], c + v * u[1] * u[1],        v * u[1] * u[2] - sn * u[0],
                    v * u[2] * u[0] - sn * u[1], v * u[2] * u[1] + sn * u[0], c + v * u[2] * u[2]};
    A* o = m + 12 * s;
    const int64_t a = q.parent[s];
    // parent's motion of p (the point stays on the axis): t_k = M_parent p - R_k' p
    A mp[3] = {p[0], p[1], p[2]};
    if (a >= 0) {
      const A* f = m + 12 * a;
      for (int i = 0; i < 3; ++i) {
        mp[i] = f[4 * i] * p[0] + f[4 * i + 1] * p[1] + f[4 * i + 2] * p[2] + f[4 * i + 3];
        for (int j = 0; j < 3; ++j)
          o[4 * i + j] = f[4 * i] * r[j] + f[4 * i + 1] * r[3 + j] + f[4 * i + 2] * r[6 + j];
      }
    } else {
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) o[4 * i + j] = r[3 * i + j];
    }
    for (int i = 0; i < 3; ++i) o[4 * i + 3] = mp[i] - (o[4 * i] * p[0] + o[4 * i + 1] * p[1] + o[4 * i + 2] * p[2]);
  }
}

inline void move(const A* m, const A* x, A* y) {
  for (int i = 0; i < 3; ++i) y[i] = m[4 * i] * x[0] + m[4 * i + 1] * x[1] + m[4 * i + 2] * x[2] + m[4 * i + 3];
}

A* scratch(int64_t size) {
  static thread_local std::vector<A> kept;
  if (kept.size() < static_cast<size_t>(size)) kept.resize(size);
  return kept.data();
}

// t (b, K) torsions (element strides ts0, ts1) -> xyz (b, N, 3).
template <typename T>
void forward(const Plan& q, const T* t, int64_t b, int64_t ts0, int64_t ts1, T* xyz, int64_t threads) {
  zmat::parallel_for(b, threads, [&](int64_t s) {
    A* m = scratch(12 * q.k);
    motions<T>(q, t + s * ts0, ts1, m);
    T* x = xyz + s * q.n * 3;
    for (int64_t i = 0; i < q.n; ++i) {
      const A* x0 = q.x0 + 3 * i;
      A y[3] = {x0[0], x0[1], x0[2]};
      if (q.slot[i] >= 0) move(m + 12 * q.slot[i], x0, y);
      for (int c = 0; c < 3; ++c) x[3 * i + c] = static_cast<T>(y[c]);
    }
  });
}

// g (b, N, 3) (element strides gs) -> grad (b, K), in the input's columns.
template <typename T>
void backward(const Plan& q, const T* t, int64_t b, int64_t ts0, int64_t ts1, const T* g, const int64_t* gs,
              T* grad, int64_t threads) {
  zmat::parallel_for(b, threads, [&](int64_t s) {
    A* m = scratch(18 * q.k);
    A* sum = m + 12 * q.k;  // per torsion: sum g (3), sum x x g (3)
    motions<T>(q, t + s * ts0, ts1, m);
    std::fill(sum, sum + 6 * q.k, A(0));
    const T* gb = g + s * gs[0];
    for (int64_t i = 0; i < q.n; ++i) {
      const int64_t k = q.slot[i];
      if (k < 0) continue;
      A x[3];
      move(m + 12 * k, q.x0 + 3 * i, x);
      const T* gi = gb + i * gs[1];
      const A gx = gi[0], gy = gi[gs[2]], gz = gi[2 * gs[2]];
      A* o = sum + 6 * k;
      o[0] += gx;
      o[1] += gy;
      o[2] += gz;
      o[3] += x[1] * gz - x[2] * gy;
      o[4] += x[2] * gx - x[0] * gz;
      o[5] += x[0] * gy - x[1] * gx;
    }
    T* out = grad + s * q.k;  // (b, K) contiguous, columns col[s]
    for (int64_t k = q.k - 1; k >= 0; --k) {  // children after parents: reverse order sums subtrees
      A* o = sum + 6 * k;
      const A* f = m + 12 * k;
      const A* u = q.u + 3 * k;
      A w[3], c[3];
      move(f, q.p + 3 * k, c);
      for (int i = 0; i < 3; ++i) w[i] = f[4 * i] * u[0] + f[4 * i + 1] * u[1] + f[4 * i + 2] * u[2];
      const A tq[3] = {o[3] - (c[1] * o[2] - c[2] * o[1]), o[4] - (c[2] * o[0] - c[0] * o[2]),
                       o[5] - (c[0] * o[1] - c[1] * o[0])};
      out[q.col[k]] = static_cast<T>(w[0] * tq[0] + w[1] * tq[1] + w[2] * tq[2]);
      const int64_t a = q.parent[k];
      if (a >= 0)
        for (int i = 0; i < 6; ++i) sum[6 * a + i] += o[i];
    }
  });
}

}  // namespace

#define ZMAT_TORSIONS(T, SUFFIX)                                                                          \
  extern "C" void zmat_torsions_forward_##SUFFIX(                                                         \
      int64_t k, int64_t n, const int64_t* col, const int64_t* parent, const int64_t* slot,               \
      const double* t0, const double* u, const double* p, const double* x0, const T* t, int64_t b,        \
      int64_t ts0, int64_t ts1, T* xyz, int64_t threads) {                                                \
    forward<T>(Plan{k, n, col, parent, slot, t0, u, p, x0}, t, b, ts0, ts1, xyz, threads);                \
  }                                                                                                       \
  extern "C" void zmat_torsions_backward_##SUFFIX(                                                        \
      int64_t k, int64_t n, const int64_t* col, const int64_t* parent, const int64_t* slot,               \
      const double* t0, const double* u, const double* p, const double* x0, const T* t, int64_t b,        \
      int64_t ts0, int64_t ts1, const T* g, int64_t g0, int64_t g1, int64_t g2, T* grad,                  \
      int64_t threads) {                                                                                  \
    const int64_t gs[3] = {g0, g1, g2};                                                                   \
    backward<T>(Plan{k, n, col, parent, slot, t0, u, p, x0}, t, b, ts0, ts1, g, gs, grad, threads);       \
  }

ZMAT_TORSIONS(float, f32)
ZMAT_TORSIONS(double, f64)
