"""Excluded pairs (bonded neighbours) for :func:`zmat.clash_loss`, and their sorted keys.

Exclusions come as atom pairs, a construction table (pairs within ``depth``
bonds of its graph), or a list of those, one per structure. They are stored as
sorted int64 keys ``min * period + max``; :func:`is_excluded` looks pairs up by
``searchsorted``, with no host sync on any device.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .._segments import Segments, on_host, per_row_t, segment_arange_t, segment_ids_t, starts_t

__all__ = [
    "batch_keys",
    "exclusion_keys",
    "exclusions_from_bonds",
    "exclusions_from_table",
    "is_excluded",
]


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


def batch_keys(exclude, shape: tuple, depth: int, device, ragged: Segments | None):
    """Exclusion keys of a batch ``xyz`` of shape ``(..., N, 3)`` and their period.

    ``exclude`` is shared by every structure (keys modulo N), or a list with one
    entry per structure: along dim -3 of a padded batch (keys modulo ``B N``), or
    the ``ragged`` structures (:func:`zmat._segments.segments`; keys modulo N,
    the rows of one block). Returns ``(keys or None, period)``.
    """
    n = shape[-2]
    if not _one_per_structure(exclude):
        return exclusion_keys(exclude, n, depth, device), n
    if ragged is None:
        n_struct = shape[-3] if len(shape) > 2 else 1
        if len(exclude) != n_struct:
            raise ValueError(
                f"clash_loss: exclude has {len(exclude)} entries, one per structure, but xyz of shape "
                f"{shape} holds {n_struct} structures along dim -3"
            )
        offsets = torch.arange(n_struct, device=device) * n
        return _structure_keys(
            exclude, offsets, [n] * n_struct, n_struct * n, depth, device, False
        ), n_struct * n
    if len(exclude) != ragged.count:
        raise ValueError(
            f"clash_loss: exclude has {len(exclude)} entries, ptr/batch {ragged.count} structures"
        )
    if ragged.starts is None:
        raise ValueError("clash_loss: per-structure exclusions need a sorted batch (or ptr=)")
    return _structure_keys(exclude, ragged.starts, ragged.sizes, n, depth, device, True), n


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


def _one_per_structure(exclude) -> bool:
    """Whether ``exclude`` is a list with one exclusion entry per structure."""
    if not isinstance(exclude, (list, tuple)) or len(exclude) == 0:
        return False
    first = exclude[0]
    if isinstance(first, (torch.Tensor, np.ndarray)) or hasattr(first, "refs"):
        return True
    return isinstance(first, (list, tuple)) and len(first) > 0 and isinstance(first[0], (list, tuple))


def _structure_keys(items, offsets, sizes, period: int, depth: int, device, exact: bool):
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
