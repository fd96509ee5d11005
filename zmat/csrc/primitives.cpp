// The optimiser's primitive internal coordinates (zmat/optimize/coordinates.py, _fused: the same
// formula per kind), their Wilson B matrix, and the back-transformation's fixed-Jacobian iteration
// (zmat/optimize/steps.py, back_transform), for a batch of conformers.
// Each row has four points p0..p3 (shorter rows repeat their last atom) and a kind:
//   0 bond |p1 - p0|; 1 angle atan2(|a x w|, a . w), a = p0 - p1, w = p2 - p1;
//   2 linear bend: the same with w = the reference made perpendicular to the axis p2 - p0;
//   3 dihedral atan2(|b2| b1 . n2, n1 . n2); 4 out-of-plane atan2(n . w, |n x w|), n = b2 x b1,
//   w = p3 - p1;
// norms with a zero gradient at 0, atan2 0 (zero gradient) where x^2 + y^2 <= tiny (safe_atan2).
// B comes from forward-mode derivatives of that formula (a value and its 12 partials, one per
// point component), scattered into the row's columns. Rows after the geometric ones: frozen
// atoms' Cartesian components (constant rows of B). Conformers are the units of work.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "parallel.h"

namespace {

constexpr double kPi = 3.14159265358979323846;

// A value and its derivatives with respect to the row's 12 point components.
template <typename T>
struct D {
  T v;
  T d[12];
};

template <typename T>
inline T val(T a) {
  return a;
}
template <typename T>
inline T val(const D<T>& a) {
  return a.v;
}
template <typename T>
inline D<T> operator+(const D<T>& a, const D<T>& b) {
  D<T> o{a.v + b.v, {}};
  for (int k = 0; k < 12; ++k) o.d[k] = a.d[k] + b.d[k];
  return o;
}
template <typename T>
inline D<T> operator-(const D<T>& a, const D<T>& b) {
  D<T> o{a.v - b.v, {}};
  for (int k = 0; k < 12; ++k) o.d[k] = a.d[k] - b.d[k];
  return o;
}
template <typename T>
inline D<T> operator-(const D<T>& a) {
  D<T> o{-a.v, {}};
  for (int k = 0; k < 12; ++k) o.d[k] = -a.d[k];
  return o;
}
template <typename T>
inline D<T> operator*(const D<T>& a, const D<T>& b) {
  D<T> o{a.v * b.v, {}};
  for (int k = 0; k < 12; ++k) o.d[k] = a.d[k] * b.v + a.v * b.d[k];
  return o;
}
template <typename T>
inline D<T> operator*(const D<T>& a, T s) {
  D<T> o{a.v * s, {}};
  for (int k = 0; k < 12; ++k) o.d[k] = a.d[k] * s;
  return o;
}
template <typename T>
inline D<T> operator*(T s, const D<T>& a) {
  return a * s;
}
template <typename T>
inline D<T> operator-(T s, const D<T>& a) {
  D<T> o{s - a.v, {}};
  for (int k = 0; k < 12; ++k) o.d[k] = -a.d[k];
  return o;
}
template <typename T>
inline D<T> operator/(const D<T>& a, const D<T>& b) {
  const T q = a.v / b.v;
  D<T> o{q, {}};
  for (int k = 0; k < 12; ++k) o.d[k] = (a.d[k] - q * b.d[k]) / b.v;
  return o;
}

// sqrt of a squared norm, gradient 0 at 0 (torch's vector_norm)
template <typename T>
inline T root(T s) {
  return std::sqrt(s);
}
template <typename T>
inline D<T> root(const D<T>& s) {
  const T r = std::sqrt(s.v);
  D<T> o{r, {}};
  if (r > T(0))
    for (int k = 0; k < 12; ++k) o.d[k] = s.d[k] / (2 * r);
  return o;
}
// clamp_min(a, lo): where a value is clamped its derivative is 0
template <typename T>
inline T floor_at(T a, T lo) {
  return a < lo ? lo : a;
}
template <typename T>
inline D<T> floor_at(const D<T>& a, T lo) {
  return a.v < lo ? D<T>{lo, {}} : a;
}
// safe_atan2: 0 with zero gradient where x^2 + y^2 <= tiny
template <typename T>
inline T angle(T y, T x, T tiny) {
  return x * x + y * y <= tiny ? T(0) : std::atan2(y, x);
}
template <typename T>
inline D<T> angle(const D<T>& y, const D<T>& x, T tiny) {
  const T h = x.v * x.v + y.v * y.v;
  if (h <= tiny) return D<T>{T(0), {}};
  D<T> o{std::atan2(y.v, x.v), {}};
  for (int k = 0; k < 12; ++k) o.d[k] = (x.v * y.d[k] - y.v * x.d[k]) / h;
  return o;
}

template <typename N>
struct V {
  N x, y, z;
};
template <typename N>
inline V<N> operator-(const V<N>& a, const V<N>& b) {
  return {a.x - b.x, a.y - b.y, a.z - b.z};
}
template <typename N>
inline V<N> operator+(const V<N>& a, const V<N>& b) {
  return {a.x + b.x, a.y + b.y, a.z + b.z};
}
template <typename N>
inline V<N> neg(const V<N>& a) {
  return {-a.x, -a.y, -a.z};
}
// + 0: a sum of negative zeros is +0, as torch's sum (the sign of a dihedral's 0 sine decides +-pi)
template <typename T>
inline T plus_zero(T a) {
  return a + T(0);
}
template <typename T>
inline D<T> plus_zero(D<T> a) {
  a.v += T(0);
  return a;
}
template <typename N>
inline N dot(const V<N>& a, const V<N>& b) {
  return plus_zero(a.x * b.x + a.y * b.y + a.z * b.z);
}
template <typename N>
inline V<N> cross(const V<N>& a, const V<N>& b) {
  return {a.y * b.z - a.z * b.y, a.z * b.x - a.x * b.z, a.x * b.y - a.y * b.x};
}
template <typename N>
inline N norm(const V<N>& a) {
  return root(dot(a, a));
}

// The value of one row from its points (kind as in the header; ref: a linear bend's direction).
template <typename T, typename N>
N primitive(int64_t kind, const V<N>* p, const T* ref, T tiny) {
  const V<N> b1 = p[1] - p[0], v = p[2] - p[1], b3 = p[3] - p[2];
  switch (kind) {
    case 0:
      return norm(b1);
    case 3: {
      const V<N> n1 = cross(b1, v), n2 = cross(v, b3);
      return angle(norm(v) * dot(b1, n2), dot(n1, n2), tiny);
    }
    case 4: {
      const V<N> n = cross(v, b1), w = v + b3;
      return angle(dot(n, w), norm(cross(n, w)), tiny);
    }
    default: {
      const V<N> a = neg(b1);
      V<N> w = v;
      if (kind == 2) {  // the reference made perpendicular to the axis p2 - p0
        const V<N> ax = b1 + v;
        const N len = floor_at(norm(ax), T(1e-12));
        const V<N> u{ax.x / len, ax.y / len, ax.z / len};
        const N along = plus_zero(u.x * ref[0] + u.y * ref[1] + u.z * ref[2]);
        w = {ref[0] - along * u.x, ref[1] - along * u.y, ref[2] - along * u.z};
      }
      return angle(norm(cross(a, w)), dot(a, w), tiny);
    }
  }
}

// The rows' layout (coordinates.py, kernel_layout).
template <typename T>
struct Layout {
  int64_t g, c;                      // geometric rows, Cartesian rows
  const int64_t *atoms, *kind, *cart;  // (G, 4), (G,), (C,) flat 3 * atom + axis
  const T* ref;                      // (G, 3)
};

// q (P = G + C) of one conformer at x (3N contiguous).
template <typename T>
void values(const T* x, const Layout<T>& L, T tiny, T* q) {
  for (int64_t r = 0; r < L.g; ++r) {
    const int64_t* a = L.atoms + 4 * r;
    V<T> p[4];
    for (int j = 0; j < 4; ++j) p[j] = {x[3 * a[j]], x[3 * a[j] + 1], x[3 * a[j] + 2]};
    q[r] = primitive<T, T>(L.kind[r], p, L.ref + 3 * r, tiny);
  }
  for (int64_t r = 0; r < L.c; ++r) q[L.g + r] = x[L.cart[r]];
}

// q and the rows of B (P x n3, zeroed here) of one conformer.
template <typename T>
void values_and_b(const T* x, const Layout<T>& L, int64_t n3, T tiny, T* q, T* bm) {
  for (int64_t k = 0; k < (L.g + L.c) * n3; ++k) bm[k] = T(0);
  for (int64_t r = 0; r < L.g; ++r) {
    const int64_t* a = L.atoms + 4 * r;
    V<D<T>> p[4];
    for (int j = 0; j < 4; ++j) {
      D<T>* c[3] = {&p[j].x, &p[j].y, &p[j].z};
      for (int e = 0; e < 3; ++e) {
        *c[e] = D<T>{x[3 * a[j] + e], {}};
        c[e]->d[3 * j + e] = T(1);
      }
    }
    const D<T> out = primitive<T, D<T>>(L.kind[r], p, L.ref + 3 * r, tiny);
    q[r] = out.v;
    T* row = bm + r * n3;
    for (int j = 0; j < 4; ++j)
      for (int e = 0; e < 3; ++e) row[3 * a[j] + e] += out.d[3 * j + e];
  }
  for (int64_t r = 0; r < L.c; ++r) {
    q[L.g + r] = x[L.cart[r]];
    bm[(L.g + r) * n3 + L.cart[r]] = T(1);
  }
}

// torch.remainder(dq + pi, 2 pi) - pi (steps.wrap)
template <typename T>
inline T wrap(T dq) {
  const T b = T(2 * kPi), a = dq + T(kPi);
  T m = std::fmod(a, b);
  if (m != T(0) && ((b < 0) != (m < 0))) m += b;
  return m - T(kPi);
}

// One round of back_transform for one conformer: from x0 and the residual r0, x <- x + Vs (U^T r)
// (U: P x rank, Vs: n3 x rank) until done (update below tol, or the residual above stall times its
// best when `stall_on`), keeping the iterate of the smallest residual in best / best_x / best_q.
template <typename T>
void back_round(const T* x0, const T* r0, const T* target, const T* U, const T* Vs, const uint8_t* periodic,
                const Layout<T>& L, int64_t n3, int64_t rank, int64_t iterations, T tol, T stall, bool stall_on,
                T tiny, T* best, T* best_x, T* best_q) {
  const int64_t p = L.g + L.c;
  std::vector<T> x(x0, x0 + n3), r(r0, r0 + p), t(rank), q(p);
  for (int64_t it = 0; it < iterations; ++it) {
    for (int64_t j = 0; j < rank; ++j) t[j] = T(0);
    for (int64_t i = 0; i < p; ++i) {  // t = U^T r
      const T* u = U + i * rank;
      for (int64_t j = 0; j < rank; ++j) t[j] += u[j] * r[i];
    }
    T step = T(0);
    for (int64_t j = 0; j < n3; ++j) {  // x += Vs t
      const T* vs = Vs + j * rank;
      T dx = T(0);
      for (int64_t k = 0; k < rank; ++k) dx += vs[k] * t[k];
      x[j] += dx;
      step = std::fabs(dx) > step || std::isnan(dx) ? std::fabs(dx) : step;
    }
    values(x.data(), L, tiny, q.data());
    T size = T(0);
    for (int64_t i = 0; i < p; ++i) {
      const T d = target[i] - q[i];
      r[i] = periodic[i] ? wrap(d) : d;
      size = std::fabs(r[i]) > size || std::isnan(r[i]) ? std::fabs(r[i]) : size;
    }
    bool done = stall_on && size > stall * *best;
    if (size < *best) {
      *best = size;
      for (int64_t j = 0; j < n3; ++j) best_x[j] = x[j];
      for (int64_t i = 0; i < p; ++i) best_q[i] = q[i];
    }
    if (done || step < tol) break;
  }
}

// The distinct columns of a row of B and their entries (a row's repeated padding atom counted once):
// at most 12; returns how many.
template <typename T>
int row_columns(const T* row, const int64_t* a, int64_t* col, T* val) {
  int m = 0;
  for (int j = 0; j < 4; ++j) {
    bool seen = false;
    for (int i = 0; i < j; ++i) seen = seen || a[i] == a[j];
    if (seen) continue;
    for (int e = 0; e < 3; ++e) {
      col[m] = 3 * a[j] + e;
      val[m++] = row[3 * a[j] + e];
    }
  }
  return m;
}

// G = B^T B (n3 x n3) of one conformer from the rows' at most 12 nonzero columns (geometric rows, then
// the Cartesian rows' single ones): ~150 multiply-adds a row where the dense product takes 3N^2.
template <typename T>
void gram(const T* bm, const Layout<T>& L, int64_t n3, T* G) {
  for (int64_t k = 0; k < n3 * n3; ++k) G[k] = T(0);
  int64_t col[12];
  T val[12];
  for (int64_t r = 0; r < L.g; ++r) {
    const int m = row_columns(bm + r * n3, L.atoms + 4 * r, col, val);
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < m; ++j) G[col[i] * n3 + col[j]] += val[i] * val[j];
  }
  for (int64_t r = 0; r < L.c; ++r) G[L.cart[r] * n3 + L.cart[r]] += T(1);
}

