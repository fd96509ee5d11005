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

The code is a pipeline, one module per stage, each with one input and one
output, read top to bottom from :func:`clash_loss`:

1. :mod:`zmat.clash.atoms`: the arguments checked and flattened into ``Atoms``
   (flat rows, radii, mask, which structure each row is, exclusion keys from
   :mod:`zmat.clash.exclusions`);
2. :mod:`zmat.clash.pairs`: the pairs to score, given (``pairs=``), every pair,
   or a cell-list search (:mod:`zmat._neighbors`);
3. :mod:`zmat.clash.sums`: each pair's penalty (:mod:`zmat.clash.penalty`)
   summed per structure, NaN where a structure has a non-finite atom.

:mod:`zmat.clash.serial_sums` is stages 2-3 for ``pairs=`` on a multi-threaded CPU.
Radii tables are in :mod:`zmat.clash.radii`.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .._amp import float32_under_autocast
from .._serial import serial
from .atoms import prepare
from .exclusions import exclusion_keys, exclusions_from_bonds, exclusions_from_table, is_excluded
from .pairs import BYTES_PER_ROW, every, given, near, within
from .penalty import KINDS, TAILED, Penalty
from .radii import ALPHAFOLD_RADII, alphafold_radii, vdw_radii
from .serial_sums import serial_sum
from .sums import per_structure

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

CLASH_METHODS = ("auto", "all_pairs", "neighbors")

# "auto" switches to the neighbour list above this many pairs (B * N(N-1)/2),
# by device type (all-pairs costs 75-145 bytes a pair in float32 with gradient).
AUTO_MAX_PAIRS = {"cpu": 50_000, "default": 2_000_000}

#: Default ``memory_budget`` (bytes) of the neighbour search and the chunked
#: evaluation: per-pair intermediates held at a time. Set it per call, or
#: assign ``zmat.clash.MEMORY_BUDGET`` to change the default.
MEMORY_BUDGET = 512 * 2**20


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
    pen = _options(kind, tolerance, temperature, tail, 1.0)
    atoms = prepare(xyz, radii, mask, exclude, exclusion_depth, ptr, batch)
    return within(atoms, tolerance, pen.tail + skin, _max_rows(memory_budget))


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
    pen = _options(kind, tolerance, temperature, tail, cap)
    if method not in CLASH_METHODS:
        raise ValueError(f"clash_loss: unknown method {method!r}; choose one of {CLASH_METHODS}")
    use_serial = pairs is not None and serial(xyz)
    atoms = prepare(xyz, radii, mask, exclude, exclusion_depth, ptr, batch, pairs, flatten=not use_serial)
    if use_serial:  # the same pipeline, chunked below torch's grain (zmat.clash.serial_sums)
        out = serial_sum(atoms, pairs, pen)
    else:
        if pairs is not None:
            found = given(atoms, pairs)
        elif _resolve_method(method, xyz.device, atoms.xyz.shape[0], atoms.layout.n) == "neighbors":
            found = near(atoms, pen.tolerance, pen.tail, _max_rows(memory_budget))
        else:
            found = every(atoms)
        out = per_structure(atoms, found, pen)
    return out.to(xyz.dtype).reshape(atoms.layout.shape)


def _resolve_method(method: str, device: torch.device, m: int, n: int) -> str:
    if method != "auto":
        return method
    limit = AUTO_MAX_PAIRS.get(device.type, AUTO_MAX_PAIRS["default"])
    return "all_pairs" if (m // max(n, 1)) * n * (n - 1) // 2 <= limit else "neighbors"


def _max_rows(memory_budget: int | None) -> int:
    budget = MEMORY_BUDGET if memory_budget is None else memory_budget
    if not budget > 0:
        raise ValueError(f"clash_loss: memory_budget must be > 0 bytes, got {budget}")
    return max(int(budget) // BYTES_PER_ROW, 1)


def _options(kind, tolerance, temperature, tail, cap) -> Penalty:
    """The penalty's parameters, checked, with the default ``tail`` of each kind."""
    if tail is None:
        tail = 10.0 * temperature if kind in TAILED else 0.0
    pen = Penalty(kind, tolerance, temperature, tail, cap)
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
    return pen
