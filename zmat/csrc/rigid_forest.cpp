// Sequential placement of a rigid forest and its Abe-Go backward (see
// zmat/_analytic.py for the math and zmat/_kernel.py for the plan arrays).
// One pass over the atoms in depth-first order per structure: for batch-1
// calls the per-op dispatch floor of eager PyTorch dominates, and a loop that
// never enters a parallel region is unaffected by a busy core. Large batches
// split their structures over a few threads (parallel.h).
//
// A plain C ABI (raw pointers, sizes and element strides; no torch headers),
// so that it compiles in about a second; zmat/_kernel.py allocates the
// outputs and calls it through ctypes.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "parallel.h"

// The plan arrays of one table (zmat/_kernel.py's _Arrays), passed by pointer
// so that a call converts few arguments; element strides of the tensors travel
// as plain integers (cheaper from ctypes than arrays). `chunked`: split the
// structures' trees into plan->chunks (else one unit per structure). A joined
// plan (n_pieces > 0: a batch of tables planned once) has no arrays of its own:
// piece q is the plan pieces[q] of the atoms and dfs positions start[q] ...
// start[q + 1] - 1, read in place with those offsets (its chunks are its
// pieces' own, so no run of trees spans two pieces; unchunked, a unit is a piece).
struct zmat_plan {
  int64_t n, k_rows, n_chunks;
  const int64_t* gather;
  const uint8_t* keep;
  const uint8_t* trig;
  const int64_t* parent;
  const int64_t* order;
  const int64_t* chunks;
  int64_t n_pieces;
  const zmat_plan* pieces;
  const int64_t* start;
};