// U = B W (P x rank) of one conformer, W (n3 x rank), from the rows' nonzero columns.
template <typename T>
void sparse_times(const T* bm, const Layout<T>& L, int64_t n3, const T* W, int64_t rank, T* U) {
  int64_t col[12];
  T val[12];
  for (int64_t r = 0; r < L.g + L.c; ++r) {
    T* u = U + r * rank;
    for (int64_t k = 0; k < rank; ++k) u[k] = T(0);
    const int m = r < L.g ? row_columns(bm + r * n3, L.atoms + 4 * r, col, val) : 1;
    if (r >= L.g) col[0] = L.cart[r - L.g], val[0] = T(1);
    for (int i = 0; i < m; ++i) {
      const T* w = W + col[i] * rank;
      for (int64_t k = 0; k < rank; ++k) u[k] += val[i] * w[k];
    }
  }
}

template <typename T>
Layout<T> layout(int64_t g, const int64_t* atoms, const int64_t* kind, const T* ref, int64_t c,
                 const int64_t* cart) {
  return Layout<T>{g, c, atoms, kind, cart, ref};
}

template <typename T>
constexpr T tiny_of() {
  return sizeof(T) == 4 ? T(1e-12) : T(1e-24);  // zmat._geometry.tiny
}

}  // namespace

