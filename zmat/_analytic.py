"""Log-depth forward and O(1)-depth analytic backward.

Forward. In every segment (see ``zmat/table.py``) an atom's frame relative to
the segment's anchor is the product of local transforms along its path of
rigid parents. All of those products are computed at once by a blocked scan
(:func:`compose_paths`): 16 levels at a time over the whole forest, then
pointer jumping over the block heads (``F_i <- F_anc(i) . F_i``,
``anc(i) <- anc(anc(i))``, ``log2(depth / 16)`` rounds), then one composition
per atom: O(N) work in O(16 + log depth) steps, each a gather and a few
elementwise kernels over component-major frames. Segments whose anchor
depends on positions (rows that could not be rewritten as proper or offset
rows) are then placed level by level of segments, with ordinary autograd ops.

Backward (Abe and Go's recursive method, as in tmol). A change of ``r_i``
translates ``i``'s subtree along its bond; a change of ``theta_i`` or
``phi_i`` rotates it about an axis through its bond reference. So, with
``g_k`` the gradient on position ``k`` and ``tau_k`` the torque of the
gradient on frame ``k``, only subtree sums are needed::

    S2_i = sum_k g_k                    S1_i = sum_k (x_k x g_k + tau_k)
    dL/dr_i     =  e1_i . S2_i
    dL/dtheta_i = -e3_i . (S1_i - x_p x S2_i)
    dL/dphi_i   =  u_p  . (S1_i - x_p x S2_i)

(``e1_i``, ``e3_i``: axes of ``i``'s frame, ``x_p``, ``u_p``: origin and first
axis of its anchor). In depth-first preorder every subtree is a contiguous
range, so all subtree sums are one ``cumsum`` and a difference: the backward is
a handful of elementwise kernels whatever the depth, and saves only the output
frames (O(N)). It is written in differentiable torch ops on the saved outputs,
so it is itself differentiable (double backward), and forward mode (``jvp``)
uses the transpose: path sums from the root instead of subtree sums.
"""

from __future__ import annotations

import math
import weakref

import numpy as np
import torch

from . import _kernel, _segments
from ._geometry import LOCAL_FACTORS, compose, compose_components, identity_frame, segment_anchor
from ._stages import Staging
from .table import BOND, PLANAR, ROOT, ConstructionTable, index_tensor

#: Calls on one structure of up to this many atoms, or on up to
#: ``JUMP_FRAMES_BATCHED`` frames (atoms x structures), scan by pointer jumping
#: (:class:`_JumpPlan`: few dispatched ops, the latency of small calls);
#: larger ones by the level-by-level blocked scan (:class:`_BlockPlan`: less
#: work, more but larger kernels; gathers of short rows of a small batch are slow).
JUMP_FRAMES = 1 << 16
JUMP_FRAMES_BATCHED = 1 << 13
#: Levels per block of that scan: ``log2(JUMP_BLOCK)`` rounds over every atom,
#: the rest over one atom in ``JUMP_BLOCK`` at most.
JUMP_BLOCK = 16