namespace {

// Frames are row-major 3x4 [R | x]: f[4 * i + k] is component i of column k
// (columns 0..2 the axes, 3 the origin). Sequential products accumulate
// rounding along the depth (a 10k-atom chain), so they are kept in double
// whatever the input's dtype; only the stored frames are rounded.
using A = double;

// dfs positions lo..hi-1 (whole trees: parents inside the range) of one
// structure; the frame of position j goes to f[12 * (j - lo)].
template <typename T>
void place_one(const T* c, int64_t sc, int64_t n, int64_t k_rows, const int64_t* gather,
               const uint8_t* keep, const uint8_t* trig, const int64_t* parent, A* f, int64_t lo, int64_t hi) {
  for (int64_t j = lo; j < hi; ++j) {
    A r = keep[j] ? A(c[gather[j] * sc]) : A(0);
    A phi = 0;
    for (int64_t k = 2; k < k_rows; ++k) {
      if (keep[k * n + j]) phi += c[gather[k * n + j] * sc];
    }
    A ct = -1, st = 0, cp = 1, sp = 0;  // theta = pi, phi = 0: identity rotation
    if (trig[j]) {
      A t = c[gather[n + j] * sc];
      ct = std::cos(t);
      st = std::sin(t);
    }
    if (trig[n + j]) {
      cp = std::cos(phi);
      sp = std::sin(phi);
    }
    const A L[12] = {-ct,      -st,      0,   -r * ct,      //
                     st * cp,  -ct * cp, -sp, r * st * cp,  //
                     st * sp,  -ct * sp, cp,  r * st * sp};
    A* out = f + 12 * (j - lo);
    const int64_t p = parent[j];
    if (p < 0) {
      for (int q = 0; q < 12; ++q) out[q] = L[q];
      continue;
    }
    const A* a = f + 12 * (p - lo);
    for (int i = 0; i < 3; ++i) {
      const A a0 = a[4 * i], a1 = a[4 * i + 1], a2 = a[4 * i + 2];
      for (int k = 0; k < 4; ++k) out[4 * i + k] = a0 * L[k] + a1 * L[4 + k] + a2 * L[8 + k];
      out[4 * i + 3] += a[4 * i + 3];
    }
  }
}

// Scratch of `size` doubles. Up to 32 MB it is kept between calls (per
// thread): a fresh large buffer every call costs page faults, not arithmetic.
A* scratch(std::vector<A>& kept, std::vector<A>& local, int64_t size) {
  std::vector<A>& v = size <= (int64_t(1) << 22) ? kept : local;
  if (v.size() < static_cast<size_t>(size)) v.resize(size);
  return v.data();
}

// A unit of work of one structure: dfs positions lo..hi-1 (whole trees) of the
// plan p (a piece of a joined plan, or the call's own), whose atoms and dfs
// positions start at `at` in the call's.
struct Unit {
  const zmat_plan* p;
  int64_t at, lo, hi;
};

// The units of one structure: runs of whole trees (plan->chunks) if chunked,
// else the whole structure (a joined plan: each piece).
std::vector<Unit> units_of(const zmat_plan* p, bool chunked) {
  std::vector<Unit> out;
  if (p->n_pieces == 0) {
    if (!chunked || !p->chunks) return {{p, 0, 0, p->n}};
    for (int64_t c = 0; c < p->n_chunks; ++c) out.push_back({p, 0, p->chunks[c], p->chunks[c + 1]});
    return out;
  }
  const int64_t* bounds = chunked ? p->chunks : p->start;
  const int64_t m = chunked ? p->n_chunks : p->n_pieces;
  for (int64_t c = 0, q = 0; c < m; ++c) {
    if (bounds[c] == bounds[c + 1]) continue;  // (an empty piece)
    while (p->start[q + 1] <= bounds[c]) ++q;
    out.push_back({p->pieces + q, p->start[q], bounds[c] - p->start[q], bounds[c + 1] - p->start[q]});
  }
  return out;
}

// c: b structures of flat internal coordinates (element strides cs0, cs1);
// the plan p: gather (K, N), keep (K, N), trig (2, N), parent (N,) (-1:
// none), all in dfs order, order (N,) the atom of every dfs position, chunks
// (n_chunks + 1,) dfs positions where runs of whole trees start (0 ... N), the
// units of work with the structures if `chunked`. Writes frames (b, N, 3, 4)
// in dfs order unless `frames` is null and, unless `xyz` is null, positions
// xyz (b, N, 3) in atom order.
template <typename T>
void forward(const T* c, int64_t b, int64_t cs0, int64_t cs1, const zmat_plan* p, bool chunked, T* frames,
             T* xyz, int64_t threads) {
  const std::vector<Unit> units = units_of(p, chunked);
  const int64_t n = p->n, m = static_cast<int64_t>(units.size());
  zmat::parallel_for(b * m, threads, [&](int64_t unit) {
    const int64_t s = unit / m;
    const Unit& u = units[unit % m];
    const zmat_plan* q = u.p;
    const int64_t lo = u.lo, hi = u.hi;
    static thread_local std::vector<A> kept;
    std::vector<A> local;
    A* work = scratch(kept, local, 12 * (hi - lo));
    place_one<T>(c + s * cs0 + 3 * u.at * cs1, cs1, q->n, q->k_rows, q->gather, q->keep, q->trig, q->parent,
                 work, lo, hi);
    if (frames) {
      T* f = frames + (s * n + u.at + lo) * 12;
      for (int64_t e = 0; e < 12 * (hi - lo); ++e) f[e] = static_cast<T>(work[e]);
    }
    if (xyz) {
      T* x = xyz + (s * n + u.at) * 3;
      for (int64_t j = lo; j < hi; ++j)
        for (int i = 0; i < 3; ++i) x[3 * q->order[j] + i] = static_cast<T>(work[12 * (j - lo) + 4 * i + 3]);
    }
  });
}

// Abe-Go backward: subtree sums of the position gradients and of the moments
// in reverse dfs order, then d r, d theta, d phi_eff per atom, scattered to the
// flat internal coordinates through the forward's gather. frames (b, N, 3, 4)
// as the forward wrote them (rot: columns 0..2, pos: column 3); the gradients,
// each optional (null): g_rot (b, N, 3, 3) ([s, j, i, k]: component i of axis
// k), g_pos (b, N, 3), both in dfs order, and g_x (b, N, 3) in atom order (row
// rows[j] belongs to dfs position j). Strides fs, grs, gps, gxs in elements.
// chunks as in forward (a tree's entries of grad are its own atoms'). Writes
// grad (b, n3).
template <typename T>
void backward(const T* fr, const int64_t* fs, const T* grp, const int64_t* grs, const T* gpp,
              const int64_t* gps, const T* gxp, const int64_t* gxs, int64_t b, const zmat_plan* p,
              bool chunked, int64_t n3, T* grad, int64_t threads) {
  const std::vector<Unit> units = units_of(p, chunked);
  const int64_t m = static_cast<int64_t>(units.size());
  // A unit zeroes the entries of its own atoms (3 order[j] + c: a tree's
  // gathers stay in the tree) before adding to them; without order, all first.
  bool own = m > 1 && n3 == 3 * p->n;
  for (const Unit& u : units) own = own && u.p->order;
  if (m > 1 && !own) std::fill(grad, grad + b * n3, T(0));
  zmat::parallel_for(b * m, threads, [&](int64_t unit) {
    const int64_t t = unit / m;
    const Unit& u = units[unit % m];
    const int64_t n = u.p->n, k_rows = u.p->k_rows, lo = u.lo, hi = u.hi, at = u.at;
    const int64_t *g = u.p->gather, *par = u.p->parent, *row = u.p->order;
    const uint8_t* kp = u.p->keep;
    static thread_local std::vector<A> kept;
    std::vector<A> local;
    A* s0 = scratch(kept, local, 6 * (hi - lo));  // per dfs position: S2 (3), S1 (3), summed in double
    A* s = s0 - 6 * lo;  // s[6 * j] for j in lo..hi-1
    const T* f0 = fr + t * fs[0] + at * fs[1];
    auto R = [&](int64_t j, int i, int k) { return A(f0[j * fs[1] + i * fs[2] + k * fs[3]]); };
    auto X = [&](int64_t j, int i) { return A(f0[j * fs[1] + i * fs[2] + 3 * fs[3]]); };
    std::fill(s0, s0 + 6 * (hi - lo), A(0));
    for (int64_t j = hi - 1; j >= lo; --j) {  // children come later in dfs order
      A gp[3] = {0, 0, 0};
      if (gpp) {
        const T* gx = gpp + t * gps[0] + (at + j) * gps[1];
        for (int i = 0; i < 3; ++i) gp[i] = gx[i * gps[2]];
      }
      if (gxp) {
        const T* gx = gxp + t * gxs[0] + (at + (row ? row[j] : j)) * gxs[1];
        for (int i = 0; i < 3; ++i) gp[i] += gx[i * gxs[2]];
      }
      // moment x_j x g_j, plus the torque sum_k R[:, k] x G[:, k]
      const A xj[3] = {X(j, 0), X(j, 1), X(j, 2)};
      A m[3] = {xj[1] * gp[2] - xj[2] * gp[1], xj[2] * gp[0] - xj[0] * gp[2], xj[0] * gp[1] - xj[1] * gp[0]};
      if (grp) {
        const T* G = grp + t * grs[0] + (at + j) * grs[1];  // G[i * grs[2] + k * grs[3]]: component i of axis k
        for (int k = 0; k < 3; ++k) {
          const A g0 = G[k * grs[3]], g1 = G[grs[2] + k * grs[3]], g2 = G[2 * grs[2] + k * grs[3]];
          m[0] += R(j, 1, k) * g2 - R(j, 2, k) * g1;
          m[1] += R(j, 2, k) * g0 - R(j, 0, k) * g2;
          m[2] += R(j, 0, k) * g1 - R(j, 1, k) * g0;
        }
      }
      A* sj = s + 6 * j;
      for (int i = 0; i < 3; ++i) {
        sj[i] += gp[i];
        sj[3 + i] += m[i];
      }
      if (par[j] >= 0) {
        A* sp = s + 6 * par[j];
        for (int i = 0; i < 6; ++i) sp[i] += sj[i];
      }
    }
    if (m == 1) std::fill(grad + t * n3, grad + (t + 1) * n3, T(0));
    T* out = grad + t * n3 + 3 * at;
    if (own)
      for (int64_t j = lo; j < hi; ++j)
        for (int c = 0; c < 3; ++c) out[3 * row[j] + c] = T(0);
    for (int64_t j = lo; j < hi; ++j) {
      const A* s2 = s + 6 * j;
      const A* s1 = s2 + 3;
      A xp[3] = {0, 0, 0}, up[3] = {1, 0, 0};  // anchor origin and first axis
      const int64_t p = par[j];
      if (p >= 0) {
        for (int i = 0; i < 3; ++i) {
          xp[i] = X(p, i);
          up[i] = R(p, i, 0);
        }
      }
      const A tq[3] = {s1[0] - (xp[1] * s2[2] - xp[2] * s2[1]), s1[1] - (xp[2] * s2[0] - xp[0] * s2[2]),
                       s1[2] - (xp[0] * s2[1] - xp[1] * s2[0])};
      A d[3] = {0, 0, 0};
      for (int i = 0; i < 3; ++i) {
        d[0] += R(j, i, 0) * s2[i];
        d[1] -= R(j, i, 2) * tq[i];
        d[2] += up[i] * tq[i];
      }
      for (int64_t k = 0; k < k_rows; ++k) {
        if (kp[k * n + j]) out[g[k * n + j]] += static_cast<T>(d[k < 2 ? k : 2]);
      }
    }
  });
}

// ------------------------------------------------------------------ protein fill
// Torsions -> internal coordinates of a protein layout, the semantics of
// fill_internal (zmat/protein/build.py) without `base`: r and theta are the
// ideal values, phi the torsion of the atom's slot (its default where the
// torsion is NaN) or the ideal value; NaN ideal values read 0 (nan_to_num).
// In torch these are ~30 elementwise ops, each a parallel region on a batch.

template <typename T>
T finite(double v) {  // torch.nan_to_num of v cast to T
  const T x = static_cast<T>(v);
  if (std::isnan(x)) return T(0);
  if (std::isinf(x)) return x > 0 ? std::numeric_limits<T>::max() : std::numeric_limits<T>::lowest();
  return x;
}

// A threaded fill splits every structure's atoms into ranges of about
// FILL_ATOMS, handed out one at a time (parallel.h): a thread that shares its
// core with another takes fewer of them.
constexpr int64_t FILL_ATOMS = 8192;

int64_t fill_parts(int64_t n, int64_t threads) {
  return threads <= 1 ? 1 : std::clamp<int64_t>(n / FILL_ATOMS, 1, 256);
}

// t (s_n, L, 7) torsions (element strides ts); ideal (N, 3) float64; slot
// (N,), k * 7 + c or -1; defaults (7,). Writes out (s_n, N, 3): each atom its
// own row, so ranges of atoms never overlap.
template <typename T>
void fill_forward(const T* tp, const int64_t* ts, int64_t s_n, int64_t n, const double* id,
                  const int64_t* sl, const double* df, T* out, int64_t threads) {
  const int64_t parts = fill_parts(n, threads);
  zmat::parallel_for(s_n * parts, threads, [&](int64_t unit) {
    const int64_t s = unit / parts, part = unit % parts;
    const T* t = tp + s * ts[0];
    T* o = out + s * n * 3;
    for (int64_t j = n * part / parts, hi = n * (part + 1) / parts; j < hi; ++j) {
      for (int c = 0; c < 3; ++c) o[3 * j + c] = finite<T>(id[3 * j + c]);
      const int64_t k = sl[j];
      if (k < 0) continue;
      const T x = t[(k / 7) * ts[1] + (k % 7) * ts[2]];
      o[3 * j + 2] = std::isnan(x) ? static_cast<T>(df[k % 7]) : x;
    }
  });
}

// Ranges of atoms cut[p] ... cut[p + 1] meant to add only to the entries
// own[p] ... own[p + 1] of a structure's gradient: cuts at or a little after
// n * p / parts where the nearest few slots before are all below the nearest
// few after (own[p]: the lowest of these). Not checked here: a range that
// meets a slot outside its entries says so (fill_backward).
void fill_ranges(const int64_t* sl, int64_t n, int64_t size, int64_t parts, std::vector<int64_t>& cut,
                 std::vector<int64_t>& own) {
  constexpr int64_t W = 16, REACH = 256, TRIES = 64;
  const int64_t none = std::numeric_limits<int64_t>::max();
  auto nearest = [&](int64_t b, int64_t step) {  // max of the W slots before b (step -1), min after (+1)
    int64_t m = step < 0 ? -1 : none, seen = 0;
    for (int64_t j = step < 0 ? b - 1 : b, r = 0; 0 <= j && j < n && r < REACH && seen < W; j += step, ++r) {
      if (sl[j] < 0) continue;
      m = step < 0 ? std::max(m, sl[j]) : std::min(m, sl[j]);
      ++seen;
    }
    return m;
  };
  cut.assign(parts + 1, n);
  own.assign(parts + 1, size);
  cut[0] = own[0] = 0;
  for (int64_t p = 1; p < parts; ++p) {
    cut[p] = std::max(cut[p - 1], n * p / parts);
    own[p] = own[p - 1];
    for (int64_t b = cut[p]; b < std::min(n, cut[p] + TRIES); ++b) {
      const int64_t below = nearest(b, -1), above = nearest(b, 1);
      if (below < above) {
        cut[p] = b;
        own[p] = std::clamp(above == none ? below + 1 : above, own[p - 1], size);
        break;
      }
    }
  }
}

// The gradient of fill_forward: g (s_n, N, 3) (strides gs) -> out (s_n, L, 7),
// the phi column of every atom with a slot added to its torsion unless the
// torsion is NaN (t: the forward's input). Several atoms may share a torsion:
// threads take ranges of atoms that add to ranges of entries of their own
// (fill_ranges); where an atom's slot lies outside its range's entries (slots
// that no cut separates) it is all done again on one thread. Every entry is a
// sum in atom order by one thread: the same bits on any number of threads.
template <typename T>
void fill_backward(const T* gp, const int64_t* gs, const T* tp, const int64_t* ts, int64_t s_n, int64_t l,
                   int64_t n, const int64_t* sl, T* out, int64_t threads) {
  const int64_t size = l * 7, t0 = ts[0], t1 = ts[1], t2 = ts[2], g0 = gs[0], g1 = gs[1], g2 = 2 * gs[2];
  // atoms lo..hi-1 of structure s add to entries first..last-1; false if one's slot is outside
  auto add = [=](int64_t s, int64_t lo, int64_t hi, int64_t first, int64_t last) {
    T* os = out + s * size;
    const T* t = tp + s * t0;
    const T* g = gp + s * g0 + g2;
    std::fill(os + first, os + last, T(0));
    bool apart = true;
    for (int64_t j = lo; j < hi; ++j) {
      const int64_t k = sl[j];
      if (k < 0) continue;
      if (k < first || k >= last) {  // another range's entry: not written here
        apart = false;
        continue;
      }
      if (!std::isnan(t[(k / 7) * t1 + (k % 7) * t2])) os[k] += g[j * g1];
    }
    return apart;
  };
  const int64_t parts = fill_parts(n, threads);
  if (parts > 1) {
    std::vector<int64_t> cut, own;
    fill_ranges(sl, n, size, parts, cut, own);
    std::atomic<bool> apart{true};
    zmat::parallel_for(s_n * parts, threads, [&](int64_t unit) {
      const int64_t s = unit / parts, p = unit % parts;
      if (!add(s, cut[p], cut[p + 1], own[p], own[p + 1])) apart.store(false, std::memory_order_relaxed);
    });
    if (apart.load()) return;
  }
  for (int64_t s = 0; s < s_n; ++s) add(s, 0, n, 0, size);
}

}  // namespace