// Inputs contiguous: x (B, N, 3), layout arrays; outputs q (B, P), bm (B, P, 3N).
#define ZMAT_PRIMITIVES(T, SUFFIX)                                                                          \
  extern "C" void zmat_prims_values_##SUFFIX(const T* x, int64_t b, int64_t n, int64_t g,                  \
                                             const int64_t* atoms, const int64_t* kind, const T* ref,       \
                                             int64_t c, const int64_t* cart, T* q, int64_t threads) {       \
    const Layout<T> L = layout<T>(g, atoms, kind, ref, c, cart);                                           \
    zmat::parallel_for(b, threads,                                                                          \
                       [&](int64_t k) { values<T>(x + k * 3 * n, L, tiny_of<T>(), q + k * (g + c)); });    \
  }                                                                                                         \
  extern "C" void zmat_prims_b_##SUFFIX(const T* x, int64_t b, int64_t n, int64_t g, const int64_t* atoms, \
                                        const int64_t* kind, const T* ref, int64_t c, const int64_t* cart,  \
                                        T* q, T* bm, int64_t threads) {                                     \
    const Layout<T> L = layout<T>(g, atoms, kind, ref, c, cart);                                           \
    const int64_t p = g + c, n3 = 3 * n;                                                                    \
    zmat::parallel_for(b, threads, [&](int64_t k) {                                                         \
      values_and_b<T>(x + k * n3, L, n3, tiny_of<T>(), q + k * p, bm + k * p * n3);                         \
    });                                                                                                     \
  }                                                                                                         \
  /* x0, r0, target, U (B, P, R), Vs (B, 3N, R) contiguous; best (B), best_x, best_q updated */            \
  extern "C" void zmat_back_round_##SUFFIX(                                                                 \
      const T* x0, const T* r0, const T* target, const T* U, const T* Vs, const uint8_t* periodic,          \
      int64_t b, int64_t n, int64_t g, const int64_t* atoms, const int64_t* kind, const T* ref, int64_t c,  \
      const int64_t* cart, int64_t rank, int64_t iterations, double tol, double stall, int64_t stall_on,    \
      T* best, T* best_x, T* best_q, int64_t threads) {                                                     \
    const Layout<T> L = layout<T>(g, atoms, kind, ref, c, cart);                                           \
    const int64_t p = g + c, n3 = 3 * n;                                                                    \
    zmat::parallel_for(b, threads, [&](int64_t k) {                                                         \
      back_round<T>(x0 + k * n3, r0 + k * p, target + k * p, U + k * p * rank, Vs + k * n3 * rank,         \
                    periodic, L, n3, rank, iterations, T(tol), T(stall), stall_on != 0, tiny_of<T>(),      \
                    best + k, best_x + k * n3, best_q + k * p);                                             \
    });                                                                                                     \
  }

