// The free trees' poses of the normalizing flows' global forward (zmat/flows.py,
// _tree_frames_torch: _in_chart, _scale, then _euler_to_matrix; the same formulas,
// clamp and dtype arithmetic). Per tree, from its six entries of q (root x, y, z,
// alpha, gamma, cos beta; each v = q * scale + shift where scale is given):
//   c = clamp(cos beta, -1, 1) (only a tree with a second atom: else the entry is a
//       Cartesian one and read as is),  s = sqrt((1 - c)(1 + c)), 0 where that is <= tiny,
//   R = (Rz(alpha) Ry(beta)) (Rz(gamma) P),  P e_x = e_z, P e_y = e_x, P e_z = e_y,
//   o = the root's position.
// Backward: the chain rule of those products, the clamp passing the gradient on
// [-1, 1] and s's where s^2 > tiny (as autograd takes torch's clamp and where).
#include <cmath>
#include <cstdint>

#include "parallel.h"

namespace {

template <typename T>
struct Pose {
  T ca, sa, cg, sg, cb, sb, c;  // c: cos beta before the clamp
  bool inside, ok;              // the clamp passes; s^2 > tiny
  T A[9], G[9];                 // Rz(alpha) Ry(beta), Rz(gamma) P (row major)
};

template <typename T>
inline T entry(const T* q, const int64_t* qs, int64_t k, const T* scale, const T* shift) {
  const T v = q[(k / 3) * qs[1] + (k % 3) * qs[2]];
  return scale ? shift[k] + v * scale[k] : v;
}

template <typename T>
Pose<T> pose(const T* q, const int64_t* qs, const int64_t* idx, bool chart, const T* scale, const T* shift,
             T tiny) {
  Pose<T> p;
  const T alpha = entry(q, qs, idx[3], scale, shift), gamma = entry(q, qs, idx[4], scale, shift);
  p.c = entry(q, qs, idx[5], scale, shift);
  p.inside = !chart || (p.c >= T(-1) && p.c <= T(1));
  const T c = chart ? (p.c < T(-1) ? T(-1) : p.c > T(1) ? T(1) : p.c) : p.c;
  const T s2 = (T(1) - c) * (T(1) + c);
  p.ok = s2 > tiny;
  p.ca = std::cos(alpha), p.sa = std::sin(alpha), p.cg = std::cos(gamma), p.sg = std::sin(gamma);
  p.cb = c, p.sb = p.ok ? std::sqrt(s2) : T(0);
  const T Z = T(0), I = T(1);
  const T Rz[9] = {p.ca, -p.sa, Z, p.sa, p.ca, Z, Z, Z, I};
  const T Ry[9] = {p.cb, Z, p.sb, Z, I, Z, -p.sb, Z, p.cb};
  const T G[9] = {Z, p.cg, -p.sg, Z, p.sg, p.cg, I, Z, Z};
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) {
      T a = Rz[3 * i] * Ry[j];
      for (int k = 1; k < 3; ++k) a += Rz[3 * i + k] * Ry[3 * k + j];
      p.A[3 * i + j] = a;
      p.G[3 * i + j] = G[3 * i + j];
    }
  return p;
}

template <typename T>
void forward(const T* q, int64_t bn, const int64_t* qs, int64_t nt, const int64_t* index, const uint8_t* chart,
             const T* scale, const T* shift, T* R, T* o, T tiny, int64_t threads) {
  zmat::parallel_for(bn, threads, [&](int64_t b) {
    const T* qb = q + b * qs[0];
    for (int64_t j = 0; j < nt; ++j) {
      const int64_t* idx = index + 6 * j;
      const Pose<T> p = pose(qb, qs, idx, chart[j], scale, shift, tiny);
      T* r = R + (b * nt + j) * 9;
      for (int i = 0; i < 3; ++i)
        for (int k = 0; k < 3; ++k) {
          T a = p.A[3 * i] * p.G[k];
          for (int l = 1; l < 3; ++l) a += p.A[3 * i + l] * p.G[3 * l + k];
          r[3 * i + k] = a;
        }
      for (int c = 0; c < 3; ++c) o[(b * nt + j) * 3 + c] = entry(qb, qs, idx[c], scale, shift);
    }
  });
}