class _ForestPlan:
    """Index tensors for one table on one device (not a tensor, so ``vmap``
    and ``torch.compile`` see it as a constant).

    Everything an atom's local transform needs is planned here, so a call
    builds all of them with one gather and a few elementwise kernels: the
    flat index of its ``(r, theta, phi, phi of its offset chain...)`` entries
    of ``C`` in depth-first order, which of them the table ignores (missing
    references: their constants, hence zero gradients), and one extra slot
    ``N`` holding a ROOT atom (every valid table has one), whose local
    transform is the identity: the "no parent" target of the scans.
    """

    def __init__(self, table: ConstructionTable, device: torch.device) -> None:
        n = table.n_atoms
        self.n = n
        # The scans' own plans are kept here (``table_plan``); the table only
        # weakly: a table -> plan -> table cycle would keep every fresh batch's
        # arrays alive until the cyclic garbage collector runs.
        self._table = weakref.ref(table)
        self.sub: dict = {}
        self.max_depth = table.max_depth
        dfs = table.dfs_order
        self.dfs_order = index_tensor(dfs, device)
        identity = bool(np.array_equal(dfs, np.arange(n)))
        self.to_dfs = None if identity else self.dfs_order  # atom order -> dfs order
        self.to_atoms = None if identity else index_tensor(table.dfs_pos, device)
        parent = np.where(table.dfs_parent >= 0, table.dfs_parent, n)  # n = identity slot
        self.parent = index_tensor(parent, device)
        self.end = index_tensor(table.subtree_end, device)

        # Gather of C's entries (+ the identity slot: a ROOT atom keeps none)
        root = np.argmax(table.kind == ROOT)
        slots = np.append(dfs, root)
        gather, keep = entries(table, slots)
        keep[:, n] = False
        kind = np.take(table.kind, slots)
        self.k = len(gather)
        self.gather = index_tensor(gather.reshape(-1), device)  # (K * (N + 1),)
        self.keep = torch.as_tensor(keep[..., None], device=device)  # (K, N + 1, 1)
        # copies in numpy: torch's strided int64 copy is many times slower on the CPU
        self.grad_index = index_tensor(np.ascontiguousarray(gather[:, :n]).reshape(-1), device)
        self.grad_keep = torch.as_tensor(np.ascontiguousarray(keep[:, :n, None]), device=device)
        self.zero = torch.zeros((1, 1, 1), dtype=torch.int8, device=device)
        # (0, 0, 0, 1) for compose_components: int8 multiplies with any float dtype
        self.e4 = torch.tensor([0, 0, 0, 1], dtype=torch.int8, device=device).view(1, 4, 1, 1)
        self.grad_rows = index_tensor([0, 1] + [2] * (self.k - 2), device)
        # Rows T = (r, 1, 0, cos t, cos p, sin t, sin p): constants where a
        # reference is missing (theta = pi, phi = 0 make L the identity rotation).
        # (kind[n] is ROOT: the identity slot keeps none)
        trig_keep = np.zeros((7, n + 1, 1), bool)
        trig_keep[0, :, 0] = keep[0]  # kind != ROOT
        trig_keep[3::2, :, 0] = keep[1]  # kind > BOND
        trig_keep[4::2, :, 0] = kind > PLANAR
        trig_const = np.array([0, 1, 0, -1, 1, 0, 0], np.int8)[:, None]  # per row, broadcast over atoms
        self.trig_keep = torch.as_tensor(trig_keep, device=device)
        self.trig_const = torch.as_tensor(trig_const[..., None], device=device)
        self.factors = index_tensor(np.array(LOCAL_FACTORS).T.reshape(-1), device)  # (36,)

        # Stages of segments whose anchors depend on positions.
        self.constant_anchors = table.constant_anchors
        if not self.constant_anchors:
            seg = table.dfs_segment
            stage_pos = [np.sort(table.dfs_pos[a]) for a in table.stage_atoms]
            staging = Staging([table.dfs_order[p] for p in stage_pos], n)
            self.stages = []
            for s, pos in enumerate(stage_pos):
                roots = np.unique(seg[pos])  # dfs positions of the segment roots
                local = np.searchsorted(roots, seg[pos])
                atoms = table.dfs_order[roots]
                refs = np.where(table.refs[atoms] >= 0, table.refs[atoms], n).reshape(-1)
                self.stages.append(
                    (
                        index_tensor(pos, device),
                        index_tensor(local, device),
                        index_tensor(table.kind[atoms], device),
                        index_tensor(table.dihedral_plane[atoms], device),
                        None if s == 0 else Staging.to_device(staging.gather_plan(refs), device),
                        len(atoms),
                    )
                )
            self.final = staging.final_index(device)


def entries(table: ConstructionTable, slots: np.ndarray, gather=None, keep=None):
    """Where the local transforms of atoms ``slots`` read ``C``: ``gather``
    ``(K, M)``, the flat index into ``C`` of each one's ``(r, theta, phi, phi
    of its offset chain...)`` entries, and ``keep`` ``(K, M)``, which of them
    the table uses (missing references: constants, hence zero gradients).
    Each array is written once, in place (into ``gather`` and ``keep`` if
    given): this runs on every fresh batch, where a new large array costs
    page faults more than arithmetic."""
    n = table.n_atoms
    chain = np.take(table.offset_chain, slots, 0).T  # (L, M), n = none
    if gather is None:
        gather = np.empty((2 + len(chain), len(slots)), np.int64)
        keep = np.empty(gather.shape, bool)
    np.multiply(slots, 3, out=gather[0])
    np.add(gather[0], 1, out=gather[1])
    np.minimum(chain, n - 1, out=gather[2:])
    gather[2:] *= 3
    gather[2:] += 2
    kind = np.take(table.kind, slots)
    link_kind = np.take(np.append(table.kind, ROOT), chain)  # a PLANAR link's phi is ignored too
    np.not_equal(kind, ROOT, out=keep[0])
    np.greater(kind, BOND, out=keep[1])
    np.greater(link_kind, PLANAR, out=keep[2:])
    return gather, keep


