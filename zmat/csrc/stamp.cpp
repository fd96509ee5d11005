// A protein batch's kernel plan stamped from per-residue pieces in one pass:
// zmat/protein/pieces.py `kernel_arrays` in C (the numpy version there is the
// reference and the fallback; tests compare the two exactly). A fresh batch's
// training step needs nothing else of its table.
//
// A tree of units t0..t1 (residues; a padding atom is a one-unit tree) is,
// in depth-first order, every unit's head atoms in unit order, then every
// unit's tail atoms in reverse unit order; each run lists piece atoms in the
// piece's own order (`seq`). Trees follow each other, so a tree's first
// position is its first atom. Trees are independent, so runs of whole trees
// go to threads (parallel.h): the same bits on any thread count.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "parallel.h"

namespace {

// Runs of units for `threads`: a few per thread (a busy core takes fewer),
// each starting at a tree's first unit (`last` of the unit before it is
// itself; nullptr: any unit starts one). f(u0, u1) per run.
template <typename F>
void runs_of_trees(int64_t u_n, const int64_t* last, int64_t threads, const F& f) {
  const int64_t n_runs = threads <= 1 ? 1 : std::min<int64_t>(8 * threads, u_n);
  std::vector<int64_t> cut(n_runs + 1, u_n);
  for (int64_t r = 0; r < n_runs; ++r) {
    int64_t u = std::max(u_n * r / n_runs, r > 0 ? cut[r - 1] : int64_t(0));
    while (last != nullptr && u > 0 && u < u_n && last[u - 1] != u - 1) ++u;  // to the next tree's start
    cut[r] = u;
  }
  zmat::parallel_for(n_runs, threads, [&](int64_t r) { f(cut[r], cut[r + 1]); }, false);
}

struct Pieces {  // per piece: head size, first piece atom, rank of the hanging atom
  const int64_t *head, *start, *prev_rank;
  // per piece atom: dfs order, parent (rank * 4 + code), link delta, 8 flag bytes
  const int64_t *seq, *parent_where, *link;
  const uint8_t* flags;
};

struct Out {
  int64_t n, k;  // positions, gather rows (3 or 4)
  int64_t* ints;  // (k + 2, n)
  uint8_t* flags;  // (k + 2, n)
};

// Positions p .. p + len of unit u's run starting at piece atom `first`; K:
// the gather rows (3 or 4), a template argument so that the loop has no
// branch. The rows are restrict pointers: no input is reloaded after each
// store (5-10% of the stamp; the rest is mostly the ~7 MB of stores).
template <int64_t K>
void run(const Pieces& P, const Out& o, int64_t u, int64_t atom_off, int64_t first, int64_t len, int64_t p,
         const int64_t* base) {
  const int64_t n = o.n;
  int64_t* __restrict ints = o.ints + p;
  uint8_t* __restrict fl = o.flags + p;
  const int64_t* __restrict seq = P.seq + first;
  const int64_t* __restrict where = P.parent_where;
  const int64_t* __restrict link = P.link;
  const uint8_t* __restrict flags = P.flags;
  const int64_t* __restrict b = base + 4 * u;
  for (int64_t i = 0; i < len; ++i) {
    const int64_t pa = seq[i], a = atom_off + pa, w = where[pa];
    const uint8_t* f = flags + 8 * pa;
    ints[(K + 1) * n + i] = a;  // order
    ints[K * n + i] = b[w & 3] + (w >> 2);  // parent
    for (int64_t c = 0; c < 3; ++c) ints[c * n + i] = 3 * a + c;
    for (int64_t r = 0; r < 3; ++r) fl[r * n + i] = f[r];
    if (K == 4) {
      ints[3 * n + i] = 3 * std::min(a + link[pa], n - 1) + 2;
      fl[3 * n + i] = f[3];
    }
    fl[K * n + i] = f[4];
    fl[(K + 1) * n + i] = f[5];
  }
}

// run<3> or run<4>, as o.k says.
void run(const Pieces& P, const Out& o, int64_t u, int64_t atom_off, int64_t first, int64_t len, int64_t p,
         const int64_t* base) {
  (o.k == 4 ? run<4> : run<3>)(P, o, u, atom_off, first, len, p, base);
}

}  // namespace

// Units: piece, size, atom0 (first atom), last (last unit of its tree), u_n of
// them; writes ints and flags of zmat._kernel.KernelPlan on up to `threads`.
extern "C" void zmat_stamp_plan(int64_t u_n, const int64_t* piece, const int64_t* size, const int64_t* atom0,
                                const int64_t* last, const int64_t* head, const int64_t* start,
                                const int64_t* prev_rank, const int64_t* seq, const int64_t* parent_where,
                                const int64_t* link, const uint8_t* flags, int64_t n, int64_t k,
                                int64_t threads, int64_t* ints, uint8_t* flags_out) {
  const Pieces P{head, start, prev_rank, seq, parent_where, link, flags};
  const Out o{n, k, ints, flags_out};
  // per unit, where its atoms' parents are: its head, its tail, the previous
  // unit's hanging atom, none (-1)
  std::vector<int64_t> base(4 * u_n);  // a unit's entries: written and read in its tree only
  runs_of_trees(u_n, last, threads, [&](int64_t r0, int64_t r1) {
    for (int64_t t0 = r0; t0 < r1; t0 = last[t0] + 1) {
      int64_t p = atom0[t0];
      const int64_t t1 = last[t0];
      for (int64_t u = t0; u <= t1; ++u) {
        const int64_t q = piece[u];
        base[4 * u] = p;
        base[4 * u + 2] = u > t0 ? base[4 * (u - 1)] + prev_rank[piece[u - 1]] : -1;
        base[4 * u + 3] = -1;
        run(P, o, u, atom0[u] - start[q], start[q], head[q], p, base.data());
        p += head[q];
      }
      for (int64_t u = t1; u >= t0; --u) {
        const int64_t q = piece[u];
        base[4 * u + 1] = p;
        run(P, o, u, atom0[u] - start[q], start[q] + head[q], size[u] - head[q], p, base.data());
        p += size[u] - head[q];
      }
    }
  });
}

// The per-atom arrays the protein fill reads, stamped in one pass: for atom
// a = atom0[u] + i of unit u (piece atom pa = start[piece[u]] + i), ideal[a]
// = p_ideal[pa] (3 doubles) and its torsion slot max(pad7[u] + code[pa], -1)
// (code: far below -1 for an atom without a torsion); units on up to `threads`.
extern "C" void zmat_stamp_atoms(int64_t u_n, const int64_t* piece, const int64_t* size, const int64_t* atom0,
                                 const int64_t* pad7, const int64_t* start, const double* p_ideal,
                                 const int64_t* code, int64_t threads, double* ideal, int64_t* slot) {
  runs_of_trees(u_n, nullptr, threads, [&](int64_t r0, int64_t r1) {
    for (int64_t u = r0; u < r1; ++u) {
      const int64_t a0 = atom0[u], p0 = start[piece[u]], m = size[u];
      std::memcpy(ideal + 3 * a0, p_ideal + 3 * p0, sizeof(double) * 3 * m);
      for (int64_t i = 0; i < m; ++i) slot[a0 + i] = std::max(pad7[u] + code[p0 + i], int64_t(-1));
    }
  });
}