#define ZMAT_FOREST(T, SUFFIX)                                                                              \
  extern "C" void zmat_forward_##SUFFIX(const T* c, int64_t b, int64_t cs0, int64_t cs1, const zmat_plan* p, \
                                        int64_t chunked, T* frames, T* xyz, int64_t threads) {              \
    forward<T>(c, b, cs0, cs1, p, chunked, frames, xyz, threads);                                           \
  }                                                                                                         \
  extern "C" void zmat_backward_##SUFFIX(                                                                   \
      const T* frames, int64_t f0, int64_t f1, int64_t f2, int64_t f3, const T* g_rot, int64_t r0,          \
      int64_t r1, int64_t r2, int64_t r3, const T* g_pos, int64_t p0, int64_t p1, int64_t p2, const T* g_x, \
      int64_t x0, int64_t x1, int64_t x2, int64_t b, const zmat_plan* p, int64_t chunked, int64_t n3,       \
      T* grad, int64_t threads) {                                                                           \
    const int64_t fs[4] = {f0, f1, f2, f3}, grs[4] = {r0, r1, r2, r3}, gps[3] = {p0, p1, p2},               \
                  gxs[3] = {x0, x1, x2};                                                                    \
    backward<T>(frames, fs, g_rot, grs, g_pos, gps, g_x, gxs, b, p, chunked, n3, grad, threads);            \
  }                                                                                                         \
  extern "C" void zmat_fill_forward_##SUFFIX(const T* t, int64_t t0, int64_t t1, int64_t t2, int64_t s_n,  \
                                             int64_t n, const double* ideal, const int64_t* slot,           \
                                             const double* defaults, T* out, int64_t threads) {             \
    const int64_t ts[3] = {t0, t1, t2};                                                                     \
    fill_forward<T>(t, ts, s_n, n, ideal, slot, defaults, out, threads);                                    \
  }                                                                                                         \
  extern "C" void zmat_fill_backward_##SUFFIX(const T* g, int64_t g0, int64_t g1, int64_t g2, const T* t,  \
                                              int64_t t0, int64_t t1, int64_t t2, int64_t s_n, int64_t l,   \
                                              int64_t n, const int64_t* slot, T* out, int64_t threads) {    \
    const int64_t gs[3] = {g0, g1, g2}, ts[3] = {t0, t1, t2};                                               \
    fill_backward<T>(g, gs, t, ts, s_n, l, n, slot, out, threads);                                          \
  }

ZMAT_FOREST(float, f32)
ZMAT_FOREST(double, f64)
