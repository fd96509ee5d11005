// Sequential placement of a rigid forest and its Abe-Go backward (see
// zmat/_analytic.py for the math and zmat/_kernel.py for the plan arrays).
// One pass over the atoms in depth-first order per structure, single-threaded:
// for batch-1 calls the per-op dispatch floor of eager PyTorch dominates, and
// a loop that never enters a parallel region is unaffected by a busy core.
#include <torch/extension.h>

#include <cmath>
#include <limits>
#include <optional>
#include <vector>

namespace {

// Frames are row-major 3x4 [R | x]: f[4 * i + k] is component i of column k
// (columns 0..2 the axes, 3 the origin). Sequential products accumulate
// rounding along the depth (a 10k-atom chain), so they are kept in double
// whatever the input's dtype; only the stored frames are rounded.
using A = double;

template <typename T>
void place_one(const T* c, int64_t sc, int64_t n, int64_t k_rows, const int64_t* gather,
               const uint8_t* keep, const uint8_t* trig, const int64_t* parent, A* f) {
  for (int64_t j = 0; j < n; ++j) {
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
    A* out = f + 12 * j;
    const int64_t p = parent[j];
    if (p < 0) {
      for (int q = 0; q < 12; ++q) out[q] = L[q];
      continue;
    }
    const A* a = f + 12 * p;
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

}  // namespace

// c: (B, 3N) flat internal coordinates (any strides); gather (K, N) int64,
// keep (K, N) uint8, trig (2, N) uint8, parent (N,) int64 (-1: none), all in dfs
// order. Returns frames (B, N, 3, 4) in dfs order and, if `order` (N,) is given
// (atom index of every dfs position), positions (B, N, 3) in atom order.
std::vector<at::Tensor> forward(const at::Tensor& c, const at::Tensor& gather, const at::Tensor& keep,
                                const at::Tensor& trig, const at::Tensor& parent,
                                const std::optional<at::Tensor>& order) {
  TORCH_CHECK(c.dim() == 2 && c.device().is_cpu(), "c must be a 2-D CPU tensor");
  const int64_t b = c.size(0), n = parent.size(0), k_rows = gather.size(0);
  auto frames = at::empty({b, n, 3, 4}, c.options());
  at::Tensor xyz;
  if (order) xyz = at::empty({b, n, 3}, c.options());
  static thread_local std::vector<A> kept;
  std::vector<A> local;
  A* work = scratch(kept, local, 12 * n);
  AT_DISPATCH_FLOATING_TYPES(c.scalar_type(), "zmat_forward", [&] {
    const scalar_t* cp = c.data_ptr<scalar_t>();
    for (int64_t s = 0; s < b; ++s) {
      place_one<scalar_t>(cp + s * c.stride(0), c.stride(1), n, k_rows, gather.data_ptr<int64_t>(),
                          keep.data_ptr<uint8_t>(), trig.data_ptr<uint8_t>(), parent.data_ptr<int64_t>(),
                          work);
      scalar_t* f = frames.data_ptr<scalar_t>() + s * n * 12;
      for (int64_t q = 0; q < 12 * n; ++q) f[q] = static_cast<scalar_t>(work[q]);
      if (order) {
        const int64_t* o = order->data_ptr<int64_t>();
        scalar_t* x = xyz.data_ptr<scalar_t>() + s * n * 3;
        for (int64_t j = 0; j < n; ++j)
          for (int i = 0; i < 3; ++i) x[3 * o[j] + i] = static_cast<scalar_t>(work[12 * j + 4 * i + 3]);
      }
    }
  });
  if (order) return {frames, xyz};
  return {frames};
}

// Abe-Go backward: subtree sums of the position gradients and of the moments
// in reverse dfs order, then d r, d theta, d phi_eff per atom, scattered to the
// flat internal coordinates through the forward's gather. rot (B, N, 3, 3)
// ([b, j, i, k]: component i of axis k), pos (B, N, 3), g_rot like rot, g_pos
// (B, M, 3) whose row rows[j] (or j) belongs to dfs position j; any strides.
// Returns the gradient of c, (B, n3).
at::Tensor backward(const at::Tensor& rot, const at::Tensor& pos, const std::optional<at::Tensor>& g_rot,
                    const std::optional<at::Tensor>& g_pos, const std::optional<at::Tensor>& rows,
                    const at::Tensor& gather, const at::Tensor& keep, const at::Tensor& parent, int64_t n3) {
  const int64_t b = rot.size(0), n = parent.size(0), k_rows = gather.size(0);
  // zeroed here, not by at::zeros: its fill is parallel on large tensors, and a
  // parallel region waits for a busy core
  auto grad = at::empty({b, n3}, rot.options());
  AT_DISPATCH_FLOATING_TYPES(rot.scalar_type(), "zmat_backward", [&] {
    using T = scalar_t;
    auto R = rot.accessor<T, 4>();
    auto X = pos.accessor<T, 3>();
    static thread_local std::vector<A> kept;
    std::vector<A> local;
    A* s = scratch(kept, local, 6 * n);  // per dfs position: S2 (3), S1 (3), summed in double
    const int64_t* g = gather.data_ptr<int64_t>();
    const uint8_t* kp = keep.data_ptr<uint8_t>();
    const int64_t* par = parent.data_ptr<int64_t>();
    const int64_t* row = rows ? rows->data_ptr<int64_t>() : nullptr;
    // optional gradients as raw pointers and strides (an accessor per atom costs more than the math)
    const T* gpp = g_pos ? g_pos->data_ptr<T>() : nullptr;
    const T* grp = g_rot ? g_rot->data_ptr<T>() : nullptr;
    const auto gps = g_pos ? g_pos->strides() : at::IntArrayRef();
    const auto grs = g_rot ? g_rot->strides() : at::IntArrayRef();
    for (int64_t t = 0; t < b; ++t) {
      auto r = R[t];
      auto x = X[t];
      std::fill(s, s + 6 * n, A(0));
      for (int64_t j = n - 1; j >= 0; --j) {  // children come later in dfs order
        A gp[3] = {0, 0, 0};
        if (gpp) {
          const T* gx = gpp + t * gps[0] + (row ? row[j] : j) * gps[1];
          for (int i = 0; i < 3; ++i) gp[i] = gx[i * gps[2]];
        }
        // moment x_j x g_j, plus the torque sum_k R[:, k] x G[:, k]
        A m[3] = {x[j][1] * gp[2] - x[j][2] * gp[1], x[j][2] * gp[0] - x[j][0] * gp[2],
                  x[j][0] * gp[1] - x[j][1] * gp[0]};
        if (grp) {
          const T* G = grp + t * grs[0] + j * grs[1];  // G[i * grs[2] + k * grs[3]]: component i of axis k
          auto A = r[j];
          for (int k = 0; k < 3; ++k) {
            const T g0 = G[k * grs[3]], g1 = G[grs[2] + k * grs[3]], g2 = G[2 * grs[2] + k * grs[3]];
            m[0] += A[1][k] * g2 - A[2][k] * g1;
            m[1] += A[2][k] * g0 - A[0][k] * g2;
            m[2] += A[0][k] * g1 - A[1][k] * g0;
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
      T* out = grad.data_ptr<T>() + t * n3;
      std::fill(out, out + n3, T(0));
      for (int64_t j = 0; j < n; ++j) {
        const A* s2 = s + 6 * j;
        const A* s1 = s2 + 3;
        A xp[3] = {0, 0, 0}, up[3] = {1, 0, 0};  // anchor origin and first axis
        const int64_t p = par[j];
        if (p >= 0) {
          for (int i = 0; i < 3; ++i) {
            xp[i] = x[p][i];
            up[i] = r[p][i][0];
          }
        }
        const A tq[3] = {s1[0] - (xp[1] * s2[2] - xp[2] * s2[1]), s1[1] - (xp[2] * s2[0] - xp[0] * s2[2]),
                         s1[2] - (xp[0] * s2[1] - xp[1] * s2[0])};
        A d[3] = {0, 0, 0};
        for (int i = 0; i < 3; ++i) {
          d[0] += r[j][i][0] * s2[i];
          d[1] -= r[j][i][2] * tq[i];
          d[2] += up[i] * tq[i];
        }
        for (int64_t k = 0; k < k_rows; ++k) {
          if (kp[k * n + j]) out[g[k * n + j]] += static_cast<T>(d[k < 2 ? k : 2]);
        }
      }
    }
  });
  return grad;
}

// ------------------------------------------------------------------ protein fill
// Torsions -> internal coordinates of a protein layout, the semantics of
// fill_internal (zmat/protein/build.py) without `base`: r and theta are the
// ideal values, phi the torsion of the atom's slot (its default where the
// torsion is NaN) or the ideal value; NaN ideal values read 0 (nan_to_num).
// In torch these are ~30 elementwise ops, each a parallel region on a batch.

namespace {

template <typename T>
T finite(double v) {  // torch.nan_to_num of v cast to T
  const T x = static_cast<T>(v);
  if (std::isnan(x)) return T(0);
  if (std::isinf(x)) return x > 0 ? std::numeric_limits<T>::max() : std::numeric_limits<T>::lowest();
  return x;
}

}  // namespace

// t (S, L, 7) torsions (any strides); ideal (N, 3) float64 contiguous; slot
// (N,) int64, k * 7 + c or -1; defaults (7,) float64. Returns (S, N, 3) in t's dtype.
at::Tensor fill_forward(const at::Tensor& t, const at::Tensor& ideal, const at::Tensor& slot,
                        const at::Tensor& defaults) {
  TORCH_CHECK(t.dim() == 3 && t.size(2) == 7 && t.device().is_cpu(), "t must be a (S, L, 7) CPU tensor");
  const int64_t s_n = t.size(0), n = slot.size(0);
  auto out = at::empty({s_n, n, 3}, t.options());
  AT_DISPATCH_FLOATING_TYPES(t.scalar_type(), "zmat_fill_forward", [&] {
    using T = scalar_t;
    const T* tp = t.data_ptr<T>();
    const int64_t s0 = t.stride(0), s1 = t.stride(1), s2 = t.stride(2);
    const double* id = ideal.data_ptr<double>();
    const int64_t* sl = slot.data_ptr<int64_t>();
    const double* df = defaults.data_ptr<double>();
    T* o = out.data_ptr<T>();
    for (int64_t s = 0; s < s_n; ++s) {
      const T* ts = tp + s * s0;
      for (int64_t j = 0; j < n; ++j, o += 3) {
        for (int c = 0; c < 3; ++c) o[c] = finite<T>(id[3 * j + c]);
        const int64_t k = sl[j];
        if (k < 0) continue;
        const T x = ts[(k / 7) * s1 + (k % 7) * s2];
        o[2] = std::isnan(x) ? static_cast<T>(df[k % 7]) : x;
      }
    }
  });
  return out;
}

// The gradient of fill_forward: g (S, N, 3) (any strides) -> (S, L, 7), the
// phi column of every atom with a slot added to its torsion unless the torsion
// is NaN (t: the forward's input).
at::Tensor fill_backward(const at::Tensor& g, const at::Tensor& t, const at::Tensor& slot) {
  const int64_t s_n = t.size(0), l = t.size(1), n = slot.size(0);
  auto grad = at::empty({s_n, l, 7}, g.options());  // zeroed below: at::zeros' fill is parallel
  AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "zmat_fill_backward", [&] {
    using T = scalar_t;
    const T* gp = g.data_ptr<T>();
    const T* tp = t.data_ptr<T>();
    const int64_t g0 = g.stride(0), g1 = g.stride(1), g2 = g.stride(2);
    const int64_t s0 = t.stride(0), s1 = t.stride(1), s2 = t.stride(2);
    const int64_t* sl = slot.data_ptr<int64_t>();
    T* out = grad.data_ptr<T>();
    std::fill(out, out + s_n * l * 7, T(0));
    for (int64_t s = 0; s < s_n; ++s) {
      T* os = out + s * l * 7;
      for (int64_t j = 0; j < n; ++j) {
        const int64_t k = sl[j];
        if (k < 0 || std::isnan(tp[s * s0 + (k / 7) * s1 + (k % 7) * s2])) continue;
        os[k] += gp[s * g0 + j * g1 + 2 * g2];
      }
    }
  });
  return grad;
}
