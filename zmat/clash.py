r"""Smooth, differentiable clash losses that scale to large assemblies.

A hard clash count ``(d < cutoff).float()`` has zero gradient everywhere, so it
cannot train or refine anything. This module sums smooth per-pair penalties
instead, over unordered pairs ``{i, j}`` of distinct atoms that are neither
excluded (bonded neighbours) nor masked (padding).

Conventions, for a pair at distance ``d = |x_i - x_j|`` with radii ``r_i, r_j``:

- contact distance ``c = r_i + r_j - tolerance``; the pair clashes when
  ``d < c``;
- overlap ``o = c - d`` (positive when clashing), in the length unit of ``xyz``
  (Angstrom in the examples);
- ``T`` is ``temperature``, a length; ``relu(x) = max(x, 0)``.

Kinds (``KINDS``), the per-pair penalty ``p``:

- ``"flat_bottom"``: ``p = relu(o)``. AlphaFold's between-residue clash term
  (tolerance 1.5 A, radii ``ALPHAFOLD_RADII``).
- ``"flat_bottom_squared"``: ``p = relu(o)**2``; gradient vanishes at contact.
- ``"softplus"``: ``p = T * softplus(o / T) - T * softplus(-tail / T)`` for
  ``o > -tail``, else 0. Smooth everywhere except a jump-free kink at
  ``o = -tail``; tends to ``"flat_bottom"`` as ``T -> 0``.
- ``"soft_count"``: ``p = sigmoid(o / T) - sigmoid(-tail / T)`` for
  ``o > -tail``, else 0. Each clashing pair counts about 1 and each clear pair
  about 0, so the sum tends to the hard clash count ``#{d < c}`` as ``T -> 0``
  at fixed ``tail``. With the default ``tail = 10 T`` the shift
  ``sigmoid(-10) = 4.5e-5`` biases each clashing pair by that much.
- ``"lennard_jones"``: the purely repulsive (Weeks-Chandler-Andersen) part of a
  Lennard-Jones potential whose repulsion starts at the contact distance, with
  well depth 1: ``p = ((c / d)**6 - 1)**2`` for ``d < c``, else 0. It is capped
  so that it stays finite at ``d = 0``: below the distance ``d_cap`` where
  ``p = cap`` (``d_cap = c (1 + sqrt(cap))**(-1/6)``), ``p`` continues along
  its tangent, ``p = cap + p'(d_cap) (d - d_cap)``, a constant push; so
  ``p(0) = cap + 12 sqrt(cap) (1 + sqrt(cap))`` (168 for the default cap 10).

The soft kinds (``softplus``, ``soft_count``) have tails; pairs with
``o <= -tail`` contribute exactly zero, so only pairs closer than
``r_i + r_j - tolerance + tail`` matter. That is the cutoff of the neighbour
search, and the reason the total can be computed on a short pair list.

Methods:

- ``"all_pairs"``: every pair, O(B N^2) memory, no host synchronisation at all.
  The reference, and the fastest for small N.
- ``"neighbors"``: a cell list built without gradient finds the candidate pairs
  (O(N k) memory); distances and penalties with gradient are computed on those
  pairs only. The number of pairs depends on the data, so this method makes
  exactly two host-device syncs (sizing the candidates, then compacting them;
  or, above the memory budget, sizing and cutting them into chunks). To keep
  them out of a training step, build the list with :func:`candidate_pairs`
  (with a ``skin``) every few steps and pass it as ``pairs=``: then
  ``clash_loss`` makes no host-device sync and compiles into one graph.
- ``"auto"``: ``"all_pairs"`` when the batch holds at most
  ``AUTO_MAX_PAIRS[device type]`` pairs, ``"neighbors"`` otherwise. On CPU the
  neighbour list wins from a few hundred atoms, so the switch is at 50,000
  pairs (N ~ 300); on accelerators
  all-pairs is cheap and sync-free, so it is kept up to 2,000,000 pairs
  (N ~ 2000, ~0.3 GB in float32).

Memory: the neighbour method holds at most ``memory_budget`` bytes
(``MEMORY_BUDGET``, 512 MiB by default) of per-pair intermediates at a time.
Above that it evaluates the candidates in chunks and recomputes each chunk in
the backward pass, so a collapsed structure (thousands of atoms within an
Angstrom, as a model may emit at initialisation) costs time in proportion to
its clashing pairs, not memory. ``"all_pairs"`` is O(B N^2) by design; ``"auto"``
uses it only below ``AUTO_MAX_PAIRS``. A pair list (:func:`candidate_pairs`)
may not exceed the budget either (it raises instead).

Batches: ``xyz`` of shape ``(..., N, 3)`` is a padded batch (``mask`` marks
padding), or, with ``ptr=`` / ``batch=`` (PyTorch Geometric's layout,
:class:`zmat.batch.Ragged`), a ragged one: structures of different sizes back
to back in the N rows, one loss value per structure, in one call with no host
sync (pairs of two structures never count; on ``"all_pairs"`` they are
masked, so its cost is that of all N rows). Exclusions may be one list entry
per structure, each in its own atom indices, as ``TorsionSpace.batch`` users
have them.

Sums accumulate in float64 (on MPS, which has no float64, in the input
dtype): a float32 loss over millions of pairs is exact to its own rounding.

Threads: on the CPU, ``pairs=`` (the training path) evaluates the pairs in
chunks whose every torch op stays below torch's parallel grain, so it opens
no parallel region at any thread count; a parallel region waits for all of
torch's threads, which costs a scheduling delay per op when another process
holds a core. The thread setting is left alone. Other paths use plain torch
ops (and threads).

NaN policy (the same as ``to_xyz`` and ``to_internal``): non-finite
coordinates and radii are propagated, never checked, because a check would
cost a host sync in every training step. The loss of a structure with a NaN
or infinite coordinate or radius in an unmasked atom is NaN, whatever the
method; the other structures of the batch are unaffected; masked atoms may
hold anything. Mixed precision: under ``torch.autocast`` the loss is computed
in float32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from ._amp import float32_under_autocast
from ._geometry import safe_norm, tiny
from ._neighbors import CellList, build_cell_list
from ._segments import on_host, per_row_t, segment_arange_t, segment_ids_t, segments, starts_t
from ._serial import SERIAL_CHUNK, host_zeros, serial

__all__ = [
    "ALPHAFOLD_RADII",
    "CLASH_METHODS",
    "KINDS",
    "MEMORY_BUDGET",
    "alphafold_radii",
    "candidate_pairs",
    "clash_loss",
    "exclusion_keys",
    "exclusions_from_bonds",
    "exclusions_from_table",
    "is_excluded",
    "vdw_radii",
]

KINDS = ("flat_bottom", "flat_bottom_squared", "softplus", "soft_count", "lennard_jones")
CLASH_METHODS = ("auto", "all_pairs", "neighbors")
_TAILED = ("softplus", "soft_count")

# "auto" switches to the neighbour list above this many pairs (B * N(N-1)/2),
# by device type (all-pairs costs 75-145 bytes a pair in float32 with gradient).
AUTO_MAX_PAIRS = {"cpu": 50_000, "default": 2_000_000}

# Heavy-atom van der Waals radii (Angstrom) of AlphaFold's clash loss.
ALPHAFOLD_RADII = {"C": 1.7, "N": 1.55, "O": 1.52, "S": 1.8}

# Slack on the no-grad distance filter, so that float rounding there can never
# drop a pair whose (differentiable) penalty is nonzero.
_FILTER_SLACK = 1e-3

#: Default ``memory_budget`` (bytes) of the neighbour search and the chunked
#: evaluation: per-pair intermediates held at a time. Set it per call, or
#: assign ``zmat.clash.MEMORY_BUDGET`` to change the default.
MEMORY_BUDGET = 512 * 2**20

# Bytes a candidate row costs at the peak of a chunk (indices, gathered
# positions, distances, penalty and their gradients): a 512 MiB budget took
# 480-590 MB, 64 MiB took 120 MB (benchmarks/clash.py --collapsed, N = 5000).
_BYTES_PER_ROW = 200
# Bytes a pair of a returned pair list takes (two int64 indices).
_BYTES_PER_PAIR = 16


# ----------------------------------------------------------------------------
# radii


def _as_radii(values: Sequence[float], dtype, device) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype or torch.get_default_dtype(), device=device)


def vdw_radii(symbols: Sequence[str], *, fallback: float = 2.0, dtype=None, device=None) -> torch.Tensor:
    """Van der Waals radii of elements, from ``ase.data.vdw_radii`` (Angstrom).

    ASE's table (Bondi 1964, Mantina 2009 for main-group elements) has no value
    for most transition metals, lanthanides and actinides; they get
    ``fallback`` (2.0 A, a conventional default for an atom without a tabulated
    radius). Dummy atoms (``"X"``) get 0, so they never clash.

    Args:
        symbols: N element symbols (``"C"``, ``"Fe"``; case as in the periodic
            table).
        fallback: radius for elements ASE has no value for.
        dtype, device: of the result (default dtype, CPU by default).

    Returns:
        Tensor of shape (N,).

    Raises:
        ValueError: for an unknown symbol.

    Example:
        >>> vdw_radii(["C", "O", "Fe", "X"], dtype=torch.float64).tolist()
        [1.7, 1.52, 2.0, 0.0]
    """
    from ase.data import atomic_numbers
    from ase.data import vdw_radii as table

    out = []
    for k, s in enumerate(symbols):
        if s not in atomic_numbers:
            raise ValueError(f"vdw_radii: unknown element symbol {s!r} at index {k}")
        z = atomic_numbers[s]
        r = float(table[z]) if z > 0 else 0.0
        out.append(fallback if math.isnan(r) else r)
    return _as_radii(out, dtype, device)


def alphafold_radii(
    elements: Sequence[str], *, default: float | None = None, dtype=None, device=None
) -> torch.Tensor:
    """AlphaFold's heavy-atom radii: C 1.7, N 1.55, O 1.52, S 1.8 (Angstrom).

    Args:
        elements: N element symbols (case-insensitive).
        default: radius for other elements; if None they raise.
        dtype, device: of the result (default dtype, CPU by default).

    Returns:
        Tensor of shape (N,).

    Raises:
        ValueError: for an element not in ``ALPHAFOLD_RADII`` when ``default``
            is None.

    Example:
        >>> alphafold_radii(["N", "C", "C", "O"], dtype=torch.float64).tolist()
        [1.55, 1.7, 1.7, 1.52]
    """
    out = []
    for k, e in enumerate(elements):
        r = ALPHAFOLD_RADII.get(str(e).upper(), default)
        if r is None:
            raise ValueError(
                f"alphafold_radii: no radius for element {e!r} at index {k}; "
                f"known: {sorted(ALPHAFOLD_RADII)} (pass default=...)"
            )
        out.append(r)
    return _as_radii(out, dtype, device)


# ----------------------------------------------------------------------------
# exclusions


def exclusions_from_bonds(bonds: Any, n_atoms: int, depth: int = 3) -> torch.Tensor:
    """Pairs of atoms at most ``depth`` bonds apart in a covalent graph.

    The graph distance is exact for any graph, rings included (in benzene,
    ``depth=3`` excludes every pair, ``depth=2`` leaves the three para pairs).
    Computed by repeated sparse expansion (pure torch, CPU), O(N k^depth).

    Args:
        bonds: integer array-like of shape (E, 2), atom indices in
            ``[0, n_atoms)``; direction and duplicates do not matter.
        n_atoms: number of atoms N.
        depth: 1 excludes bonded pairs (1-2), 2 adds 1-3 pairs, 3 adds 1-4
            pairs; 0 excludes nothing.

    Returns:
        int64 tensor of shape (P, 2) with rows ``(i, j)``, ``i < j``, sorted.

    Raises:
        ValueError: for a bad shape, an index out of range, or ``depth < 0``.

    Example:
        >>> exclusions_from_bonds([[0, 1], [1, 2], [2, 3]], 4, depth=2).tolist()
        [[0, 1], [0, 2], [1, 2], [1, 3], [2, 3]]
    """
    if isinstance(bonds, torch.Tensor):
        bonds = bonds.cpu()
    arr = np.asarray(bonds, dtype=np.int64)
    if arr.size == 0:
        arr = arr.reshape(0, 2)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise ValueError(f"exclusions_from_bonds: bonds must have shape (E, 2), got {arr.shape}")
    b = torch.from_numpy(arr)
    if depth < 0:
        raise ValueError(f"exclusions_from_bonds: depth must be >= 0, got {depth}")
    if b.numel() and (int(b.min()) < 0 or int(b.max()) >= n_atoms):
        raise ValueError(
            f"exclusions_from_bonds: bond index out of range [0, {n_atoms}): "
            f"min {int(b.min())}, max {int(b.max())}"
        )
    if depth == 0 or b.numel() == 0:
        return torch.zeros(0, 2, dtype=torch.long)

    # Directed adjacency in CSR form: neighbours of atom a are dst[ptr[a]:ptr[a+1]].
    src = torch.cat([b[:, 0], b[:, 1]])
    dst = torch.cat([b[:, 1], b[:, 0]])
    order = torch.argsort(src)
    src, dst = src[order], dst[order]
    deg = torch.bincount(src, minlength=n_atoms)
    ptr = starts_t(deg)

    # reach: pairs (a, c) within k bonds; frontier: those reached at exactly k.
    key = src * n_atoms + dst
    reach = torch.unique(key)
    frontier = reach
    for _ in range(depth - 1):
        if frontier.numel() == 0:
            break
        a, mid = frontier // n_atoms, frontier % n_atoms
        cnt = deg[mid]
        rep = segment_ids_t(cnt)
        offs = segment_arange_t(cnt, ids=rep)
        new = a[rep] * n_atoms + dst[ptr[mid][rep] + offs]
        new = torch.unique(new)
        frontier = new[~torch.isin(new, reach)]
        reach = torch.unique(torch.cat([reach, frontier]))
    i, j = reach // n_atoms, reach % n_atoms
    keep = i < j  # drops self pairs and the (j, i) duplicates
    return torch.stack([i[keep], j[keep]], dim=1)


def exclusions_from_table(table: Any, depth: int = 3, extra_bonds: Any = None) -> torch.Tensor:
    """Pairs within ``depth`` bonds in the graph of atoms and their bond references.

    The covalent graph has an edge ``(i, refs[i, 0])`` for every atom with a
    bond reference; a table is a spanning forest, so add ring closures (and
    disulfides, metal contacts, ...) with ``extra_bonds``.

    Args:
        table: a construction table (anything with a ``.refs`` attribute, such
            as ``zmat.ConstructionTable``) or an integer array-like of shape
            (N, 3), rows ``(b, a, d)``, -1 for a missing reference.
        depth: see :func:`exclusions_from_bonds`.
        extra_bonds: optional integer array-like of shape (E, 2).

    Returns:
        int64 tensor of shape (P, 2), rows ``(i, j)`` with ``i < j``.

    Raises:
        ValueError: if the table does not have shape (N, 3).

    Example:
        >>> refs = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0]]  # a chain
        >>> exclusions_from_table(refs, depth=1).tolist()
        [[0, 1], [1, 2], [2, 3]]
    """
    refs = np.asarray(getattr(table, "refs", table))
    if refs.ndim != 2 or refs.shape[1] != 3:
        raise ValueError(f"exclusions_from_table: table must have shape (N, 3), got {refs.shape}")
    n = refs.shape[0]
    has = refs[:, 0] >= 0
    bonds = np.stack([np.nonzero(has)[0], refs[has, 0]], axis=1).astype(np.int64)
    if extra_bonds is not None and len(extra_bonds):
        bonds = np.concatenate([bonds, np.asarray(extra_bonds, dtype=np.int64).reshape(-1, 2)])
    return exclusions_from_bonds(bonds, n, depth)


def exclusion_keys(exclude, n: int, depth: int = 3, device=None) -> torch.Tensor | None:
    """Sorted int64 keys ``i * n + j`` (``i < j``) of excluded atom pairs, or None.

    Args:
        exclude: None; an integer (E, 2) tensor or array of atom pairs; or a
            construction table (a ``.refs`` attribute or an (N, 3) integer
            array), turned into pairs within ``depth`` bonds on the CPU.
        n: number of atoms N per structure.
        depth: bond depth for a construction table.
        device: of the result.

    Returns:
        int64 tensor of shape (E,), sorted (duplicates kept), or None when
        nothing is excluded. For :func:`is_excluded`.

    Raises:
        ValueError, TypeError: for a bad shape or dtype, or (for host data
            only, where it costs no device sync) an index out of range.
    """
    pairs = _exclusion_pairs(exclude, n, depth, "exclude")
    if pairs is None:
        return None
    return _keys(pairs.to(device=device, dtype=torch.long), n)


def _keys(pairs: torch.Tensor, period: int) -> torch.Tensor:
    lo = torch.minimum(pairs[:, 0], pairs[:, 1])
    hi = torch.maximum(pairs[:, 0], pairs[:, 1])
    return torch.sort(lo * period + hi).values  # sort, not unique: unique would sync


def _exclusion_pairs(exclude, n: int | None, depth: int, name: str, exact: bool = True):
    """``exclude`` (pairs or a table) as an (E, 2) integer tensor, or None; ``n``: atoms
    it may name (None: unknown, not checked); a table has ``n`` rows (``exact``) or at most ``n``."""
    if exclude is None:
        return None
    if hasattr(exclude, "refs"):  # a construction table
        exclude = np.asarray(exclude.refs)
    try:
        pairs = exclude if isinstance(exclude, torch.Tensor) else torch.as_tensor(np.asarray(exclude))
    except (ValueError, TypeError) as e:
        raise TypeError(
            f"clash_loss: {name} must be an (E, 2) integer array of pairs, an (N, 3) construction "
            f"table, or (with several structures) a list of those, one per structure: {e}"
        ) from None
    if pairs.numel() == 0:
        return None
    if pairs.ndim != 2 or pairs.shape[1] not in (2, 3):
        raise ValueError(
            f"clash_loss: {name} must be an (E, 2) tensor of pairs or an (N, 3) "
            f"construction table, got shape {tuple(pairs.shape)}"
        )
    if pairs.dtype.is_floating_point or pairs.dtype == torch.bool:
        raise TypeError(f"clash_loss: {name} must hold integers, got {pairs.dtype}")
    if pairs.shape[1] == 3:  # a construction table
        if n is not None and (pairs.shape[0] != n if exact else pairs.shape[0] > n):
            want = n if exact else f"at most {n}"
            raise ValueError(f"clash_loss: {name}: construction table has {pairs.shape[0]} rows, want {want}")
        return exclusions_from_table(pairs.cpu().numpy(), depth)
    if n is not None and on_host(pairs):
        host = pairs.numpy()  # host memory: checking it involves no device
        if host.min() < 0 or host.max() >= n:
            raise ValueError(
                f"clash_loss: {name} index out of range [0, {n}): min {host.min()}, max {host.max()}"
            )
    return pairs


def _per_structure(exclude) -> bool:
    """Whether ``exclude`` is a list with one exclusion entry per structure."""
    if not isinstance(exclude, (list, tuple)) or len(exclude) == 0:
        return False
    first = exclude[0]
    if isinstance(first, (torch.Tensor, np.ndarray)) or hasattr(first, "refs"):
        return True
    return isinstance(first, (list, tuple)) and len(first) > 0 and isinstance(first[0], (list, tuple))


def _structure_exclusions(items, offsets, sizes, period: int, depth: int, device, exact: bool):
    """Keys (modulo ``period``) of per-structure exclusions, each offset to its structure.

    ``offsets``: ``(B,)`` int64 tensor on ``device``, the first row of each
    structure; ``sizes``: their atom counts (exact, or an upper bound) where
    known on the host, for the checks, else None. One concatenation: no
    per-structure device work.
    """
    parts = []
    for b, e in enumerate(items):  # host-side coercion only (flat pairs skip it)
        n_b = None if sizes is None else int(sizes[b])
        p = _exclusion_pairs(e, n_b, depth, f"exclude[{b}]", exact)
        parts.append(torch.zeros(0, 2, dtype=torch.long) if p is None else p)
    counts = [len(p) for p in parts]
    if sum(counts) == 0:
        return None
    pairs = torch.cat([p.to(device=device, dtype=torch.long) for p in parts])
    shift = per_row_t(offsets, torch.tensor(counts, device=device), len(pairs))
    return _keys(pairs + shift[:, None], period)


def is_excluded(i: torch.Tensor, j: torch.Tensor, n: int, keys: torch.Tensor | None) -> torch.Tensor:
    """Whether pairs ``(i, j)`` of a flattened batch are excluded (no host sync).

    Args:
        i, j: int64 tensors of shape (P,), indices into ``xyz.reshape(-1, 3)``
            of an ``(..., N, 3)`` batch (atom ``a`` of member ``b`` is ``b * n + a``).
        n: atoms per structure N; the pair tested is ``(i % n, j % n)``.
        keys: sorted int64 keys ``min * n + max`` of the excluded pairs (as
            :func:`exclusion_keys` makes them), or None.

    Returns:
        bool tensor of shape (P,).

    Example:
        >>> keys = exclusion_keys([[0, 1]], n=3)
        >>> is_excluded(torch.tensor([1, 4, 0]), torch.tensor([0, 3, 2]), 3, keys).tolist()
        [True, True, False]
    """
    if keys is None or keys.numel() == 0:
        return torch.zeros_like(i, dtype=torch.bool)
    li, lj = i % n, j % n
    key = torch.minimum(li, lj) * n + torch.maximum(li, lj)
    # searchsorted, not isin/unique: no sync on any device.
    pos = torch.searchsorted(keys, key).clamp_(max=keys.numel() - 1)
    return keys[pos] == key


# ----------------------------------------------------------------------------
# per-pair penalties (differentiable)


class _Penalty(NamedTuple):
    kind: str
    tolerance: float
    temperature: float
    tail: float
    cap: float


def _penalty(pen: _Penalty, d, c):
    """Per-pair penalty for distances ``d`` and contact distances ``c``."""
    o = c - d
    kind, temperature, tail, cap = pen.kind, pen.temperature, pen.tail, pen.cap
    if kind == "flat_bottom":
        return F.relu(o)
    if kind == "flat_bottom_squared":
        return F.relu(o) ** 2
    if kind == "softplus":
        floor = temperature * math.log1p(math.exp(-tail / temperature))
        p = F.softplus(o, beta=1.0 / temperature) - floor
        return torch.where(o > -tail, p, 0.0)
    if kind == "soft_count":
        z = math.exp(-tail / temperature)  # sigmoid(-tail / T), overflow-free
        floor = z / (1.0 + z)
        return torch.where(o > -tail, torch.sigmoid(o / temperature) - floor, 0.0)
    # lennard_jones: capped WCA repulsion, well depth 1.
    clash = (c > 0) & (d < c)
    c_safe = torch.where(c > 0, c, 1.0)  # keeps the unused branch finite
    d_cap = c_safe * (1.0 + math.sqrt(cap)) ** (-1.0 / 6.0)
    d_eff = torch.maximum(d, d_cap)
    x = (c_safe / d_eff) ** 6
    slope = -12.0 * (x - 1.0) * x / d_eff  # dp/dd at d_eff
    # For d >= d_cap the second term is 0; below it, the tangent at d_cap.
    p = (x - 1.0) ** 2 + slope * (d - d_eff)
    return torch.where(clash, p, 0.0)


class _Layout(NamedTuple):
    """Which structure each row of the flattened batch ``xyz_f`` (M rows) belongs to.

    Padded batches: row ``a`` is structure ``a // n``. Ragged batches (``ptr`` /
    ``batch``): each block of ``n`` rows (one per leading index) holds ``B``
    structures, and ``seg`` says which (as a flat result index). Exclusion keys
    name rows modulo ``period``: ``n`` for exclusions shared by every
    structure (or of a whole ragged block), ``B n`` for per-structure lists
    of a padded ``(..., B, n, 3)`` batch.
    """

    shape: tuple
    n: int
    seg: torch.Tensor | None
    period: int

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def of(self, i: torch.Tensor) -> torch.Tensor:
        """Result index (structure) of rows ``i``."""
        if self.seg is not None:
            return self.seg.index_select(0, i)
        return torch.div(i, self.n, rounding_mode="floor")

    def groups(self, m: int, device) -> torch.Tensor:
        return self.seg if self.seg is not None else self.of(torch.arange(m, device=device))


def _acc_dtype(t: torch.Tensor) -> torch.dtype:
    """Sums accumulate in float64 (exact to the result's rounding in float32), where
    the device has it (MPS does not)."""
    return t.dtype if t.device.type == "mps" else torch.float64


def _pair_penalties(xyz_f, radii_f, i, j, keep, pen: _Penalty):
    """Per-pair penalties ``(P,)`` of pairs (i, j) of the flattened batch."""
    # index_select, whose backward is an index_add: no sync on any device.
    # safe_norm's zero threshold (1e-24 in float64, 1e-12 in float32, on the
    # squared distance) only affects coincident atoms: value 0, gradient 0.
    d = safe_norm(xyz_f.index_select(0, i) - xyz_f.index_select(0, j))
    c = radii_f.index_select(0, i) + radii_f.index_select(0, j) - pen.tolerance
    p = _penalty(pen, d, c)
    return p if keep is None else torch.where(keep, p, 0.0)


def _pair_sum(xyz_f, radii_f, i, j, keep, layout: _Layout, pen: _Penalty):
    """Sum of penalties over pairs (i, j) per structure: shape (size,), float64."""
    p = _pair_penalties(xyz_f, radii_f, i, j, keep, pen)
    out = torch.zeros(layout.size, dtype=_acc_dtype(p), device=p.device)
    return out.index_add(0, layout.of(i), p.to(out.dtype))


class _ChunkedPairSum(torch.autograd.Function):
    """:func:`_pair_sum` over the candidate rows of a cell list, chunk by chunk.

    No per-pair tensor outlives its chunk: backward recomputes the rows and
    the penalties of each chunk, so memory stays within the budget however
    many pairs clash. Double backward works (the recomputation is then
    recorded, chunk by chunk, in the graph).
    """

    @staticmethod
    def forward(xyz_f, radii_f, rows, layout, pen):
        out = torch.zeros(layout.size, dtype=_acc_dtype(xyz_f), device=xyz_f.device)
        for i, j, keep in rows():
            out = out + _pair_sum(xyz_f, radii_f, i, j, keep, layout, pen)
        return out

    @staticmethod
    def setup_context(ctx, inputs, output):
        xyz_f, radii_f, ctx.rows, ctx.layout, ctx.pen = inputs
        ctx.save_for_backward(xyz_f, radii_f)

    @staticmethod
    def backward(ctx, grad):
        xyz_f, radii_f = ctx.saved_tensors
        need = ctx.needs_input_grad[:2]
        create = torch.is_grad_enabled()  # double backward: record the recomputation
        grads = [None, None]
        for i, j, keep in ctx.rows():
            with torch.enable_grad():
                x = xyz_f if create else xyz_f.detach().requires_grad_(need[0])
                r = radii_f if create else radii_f.detach().requires_grad_(need[1])
                s = (_pair_sum(x, r, i, j, keep, ctx.layout, ctx.pen) * grad).sum()
                wrt = [t for t, k in zip((x, r), need, strict=True) if k]
                got = iter(torch.autograd.grad(s, wrt, create_graph=create))
            for k in range(2):
                if need[k]:
                    g = next(got)
                    grads[k] = g if grads[k] is None else grads[k] + g
        return grads[0], grads[1], None, None, None


# ----------------------------------------------------------------------------
# neighbour search (no gradient)


def _max_rows(memory_budget: int | None) -> int:
    budget = MEMORY_BUDGET if memory_budget is None else memory_budget
    if not budget > 0:
        raise ValueError(f"clash_loss: memory_budget must be > 0 bytes, got {budget}")
    return max(int(budget) // _BYTES_PER_ROW, 1)


@torch.no_grad()
def _search(xyz_f, radii_f, mask_f, layout: _Layout, tolerance: float, reach: float) -> CellList:
    """Cell list of the flat batch for pairs closer than ``2 max(r) - tolerance + reach``."""
    x, r = xyz_f.detach(), radii_f.detach()
    valid = torch.isfinite(x).all(-1) & torch.isfinite(r)  # non-finite atoms: NaN loss, not a search
    if mask_f is not None:
        valid = valid & mask_f
    r_max = torch.where(valid, r, -torch.inf).amax()
    cutoff = (2 * r_max - tolerance + reach).nan_to_num(nan=0.0, neginf=0.0)
    return build_cell_list(x, layout.groups(x.shape[0], x.device), cutoff, valid)


def _near(xyz_f, radii_f, i, j, excl, layout: _Layout, tolerance: float, reach: float):
    """Pairs within ``r_i + r_j - tolerance + reach`` of each other, not excluded."""
    x, r = xyz_f.detach(), radii_f.detach()
    d2 = ((x[i] - x[j]) ** 2).sum(-1)
    lim = (r[i] + r[j] - tolerance + reach).clamp(min=0) + _FILTER_SLACK
    return (d2 < lim * lim) & ~is_excluded(i, j, layout.period, excl)


@torch.no_grad()
def _pair_list(cells: CellList, chunks, xyz_f, radii_f, excl, layout, tolerance, reach, max_pairs=None):
    """Compact (P,) lists ``i, j`` of the pairs within reach: one sync per chunk.
    Raises once the list would exceed ``max_pairs``."""
    out_i, out_j = [xyz_f.new_zeros(0, dtype=torch.long)], [xyz_f.new_zeros(0, dtype=torch.long)]
    total = 0
    for lo, hi, n_rows in chunks:
        i, j = cells.rows(lo, hi, n_rows)
        keep = _near(xyz_f, radii_f, i, j, excl, layout, tolerance, reach)
        sel = keep.nonzero().squeeze(1)  # the one sync of a chunk: the number of pairs
        total += len(sel)
        if max_pairs is not None and total > max_pairs:
            raise ValueError(
                f"candidate_pairs: the pair list would exceed memory_budget (more than {max_pairs} "
                f"pairs at {_BYTES_PER_PAIR} bytes each; atoms collapsed onto each other?): raise "
                "memory_budget, or call clash_loss without pairs=, whose neighbour method "
                "evaluates the pairs in chunks within its budget"
            )
        out_i.append(i.index_select(0, sel))
        out_j.append(j.index_select(0, sel))
    return torch.cat(out_i), torch.cat(out_j)


def _neighbor_sum(xyz_f, radii_f, mask_f, excl, layout: _Layout, pen: _Penalty, memory_budget):
    """Loss by the neighbour list: 2 host syncs; per-chunk recomputation if it is large."""
    if xyz_f.shape[0] < 2:
        return xyz_f.new_zeros(layout.size, dtype=_acc_dtype(xyz_f))
    cells = _search(xyz_f, radii_f, mask_f, layout, pen.tolerance, pen.tail)
    chunks = cells.chunks(_max_rows(memory_budget))  # sync: sizing
    if len(chunks) <= 1:  # fits the budget: compact once, plain autograd
        i, j = _pair_list(cells, chunks, xyz_f, radii_f, excl, layout, pen.tolerance, pen.tail)
        return _pair_sum(xyz_f, radii_f, i, j, None, layout, pen)

    def rows():  # candidate rows chunk by chunk; no compaction, hence no sync
        for lo, hi, n_rows in chunks:
            i, j = cells.rows(lo, hi, n_rows)  # integer tensors: no graph
            yield i, j, None if excl is None else ~is_excluded(i, j, layout.period, excl)

    return _ChunkedPairSum.apply(xyz_f, radii_f, rows, layout, pen)


# ----------------------------------------------------------------------------
# public entry points


def _prepare(xyz, radii, mask, pen: _Penalty, exclude=None, depth=3, ptr=None, batch=None, flatten=True):
    """Validate, broadcast and flatten: ``xyz_f (M, 3), radii_f (M,), mask_f, layout, excl``
    (``flatten=False``: ``xyz``, ``radii`` as a tensor and ``mask`` as given)."""
    _check_scalars(xyz, pen)
    *lead, n, _ = xyz.shape
    full = (*lead, n)
    if radii is None:
        raise TypeError(
            "clash_loss: radii is required: a tensor or array-like of shape (N,) or (..., N) "
            "(zmat.vdw_radii(symbols), zmat.clash.alphafold_radii(elements))"
        )
    if isinstance(radii, torch.Tensor) and radii.device != xyz.device:
        raise ValueError(f"clash_loss: radii on {radii.device}, xyz on {xyz.device}")
    try:
        radii = torch.as_tensor(radii, device=xyz.device).to(xyz.dtype)
    except (TypeError, ValueError, RuntimeError) as e:
        raise TypeError(f"clash_loss: radii must be numbers, got {type(radii).__name__}: {e}") from None
    if radii.ndim == 0 or radii.shape[-1] != n or _broadcast(radii.shape, full) != full:
        raise ValueError(
            f"clash_loss: radii of shape {tuple(radii.shape)} do not match xyz of shape "
            f"{tuple(xyz.shape)}; expected (N,) or (..., N) with N = {n}"
        )
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise TypeError("clash_loss: mask must be a bool tensor")
        if mask.device != xyz.device:
            raise ValueError(f"clash_loss: mask on {mask.device}, xyz on {xyz.device}")
        if mask.ndim == 0 or mask.shape[-1] != n or _broadcast(mask.shape, full) != full:
            raise ValueError(
                f"clash_loss: mask of shape {tuple(mask.shape)} does not match xyz of "
                f"shape {tuple(xyz.shape)}; expected (N,) or (..., N) with N = {n}"
            )
    layout, excl = _layout(xyz, lead, n, exclude, depth, ptr, batch)
    if not flatten:
        return xyz, radii, mask, layout, excl
    return (*_flatten(xyz, radii, mask), layout, excl)


def _flatten(xyz, radii, mask):
    """``xyz_f (M, 3), radii_f (M,), mask_f (M,) or None``, padding zeroed."""
    full = xyz.shape[:-1]
    m = math.prod(full)
    xyz_f = xyz.reshape(m, 3)
    radii_f = radii.expand(full).reshape(m)
    if mask is None:
        return xyz_f, radii_f, None
    mask_f = mask.expand(full).reshape(m)
    # Padded atoms may hold garbage (NaN): a where, not a product, keeps
    # it out of the values and the gradient.
    return torch.where(mask_f[:, None], xyz_f, 0.0), torch.where(mask_f, radii_f, 0.0), mask_f


def _layout(xyz, lead, n: int, exclude, depth: int, ptr, batch):
    """The :class:`_Layout` of ``xyz`` (padded, or ragged by ``ptr``/``batch``) and the
    exclusion keys."""
    dev = xyz.device
    per_structure = _per_structure(exclude)
    if ptr is None and batch is None:
        layout = _Layout(tuple(lead), n, None, n)
        if not per_structure:
            return layout, exclusion_keys(exclude, n, depth, dev)
        n_struct = lead[-1] if lead else 1
        if len(exclude) != n_struct:
            raise ValueError(
                f"clash_loss: exclude has {len(exclude)} entries, one per structure, but xyz of shape "
                f"{tuple(xyz.shape)} holds {n_struct} structures along dim -3"
            )
        offsets = torch.arange(n_struct, device=dev) * n
        excl = _structure_exclusions(exclude, offsets, [n] * n_struct, n_struct * n, depth, dev, False)
        return layout._replace(period=n_struct * n), excl
    n_struct, seg, sizes, starts = segments(ptr, batch, n, dev)
    n_lead = math.prod(lead)
    if n_lead != 1:
        seg = ((torch.arange(n_lead, device=dev) * n_struct)[:, None] + seg).reshape(-1)
    layout = _Layout((*lead, n_struct), n, seg, n)
    if not per_structure:
        return layout, exclusion_keys(exclude, n, depth, dev)
    if len(exclude) != n_struct:
        raise ValueError(f"clash_loss: exclude has {len(exclude)} entries, ptr/batch {n_struct} structures")
    if starts is None:
        raise ValueError("clash_loss: per-structure exclusions need a sorted batch (or ptr=)")
    return layout, _structure_exclusions(exclude, starts, sizes, n, depth, dev, True)


def _check_scalars(xyz, pen: _Penalty) -> None:
    if not isinstance(xyz, torch.Tensor):
        raise TypeError(f"clash_loss: xyz must be a torch.Tensor, got {type(xyz).__name__}")
    if not xyz.is_floating_point():
        raise TypeError(f"clash_loss: xyz must be a float tensor, got {xyz.dtype}")
    if xyz.ndim < 2 or xyz.shape[-1] != 3:
        raise ValueError(f"clash_loss: xyz must have shape (..., N, 3), got {tuple(xyz.shape)}")
    if pen.kind not in KINDS:
        raise ValueError(f"clash_loss: unknown kind {pen.kind!r}; choose one of {KINDS}")
    if not pen.tolerance >= 0:
        raise ValueError(f"clash_loss: tolerance must be >= 0, got {pen.tolerance}")
    if not pen.temperature > 0:
        raise ValueError(f"clash_loss: temperature must be > 0, got {pen.temperature}")
    if not pen.cap > 0:
        raise ValueError(f"clash_loss: cap must be > 0, got {pen.cap}")
    if not (pen.tail >= 0 and math.isfinite(pen.tail)):
        raise ValueError(f"clash_loss: tail must be finite and >= 0, got {pen.tail}")


def _penalty_params(kind, tolerance, temperature, tail, cap) -> _Penalty:
    if tail is None:
        tail = 10.0 * temperature if kind in _TAILED else 0.0
    return _Penalty(kind, tolerance, temperature, tail, cap)


def _broadcast(a, b):
    """The broadcast shape of ``a`` and ``b``, or ``None``: numpy's rule, not torch's, whose
    ``broadcast_shapes`` imports sympy (symbolic shapes) on its first call, ~1 s."""
    try:
        return tuple(np.broadcast_shapes(tuple(a), tuple(b)))
    except ValueError:
        return None


def candidate_pairs(
    xyz: torch.Tensor,
    radii: Any,
    *,
    exclude: Any = None,
    tolerance: float = 1.5,
    kind: str = "flat_bottom",
    temperature: float = 0.1,
    tail: float | None = None,
    skin: float = 0.0,
    mask: torch.Tensor | None = None,
    exclusion_depth: int = 3,
    memory_budget: int | None = None,
    ptr: Any = None,
    batch: Any = None,
) -> torch.Tensor:
    """Pair list for :func:`clash_loss` (``pairs=``), from a cell list, no gradient.

    Finds every pair of distinct, unmasked, non-excluded atoms of the same
    structure closer than ``r_i + r_j - tolerance + tail + skin``. With
    ``skin > 0`` the list stays valid (gives the exact loss) while no atom has
    moved more than ``skin / 2`` since it was built: a Verlet list, so one
    search serves many optimisation steps. Atoms with non-finite coordinates
    are left out (``clash_loss`` is NaN for their structure anyway).

    Host syncs: the number of pairs depends on the data, so this call syncs
    with the device: once to size the candidates (twice if they are split
    into chunks), then once per chunk to compact them.

    Memory is bounded by ``memory_budget``: the search works in chunks of
    that size, and the list itself (16 bytes a pair) may not exceed it
    either: a collapsed structure (thousands of atoms within an Angstrom)
    raises a ``ValueError`` instead of asking for gigabytes. ``clash_loss``
    without ``pairs=`` evaluates such a structure in chunks, within its budget.

    Args:
        xyz, radii, exclude, tolerance, kind, temperature, tail, mask, exclusion_depth, ptr, batch:
            as in :func:`clash_loss` (``kind``, ``temperature`` and ``tail`` only set the
            default search distance).
        skin: extra search distance, >= 0.
        memory_budget: bytes of search intermediates at a time, and at most
            of the returned list (default ``MEMORY_BUDGET``).

    Returns:
        int64 tensor of shape (P, 2): rows ``(i, j)``, ``i != j``, indices into
        the flattened batch ``xyz.reshape(-1, 3)`` (atom ``a`` of batch member
        ``b`` is ``b * N + a``; in a ragged batch, the flat rows of ``xyz``).

    Raises:
        ValueError, TypeError: as :func:`clash_loss`, for ``skin < 0``, and
            for a list that would exceed ``memory_budget``.

    Example:
        >>> xyz = torch.rand(2, 1000, 3) * 40  # two structures
        >>> radii = torch.full((1000,), 1.7)
        >>> pairs = candidate_pairs(xyz, radii, skin=1.0)  # one search...
        >>> clash_loss(xyz, radii, pairs=pairs).shape  # ...many sync-free steps
        torch.Size([2])
    """
    if not skin >= 0:
        raise ValueError(f"candidate_pairs: skin must be >= 0, got {skin}")
    pen = _penalty_params(kind, tolerance, temperature, tail, 1.0)
    prepared = _prepare(xyz, radii, mask, pen, exclude, exclusion_depth, ptr, batch)
    xyz_f, radii_f, mask_f, layout, excl = prepared
    max_rows = _max_rows(memory_budget)
    if xyz_f.shape[0] < 2:
        return xyz_f.new_zeros(0, 2, dtype=torch.long)
    cells = _search(xyz_f, radii_f, mask_f, layout, tolerance, pen.tail + skin)
    chunks = cells.chunks(max_rows)
    max_pairs = max_rows * _BYTES_PER_ROW // _BYTES_PER_PAIR
    i, j = _pair_list(cells, chunks, xyz_f, radii_f, excl, layout, tolerance, pen.tail + skin, max_pairs)
    return torch.stack([i, j], dim=1)


@float32_under_autocast
def clash_loss(
    xyz: torch.Tensor,
    radii: Any,
    *,
    exclude: Any = None,
    tolerance: float = 1.5,
    kind: str = "flat_bottom",
    temperature: float = 0.1,
    tail: float | None = None,
    cap: float = 10.0,
    mask: torch.Tensor | None = None,
    method: str = "auto",
    exclusion_depth: int = 3,
    pairs: torch.Tensor | None = None,
    memory_budget: int | None = None,
    ptr: Any = None,
    batch: Any = None,
) -> torch.Tensor:
    """Sum of smooth clash penalties over pairs of atoms (see the module doc).

    Differentiable in ``xyz`` (and in ``radii``), first and second
    derivatives. Pairs are unordered pairs of distinct atoms of one structure,
    not excluded and not masked; the penalty formulas of each ``kind`` are in
    the module docstring. Under ``torch.autocast`` it computes in float32
    (float16/bfloat16 inputs are upcast). Non-finite coordinates or radii of an
    unmasked atom make the loss of its structure NaN (no error, no sync).
    Sums accumulate in float64 (not on MPS), so a float32 result is exact to
    its own rounding however many pairs it sums.

    Batches: ``xyz`` of shape ``(..., N, 3)`` is a padded batch of structures of
    N atoms (``mask`` marks the padding), or, with ``ptr`` or ``batch`` (PyTorch
    Geometric's layout, :class:`zmat.batch.Ragged`), a ragged batch: the N rows
    hold B structures back to back, and the result has one value per structure.

    Args:
        xyz: float tensor of shape (..., N, 3).
        radii: radii of shape (N,) or (..., N), broadcast against
            ``xyz.shape[:-1]``; array-likes are converted to ``xyz``'s dtype.
        exclude: None; an integer (E, 2) tensor or array of atom pairs never
            penalised (atom indices of one structure, shared by all of a padded
            batch; flat row indices of a ragged batch); or a construction table
            (a ``.refs`` attribute or an (N, 3) integer array, a forest table for a
            ragged batch), which excludes pairs within ``exclusion_depth`` bonds of
            the graph of atoms and their bond references; or a list of such
            pairs or tables, one per structure, in each structure's own atom
            indices (structures along dim -3 of a padded batch, or the B of
            ``ptr``). Tables are turned into pairs on the CPU at every call, and
            a list is concatenated at every call: for repeated calls, build the
            pairs once (:func:`exclusions_from_table`) and pass those.
        tolerance: subtracted from ``r_i + r_j``; >= 0 (AlphaFold: 1.5 A).
        kind: one of ``KINDS``.
        temperature: length scale of ``"softplus"`` and ``"soft_count"``, > 0.
        tail: pairs with overlap ``<= -tail`` contribute exactly zero; default
            ``10 * temperature`` for the soft kinds, 0 for the others (whose
            penalty already vanishes at contact). Sets the neighbour-search
            cutoff ``2 max(r) - tolerance + tail``.
        cap: energy cap of ``"lennard_jones"`` (well depth 1), > 0.
        mask: optional bool tensor of shape (N,) or (..., N); False marks padded
            atoms, which take no part (their coordinates may be anything).
        method: one of ``CLASH_METHODS``: ``"all_pairs"``, ``"neighbors"`` or
            ``"auto"``; ignored when ``pairs`` is given.
        exclusion_depth: bond depth for a construction table ``exclude``.
        pairs: optional (P, 2) pair list from :func:`candidate_pairs`, reused
            as is (then no host-device sync at all). It is trusted, not
            checked on the device (a check would sync): self pairs ``(i, i)``
            count zero, but a pair listed twice counts twice, and a pair of
            two structures counts toward the structure of its first atom.
            Indices out of range raise where the list is on the CPU.
        memory_budget: bytes the neighbour method may hold in per-pair
            intermediates at a time (default ``MEMORY_BUDGET``, 512 MiB).
            Above it the pairs are evaluated in chunks and recomputed in the
            backward pass, so memory stays bounded however many atoms clash.
        ptr: ragged batch: ``(B + 1,)`` integer offsets, structure ``b`` is rows
            ``ptr[b]:ptr[b + 1]`` of ``xyz`` (a :class:`zmat.batch.Ragged` works
            too). No sync: B is read from its shape.
        batch: ragged batch: ``(N,)`` structure of each row (PyG's ``batch``);
            alone it must be host data (B is read from it); with ``ptr`` it
            saves the expansion.

    Returns:
        Tensor of shape ``xyz.shape[:-2]`` (ragged: ``(*xyz.shape[:-2], B)``),
        dtype of ``xyz`` (float32 under autocast).

    Raises:
        ValueError: for mismatched shapes of ``xyz``, ``radii``, ``mask``,
            ``ptr``, ``batch`` or the table, an unknown kind or method, a
            negative tolerance or tail, a non-positive temperature, cap or
            memory budget, exclusion or pair indices out of range (host data).
        TypeError: for a non-float ``xyz``, missing or non-numeric radii, a
            non-bool mask, non-integer exclusions, pairs, ``ptr`` or ``batch``.

    Example:
        >>> xyz = torch.tensor([[0.0, 0, 0], [1.5, 0, 0]])  # two C, 1.5 A apart
        >>> clash_loss(xyz, alphafold_radii("CC"))  # relu(1.7 + 1.7 - 1.5 - 1.5)
        tensor(0.4000)
    """
    pen = _penalty_params(kind, tolerance, temperature, tail, cap)
    if method not in CLASH_METHODS:
        raise ValueError(f"clash_loss: unknown method {method!r}; choose one of {CLASH_METHODS}")
    use_serial = pairs is not None and serial(xyz)
    prepared = _prepare(xyz, radii, mask, pen, exclude, exclusion_depth, ptr, batch, flatten=not use_serial)
    if pairs is not None:
        _check_pairs(pairs, xyz)
    if use_serial:
        return _serial_pairs_loss(*prepared, pairs, pen).to(xyz.dtype).reshape(prepared[3].shape)
    xyz_f, radii_f, mask_f, layout, excl = prepared
    if pairs is not None:
        out = _given_pairs_sum(xyz_f, radii_f, mask_f, excl, pairs, layout, pen)
    elif _resolve_method(method, xyz.device, xyz_f.shape[0], layout.n) == "neighbors":
        out = _neighbor_sum(xyz_f, radii_f, mask_f, excl, layout, pen, memory_budget)
    else:
        out = _all_pairs_sum(xyz_f, radii_f, mask_f, excl, layout, pen)
    return _propagate_nan(out, xyz_f, radii_f, layout).to(xyz.dtype).reshape(layout.shape)


def _resolve_method(method: str, device: torch.device, m: int, n: int) -> str:
    if method != "auto":
        return method
    limit = AUTO_MAX_PAIRS.get(device.type, AUTO_MAX_PAIRS["default"])
    return "all_pairs" if (m // max(n, 1)) * n * (n - 1) // 2 <= limit else "neighbors"


def _check_pairs(pairs, xyz) -> None:
    """A (P, 2) integer pair list on ``xyz``'s device; indices checked where on the host."""
    if not isinstance(pairs, torch.Tensor) or pairs.ndim != 2 or pairs.shape[1] != 2:
        raise ValueError(f"clash_loss: pairs must be a (P, 2) tensor, got {getattr(pairs, 'shape', pairs)}")
    if pairs.dtype.is_floating_point or pairs.dtype.is_complex or pairs.dtype == torch.bool:
        raise TypeError(f"clash_loss: pairs must hold integers, got {pairs.dtype}")
    if pairs.device != xyz.device:
        raise ValueError(f"clash_loss: pairs on {pairs.device}, xyz on {xyz.device}")
    m = xyz.numel() // 3
    if pairs.numel() and on_host(pairs):  # host memory: checking it involves no device
        host = pairs.numpy()
        bad = (host < 0) | (host >= m)
        if bad.any():
            row = int(np.argmax(bad.any(1)))
            raise ValueError(
                f"clash_loss: pairs row {row} = {host[row].tolist()} is out of range [0, {m}) "
                f"(indices into xyz.reshape(-1, 3))"
            )


def _given_pairs_sum(xyz_f, radii_f, mask_f, excl, pairs, layout: _Layout, pen: _Penalty):
    """Loss over a given (P, 2) pair list: no sync; self pairs, exclusions and padding
    become a mask."""
    i, j = pairs[:, 0], pairs[:, 1]
    keep = i != j  # a self pair is no pair (no sync: a mask, not a filter)
    if mask_f is not None:
        keep = keep & mask_f[i] & mask_f[j]
    if excl is not None:
        keep = keep & ~is_excluded(i, j, layout.period, excl)
    return _pair_sum(xyz_f, radii_f, i, j, keep, layout, pen)


def _all_pairs_sum(xyz_f, radii_f, mask_f, excl, layout: _Layout, pen: _Penalty):
    """Every pair: a fixed-size list (shape known from N alone: no sync), O(B N^2) memory.
    In a ragged batch, every pair of a block's N rows, pairs of two structures masked."""
    n, dev = layout.n, xyz_f.device
    n_block = xyz_f.shape[0] // max(n, 1)
    li, lj = torch.triu_indices(n, n, 1, device=dev)
    offset = (torch.arange(n_block, device=dev) * n)[:, None]
    i, j = (li + offset).reshape(-1), (lj + offset).reshape(-1)
    keep = None
    if layout.seg is not None:  # the same structure (the blocks' structures repeat)
        keep = (layout.seg[li] == layout.seg[lj]).expand(n_block, -1).reshape(-1)
    if excl is not None:
        if layout.period == n:
            out = (~is_excluded(li, lj, n, excl)).expand(n_block, -1).reshape(-1)
        else:
            out = ~is_excluded(i, j, layout.period, excl)
        keep = out if keep is None else keep & out
    if mask_f is not None:
        both = mask_f[i] & mask_f[j]
        keep = both if keep is None else keep & both
    return _pair_sum(xyz_f, radii_f, i, j, keep, layout, pen)


def _propagate_nan(out, xyz_f, radii_f, layout: _Layout):
    """NaN policy: the loss of a structure with a non-finite (unmasked) coordinate or
    radius is NaN, whatever the method; ``0 * x`` is NaN exactly there (no sync)."""
    bad = ((xyz_f * 0).sum(-1) + radii_f * 0).to(out.dtype)
    if layout.seg is not None:
        return out.index_add(0, layout.seg, bad)
    return out + bad.view(layout.size, layout.n).sum(-1)


# ----------------------------------------------------------------------------
# the CPU path of a given pair list that opens no parallel region (see zmat._serial)
#
# It works on chunks of pairs whose every tensor stays below the grain (1-D
# columns of ``SERIAL_CHUNK`` elements; square roots by numpy), and prepares the
# per-atom arrays (padding, radii) with numpy.


def _host_rows(t: torch.Tensor, full) -> np.ndarray:
    """``t`` broadcast to ``full`` and flattened, as a numpy array (no torch op)."""
    return np.array(np.broadcast_to(t.detach().numpy(), tuple(full))).reshape(-1)  # a writable copy


class _SerialInputs(NamedTuple):
    """Host-prepared inputs of :class:`_SerialPairSum`: padding zeroed by numpy."""

    cols: tuple  # x, y, z: (M,) contiguous coordinate columns
    radii: torch.Tensor  # (M,)
    radii_mod: int  # radii gradient rows: atom % radii_mod (0: the atom)
    keep_atom: torch.Tensor | None  # (M,) bool, the mask
    i: torch.Tensor
    j: torch.Tensor
    excl: torch.Tensor | None
    layout: _Layout
    pen: _Penalty


def _chunk_terms(inp: _SerialInputs, lo: int, hi: int):
    """Per pair of chunk ``[lo, hi)``: ``(dx, dy, dz, c, keep, i, j)``: separation,
    contact distance, kept flag, atoms (no graph)."""
    i, j = inp.i[lo:hi], inp.j[lo:hi]
    dx, dy, dz = (col.index_select(0, i) - col.index_select(0, j) for col in inp.cols)
    c = inp.radii.index_select(0, i) + inp.radii.index_select(0, j) - inp.pen.tolerance
    keep = i != j
    if inp.keep_atom is not None:
        keep = keep & inp.keep_atom.index_select(0, i) & inp.keep_atom.index_select(0, j)
    if inp.excl is not None:
        keep = keep & ~is_excluded(i, j, inp.layout.period, inp.excl)
    return dx, dy, dz, c, keep, i, j


def _distance(dx, dy, dz):
    sq = dx * dx + dy * dy + dz * dz
    ok = ~(sq <= tiny(sq.dtype))  # as safe_norm: coincident atoms, value 0 and gradient 0
    # numpy's sqrt (no graph here): torch's sqrt kernel goes parallel from 2,048 elements
    root = torch.from_numpy(np.sqrt(torch.where(ok, sq, 1.0).numpy()))
    return torch.where(ok, root, 0.0), ok


def _penalty_grad(pen: _Penalty, d, c):
    """``(dp/dd, dp/dc)`` of :func:`_penalty`."""
    o = c - d
    if pen.kind == "lennard_jones":  # see _penalty; the capped part is its tangent at d_cap = k c
        clash = (c > 0) & (d < c)
        c_safe = torch.where(c > 0, c, 1.0)
        d_cap = c_safe * (1.0 + math.sqrt(pen.cap)) ** (-1.0 / 6.0)
        d_eff = torch.maximum(d, d_cap)
        x = (c_safe / d_eff) ** 6
        g = 12.0 * (x - 1.0) * x
        g_c = g / c_safe * torch.where(d < d_cap, d / d_cap, 1.0)
        return torch.where(clash, -g / d_eff, 0.0), torch.where(clash, g_c, 0.0)
    if pen.kind == "flat_bottom":
        s = (o > 0).to(o.dtype)
    elif pen.kind == "flat_bottom_squared":
        s = 2.0 * F.relu(o)
    elif pen.kind == "softplus":
        z = o / pen.temperature  # F.softplus is linear above its threshold, 20
        s = torch.where(o > -pen.tail, torch.where(z > 20.0, 1.0, torch.sigmoid(z)), 0.0)
    else:  # soft_count
        q = torch.sigmoid(o / pen.temperature)
        s = torch.where(o > -pen.tail, q * (1.0 - q) / pen.temperature, 0.0)
    return -s, s


class _SerialPairSum(torch.autograd.Function):
    """Sum of penalties over a pair list, chunk by chunk, analytic per-pair backward
    (double backward: a differentiable recomputation, which may use threads)."""

    @staticmethod
    def forward(xyz_f, radii, inp: _SerialInputs):
        out = host_zeros(inp.layout.size, torch.float64)
        for lo in range(0, len(inp.i), SERIAL_CHUNK):
            dx, dy, dz, c, keep, i, _ = _chunk_terms(inp, lo, lo + SERIAL_CHUNK)
            p = torch.where(keep, _penalty(inp.pen, _distance(dx, dy, dz)[0], c), 0.0)
            out.index_add_(0, inp.layout.of(i), p.to(torch.float64))
        return out

    @staticmethod
    def setup_context(ctx, inputs, output):
        xyz_f, radii, ctx.inp = inputs
        ctx.save_for_backward(xyz_f, radii)

    @staticmethod
    def backward(ctx, grad):
        xyz_f, radii = ctx.saved_tensors
        inp, (need_x, need_r) = ctx.inp, ctx.needs_input_grad[:2]
        if torch.is_grad_enabled():  # double backward: the differentiable torch path
            gx, gr = _SerialPairSumBackward.apply(xyz_f, radii, grad, inp)
            return gx if need_x else None, gr if need_r else None, None
        return _serial_grad(inp, grad, xyz_f, radii, need_x, need_r) + (None,)


def _serial_grad(inp: _SerialInputs, grad, xyz_f, radii, need_x: bool, need_r: bool):
    """First derivatives of :class:`_SerialPairSum`, chunk by chunk (no graph)."""
    gx = host_zeros(tuple(xyz_f.shape), xyz_f.dtype) if need_x else None
    gr = host_zeros(radii.shape[0], radii.dtype) if need_r else None
    cols = None if gx is None else gx.unbind(1)  # strided views: written in place
    for lo in range(0, len(inp.i), SERIAL_CHUNK):
        dx, dy, dz, c, keep, i, j = _chunk_terms(inp, lo, lo + SERIAL_CHUNK)
        d, ok = _distance(dx, dy, dz)
        g_d, g_c = _penalty_grad(inp.pen, d, c)
        w = torch.where(keep, grad.index_select(0, inp.layout.of(i)).to(d.dtype), 0.0)
        if need_x:
            s = torch.where(ok, w * g_d / torch.where(ok, d, 1.0), 0.0)  # d|dx|/d(dx) = dx / d
            for col, v in zip(cols, (dx, dy, dz), strict=True):
                f = s * v
                col.index_add_(0, i, f).index_add_(0, j, -f)
        if need_r:
            f = w * g_c
            ri, rj = (t if inp.radii_mod == 0 else torch.remainder(t, inp.radii_mod) for t in (i, j))
            gr.index_add_(0, ri, f).index_add_(0, rj, f)
    return gx, gr


class _SerialPairSumBackward(torch.autograd.Function):
    """Double backward of :class:`_SerialPairSum`: the same sum recomputed by plain torch
    ops with a graph, differentiated with ``create_graph``."""

    @staticmethod
    def forward(xyz_f, radii, grad, inp):
        return _serial_grad(inp, grad, xyz_f, radii, True, True)

    @staticmethod
    def setup_context(ctx, inputs, output):
        xyz_f, radii, grad, ctx.inp = inputs
        ctx.save_for_backward(xyz_f, radii, grad)

    @staticmethod
    def backward(ctx, gg_x, gg_r):
        xyz_f, radii, grad = ctx.saved_tensors
        inp = ctx.inp
        with torch.enable_grad():
            x = xyz_f.detach().requires_grad_(True)
            r = radii.detach().requires_grad_(True)
            g = grad.detach().requires_grad_(True)
            keep = None if inp.keep_atom is None else inp.keep_atom
            x_f = x if keep is None else torch.where(keep[:, None], x, 0.0)
            r_f = _radii_rows(r, inp, len(x))
            pk = inp.i != inp.j
            if keep is not None:
                pk = pk & keep[inp.i] & keep[inp.j]
            if inp.excl is not None:
                pk = pk & ~is_excluded(inp.i, inp.j, inp.layout.period, inp.excl)
            s = (_pair_sum(x_f, r_f, inp.i, inp.j, pk, inp.layout, inp.pen) * g).sum()
            first = torch.autograd.grad(s, [x, r], create_graph=True)
            total = sum((o * gg).sum() for o, gg in zip(first, (gg_x, gg_r), strict=True) if gg is not None)
            if not torch.is_tensor(total):
                return None, None, None, None
            grads = torch.autograd.grad(total, [x, r, g], allow_unused=True)
        return grads[0], grads[1], grads[2], None


def _radii_rows(r, inp: _SerialInputs, m: int):
    """Per-atom radii (M,) from the differentiable radii ``r`` (its own rows or N)."""
    rows = r if inp.radii_mod == 0 else r.repeat(m // inp.radii_mod)
    return rows if inp.keep_atom is None else torch.where(inp.keep_atom, rows, 0.0)


def _serial_pairs_loss(xyz, radii, mask, layout: _Layout, excl, pairs, pen: _Penalty):
    """``clash_loss(pairs=)`` on the CPU, without a parallel region: ``(size,)`` float64."""
    full = xyz.shape[:-1]
    xyz_f = xyz.reshape(-1, 3)
    x = xyz_f.detach().numpy()
    r = _host_rows(radii, full)
    keep = None if mask is None else _host_rows(mask, full)
    # NaN policy, read on the host: a non-finite unmasked coordinate or radius makes
    # its structure NaN; padding is zeroed (it may hold anything)
    bad = ~(np.isfinite(x).all(1) & np.isfinite(r))
    if keep is not None:
        bad &= keep
        x, r = np.where(keep[:, None], x, 0), np.where(keep, r, 0)
    cols = tuple(torch.from_numpy(np.ascontiguousarray(x[:, k])) for k in range(3))
    radii_mod = 0 if tuple(radii.shape) == tuple(full) else (full[-1] if radii.numel() == full[-1] else -1)
    if radii_mod == -1:  # an unusual broadcast: differentiate through rows made by torch
        radii = radii.expand(full).reshape(-1)
        radii_mod = 0
    ij = pairs.numpy().astype(np.int64, copy=False)
    i, j = (torch.from_numpy(np.ascontiguousarray(ij[:, k])) for k in range(2))  # numpy copies: no torch op
    keep_t = None if keep is None else torch.from_numpy(keep)
    inp = _SerialInputs(cols, torch.from_numpy(r), radii_mod, keep_t, i, j, excl, layout, pen)
    out = _SerialPairSum.apply(xyz_f, radii.reshape(-1), inp)
    if bad.any():
        rows = torch.from_numpy(np.nonzero(bad)[0])
        out = out.index_put((layout.of(rows),), torch.tensor(math.nan, dtype=out.dtype))
    return out