class _JumpPlan:
    """Pointer jumping in two passes over ``N + 1`` slots (slot ``N``, the
    identity, is its own ancestor). Depth is cut into blocks of ``JUMP_BLOCK``
    levels; (1) within blocks, round ``k`` composes every frame with the one
    ``2**k`` levels up (stopping at the block's head): the product from the
    head down to every atom; (2) the same over the block heads, each composed
    with its parent's block product: the prefix above every block; then one
    composition per atom. ``log2(depth) + 1`` rounds of one gather and one
    composition each, O(N log JUMP_BLOCK) work."""

    def __init__(self, table: ConstructionTable, device: torch.device) -> None:
        n, depth, parent = table.n_atoms, table.dfs_depth, table.dfs_parent
        block = JUMP_BLOCK
        level = depth % block
        at_head = level == 0  # segment roots are at depth 0, so at a head
        anc = np.empty(n + 1, np.int64)
        anc[n] = n
        np.copyto(anc[:n], np.where(at_head, n, parent))
        self.inside = []
        for _ in range(math.ceil(math.log2(min(block, table.max_depth + 1)))):
            self.inside.append(index_tensor(anc, device))
            anc = np.take(anc, anc)
        self.blocked = table.max_depth >= block
        if not self.blocked:
            return
        flat, counts, head, _ = _levels(parent, level)  # head: block head (dfs position) of every atom
        heads = flat[: counts[0]]  # in dfs order
        rank = np.cumsum(at_head) - 1  # of each block head among heads
        h_parent = parent[heads]  # -1 for segment roots
        self.head_source = index_tensor(np.append(np.where(h_parent >= 0, h_parent, n), n), device)
        up = np.where(h_parent >= 0, rank[head[np.maximum(h_parent, 0)]], len(heads))
        anc = np.append(up, len(heads))
        self.over = []
        for _ in range(math.ceil(math.log2(table.max_depth // block + 1))):
            self.over.append(index_tensor(anc, device))
            anc = np.take(anc, anc)
        self.head_of = index_tensor(rank[head], device)


class _BlockPlan:
    """Blocked scan (see :func:`compose_paths`): depth is cut into blocks of
    ``block`` levels; within a block, frames are composed level by level
    over the whole forest at once, across blocks by pointer jumping."""

    def __init__(self, table: ConstructionTable, device: torch.device) -> None:
        n = table.n_atoms
        depth = table.dfs_depth
        block = _block_size(table.max_depth)
        flat, counts, head, parents = _levels(table.dfs_parent, depth % block)
        starts = _segments.starts(counts)
        inv = np.empty(n, np.int64)
        inv[flat] = np.arange(n)
        self.steps = [(int(counts[0]), None)]
        for k, parent in enumerate(parents, 1):  # a level's parents are the previous level's atoms
            self.steps.append((int(counts[k]), index_tensor(inv[parent] - starts[k - 1], device)))
        self.step_order = index_tensor(flat, device)
        self.step_inverse = index_tensor(inv, device)
        heads = flat[: counts[0]]  # block heads; inv[h] is the index of head h among them
        self.blocked = table.max_depth >= block
        if self.blocked:
            head_parent = table.dfs_parent[heads]  # -1 for segment roots
            self.head_source = index_tensor(np.where(head_parent >= 0, head_parent, n), device)
            up = np.where(head_parent >= 0, inv[head[np.maximum(head_parent, 0)]], len(heads))
            rounds = math.ceil(math.log2(table.max_depth // block + 1))
            anc = np.append(up, len(heads))
            self.jumps = []
            for _ in range(rounds):
                self.jumps.append(index_tensor(anc, device))
                anc = np.take(anc, anc)
            self.head_of = index_tensor(inv[head], device)


def forest_plan(table: ConstructionTable, device: torch.device) -> _ForestPlan:
    return table.cached(_ForestPlan, device)


def _small(m: int, b: int) -> bool:
    """Whether a call on ``b`` structures of ``m - 1`` atoms takes the paths for small calls.

    A symbolic batch size (``torch.export`` with a dynamic batch dimension)
    takes the general path, so the exported program serves every batch size
    without a guard on it."""
    if not isinstance(b, int):
        return False
    return m * b <= (JUMP_FRAMES if b == 1 else JUMP_FRAMES_BATCHED)


def prepare(table: ConstructionTable, device: torch.device | str, batch: int = 1) -> None:
    """Build (and cache on ``table``) every plan a call on ``batch`` structures
    on ``device`` will use, ahead of the call (the first call builds them
    otherwise): the compiled kernel's where it serves the call, else the torch
    path's. Run it where its host time is hidden, e.g. in the loop that
    prefetches the next batch."""
    device = torch.device(device)
    if _kernel.serves(device):
        table.cached(_kernel_plan, device)
        if not table.constant_anchors:  # its stages are placed by the torch path
            forest_plan(table, device)
        return
    plan = forest_plan(table, device)
    table_plan(plan, _JumpPlan if _small(table.n_atoms + 1, batch) else _BlockPlan, device)


# ------------------------------------------------------------------ helpers
def _levels(parent: np.ndarray, level: np.ndarray):
    """Nodes of a forest (``parent`` pointers, parents before children) grouped
    by ``level`` (depth within a block, < 256, 0 at block heads): ``(flat,
    counts, head)``, ``flat`` the nodes by level (index order within one),
    ``counts`` per level, ``head`` the block head of every node (its ancestor
    at level 0), ``parents`` per level from 1 on, its nodes' parents. A radix
    sort and one gather per level: no search."""
    level = level.astype(np.uint8)  # numpy's stable sort of 8-bit keys is a radix sort
    flat = np.argsort(level, kind="stable")
    counts = np.bincount(level)
    head = np.empty(len(parent), np.int64)
    head[flat[: counts[0]]] = flat[: counts[0]]
    start, parents = counts[0], []
    for c in counts[1:].tolist():  # a level's parents are on the level above
        nodes = flat[start : start + c]
        parents.append(parent[nodes])
        head[nodes] = head[parents[-1]]
        start += c
    return flat, counts, head, parents


def _block_size(max_depth: int) -> int:
    # Levels composed one at a time inside a block; the rest is pointer
    # jumping over block heads. Each level step is a small kernel, each jump
    # round too, so a handful of levels per block keeps both counts low.
    return max(1, min(16, max_depth + 1))


def _take(f: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``f.index_select(2, index)`` for component-major frames ``(3, 4, M, B)``,
    through a ``(12, M, B)`` view (``(12, M)`` when ``B = 1``): index_select is
    several times faster gathering along the last or middle axis of a 2-D or
    3-D tensor than along the third axis of the 4-D original."""
    m, b = f.shape[2], f.shape[3]
    flat = f.reshape(12, m) if b == 1 else f.reshape(12, m, b)
    return flat.index_select(1, index).view(3, 4, index.shape[0], b)


def _jump(f: torch.Tensor, jumps: list, e4: torch.Tensor) -> torch.Tensor:
    """Inclusive prefix products along ancestor pointers (pointer jumping);
    ``f`` is component-major ``(3, 4, M, ...)``."""
    f = torch.cat([f, _identity_components(f)], 2)
    for anc in jumps:
        f = compose_components(_take(f, anc), f, e4)
    return f[:, :, :-1]


def _identity_components(f: torch.Tensor) -> torch.Tensor:
    """One identity frame, ``(3, 4, 1, ...)``, to append along the atom axis."""
    eye = torch.eye(3, 4, dtype=f.dtype, device=f.device)
    return eye.view(3, 4, *([1] * (f.ndim - 2))).expand(3, 4, 1, *f.shape[3:])


def _flat(c: torch.Tensor) -> torch.Tensor:
    """``(..., N, 3)`` -> ``(3 N, B)``, the batch dims flattened last."""
    return c.reshape(-1, c.shape[-2] * 3).t()


def _effective(flat: torch.Tensor, plan: _ForestPlan, index, keep) -> torch.Tensor:
    """Rows ``(r, theta, phi_eff)`` ``(3, M, B)`` gathered from flat ``C``
    (``keep``: the planned columns; the others 0; phi summed along offset chains)."""
    # sizes spelled out: an empty batch has no -1 to infer
    g = flat.index_select(0, index).view(plan.k, index.shape[0] // plan.k, flat.shape[1])
    g = torch.where(keep, g, plan.zero)
    if plan.k > 3:
        head, chain = g.split([2, plan.k - 2])
        g = torch.cat([head, chain.sum(0, keepdim=True)])
    return g


def local_frames(flat: torch.Tensor, plan: _ForestPlan, small: bool = True) -> torch.Tensor:
    """Local transforms ``(3, 4, N + 1, B)`` (component-major, dfs order, the
    identity in slot ``N``) from flat internal coordinates ``(3 N, B)``.

    ``small``: every entry as a product of three gathered factors
    (``LOCAL_FACTORS``: few dispatched ops); else the entries one by one (a
    third of the memory traffic, for calls bound by it)."""
    r, angles = _effective(flat, plan, plan.gather, plan.keep).split([1, 2])
    t = torch.cat([r, r, r, torch.cos(angles), torch.sin(angles)])  # rows 1, 2: constants 1, 0
    t = torch.where(plan.trig_keep, t, plan.trig_const)
    if small:
        f0, f1, f2 = torch.cat([t, -t]).index_select(0, plan.factors).view(3, 12, *t.shape[1:]).unbind(0)
        return (f0 * f1 * f2).view(3, 4, *t.shape[1:])
    r, _, zero, ct, cp, st, sp = t.split(1)
    cs = t[4::2]  # (cos p, sin p)
    e1 = torch.cat([-ct, st * cs])
    e2 = -torch.cat([st, ct * cs])
    e3 = torch.cat([zero, -sp, cp])
    return torch.stack([e1, e2, e3, r * e1], 1)


def _local(flat: torch.Tensor, plan: _ForestPlan) -> torch.Tensor:
    return local_frames(flat, plan, _small(plan.n + 1, flat.shape[1]))


def compose_paths(local: torch.Tensor, plan: _ForestPlan) -> torch.Tensor:
    """Products of local transforms along root paths.

    Args:
        local: ``(3, 4, N + 1, B)`` local transforms from :func:`local_frames`.

    Returns:
        ``(3, 4, N, B)`` frames, component-major (atoms, then batch, last:
        gathers along the atom axis then copy contiguous rows), in dfs order.

    Small calls (see ``JUMP_FRAMES``) jump pointers (:class:`_JumpPlan`):
    ``log2(depth) + 1`` rounds of one gather and one composition. Larger
    ones take the blocked scan, three passes of O(N) work each: (1) within
    blocks of ``block`` levels, the product from the block's head down to
    every atom, one level at a time over the whole forest; (2) pointer
    jumping over the block heads (``log2(depth / block)`` rounds on N / block
    frames); (3) one composition per atom with its head's prefix.
    """
    n, e4 = plan.n, plan.e4
    if _small(local.shape[2], local.shape[3]):
        jump = table_plan(plan, _JumpPlan, local.device)
        for anc in jump.inside:
            local = compose_components(_take(local, anc), local, e4)
        if not jump.blocked:
            return local.narrow(2, 0, n)
        prefix = _take(local, jump.head_source)
        for anc in jump.over:
            prefix = compose_components(_take(prefix, anc), prefix, e4)
        return compose_components(_take(prefix, jump.head_of), local.narrow(2, 0, n), e4)
    block = table_plan(plan, _BlockPlan, local.device)
    local = _take(local, block.step_order)
    parts = []
    start = 0
    for size, parent in block.steps:
        step = local.narrow(2, start, size)
        start += size
        if parent is not None:
            step = compose_components(_take(parts[-1], parent), step, e4)
        parts.append(step)
    inside = parts[0] if len(parts) == 1 else torch.cat(parts, 2)
    inside = _take(inside, block.step_inverse)
    if not block.blocked:
        return inside
    head_frames = _take(torch.cat([inside, _identity_components(inside)], 2), block.head_source)
    prefix = _jump(head_frames, block.jumps, e4)
    return compose_components(_take(prefix, block.head_of), inside, e4)


def table_plan(plan: _ForestPlan, build, device):
    """A further per-device plan of ``plan``'s table (cached on the table,
    and on ``plan`` for the eager path's sake: no weak reference per call)."""
    if torch.compiler.is_compiling():
        return plan._table().cached(build, device)
    sub = plan.sub.get(build)
    if sub is None:
        sub = plan._table().cached(build, device)
        if torch._guards.detect_fake_mode() is None:  # as ConstructionTable.cached
            plan.sub[build] = sub
    return sub


def _split(frames: torch.Tensor):
    """Component-major frames -> rotations ``(3, 3, N, ...)``, positions ``(3, N, ...)``."""
    return frames[:, :3], frames[:, 3]


# The backward and forward-mode rules work on component-major tensors, the
# layout the forward produces: vectors (3, N, B), rotations (3, 3, N, B)
# with rot[:, k] the k-th axis. The atom axis is dim 1 of a vector.


def _subtree_sum(v: torch.Tensor, plan: _ForestPlan) -> torch.Tensor:
    """``sum_{k in subtree(i)} v_k`` for every ``i``; ``v`` is ``(C, N, ...)``."""
    c = torch.cumsum(v, 1)
    c = torch.cat([torch.zeros_like(c[:, :1]), c], 1)
    return c.index_select(1, plan.end) - c[:, :-1]


def _path_sum(v: torch.Tensor, plan: _ForestPlan) -> torch.Tensor:
    """``sum_{j ancestor-or-self of i} v_j`` for every ``i``; ``v`` is ``(C, N, ...)``."""
    padded = torch.cat([v, torch.zeros_like(v[:, :1])], 1)
    leave = torch.zeros_like(padded).index_add(1, plan.end, v)
    return torch.cumsum(padded - leave, 1)[:, :-1]


def _axes(rot: torch.Tensor, pos: torch.Tensor, plan: _ForestPlan):
    """Anchor origin and first axis of every atom (its parent's, or identity)."""
    origin = torch.zeros_like(pos[:, :1])
    ex = axis_column(pos).expand_as(origin)
    xp = torch.cat([pos, origin], 1).index_select(1, plan.parent)
    up = torch.cat([rot[:, 0], ex], 1).index_select(1, plan.parent)
    return xp, up


def axis_column(pos: torch.Tensor) -> torch.Tensor:
    """``(1, 0, 0)`` shaped ``(3, 1, ...)`` like the vectors ``pos``."""
    return torch.eye(3, 1, dtype=pos.dtype, device=pos.device).view(3, *([1] * (pos.ndim - 1)))


def _vjp(rot, pos, g_rot, g_pos, plan: _ForestPlan) -> torch.Tensor:
    """Gradient ``(3 N, B)`` of the flat internal coordinates."""
    if g_pos is None:
        g_pos = torch.zeros_like(pos)
    moment = torch.linalg.cross(pos, g_pos, dim=0)
    if g_rot is not None:  # torque of the frame gradient: sum_k R[:, k] x G[:, k]
        moment = moment + torch.linalg.cross(rot, g_rot, dim=0).sum(1)
    sums = _subtree_sum(torch.cat([g_pos, moment], 0), plan)  # one cumsum for both
    s2, s1 = sums[:3], sums[3:]
    xp, up = _axes(rot, pos, plan)
    torque = s1 - torch.linalg.cross(xp, s2, dim=0)
    d_eff = torch.stack([(rot[:, 0] * s2).sum(0), -(rot[:, 2] * torque).sum(0), (up * torque).sum(0)])
    # the transpose of the gather in _effective: d phi_eff reaches every phi of the chain
    d = torch.where(plan.grad_keep, d_eff.index_select(0, plan.grad_rows), plan.zero)
    flat = d.reshape(plan.grad_index.shape[0], d.shape[-1])  # (an empty batch too)
    return d.new_zeros((3 * plan.n, d.shape[-1])).index_add(0, plan.grad_index, flat)


def _jvp(rot, pos, tangent: torch.Tensor, plan: _ForestPlan):
    """Tangents of the (component-major) frames for a flat tangent ``(3 N, B)``."""
    xp, up = _axes(rot, pos, plan)
    d_r, d_theta, d_phi = _effective(tangent, plan, plan.grad_index, plan.grad_keep)
    v = d_r * rot[:, 0]  # translation of the subtree
    w = -d_theta * rot[:, 2] + d_phi * up  # rotation about x_p
    sums = _path_sum(torch.cat([v - torch.linalg.cross(w, xp, dim=0), w], 0), plan)
    a, w = sums[:3], sums[3:]
    d_pos = a + torch.linalg.cross(w, pos, dim=0)
    d_rot = torch.linalg.cross(w.unsqueeze(1).expand_as(rot), rot, dim=0)
    # the forward's outputs are two views of one tensor: so must the tangents be
    return _split(torch.cat([d_rot, d_pos.unsqueeze(1)], 1))


class _RigidForestFunction(torch.autograd.Function):
    """Flat internal coordinates ``(3 N, B)`` (``C`` as given, see :func:`_flat`)
    -> frames relative to their segment anchors, component-major, dfs order:
    rotations ``(3, 3, N, B)`` and positions ``(3, N, B)``. Missing
    references and offset rows are resolved inside (see :class:`_ForestPlan`).

    Reverse mode only: this is the variant ``torch.compile`` traces (Dynamo
    does not trace Functions that define ``jvp``)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(flat: torch.Tensor, plan: _ForestPlan):
        return _split(compose_paths(_local(flat, plan), plan).contiguous())  # views of one dense tensor

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.plan = inputs[1]
        ctx.save_for_backward(*output)
        ctx.set_materialize_grads(False)  # rotations unused downstream: no torque term

    @staticmethod
    def backward(ctx, g_rot, g_pos):
        rot, pos = ctx.saved_tensors
        return _vjp(rot, pos, g_rot, g_pos, ctx.plan), None


class RigidForest(_RigidForestFunction):
    """:class:`_RigidForestFunction` with forward mode (``jvp``, ``jacfwd``)."""

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        _RigidForestFunction.setup_context(ctx, inputs, output)
        ctx.save_for_forward(*output)

    @staticmethod
    def jvp(ctx, tangent: torch.Tensor, _plan):
        rot, pos = ctx.saved_tensors
        return _jvp(rot, pos, tangent, ctx.plan)


class _Permute(torch.autograd.Function):
    """``x.index_select(dim, perm)`` for a permutation, whose backward is the
    inverse permutation (a gather) instead of ``index_add`` (a scatter)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, dim, perm, inverse):
        return x.index_select(dim, perm)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        _, ctx.dim, ctx.perm, ctx.inverse = inputs

    @staticmethod
    def backward(ctx, grad):
        return _Permute.apply(grad, ctx.dim, ctx.inverse, ctx.perm), None, None, None

    @staticmethod
    def jvp(ctx, tangent, *_):
        return tangent.index_select(ctx.dim, ctx.perm)


def permute(x: torch.Tensor, dim: int, perm, inverse) -> torch.Tensor:
    """Apply a planned permutation (``None``: the identity) along ``dim``."""
    if perm is None:
        return x
    if torch.compiler.is_compiling():
        return x.index_select(dim, perm)
    return _Permute.apply(x, dim, perm, inverse)


def _place(rot: torch.Tensor, pos: torch.Tensor, plan: _ForestPlan, shape) -> torch.Tensor:
    """World positions ``shape = (..., N, 3)`` in atom order from relative
    frames ``(3, 3, N, B)``, ``(3, N, B)``."""
    if plan.constant_anchors:
        # permute while still component-major (a fast gather), then lay out as (..., N, 3)
        return permute(pos, 1, plan.to_atoms, plan.to_dfs).permute(2, 1, 0).reshape(shape)
    frames_dfs = torch.cat([rot, pos.unsqueeze(1)], 1).movedim((0, 1, 2), (-2, -1, -3))
    origin = identity_frame((*frames_dfs.shape[:-3], 1), frames_dfs.dtype, frames_dfs.device)
    outputs: list[torch.Tensor] = []
    for stage_pos, local, kind, plane, gather, n_roots in plan.stages:
        rel = frames_dfs.index_select(-3, stage_pos)
        if gather is None:  # stage 0: segments rooted at the origin
            outputs.append(rel)
            continue
        f = Staging.gather(outputs, origin, gather).unflatten(-3, (n_roots, 3))  # frames of (b, a, d)
        anchor = segment_anchor(kind, plane, f[..., 2, :, :], f[..., 1, :, :], f[..., 0, :, :])
        outputs.append(compose(anchor.index_select(-3, local), rel))
    frames = outputs[0] if len(outputs) == 1 else torch.cat(outputs, -3)
    return frames[..., 3].index_select(-2, plan.final).reshape(shape)


def place_analytic(C: torch.Tensor, table: ConstructionTable) -> torch.Tensor:
    """Positions ``(..., N, 3)`` from internal coordinates ``C`` as given
    (missing references and offset rows are resolved by the plan) via
    :class:`RigidForest` (analytic backward), or on the CPU the same math
    compiled (``zmat/_kernel.py``, where it can be built and used)."""
    if _kernel.usable(C):
        kplan = table.cached(_kernel_plan, C.device)
        if table.constant_anchors:
            return _kernel.positions(C, kplan, table)
        rot, pos = _kernel.frames(_flat(C), kplan, table)
        return _place(rot, pos, forest_plan(table, C.device), C.shape)
    return _place_torch(C, table)


def _place_torch(C: torch.Tensor, table: ConstructionTable) -> torch.Tensor:
    """:func:`place_analytic` in torch ops (the reference for the kernel)."""
    plan = forest_plan(table, C.device)
    function = _RigidForestFunction if torch.compiler.is_compiling() else RigidForest
    rot, pos = function.apply(_flat(C), plan)
    return _place(rot, pos, plan, C.shape)


#: the mean atoms per piece from which a concatenated table's kernel plan is
#: made from its pieces' plans
PIECE_PLAN_ATOMS = 512


def _kernel_plan(table: ConstructionTable, device: torch.device) -> _kernel.KernelPlan:
    """The kernel's arrays only: the torch path is planned when first used
    (a double backward, ``torch.compile``), not for every fresh batch. A
    table taken from another (``ConstructionTable.take``: a batch of a data
    set) takes its plan from the other's, planned once; one made by
    ``ConstructionTable.concatenate`` of large pieces, from its pieces' plans."""
    if table.kernel_arrays is not None:  # stamped by its builder: ints, flags (and chunks, if made)
        ints, flags, *chunks = table.kernel_arrays()
        return _kernel.KernelPlan(ints, flags, _kernel_vjp, *chunks)
    origin = table.origin
    if origin is not None:
        source, ptr, index = origin
        return source.cached(_kernel_plan, device).take(ptr, index)
    pieces = table.pieces
    # ConstructionTable.concatenate of large pieces (structures, not small
    # molecules, whose plans cost more per piece than per atom): its pieces'
    # plans, each made once
    if pieces is not None and table.n_atoms >= PIECE_PLAN_ATOMS * len(pieces):
        return _kernel.KernelPlan.concatenate([t.cached(_kernel_plan, device) for t in pieces])
    order = table.dfs_order
    k = 2 + table.offset_chain.shape[1]
    ints, flags = np.empty((k + 2, table.n_atoms), np.int64), np.empty((k + 2, table.n_atoms), bool)
    entries(table, order, ints[:k], flags[:k])
    ints[k], ints[k + 1] = table.dfs_parent, order
    kind = np.take(table.kind, order)
    np.greater(kind, BOND, out=flags[k])
    np.greater(kind, PLANAR, out=flags[k + 1])
    return _kernel.KernelPlan(ints, flags, _kernel_vjp)


def _kernel_vjp(table: ConstructionTable, rot, pos, g_rot, g_pos) -> torch.Tensor:
    return _vjp(rot, pos, g_rot, g_pos, forest_plan(table, rot.device))


def place_prefix(C: torch.Tensor, table: ConstructionTable) -> torch.Tensor:
    """Same forward as :func:`place_analytic`, differentiated by plain autograd
    (the pure-autograd twin: O(N log N) saved intermediates)."""
    plan = forest_plan(table, C.device)
    rot, pos = _split(compose_paths(_local(_flat(C), plan), plan))
    return _place(rot, pos, plan, C.shape)