// gR (B, T, 3, 3), go (B, T, 3) with element strides (either null) -> gq (B, N, 3) contiguous.
template <typename T>
void backward(const T* q, int64_t bn, const int64_t* qs, int64_t n, int64_t nt, const int64_t* index,
              const uint8_t* chart, const T* scale, const T* shift, const T* gR, const int64_t* rs, const T* go,
              const int64_t* os, T* gq, T tiny, int64_t threads) {
  zmat::parallel_for(bn, threads, [&](int64_t b) {
    const T* qb = q + b * qs[0];
    T* g = gq + b * 3 * n;
    for (int64_t k = 0; k < 3 * n; ++k) g[k] = T(0);
    for (int64_t j = 0; j < nt; ++j) {
      const int64_t* idx = index + 6 * j;
      auto add = [&](int64_t k, T v) { g[k] += scale ? v * scale[k] : v; };
      if (go)
        for (int c = 0; c < 3; ++c) add(idx[c], go[b * os[0] + j * os[1] + c * os[2]]);
      if (!gR) continue;
      const Pose<T> p = pose(qb, qs, idx, chart[j], scale, shift, tiny);
      T gr[9], gA[9], gG[9], gRz[9], gRy[9];
      for (int i = 0; i < 3; ++i)
        for (int k = 0; k < 3; ++k) gr[3 * i + k] = gR[b * rs[0] + j * rs[1] + i * rs[2] + k * rs[3]];
      for (int i = 0; i < 3; ++i)  // R = A G: gA = gR G^T, gG = A^T gR
        for (int k = 0; k < 3; ++k) {
          T a = T(0), e = T(0);
          for (int l = 0; l < 3; ++l) a += gr[3 * i + l] * p.G[3 * k + l], e += p.A[3 * l + i] * gr[3 * l + k];
          gA[3 * i + k] = a, gG[3 * i + k] = e;
        }
      const T Z = T(0), I = T(1);
      const T Rz[9] = {p.ca, -p.sa, Z, p.sa, p.ca, Z, Z, Z, I};
      const T Ry[9] = {p.cb, Z, p.sb, Z, I, Z, -p.sb, Z, p.cb};
      for (int i = 0; i < 3; ++i)  // A = Rz Ry: gRz = gA Ry^T, gRy = Rz^T gA
        for (int k = 0; k < 3; ++k) {
          T a = T(0), e = T(0);
          for (int l = 0; l < 3; ++l) a += gA[3 * i + l] * Ry[3 * k + l], e += Rz[3 * l + i] * gA[3 * l + k];
          gRz[3 * i + k] = a, gRy[3 * i + k] = e;
        }
      const T gca = gRz[0] + gRz[4], gsa = gRz[3] - gRz[1];
      const T gcb = gRy[0] + gRy[8], gsb = gRy[2] - gRy[6];
      const T gcg = gG[1] + gG[5], gsg = gG[4] - gG[2];
      add(idx[3], gsa * p.ca - gca * p.sa);
      add(idx[4], gsg * p.cg - gcg * p.sg);
      if (p.inside) add(idx[5], gcb + (p.ok ? -p.cb / p.sb * gsb : T(0)));
    }
  });
}

}  // namespace

// q (B, N, 3) with element strides; index (6 T,) int64 (per tree: root x, y, z, alpha, gamma,
// cos beta, flat into an (N, 3) row); chart (T,) uint8 (1: clamp cos beta); scale, shift
// (N, 3) contiguous or null; R (B, T, 3, 3), o (B, T, 3), gq (B, N, 3) contiguous.
#define ZMAT_EULER(T, SUFFIX, TINY)                                                                          \
  extern "C" void zmat_euler_forward_##SUFFIX(const T* q, int64_t b, int64_t q0, int64_t q1, int64_t q2,     \
                                              int64_t nt, const int64_t* index, const uint8_t* chart,        \
                                              const T* scale, const T* shift, T* R, T* o, int64_t threads) { \
    const int64_t qs[3] = {q0, q1, q2};                                                                      \
    forward<T>(q, b, qs, nt, index, chart, scale, shift, R, o, TINY, threads);                              \
  }                                                                                                          \
  extern "C" void zmat_euler_backward_##SUFFIX(                                                              \
      const T* q, int64_t b, int64_t q0, int64_t q1, int64_t q2, int64_t n, int64_t nt, const int64_t* index, \
      const uint8_t* chart, const T* scale, const T* shift, const T* gR, int64_t r0, int64_t r1, int64_t r2,  \
      int64_t r3, const T* go, int64_t o0, int64_t o1, int64_t o2, T* gq, int64_t threads) {                 \
    const int64_t qs[3] = {q0, q1, q2}, rs[4] = {r0, r1, r2, r3}, os[3] = {o0, o1, o2};                      \
    backward<T>(q, b, qs, n, nt, index, chart, scale, shift, gR, rs, go, os, gq, TINY, threads);            \
  }

ZMAT_EULER(float, f32, 1e-12f)
ZMAT_EULER(double, f64, 1e-24)
