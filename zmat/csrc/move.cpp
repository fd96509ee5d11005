// The rigid motions of the normalizing flows' forward (zmat/flows.py, _move):
// every atom i placed by to_xyz in its frame's placement frame moves to
//   x_i = o_f + R_f y_i,  f = frame_of[i],
// or, where the atom is Cartesian (fixed atoms, roots), is c_i itself. One pass
// over the atoms instead of a gather of every atom's rotation. Backward:
//   g_y_i = R_f^T g_i,  g_R_f += g_i y_i^T,  g_o_f += g_i  (free atoms),  g_c_i = g_i (Cartesian),
// summed in atom order per structure (the same bits on any number of threads).
// Element strides for every input; outputs contiguous.
#include <cstdint>

#include "parallel.h"

namespace {

struct Strides {
  int64_t r[4], o[3], y[3], c[3];
};

template <typename T>
void forward(const T* R, const T* o, const T* y, const T* c, const Strides& s, int64_t b, int64_t n,
             const int64_t* frame_of, const uint8_t* cartesian, T* x, int64_t threads) {
  zmat::parallel_for(b, threads, [&](int64_t k) {
    const T *Rk = R + k * s.r[0], *ok = o + k * s.o[0], *yk = y + k * s.y[0], *ck = c + k * s.c[0];
    T* xk = x + k * 3 * n;
    for (int64_t i = 0; i < n; ++i, xk += 3) {
      if (cartesian[i]) {
        for (int j = 0; j < 3; ++j) xk[j] = ck[i * s.c[1] + j * s.c[2]];
        continue;
      }
      const int64_t f = frame_of[i];
      const T* Rf = Rk + f * s.r[1];
      const T* yi = yk + i * s.y[1];
      const T y0 = yi[0], y1 = yi[s.y[2]], y2 = yi[2 * s.y[2]];
      for (int j = 0; j < 3; ++j) {
        const T* row = Rf + j * s.r[2];
        xk[j] = ok[f * s.o[1] + j * s.o[2]] + (row[0] * y0 + row[s.r[3]] * y1 + row[2 * s.r[3]] * y2);
      }
    }
  });
}

// g (B, N, 3) with strides gs; gR (B, F, 3, 3), go (B, F, 3), gy (B, M, 3), gc (B, N, 3), contiguous.
template <typename T>
void backward(const T* R, const T* y, const Strides& s, const T* g, const int64_t* gs, int64_t b, int64_t n,
              int64_t f_n, int64_t m, const int64_t* frame_of, const uint8_t* cartesian, T* gR, T* go, T* gy,
              T* gc, int64_t threads) {
  zmat::parallel_for(b, threads, [&](int64_t k) {
    const T *Rk = R + k * s.r[0], *yk = y + k * s.y[0], *gk = g + k * gs[0];
    T *gRk = gR + k * 9 * f_n, *gok = go + k * 3 * f_n, *gyk = gy + k * 3 * m, *gck = gc + k * 3 * n;
    for (int64_t j = 0; j < 9 * f_n; ++j) gRk[j] = T(0);
    for (int64_t j = 0; j < 3 * f_n; ++j) gok[j] = T(0);
    for (int64_t j = 0; j < 3 * m; ++j) gyk[j] = T(0);
    for (int64_t j = 0; j < 3 * n; ++j) gck[j] = T(0);
    for (int64_t i = 0; i < n; ++i) {
      const T* gi = gk + i * gs[1];
      const T g0 = gi[0], g1 = gi[gs[2]], g2 = gi[2 * gs[2]];
      if (cartesian[i]) {
        gck[3 * i] = g0;
        gck[3 * i + 1] = g1;
        gck[3 * i + 2] = g2;
        continue;
      }
      const int64_t f = frame_of[i];
      const T* Rf = Rk + f * s.r[1];
      const T* yi = yk + i * s.y[1];
      const T yv[3] = {yi[0], yi[s.y[2]], yi[2 * s.y[2]]}, gv[3] = {g0, g1, g2};
      T* gRf = gRk + 9 * f;
      for (int j = 0; j < 3; ++j) {
        gok[3 * f + j] += gv[j];
        for (int l = 0; l < 3; ++l) {
          gRf[3 * j + l] += gv[j] * yv[l];
          gyk[3 * i + l] += Rf[j * s.r[2] + l * s.r[3]] * gv[j];
        }
      }
    }
  });
}

}  // namespace

#define ZMAT_MOVE(T, SUFFIX)                                                                                  \
  extern "C" void zmat_move_forward_##SUFFIX(                                                                \
      const T* R, int64_t r0, int64_t r1, int64_t r2, int64_t r3, const T* o, int64_t o0, int64_t o1,        \
      int64_t o2, const T* y, int64_t y0, int64_t y1, int64_t y2, const T* c, int64_t c0, int64_t c1,        \
      int64_t c2, int64_t b, int64_t n, const int64_t* frame_of, const uint8_t* cartesian, T* x,             \
      int64_t threads) {                                                                                     \
    const Strides s{{r0, r1, r2, r3}, {o0, o1, o2}, {y0, y1, y2}, {c0, c1, c2}};                             \
    forward<T>(R, o, y, c, s, b, n, frame_of, cartesian, x, threads);                                        \
  }                                                                                                          \
  extern "C" void zmat_move_backward_##SUFFIX(                                                               \
      const T* R, int64_t r0, int64_t r1, int64_t r2, int64_t r3, const T* y, int64_t y0, int64_t y1,        \
      int64_t y2, const T* g, int64_t g0, int64_t g1, int64_t g2, int64_t b, int64_t n, int64_t f_n,         \
      int64_t m, const int64_t* frame_of, const uint8_t* cartesian, T* gR, T* go, T* gy, T* gc,              \
      int64_t threads) {                                                                                     \
    const Strides s{{r0, r1, r2, r3}, {0, 0, 0}, {y0, y1, y2}, {0, 0, 0}};                                   \
    const int64_t gs[3] = {g0, g1, g2};                                                                      \
    backward<T>(R, y, s, g, gs, b, n, f_n, m, frame_of, cartesian, gR, go, gy, gc, threads);                 \
  }

ZMAT_MOVE(float, f32)
ZMAT_MOVE(double, f64)
