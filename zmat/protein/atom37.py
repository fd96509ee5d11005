"""AlphaFold's atom37 / atom14 tensors, and conversions to and from zmat's layouts.

Structure-prediction models (AlphaFold, OpenFold and their descendants)
exchange coordinates as

* **atom37**: ``(..., L, 37, 3)`` positions and an ``(..., L, 37)`` mask, one
  column per heavy-atom *name* (``ATOM_TYPES``: ``N, CA, C, CB, O, CG, ...,
  OXT``), the same column for a name in every residue type;
* **atom14**: ``(..., L, 14, 3)`` and ``(..., L, 14)``, the atoms of each
  residue type packed in PDB order (``ATOM14_NAMES``; no ``OXT``);

with an ``aatype`` ``(..., L)`` int64 in AlphaFold's residue order
(``RESTYPES``: ``ARNDCQEGHILKMFPSTWYV``, 20 = unknown). Absent atoms have mask
0 and position 0, as in AlphaFold.

Constants are AlphaFold's published ones (``alphafold/common/residue_constants.py``
of google-deepmind/alphafold, Apache-2.0; Jumper et al., Nature 596, 583 (2021),
supplement 1.2.1 and 1.9.11); ``tests/test_atom37.py`` checks them against
that module's values.

:func:`~zmat.protein.from_atom37` (``zmat/protein/atom37_io.py``) goes back
to a :class:`~zmat.protein.Protein`.

Conversions are gathers through index maps built once per layout (numpy, on
the host) and cached per device, so calling them in a training step is a
single ``index_select``-like op, differentiable, with no Python loop over
residues and no host sync.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .._serial import serial
from .._shapes import broadcast_shape

__all__ = [
    "ATOM14_NAMES",
    "ATOM_ORDER",
    "ATOM_TYPES",
    "RENAMING_SWAPS",
    "RESTYPES",
    "RESTYPE_3",
    "UNK",
    "VAN_DER_WAALS_RADIUS",
    "aatype_from_names",
    "aatype_of",
    "atom14_alt_positions",
    "atom14_to_atom37",
    "atom37_to_atom14",
    "compute_renamed_ground_truth",
    "to_atom14",
    "to_atom37",
]

# ------------------------------------------------ AlphaFold's residue constants
#: One-letter residue types in AlphaFold's order (``restypes``); index 20 is unknown.
RESTYPES = "ARNDCQEGHILKMFPSTWYV"
#: Three-letter names in the same order, ``"UNK"`` last (``restype_1to3``).
RESTYPE_3 = (
    "ALA", "ARG", "ASN", "ASP", "CYS", "GLN", "GLU", "GLY", "HIS", "ILE",
    "LEU", "LYS", "MET", "PHE", "PRO", "SER", "THR", "TRP", "TYR", "VAL", "UNK",
)  # fmt: skip
UNK = 20
#: The 37 atom names of atom37, in order (``atom_types``).
ATOM_TYPES = (
    "N", "CA", "C", "CB", "O", "CG", "CG1", "CG2", "OG", "OG1", "SG", "CD",
    "CD1", "CD2", "ND1", "ND2", "OD1", "OD2", "SD", "CE", "CE1", "CE2", "CE3",
    "NE", "NE1", "NE2", "OE1", "OE2", "CH2", "NH1", "NH2", "OH", "CZ", "CZ2",
    "CZ3", "NZ", "OXT",
)  # fmt: skip
ATOM_ORDER = {name: i for i, name in enumerate(ATOM_TYPES)}
#: Heavy atoms of each residue type in atom14 order (``restype_name_to_atom14_names``
#: without the empty padding names).
ATOM14_NAMES: dict[str, tuple[str, ...]] = {
    "ALA": ("N", "CA", "C", "O", "CB"),
    "ARG": ("N", "CA", "C", "O", "CB", "CG", "CD", "NE", "CZ", "NH1", "NH2"),
    "ASN": ("N", "CA", "C", "O", "CB", "CG", "OD1", "ND2"),
    "ASP": ("N", "CA", "C", "O", "CB", "CG", "OD1", "OD2"),
    "CYS": ("N", "CA", "C", "O", "CB", "SG"),
    "GLN": ("N", "CA", "C", "O", "CB", "CG", "CD", "OE1", "NE2"),
    "GLU": ("N", "CA", "C", "O", "CB", "CG", "CD", "OE1", "OE2"),
    "GLY": ("N", "CA", "C", "O"),
    "HIS": ("N", "CA", "C", "O", "CB", "CG", "ND1", "CD2", "CE1", "NE2"),
    "ILE": ("N", "CA", "C", "O", "CB", "CG1", "CG2", "CD1"),
    "LEU": ("N", "CA", "C", "O", "CB", "CG", "CD1", "CD2"),
    "LYS": ("N", "CA", "C", "O", "CB", "CG", "CD", "CE", "NZ"),
    "MET": ("N", "CA", "C", "O", "CB", "CG", "SD", "CE"),
    "PHE": ("N", "CA", "C", "O", "CB", "CG", "CD1", "CD2", "CE1", "CE2", "CZ"),
    "PRO": ("N", "CA", "C", "O", "CB", "CG", "CD"),
    "SER": ("N", "CA", "C", "O", "CB", "OG"),
    "THR": ("N", "CA", "C", "O", "CB", "OG1", "CG2"),
    "TRP": ("N", "CA", "C", "O", "CB", "CG", "CD1", "CD2", "NE1", "CE2", "CE3", "CZ2", "CZ3", "CH2"),
    "TYR": ("N", "CA", "C", "O", "CB", "CG", "CD1", "CD2", "CE1", "CE2", "CZ", "OH"),
    "VAL": ("N", "CA", "C", "O", "CB", "CG1", "CG2"),
    "UNK": (),
}
#: AlphaFold's van der Waals radii by element, Angstrom (``van_der_waals_radius``).
VAN_DER_WAALS_RADIUS = {"C": 1.7, "N": 1.55, "O": 1.52, "S": 1.8}

# Index tables (numpy, 21 residue types). ``-1`` / False where there is no atom.
#: (21, 14) atom37 column of each atom14 slot (AlphaFold's
#: ``restype_atom14_to_atom37`` uses 0 there; the mask tells them apart).
RESTYPE_ATOM14_TO_ATOM37 = np.full((21, 14), -1, np.int64)
#: (21, 37) atom14 slot of each atom37 column.
RESTYPE_ATOM37_TO_ATOM14 = np.full((21, 37), -1, np.int64)
for _r, _name in enumerate(RESTYPE_3):
    for _s, _a in enumerate(ATOM14_NAMES[_name]):
        RESTYPE_ATOM14_TO_ATOM37[_r, _s] = ATOM_ORDER[_a]
        RESTYPE_ATOM37_TO_ATOM14[_r, ATOM_ORDER[_a]] = _s
RESTYPE_ATOM14_MASK = RESTYPE_ATOM14_TO_ATOM37 >= 0
#: (21, 37) atoms a residue type can have in atom37 (AlphaFold's
#: ``restype_atom37_mask``; ``OXT`` is not in it, but may be present at a C terminus).
RESTYPE_ATOM37_MASK = RESTYPE_ATOM37_TO_ATOM14 >= 0
#: (37,) AlphaFold radius of each atom37 column (from the element, its first letter).
ATOM37_RADIUS = np.array([VAN_DER_WAALS_RADIUS[a[0]] for a in ATOM_TYPES])

_AATYPE_OF = {name: i for i, name in enumerate(RESTYPE_3)}


def aatype_from_names(res_names: Sequence[str]) -> np.ndarray:
    """Three-letter names -> ``(L,)`` int64 AlphaFold residue types (20 for anything
    else, as AlphaFold's PDB parser does)."""
    return np.array([_AATYPE_OF.get(str(n), UNK) for n in res_names], np.int64)


def aatype_of(protein) -> torch.Tensor:
    """``(L,)`` residue types of a ``Protein``, or ``(B, L_max)`` of a
    ``ProteinBatch`` (``UNK`` = 20 on padding)."""
    if hasattr(protein, "layouts"):
        out = np.full((len(protein.layouts), protein.L_max), UNK, np.int64)
        for b, lay in enumerate(protein.layouts):
            out[b, : lay.n_residues] = aatype_from_names(lay.res_names)
        return torch.from_numpy(out)
    return torch.from_numpy(aatype_from_names(protein.res_names))


# -------------------------------------------------- atom14 <-> atom37 tensors
def check_positions(pos: torch.Tensor, width: int, name: str) -> None:
    if not isinstance(pos, torch.Tensor) or not pos.is_floating_point():
        raise TypeError(f"{name}: positions must be a float tensor, got {type(pos).__name__}")
    if pos.ndim < 3 or pos.shape[-2:] != (width, 3):
        raise ValueError(f"{name}: positions must have shape (..., L, {width}, 3), got {tuple(pos.shape)}")


def _aatype_tensor(aatype, shape: torch.Size, device, name: str) -> torch.Tensor:
    a = torch.as_tensor(aatype, device=device)
    if a.dtype.is_floating_point or a.dtype == torch.bool:
        raise TypeError(f"{name}: aatype must be an integer tensor, got {a.dtype}")
    if broadcast_shape(a.shape, shape) != tuple(shape):
        raise ValueError(f"{name}: aatype of shape {tuple(a.shape)} does not match residues {tuple(shape)}")
    return a.long().clamp(0, UNK).expand(shape)  # out-of-range types read as unknown


def _convert(pos, aatype, mask, table: np.ndarray, width: int, name: str):
    """Gather ``pos[..., l, table[aatype[l], k]]``; shared by both directions."""
    idx = torch.as_tensor(table, device=pos.device)[_aatype_tensor(aatype, pos.shape[:-2], pos.device, name)]
    valid = idx >= 0
    idx = idx.clamp(min=0)
    out = torch.gather(pos, -2, idx[..., None].expand(*idx.shape, 3))
    if mask is not None:
        m = torch.as_tensor(mask, device=pos.device)
        if m.shape[-2:] != pos.shape[-3:-1]:
            raise ValueError(f"{name}: mask must have shape (..., L, {width}), got {tuple(m.shape)}")
        valid = valid & torch.gather(m.bool().expand(pos.shape[:-1]), -1, idx)
    return torch.where(valid[..., None], out, torch.zeros((), dtype=out.dtype, device=out.device)), valid


def atom14_to_atom37(positions: torch.Tensor, aatype, mask=None) -> tuple[torch.Tensor, torch.Tensor]:
    """atom14 -> atom37 (AlphaFold's ``atom14_to_atom37``), differentiable.

    Args:
        positions: ``(..., L, 14, 3)``.
        aatype: ``(..., L)`` integer residue types (``RESTYPES`` order).
        mask: optional ``(..., L, 14)`` atom mask (default: every atom of the type).

    Returns:
        ``(..., L, 37, 3)`` positions (0 where absent) and ``(..., L, 37)`` bool mask.
    """
    check_positions(positions, 14, "atom14_to_atom37")
    return _convert(positions, aatype, mask, RESTYPE_ATOM37_TO_ATOM14, 14, "atom14_to_atom37")


def atom37_to_atom14(positions: torch.Tensor, aatype, mask=None) -> tuple[torch.Tensor, torch.Tensor]:
    """atom37 -> atom14 (``OXT`` dropped: atom14 has no slot for it), differentiable.

    Args:
        positions: ``(..., L, 37, 3)``.
        aatype: ``(..., L)`` integer residue types.
        mask: optional ``(..., L, 37)`` atom mask (default: every atom of the type).

    Returns:
        ``(..., L, 14, 3)`` positions (0 where absent) and ``(..., L, 14)`` bool mask.
    """
    check_positions(positions, 37, "atom37_to_atom14")
    return _convert(positions, aatype, mask, RESTYPE_ATOM14_TO_ATOM37, 37, "atom37_to_atom14")


# ------------------------------------------------ zmat layouts <-> atom37/atom14
def _source_index(atom_names, residue_index, res_names, n_residues: int, width: int) -> np.ndarray:
    """``(n_residues * width,)`` index of the layout atom in each atom37 (or
    atom14) cell; ``len(atom_names)`` (a zero row appended) where there is none.
    ``residue_index`` < 0 marks padding atoms."""
    atom_names = np.asarray(atom_names).reshape(-1)
    res = np.asarray(residue_index).reshape(-1)
    n = len(atom_names)
    if width == 37:
        col = np.array([ATOM_ORDER.get(str(a), -1) for a in atom_names], np.int64)
    else:
        types = aatype_from_names(res_names)[np.maximum(res, 0)]
        a37 = np.array([ATOM_ORDER.get(str(a), 0) for a in atom_names], np.int64)
        col = RESTYPE_ATOM37_TO_ATOM14[types, a37]
    ok = (res >= 0) & (col >= 0)
    src = np.full(n_residues * width, n, np.int64)
    src[res[ok] * width + col[ok]] = np.nonzero(ok)[0]
    return src


def _plan(obj, width: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Cached ``(source index, mask)`` of a ``Protein`` or ``ProteinBatch``."""
    cache = obj.__dict__.setdefault("_zmat_atom_plans", {})
    key = (width, str(device))
    if key not in cache:
        if hasattr(obj, "layouts"):  # ProteinBatch: residues b * L_max + k, atoms b * N_max + a
            B, Lm = len(obj.layouts), obj.L_max
            res = np.asarray(obj.residue_index)
            res = np.where(res >= 0, res + np.arange(B)[:, None] * Lm, -1)
            names = [
                lay.res_names[k] if k < lay.n_residues else "UNK" for lay in obj.layouts for k in range(Lm)
            ]
            src = _source_index(obj.atom_names, res, names, B * Lm, width)
            n, shape = B * obj.N_max, (B, Lm, width)
        else:
            src = _source_index(obj.atom_names, obj.residue_index, obj.res_names, len(obj), width)
            n, shape = obj.n_atoms, (len(obj), width)
        cache[key] = (
            torch.as_tensor(src, device=device),
            torch.as_tensor((src < n).reshape(shape), device=device),
        )
    return cache[key]


def _gather_layout(obj, xyz, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    batch = hasattr(obj, "layouts")
    n = len(obj.layouts) * obj.N_max if batch else obj.n_atoms
    if xyz is None:
        if batch:
            raise ValueError("ProteinBatch.to_atom37 needs coordinates (..., B, N_max, 3)")
        xyz = obj.xyz
    flat = xyz.flatten(-3, -2) if batch and xyz.ndim >= 3 else xyz
    if not isinstance(flat, torch.Tensor) or flat.shape[-2:] != (n, 3):
        expected = f"(..., {len(obj.layouts)}, {obj.N_max}, 3)" if batch else f"(..., {n}, 3)"
        raise ValueError(f"xyz must have shape {expected}, got {tuple(getattr(xyz, 'shape', ()))}")
    src, mask = _plan(obj, width, flat.device)
    if serial(flat):  # CPU, several threads: numpy, no parallel region (zmat._serial)
        return _HostGather.apply(flat, src).unflatten(-2, mask.shape), mask
    padded = torch.cat([flat, flat.new_zeros(*flat.shape[:-2], 1, 3)], -2)
    out = padded.index_select(-2, src).unflatten(-2, mask.shape)
    return out, mask


class _HostGather(torch.autograd.Function):
    """``cat([flat, 0]).index_select(-2, src)`` by numpy; ``src`` names each layout atom
    at most once (index ``len`` of the rows: a zero row)."""

    @staticmethod
    def forward(flat, src):
        x, s = flat.detach().numpy(), src.numpy()
        ok = s < x.shape[-2]
        out = np.zeros((*x.shape[:-2], len(s), 3), dtype=x.dtype)
        out[..., ok, :] = x[..., s[ok], :]
        return torch.from_numpy(out)

    @staticmethod
    def setup_context(ctx, inputs, output):
        flat, ctx.src = inputs
        ctx.shape = flat.shape
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, g):
        if g is None:
            return None, None
        shape, src = ctx.shape, ctx.src
        if torch.is_grad_enabled():  # double backward: a differentiable scatter
            zeros = g.new_zeros(*shape[:-2], shape[-2] + 1, 3)
            return zeros.index_add(-2, src, g)[..., :-1, :], None
        s = src.numpy()
        ok = s < shape[-2]
        gx = np.zeros(tuple(shape), dtype=g.detach().numpy().dtype)
        gx[..., s[ok], :] = g.detach().numpy()[..., ok, :]  # each atom once: no accumulation
        return torch.from_numpy(gx), None


def to_atom37(protein, xyz: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``Protein`` (or ``ProteinBatch``) in atom37, differentiably.

    Args:
        protein: :class:`~zmat.protein.Protein` or :class:`~zmat.protein.ProteinBatch`.
        xyz: coordinates in the protein's layout, ``(..., N, 3)`` (batch:
            ``(..., B, N_max, 3)``); default ``protein.xyz``.

    Returns:
        ``(..., L, 37, 3)`` positions (batch: ``(..., B, L_max, 37, 3)``), 0
        where absent, and the ``(L, 37)`` (``(B, L_max, 37)``) bool mask.

    Example:
        >>> p = zmat.protein.from_pdb("tests/data/1ubi.pdb")
        >>> pos, mask = to_atom37(p)  # (76, 37, 3), (76, 37)
    """
    return _gather_layout(protein, xyz, 37)


def to_atom14(protein, xyz: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """As :func:`to_atom37`, in atom14 (``(..., L, 14, 3)``; ``OXT`` is dropped)."""
    return _gather_layout(protein, xyz, 14)


# ------------------------------------------------ ambiguous atom names (AlphaFold's renaming)
#: Atoms whose names a structure may give the other way round: AlphaFold's
#: ``residue_atom_renaming_swaps`` (``alphafold/common/residue_constants.py``; OpenFold's
#: ``openfold/np/residue_constants.py`` is the same). The 180-degree flip of a symmetric side chain
#: (the carboxylates of ASP and GLU, the rings of PHE and TYR) swaps them. ARG (NH1/NH2), LEU and
#: VAL, which the lDDT paper also lists, are not in it: their names follow from the geometry.
RENAMING_SWAPS = {
    "ASP": {"OD1": "OD2"},
    "GLU": {"OE1": "OE2"},
    "PHE": {"CD1": "CD2", "CE1": "CE2"},
    "TYR": {"CD1": "CD2", "CE1": "CE2"},
}
#: (21, 14) atom14 slot each slot takes in the alternative naming (the identity elsewhere).
RESTYPE_ATOM14_ALT = np.tile(np.arange(14), (21, 1))
#: (21, 14) AlphaFold's ``restype_atom14_is_ambiguous``.
RESTYPE_ATOM14_IS_AMBIGUOUS = np.zeros((21, 14), bool)
for _name, _swaps in RENAMING_SWAPS.items():
    _r = RESTYPE_3.index(_name)
    for _a, _b in _swaps.items():
        _i, _j = ATOM14_NAMES[_name].index(_a), ATOM14_NAMES[_name].index(_b)
        RESTYPE_ATOM14_ALT[_r, [_i, _j]] = _j, _i
        RESTYPE_ATOM14_IS_AMBIGUOUS[_r, [_i, _j]] = True
#: the slots ambiguous in some residue type (6 to 9): the only rows the renaming's distances need
_AMBIGUOUS_SLOTS = slice(
    int(RESTYPE_ATOM14_IS_AMBIGUOUS.any(0).argmax()),
    14 - int(RESTYPE_ATOM14_IS_AMBIGUOUS.any(0)[::-1].argmax()),
)


def atom14_alt_positions(positions: torch.Tensor, aatype, mask=None) -> tuple[torch.Tensor, torch.Tensor]:
    """atom14 positions with the ambiguous atoms named the other way (AlphaFold's
    ``atom14_alt_gt_positions`` / ``atom14_alt_gt_exists``), differentiable.

    Args:
        positions: ``(..., L, 14, 3)`` atom14 positions.
        aatype: ``(..., L)`` integer residue types.
        mask: optional ``(..., L, 14)`` atom mask (default: every atom of the type).

    Returns:
        ``(..., L, 14, 3)`` positions and ``(..., L, 14)`` bool mask: ASP's OD1 and OD2, GLU's
        OE1 and OE2, PHE's and TYR's CD1/CD2 and CE1/CE2 swapped (:data:`RENAMING_SWAPS`).
    """
    check_positions(positions, 14, "atom14_alt_positions")
    return _convert(positions, aatype, mask, RESTYPE_ATOM14_ALT, 14, "atom14_alt_positions")


def compute_renamed_ground_truth(
    pred_positions, gt_positions, aatype, gt_mask=None, eps: float = 1e-10
) -> dict:
    """The ground truth named as the prediction is (AlphaFold's ``compute_renamed_ground_truth``,
    supplement 1.9.3, Algorithm 26): per residue, the naming of its ambiguous atoms whose distances
    to every unambiguous atom of the structure are closer to the prediction's.

    Args:
        pred_positions: ``(..., L, 14, 3)`` predicted atom14 positions.
        gt_positions: ``(..., L, 14, 3)`` ground-truth atom14 positions.
        aatype: ``(..., L)`` integer residue types.
        gt_mask: optional ``(..., L, 14)`` ground-truth atom mask (default: every atom of the type).
        eps: inside the square roots, as AlphaFold's.

    Returns:
        dict with AlphaFold's keys: ``"alt_naming_is_better"`` ``(..., L)`` float (1 where the
        alternative naming is closer), ``"renamed_atom14_gt_positions"`` ``(..., L, 14, 3)``,
        ``"renamed_atom14_gt_exists"`` ``(..., L, 14)`` float. Differentiable in the positions
        (the choice itself is not). Memory: ``L^2 * 4 * 14`` distances (AlphaFold's ``(L * 14)^2``,
        from the 4 slots that can be ambiguous only): for whole large proteins, crop first.
    """
    check_positions(pred_positions, 14, "compute_renamed_ground_truth")
    check_positions(gt_positions, 14, "compute_renamed_ground_truth")
    gt, exists = _convert(gt_positions, aatype, gt_mask, np.tile(np.arange(14), (21, 1)), 14, "ground truth")
    alt, alt_exists = atom14_alt_positions(gt_positions, aatype, gt_mask)
    a = _aatype_tensor(aatype, gt.shape[:-2], gt.device, "compute_renamed_ground_truth")
    ambiguous = torch.as_tensor(RESTYPE_ATOM14_IS_AMBIGUOUS, device=gt.device)[a]
    dtype = pred_positions.dtype

    def dists(x):  # (..., L, 4, L, 14): from the slots that can be ambiguous to every slot
        return torch.sqrt(
            eps + ((x[..., :, _AMBIGUOUS_SLOTS, None, None, :] - x[..., None, None, :, :, :]) ** 2).sum(-1)
        )

    pred_d = dists(pred_positions)
    rows = (exists & ambiguous)[..., _AMBIGUOUS_SLOTS].to(dtype)[..., :, :, None, None]
    mask = rows * (exists & ~ambiguous).to(dtype)[..., None, None, :, :]
    err = (mask * torch.sqrt(eps + (pred_d - dists(gt)) ** 2)).sum((-1, -2, -3))
    alt_err = (mask * torch.sqrt(eps + (pred_d - dists(alt)) ** 2)).sum((-1, -2, -3))
    better = (alt_err < err).to(dtype)
    return {
        "alt_naming_is_better": better,
        "renamed_atom14_gt_positions": (1 - better[..., None, None]) * gt + better[..., None, None] * alt,
        "renamed_atom14_gt_exists": (1 - better[..., None]) * exists.to(dtype)
        + better[..., None] * alt_exists.to(dtype),
    }
