"""Per-residue backbone frames (AlphaFold's convention), and atoms from frames + torsions.

Convention (AlphaFold supplement, Alg. 21 ``rigidFrom3Points`` applied to
``(x1, x2, x3) = (N, CA, C)``, as in Alg. 20 line 1 and ``all_atom.atom37_to_frames``):

* origin ``t = CA``;
* ``e1 = (C - CA) / |C - CA|``: the x axis points from CA toward C;
* ``e2``: ``N - CA`` made orthogonal to ``e1`` (Gram-Schmidt), normalised: N
  lies in the xy plane on the ``+y`` side;
* ``e3 = e1 x e2``.

``R = [e1 e2 e3]`` holds the axes as *columns*, so a point with local
coordinates ``p`` is at ``R @ p + t`` in the global frame (``(..., L, 3, 3)``
and ``(..., L, 3)``, as AlphaFold's ``r3.Rigids``).

Three ways in:

* :func:`backbone_frames` from coordinates (atom37, atom14 or any layout with
  N, CA, C in columns 0, 1, 2);
* :func:`backbone_frames_from_torsions` from phi, psi, omega with ideal bond
  lengths and angles (Engh & Huber, ``zmat.protein.topology.IDEAL``), through
  ``zmat.to_xyz`` on a backbone-only table: no side chain is built;
* and back out: :func:`atom14_from_frames` builds each residue's heavy atoms
  with ``zmat.to_xyz`` (one tree per residue, rooted ``N, CA, C``, every row
  anchored on its parent's frame; each type's residues one batch of its
  table, so a new sequence plans nothing), ideal geometry, psi for O and
  chi1..chi4 for the side chain, moves each residue into AlphaFold's frame
  (CA at the origin, C on ``+x``, N in the xy plane with ``y > 0``), then
  applies the frames.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
import torch.nn.functional as F

from .. import _kernel
from .._analytic import permute  # (a permutation's backward: a gather, not index_add)
from .._geometry import rigid_from_three_points
from ..table import ConstructionTable
from ..transform import to_xyz
from .atom37 import ATOM14_NAMES, RESTYPE_3, RESTYPE_ATOM14_MASK, UNK, atom14_to_atom37
from .build import DEFAULT_TORSIONS, backbone_table, ideal_cd_angle
from .topology import IDEAL, PRO_DEFAULT_CHI, RESIDUES, TORSION_NAMES

__all__ = [
    "superpose_on_atoms",
    "apply_frames",
    "atom14_from_frames",
    "atom37_from_frames",
    "backbone_frames",
    "backbone_frames_from_torsions",
    "rigid_from_three_points",
]


def superpose_on_atoms(x: torch.Tensor, ref: torch.Tensor, atoms: tuple[int, int, int]) -> torch.Tensor:
    """``x`` ``(..., N, 3)`` moved rigidly so that its three ``atoms`` ``(a0, a1, a2)`` (a tree's
    fixed start: the root, its BOND child and the PLANAR row's atom) sit as in ``ref`` ``(N, 3)``."""
    a0, a1, a2 = atoms
    R0, t0 = rigid_from_three_points(x[..., a2, :], x[..., a0, :], x[..., a1, :])
    y = ref.to(x)
    R1, t1 = rigid_from_three_points(y[a2], y[a0], y[a1])
    M = R1 @ R0.transpose(-1, -2)
    return torch.einsum("...ij,...nj->...ni", M, x - t0[..., None, :]) + t1


def backbone_frames(atom37: torch.Tensor):
    """Backbone frames of coordinates, AlphaFold's convention (module docstring).

    Args:
        atom37: ``(..., L, A, 3)`` with N, CA, C in columns 0, 1, 2 (atom37 or
            atom14 positions, or a ``(..., L, 3, 3)`` backbone).

    Returns:
        ``R`` ``(..., L, 3, 3)`` and ``t`` ``(..., L, 3)``.

    Example:
        >>> pos, mask = zmat.protein.from_pdb("tests/data/1ubi.pdb").to_atom37()
        >>> R, t = backbone_frames(pos)  # R[k].T @ (C - CA) is along +x
    """
    if not isinstance(atom37, torch.Tensor):
        raise TypeError(
            f"backbone_frames: positions must be a torch.Tensor, got {type(atom37).__name__} "
            "(convert with torch.as_tensor)"
        )
    if atom37.ndim < 3 or atom37.shape[-1] != 3 or atom37.shape[-2] < 3:
        raise ValueError(
            f"backbone_frames: positions must have shape (..., L, 37, 3) (or A >= 3 atoms with N, CA, C "
            f"first), got {tuple(getattr(atom37, 'shape', ()))}"
        )
    return rigid_from_three_points(atom37[..., 0, :], atom37[..., 1, :], atom37[..., 2, :])


def apply_frames(R: torch.Tensor, t: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """``R @ local + t`` per residue: ``(..., L, 3, 3)``, ``(..., L, 3)`` and
    ``(..., L, A, 3)`` local points -> ``(..., L, A, 3)`` global points."""
    return torch.einsum("...ij,...aj->...ai", R, local) + t[..., None, :]


# ------------------------------------------------------ backbone from torsions
def backbone_frames_from_torsions(torsions: torch.Tensor, frame0=None):
    """Frames of an ideal backbone with the given phi, psi, omega.

    Bond lengths and angles are Engh & Huber's (``topology.IDEAL``); the
    backbone N, CA, C is built by ``zmat.to_xyz`` (no side chain).

    Args:
        torsions: ``(..., L, 3)`` phi, psi, omega (or ``(..., L, 7)`` in
            ``TORSION_NAMES`` order; only the first three are read), radians.
            ``omega[k]`` is CA(k)-C(k)-N(k+1)-CA(k+1); ``phi[0]``, ``psi[L-1]``
            and ``omega[L-1]`` are unused.
        frame0: optional ``(R0, t0)`` frame of residue 0; default identity.

    Returns:
        ``R`` ``(..., L, 3, 3)``, ``t`` ``(..., L, 3)``, differentiable in
        ``torsions`` (and ``frame0``).
    """
    if not isinstance(torsions, torch.Tensor) or torsions.ndim < 2 or torsions.shape[-1] not in (3, 7):
        raise ValueError(
            "backbone_frames_from_torsions: torsions must have shape (..., L, 3) or (..., L, 7), "
            f"got {tuple(getattr(torsions, 'shape', ()))}"
        )
    L = torsions.shape[-2]
    phi, psi, omega = torsions[..., 0], torsions[..., 1], torsions[..., 2]
    rad = math.radians
    nca, cac, cn = IDEAL["N-CA"], IDEAL["CA-C"], IDEAL["C-N"]
    t_nca_c, t_cac_n, t_cnca = rad(IDEAL["N-CA-C"]), rad(IDEAL["CA-C-N"]), rad(IDEAL["C-N-CA"])
    full = lambda v, x: torch.full_like(x, v)  # noqa: E731
    # backbone_table rows: N_k (C, CA, N)_{k-1} psi_{k-1}; CA_k (N_k, C_{k-1}, CA_{k-1})
    # omega_{k-1}; C_k (CA_k, N_k, C_{k-1}) phi_k
    n_row = torch.stack([full(cn, psi), full(t_cac_n, psi), psi.roll(1, -1)], -1)
    ca_row = torch.stack([full(nca, psi), full(t_cnca, psi), omega.roll(1, -1)], -1)
    c_row = torch.stack([full(cac, psi), full(t_nca_c, psi), phi], -1)
    internal = torch.stack([n_row, ca_row, c_row], -2)  # (..., L, 3, 3)
    # residue 0: N at the origin, CA on +x, C in the xy plane (dihedrals unused)
    first = torch.tensor([[0.0, 0, 0], [nca, 0, 0], [cac, t_nca_c, 0]], dtype=psi.dtype, device=psi.device)
    head = (torch.arange(L, device=psi.device) == 0)[:, None, None]
    internal = torch.where(head, first, internal)
    xyz = to_xyz(internal.flatten(-3, -2), backbone_table(L)).unflatten(-2, (L, 3))
    R, t = backbone_frames(xyz)
    R0, t0 = R[..., :1, :, :], t[..., :1, :]
    if frame0 is None:  # express in residue 0's frame
        return R0.transpose(-1, -2) @ R, torch.einsum("...ji,...j->...i", R0, t - t0)
    Rf, tf = frame0
    M = Rf[..., None, :, :] @ R0.transpose(-1, -2)
    return M @ R, torch.einsum("...ij,...j->...i", M, t - t0) + tf[..., None, :]


# ------------------------------------------------- full atoms from frames
@functools.lru_cache(maxsize=1)
def _residue_rows():
    """Per residue type, a local tree over atom14 slots rooted N, CA, C.

    Returns ``refs`` ``(21, 14, 3)`` (local slots, -1 none), ``ideal``
    ``(21, 14, 3)`` internal coordinates (NaN where a torsion goes) and
    ``tors`` ``(21, 14)``: the ``TORSION_NAMES`` column of the dihedral, -1 for
    a fixed one; O's dihedral N-CA-C-O is psi + pi (O is trans to the next N).

    Rooted at N (CA on ``+x``, C in the xy plane) every other row is anchored
    on its parent's frame (O proper, CB an offset of C about CA-N, the side
    chain proper or offset): no anchor from positions, so the compiled kernel
    builds the whole forest. :func:`_with_tree_frames` then moves each
    residue into AlphaFold's frame (CA at the origin, C on ``+x``). N's row
    keeps N-CA and N-CA-C (ignored by ``to_xyz``: N is a root) for
    ``_close_prolines``.
    """
    refs = np.full((21, 14, 3), -1, np.int64)
    ideal = np.zeros((21, 14, 3))
    tors = np.full((21, 14), -1, np.int64)
    psi = TORSION_NAMES.index("psi")
    for r, name in enumerate(RESTYPE_3[:UNK]):
        tpl, slots = RESIDUES[name], {a: k for k, a in enumerate(ATOM14_NAMES[name])}
        row = {a: tpl.ideal[tpl.index(a)] for a in tpl.atoms}
        # N root; CA on +x (N-CA); C in the xy plane, y > 0 (CA-C, N-CA-C)
        ideal[r, 0] = (row["CA"][0], row["C"][1], 0)
        refs[r, 1, 0], ideal[r, 1] = 0, (row["CA"][0], 0, 0)
        refs[r, 2, :2], ideal[r, 2] = (1, 0), (row["C"][0], row["C"][1], 0)
        refs[r, 3], ideal[r, 3], tors[r, 3] = (2, 1, 0), (row["O"][0], row["O"][1], math.pi), psi
        for a in ATOM14_NAMES[name][4:]:
            k, j = slots[a], tpl.index(a)
            refs[r, k] = [slots[x] for x in tpl.rows[j]]
            ideal[r, k] = row[a]
            if tpl.torsion[j] is not None:
                tors[r, k] = tpl.torsion[j][0]
                ideal[r, k, 2] = 0.0
    return refs, ideal, tors


@functools.lru_cache(maxsize=1)
def _residue_tables():
    """One validated table per residue type over its existing atom14 slots
    (in slot order); a batch of its residues is built with it (:func:`_local_atoms`)."""
    refs = _residue_rows()[0]
    # atom14 slots are filled from the first: a residue's atoms are its first n slots
    return [ConstructionTable(refs[r, : int(RESTYPE_ATOM14_MASK[r].sum())]) for r in range(UNK)]


def _with_tree_frames(R: torch.Tensor, t: torch.Tensor, local: torch.Tensor):
    """Frames ``(R, t)`` composed with the inverse of each residue's tree frame,
    so that ``apply_frames`` takes ``(..., L, 14, 3)`` residues built in their
    trees' frame (N at the origin, CA on ``+x``) as if built in AlphaFold's
    (CA at the origin, C on ``+x``, N in the xy plane, ``y > 0``): with
    ``R0, t0`` the backbone frame of the built N, CA, C, ``R R0^T`` and
    ``t - R R0^T t0``."""
    R0, t0 = backbone_frames(local)
    R1 = R @ R0.transpose(-1, -2)
    return R1, t - (R1 @ t0[..., None])[..., 0]


@functools.lru_cache(maxsize=16)
def _row_tensors(dtype, device):
    """:func:`_residue_rows` and the atom14 mask as tensors, copied to a device once."""
    _, ideal, tors = _residue_rows()
    as_t = functools.partial(torch.as_tensor, device=device)
    return as_t(ideal, dtype=dtype), as_t(tors), as_t(RESTYPE_ATOM14_MASK)


@functools.lru_cache(maxsize=16)
def _default_torsions(dtype, device) -> torch.Tensor:
    """``(21, 7)``: the torsions used where NaN is given, per residue type (``build.DEFAULT_TORSIONS``;
    proline's chi1, chi2 ``PRO_DEFAULT_CHI``, which close its ring), copied to a device once."""
    out = np.tile(np.asarray(DEFAULT_TORSIONS), (UNK + 1, 1))
    chi1 = TORSION_NAMES.index("chi1")
    out[RESTYPE_3.index("PRO"), chi1 : chi1 + 2] = PRO_DEFAULT_CHI
    return torch.as_tensor(out, dtype=dtype, device=device)


#: residues from which :func:`_local_atoms` builds each type's residues as one
#: batch (about where planning a forest costs more than ~20 calls)
GROUPED_RESIDUES = 1024


@functools.lru_cache(maxsize=16)
def _groups(aatype_bytes: bytes, device: str):
    """The residues grouped by type (types ascending, residues in order), so
    that each type's residues are one batch of its cached table: a new
    sequence costs a sort, no table of its own. Returns ``order`` (residue
    of each grouped row) and ``inverse`` on ``device``, and ``(type, first
    row, count)`` of each type present, UNK (no atoms, last) left out."""
    aa = np.frombuffer(aatype_bytes, np.int64)
    order = np.argsort(aa, kind="stable")
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    count = np.bincount(aa, minlength=UNK + 1)
    first = np.cumsum(count) - count
    groups = tuple((r, int(first[r]), int(count[r])) for r in np.flatnonzero(count[:UNK]).tolist())
    dev = torch.device(device)
    return torch.as_tensor(order, device=dev), torch.as_tensor(inverse, device=dev), groups


@functools.lru_cache(maxsize=16)
def _forest(aatype_bytes: bytes, device: str):
    """Table over the existing atoms of the residues (one tree each; absent
    slots left out: thousands of lone roots would slow ``to_xyz`` down),
    assembled from the cached per-type tables with no validation or planning
    of its own; the atom14 cell of each atom, and for each atom14 cell its
    atom (or the appended zero row)."""
    aa = np.frombuffer(aatype_bytes, np.int64)
    has = RESTYPE_ATOM14_MASK[aa].reshape(-1)  # (M * 14,)
    cells = np.flatnonzero(has)
    atom_of = np.full(len(has) + 1, len(cells), np.int64)  # cell -> compact atom; extra cell: none
    atom_of[cells] = np.arange(len(cells))
    dev = torch.device(device)
    return (
        ConstructionTable.concatenate(_residue_tables(), index=aa[aa != UNK]),  # UNK: no atoms
        torch.as_tensor(cells, device=dev),
        torch.as_tensor(atom_of[:-1], device=dev),
    )


def _local_atoms(internal: torch.Tensor, aatype_bytes: bytes) -> torch.Tensor:
    """``(M, 14, 3)`` internal coordinates of the residues grouped by type
    (:func:`_groups` of ``aatype_bytes``) -> ``(M, 14, 3)`` positions in each
    residue's tree frame, in residue order (0 for absent slots and UNK).

    From :data:`GROUPED_RESIDUES` residues on, where the compiled kernel
    serves: one ``to_xyz`` per type present, its residues the batch of its
    table, so nothing is planned per sequence. Else one ``to_xyz`` on the
    sequence's forest (:func:`_forest`: cheap to plan when small, one call to
    differentiate twice, fewer launches on an accelerator). The same bits
    either way."""
    order, inverse, groups = _groups(aatype_bytes, str(internal.device))
    tables, M = _residue_tables(), len(internal)
    if M < GROUPED_RESIDUES or not _kernel.usable(internal):
        table, cells, atom_of = _forest(aatype_bytes, str(internal.device))
        x = permute(internal, 0, inverse, order).reshape(-1, 3).index_select(0, cells)
        local = to_xyz(x, table)
        return torch.cat([local, local.new_zeros(1, 3)]).index_select(0, atom_of).view(M, 14, 3)
    n = groups[-1][1] + groups[-1][2] if groups else 0
    parts = internal.split([g[2] for g in groups] + [M - n])  # (one backward: a cat, not a sum of slices)
    out = []
    for (r, _, _), x in zip(groups, parts, strict=False):
        k = tables[r].n_atoms  # a type's atoms are its first k slots
        out.append(F.pad(to_xyz(x[:, :k], tables[r]), (0, 0, 0, 14 - k)))
    out.append(internal.new_zeros(M - n, 14, 3))  # UNK: last
    return permute(torch.cat(out), 0, inverse, order)


def atom14_from_frames(R: torch.Tensor, t: torch.Tensor, aatype, torsions: torch.Tensor):
    """Heavy atoms (atom14) from backbone frames and torsions, ideal geometry.

    Each residue is built in its frame by ``zmat.to_xyz`` (module docstring):
    N, CA, C at their ideal places in the frame, O from psi, the side chain
    from chi1..chi4 (``RESIDUES`` templates, Engh & Huber), then moved by
    ``R @ p + t``.

    Args:
        R, t: ``(..., L, 3, 3)``, ``(..., L, 3)`` frames.
        aatype: ``(L,)`` or ``(..., L)`` residue types (AlphaFold order), read
            on the host to pick the construction table (one per sequence,
            cached): pass a CPU tensor or a list, and a CUDA step makes no
            device-to-host sync.
        torsions: ``(..., L, 7)`` in ``TORSION_NAMES`` order (phi, psi, omega,
            chi1..chi4); psi and the chis are used. NaN means "not given", as in
            :mod:`zmat.protein.build`: ``DEFAULT_TORSIONS`` (psi -45 deg,
            chi1 -60, chi2..chi4 180; proline's chi1, chi2 ``PRO_DEFAULT_CHI``),
            with a zero gradient. The C-terminal psi of a measured structure is
            NaN (no next N): its O is placed at psi -45 deg.

    Returns:
        ``(..., L, 14, 3)`` positions (0 for absent slots) and the
        ``(..., L, 14)`` bool mask; differentiable in ``R``, ``t``, ``torsions``.
    """
    if torsions.shape[-1] != len(TORSION_NAMES) or torsions.shape[:-1] != t.shape[:-1]:
        raise ValueError(
            f"atom14_from_frames: torsions must have shape {(*t.shape[:-1], 7)}, got {tuple(torsions.shape)}"
        )
    shape = t.shape[:-1]
    aa = torch.as_tensor(aatype).long().expand(shape)
    flat_aa = aa.reshape(-1).cpu().numpy().clip(0, UNK).astype(np.int64)
    dev, dt = t.device, t.dtype
    ideal, tors, has = _row_tensors(dt, dev)
    order, inverse, groups = _groups(flat_aa.tobytes(), str(dev))  # residues grouped by type
    a = torch.as_tensor(flat_aa, device=dev)
    a_grouped = a.index_select(0, order)
    base = ideal[a_grouped]  # (M, 14, 3)
    col = tors[a_grouped]  # (M, 14)
    tor = torch.gather(permute(torsions.reshape(-1, 7), 0, order, inverse), 1, col.clamp(min=0))
    default = torch.gather(_default_torsions(dt, dev)[a_grouped], 1, col.clamp(min=0))
    tor = torch.where(torch.isnan(tor), default, tor)  # NaN: not given (no sync: a select)
    dihedral = torch.where(col >= 0, base[..., 2] + tor, base[..., 2])
    internal = _close_prolines(base, dihedral, groups)
    local = _local_atoms(internal, flat_aa.tobytes()).reshape(*shape, 14, 3)
    mask = has[a].reshape(*shape, 14)
    pos = apply_frames(*_with_tree_frames(R, t, local), local)
    return torch.where(mask[..., None], pos, torch.zeros((), dtype=dt, device=dev)), mask


def _close_prolines(base: torch.Tensor, dihedral: torch.Tensor, groups: list) -> torch.Tensor:
    """``(M, 14, 3)`` internal coordinates of grouped residues (:func:`_groups`) with each
    proline's CB-CG-CD angle (atom14 slot 6) closing its ring
    (``zmat.protein.build.proline_cd_angle``, ideal geometry) from chi1 (CG, slot 5) and
    chi2 (CD, slot 6)."""
    internal = torch.cat([base[..., :2], dihedral[..., None]], -1)
    pro = [(r0, n) for r, r0, n in groups if r == RESTYPE_3.index("PRO")]
    if not pro:
        return internal
    r0, n = pro[0]
    r1 = r0 + n
    x = internal[r0:r1]  # the prolines: one group
    cd = x[:, 6]
    angle = ideal_cd_angle(x[:, 5, 2], cd[:, 2])  # the rows hold proline's ideal geometry
    cd = torch.stack([cd[:, 0], angle, cd[:, 2]], -1)
    return torch.cat([internal[:r0], torch.cat([x[:, :6], cd[:, None], x[:, 7:]], 1), internal[r1:]])


def atom37_from_frames(R: torch.Tensor, t: torch.Tensor, aatype, torsions: torch.Tensor):
    """:func:`atom14_from_frames` in atom37 (``(..., L, 37, 3)``, mask ``(..., L, 37)``; no OXT)."""
    pos14, mask14 = atom14_from_frames(R, t, aatype, torsions)
    return atom14_to_atom37(
        pos14, torch.as_tensor(aatype, device=t.device).long().expand(t.shape[:-1]), mask14
    )