// bm (B, P, 3N) as zmat_prims_b wrote it; G (B, 3N, 3N); W (B, 3N, R) and U (B, P, R).
#define ZMAT_PRIMITIVES_SPARSE(T, SUFFIX)                                                                   \
  extern "C" void zmat_prims_gram_##SUFFIX(const T* bm, int64_t b, int64_t n, int64_t g,                   \
                                           const int64_t* atoms, const int64_t* kind, const T* ref,         \
                                           int64_t c, const int64_t* cart, T* G, int64_t threads) {        \
    const Layout<T> L = layout<T>(g, atoms, kind, ref, c, cart);                                           \
    const int64_t p = g + c, n3 = 3 * n;                                                                    \
    zmat::parallel_for(b, threads, [&](int64_t k) { gram<T>(bm + k * p * n3, L, n3, G + k * n3 * n3); });  \
  }                                                                                                         \
  extern "C" void zmat_prims_times_##SUFFIX(const T* bm, int64_t b, int64_t n, int64_t g,                  \
                                            const int64_t* atoms, const int64_t* kind, const T* ref,        \
                                            int64_t c, const int64_t* cart, const T* W, int64_t rank, T* U, \
                                            int64_t threads) {                                              \
    const Layout<T> L = layout<T>(g, atoms, kind, ref, c, cart);                                           \
    const int64_t p = g + c, n3 = 3 * n;                                                                    \
    zmat::parallel_for(b, threads, [&](int64_t k) {                                                         \
      sparse_times<T>(bm + k * p * n3, L, n3, W + k * n3 * rank, rank, U + k * p * rank);                   \
    });                                                                                                     \
  }

ZMAT_PRIMITIVES_SPARSE(float, f32)
ZMAT_PRIMITIVES_SPARSE(double, f64)
ZMAT_PRIMITIVES(float, f32)
ZMAT_PRIMITIVES(double, f64)
