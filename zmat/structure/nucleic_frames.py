"""Per-nucleotide frames and torsions, and every nucleotide heavy atom from them (RhoFold's convention).

Convention: RhoFold / RhoFold+ (Shen et al., "Accurate RNA 3D structure prediction using a language
model-based deep learning approach", Nature Methods 21, 2287, 2024; code ml4bio/RhoFold, tables in
``rhofold/utils/constants.py``, assembly in ``rhofold/utils/converter.py``, ``RNAConverter``).
The facts below are its tables; the code is zmat's.

* **Frame** (``zmat.protein.rigid_from_three_points(C4', C1', N9|N1)``, AlphaFold's Alg. 21): origin ``C1'``,
  ``x`` toward the glycosidic N (N9 purines, N1 pyrimidines), ``C4'`` in the xy plane (``y > 0``).
* **Rigid groups and torsions**, each torsion the IUPAC dihedral of its atom quad:

  ====  ================  ==========================  ===================================
  k     parent group      quad (torsion ``k``)        atoms placed
  ====  ================  ==========================  ===================================
  0     frame             ``C4' C1' N C4|C2``          the base
  1     frame             ``N C1' C4' C5'``            ``C5' C2' C3' O4' O2' O3'`` (sugar)
  2     group 1           ``C1' C4' C5' O5'``          ``O5'``
  3     group 2           ``C4' C5' O5' P``            ``P OP1 OP2``
  ====  ================  ==========================  ===================================

  Group ``k``'s frame is its parent's composed with a fixed offset (origin on the quad's third
  atom, ``x`` along its second -> third bond, the first atom in the xy plane) and a rotation by
  the torsion about ``x``; atoms sit at fixed local coordinates (RhoFold's
  ``ATOM_INFOS_PER_RESD``). The sugar ring is rigid (RhoFold's C3'-endo), so a C2'-endo DNA
  sugar is rebuilt only approximately (``docs/allatom.md`` gives the errors).
* **Slots**: RhoFold's ``ATOM_NAMES_PER_RESD`` order (``C4', C1', N`` first), 23 slots.
  DNA (not in RhoFold): DA, DC, DG, DT use the tables of A, C, G, U without ``O2'``; DT's ``C7``
  (an extension of ours) is in the base plane on C5, bisecting the exterior C4-C5-C6 angle, 1.50 A
  from C5 (the CCD's DT C5-C7 bond), in the slot after U's last.

Checked against RhoFold's own ``RNAConverter.build_cords`` (``tests/data/rhofold_reference.npz``,
``tests/data/make_rhofold_reference.py``): within 3.4e-3 A, all of it from the 1e-4 that RhoFold's
frame helper adds to norms (9e-6 A with that epsilon set to zero).

Every atom is built from its own nucleotide's frame and torsions: a terminal nucleotide needs no
neighbour. Measured torsions are NaN where an atom of the quad is absent (a 5' end without P);
the builders then use :data:`DEFAULT_TORSIONS` there.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from .._geometry import dihedral_from_bonds, rigid_from_three_points
from .modified import parent_atoms, parent_name

__all__ = [
    "DEFAULT_TORSIONS",
    "NUCLEIC_ATOM_NAMES",
    "NUCLEIC_RESTYPES",
    "NUCLEIC_TORSION_ATOMS",
    "nucleotide_atoms_from_frames",
    "nucleotide_frames",
    "nucleotide_positions",
    "nucleotide_torsions",
]

#: Residue types, in ``restype`` index order.
NUCLEIC_RESTYPES = ("A", "G", "U", "C", "DA", "DG", "DT", "DC")
N_SLOTS = 23

_O2 = ("O2'",)
_RNA_OF = {"A": "A", "G": "G", "U": "U", "C": "C", "DA": "A", "DG": "G", "DT": "U", "DC": "C"}
_NAMES_RNA = {
    "A": "C4' C1' N9 C2' C3' C5' O2' O3' O4' N1 C2 N3 C4 C5 C6 N6 N7 C8 O5' P OP1 OP2",
    "G": "C4' C1' N9 C2' C3' C5' O2' O3' O4' N1 N2 N3 C2 C4 C5 C6 N7 C8 O6 O5' P OP1 OP2",
    "U": "C4' C1' N1 C2' C3' C5' O2' O3' O4' C2 O2 N3 C4 O4 C5 C6 O5' P OP1 OP2",
    "C": "C4' C1' N1 C2' C3' C5' O2' O3' O4' C2 O2 N3 C4 N4 C5 C6 O5' P OP1 OP2",
}
#: Per residue type, the atom name of each slot ("" for none; DNA's O2' slot is empty).
NUCLEIC_ATOM_NAMES = {
    **{k: tuple(v.split()) for k, v in _NAMES_RNA.items()},
    **{
        d: tuple("" if a in _O2 else a for a in _NAMES_RNA[_RNA_OF[d]].split())
        + (("C7",) if d == "DT" else ())
        for d in ("DA", "DG", "DT", "DC")
    },
}

#: Per residue type, the atom quad of each of the four torsions (module docstring).
NUCLEIC_TORSION_ATOMS = {
    k: (
        ("C4'", "C1'", n, b),
        (n, "C1'", "C4'", "C5'"),
        ("C1'", "C4'", "C5'", "O5'"),
        ("C4'", "C5'", "O5'", "P"),
    )
    for k, (n, b) in {
        **dict.fromkeys(("A", "G", "DA", "DG"), ("N9", "C4")),
        **dict.fromkeys(("U", "C", "DT", "DC"), ("N1", "C2")),
    }.items()
}

#: Torsions used where NaN is given (radians): circular means over the 4p5j RNA's nucleotides.
DEFAULT_TORSIONS = tuple(math.radians(d) for d in (170.1, 18.1, -35.1, 173.0))

# RhoFold's ATOM_INFOS_PER_RESD: (group, local x, y, z); group 0 frame, 1..4 torsion groups 0..3
# (RhoFold's rigid groups 3..6).
_LOCAL = {
    "A": {
        "C4'": (0, -1.276165, 1.959880, 0.0), "C1'": (0, 0.0, 0.0, 0.0), "N9": (0, 1.475205, -0.000001, 0.0),
        "C4": (1, 0.807920, 1.111760, 0.000005), "N1": (1, 2.758503, 2.897898, 0.001554),
        "C2": (1, 1.460024, 3.206003, -0.011345), "N3": (1, 0.411131, 2.394717, -0.011532),
        "C5": (1, 2.096065, 0.639899, 0.008968), "C6": (1, 3.118781, 1.602769, 0.010104),
        "N6": (1, 4.419309, 1.291705, 0.019290), "N7": (1, 2.111291, -0.746117, 0.018068),
        "C8": (1, 0.849659, -1.070600, 0.010794),
        "C5'": (2, 1.052078, 1.092224, -0.000001), "C2'": (2, -1.872561, -0.883347, -1.102487),
        "C3'": (2, -0.472814, -0.446904, -1.365087), "O4'": (2, -1.190606, 0.491559, 0.645394),
        "O2'": (2, -1.903518, -2.126949, -0.665019), "O3'": (2, 0.263952, -1.439737, -1.802108),
        "O5'": (3, 0.496598, 1.344835, 0.000001),
        "P": (4, 0.792605, 1.387161, -0.000169), "OP1": (4, 0.471023, 2.128497, 0.712373),
        "OP2": (4, 1.873119, 1.330707, 0.059336),
    },
    "G": {
        "C4'": (0, -1.290627, 1.934672, 0.0), "C1'": (0, 0.0, 0.0, 0.0), "N9": (0, 1.468708, -0.000001, 0.0),
        "C4": (1, 0.810758, 1.110910, 0.000003), "N1": (1, 2.729542, 2.870383, -0.004097),
        "N2": (1, 1.177098, 4.564092, 0.000022), "N3": (1, 0.396910, 2.396043, 0.002390),
        "C2": (1, 1.411283, 3.249483, -0.000035), "C5": (1, 2.100985, 0.632358, -0.004182),
        "C6": (1, 3.176985, 1.556655, -0.005911), "N7": (1, 2.108585, -0.756168, -0.007856),
        "C8": (1, 0.845640, -1.077105, -0.005711), "O6": (1, 4.385028, 1.323046, -0.008872),
        "C5'": (2, 1.060114, 1.070924, -0.000001), "C2'": (2, -1.870486, -0.840342, -1.120496),
        "C3'": (2, -0.472286, -0.429812, -1.370752), "O4'": (2, -1.185897, 0.480439, 0.644563),
        "O2'": (2, -1.940520, -2.089699, -0.772286), "O3'": (2, 0.283446, -1.465567, -1.864625),
        "O5'": (3, 0.503097, 1.336331, 0.000002),
        "P": (4, 0.814429, 1.374324, 0.000002), "OP1": (4, 0.568883, 2.061261, 0.481115),
        "OP2": (4, 1.672007, 1.409980, 0.122345),
    },
    "U": {
        "C4'": (0, -1.350570, 1.894768, 0.0), "C1'": (0, 0.0, 0.0, 0.0), "N1": (0, 1.520579, -0.000001, 0.0),
        "C2": (1, 0.638019, 1.227940, 0.000004), "O2": (1, 0.076077, 2.277670, -0.006829),
        "N3": (1, 1.961198, 1.192599, 0.008837), "C4": (1, 2.696898, 0.071705, 0.015805),
        "O4": (1, 3.877673, 0.187693, 0.027359), "C5": (1, 1.967988, -1.162564, 0.010670),
        "C6": (1, 0.675351, -1.159303, 0.003821),
        "C5'": (2, 1.039819, 1.089789, -0.000002), "C2'": (2, -1.876250, -0.753623, -1.160505),
        "C3'": (2, -0.471871, -0.422424, -1.376286), "O4'": (2, -1.186856, 0.459930, 0.660486),
        "O2'": (2, -2.018161, -1.969474, -0.928107), "O3'": (2, 0.226097, -1.493296, -1.840805),
        "O5'": (3, 0.501982, 1.337641, 0.0),
        "P": (4, 0.816116, 1.371327, 0.000005), "OP1": (4, 0.539718, 2.076826, 0.553216),
        "OP2": (4, 1.746668, 1.365949, 0.098877),
    },
    "C": {
        "C4'": (0, -1.317305, 1.922806, 0.0), "C1'": (0, 0.0, 0.0, 0.0), "N1": (0, 1.478102, -0.000001, 0.0),
        "C2": (1, 0.664963, 1.227037, -0.000001), "O2": (1, 0.012728, 2.274666, -0.004938),
        "N3": (1, 2.019217, 1.239853, 0.004528), "C4": (1, 2.703047, 0.095194, 0.007302),
        "N4": (1, 4.032683, 0.156398, 0.015365), "C5": (1, 2.045381, -1.169470, 0.005066),
        "C6": (1, 0.704879, -1.170234, 0.001044),
        "C5'": (2, 1.069742, 1.064466, -0.000001), "C2'": (2, -1.871240, -0.862669, -1.112873),
        "C3'": (2, -0.471328, -0.429849, -1.368867), "O4'": (2, -1.185353, 0.488814, 0.640954),
        "O2'": (2, -1.924026, -2.126406, -0.733156), "O3'": (2, 0.305207, -1.461927, -1.871044),
        "O5'": (3, 0.506114, 1.336065, 0.0),
        "P": (4, 0.820772, 1.369937, 0.000001), "OP1": (4, 0.471030, 2.122183, 0.580409),
        "OP2": (4, 1.828789, 1.318792, 0.142234),
    },
}  # fmt: skip
_PARENT = (0, 0, 0, 2, 3)  # parent group of groups 0..4 (group 0: the frame itself)


def _frame_np(a0, a1, a2):
    """Group frame of a quad's first three atoms, numpy: origin ``a2``, x along ``a1 -> a2``,
    ``a0`` in the xy plane (``y > 0``); ``R`` (axes as columns), ``t``."""
    R, t = rigid_from_three_points(*(torch.as_tensor(a, dtype=torch.float64) for a in (a0, a2, 2 * a2 - a1)))
    return R.numpy(), t.numpy()


def _local_table(name: str) -> dict:
    """``{atom: (group, local xyz)}`` of a residue type (DNA: its RNA base's, with DT's C7)."""
    table = {a: (g, np.array(p)) for a, (g, *p) in _LOCAL[_RNA_OF[name]].items()}
    if name == "DT":
        c4, c5, c6 = (table[a][1] for a in ("C4", "C5", "C6"))
        out = -((c4 - c5) / np.linalg.norm(c4 - c5) + (c6 - c5) / np.linalg.norm(c6 - c5))
        table["C7"] = (1, c5 + 1.50 * out / np.linalg.norm(out))
    return table


@functools.lru_cache(maxsize=1)
def _tables():
    """Per type ``(8, ...)``: local coordinates ``(8, 23, 3)``, group ``(8, 23)`` and mask of each
    slot, the torsion quads' slots ``(8, 4, 4)``, and each group's fixed offset from its parent at
    zero torsion, ``(8, 5, 3, 3)`` and ``(8, 5, 3)`` (group 0: identity)."""
    T = len(NUCLEIC_RESTYPES)
    local, group, mask = (
        np.zeros((T, N_SLOTS, 3)),
        np.zeros((T, N_SLOTS), np.int64),
        np.zeros((T, N_SLOTS), bool),
    )
    quads = np.zeros((T, 4, 4), np.int64)
    off_R, off_t = np.tile(np.eye(3), (T, 5, 1, 1)), np.zeros((T, 5, 3))
    for r, name in enumerate(NUCLEIC_RESTYPES):
        names, table = NUCLEIC_ATOM_NAMES[name], _local_table(name)
        slot = {a: k for k, a in enumerate(names) if a}
        for a, k in slot.items():
            group[r, k], local[r, k], mask[r, k] = table[a][0], table[a][1], True
        quads[r] = [[slot[a] for a in q] for q in NUCLEIC_TORSION_ATOMS[name]]
        # every group's frame at zero torsion, in the nucleotide frame (RhoFold's trans_dict_init)
        frames = [(np.eye(3), np.zeros(3))]
        placed = {a: p for a, (g, p) in table.items() if g == 0}
        for g, q in enumerate(NUCLEIC_TORSION_ATOMS[name], start=1):
            R, t = _frame_np(*(placed[a] for a in q[:3]))
            frames.append((R, t))
            placed.update({a: R @ p + t for a, (h, p) in table.items() if h == g})
            Rp, tp = frames[_PARENT[g]]
            off_R[r, g], off_t[r, g] = Rp.T @ R, Rp.T @ (t - tp)
    return local, group, mask, quads, off_R, off_t


@functools.lru_cache(maxsize=16)
def _tensors(dtype, device):
    """:func:`_tables` as tensors on a device, copied once."""
    return tuple(
        torch.as_tensor(x, device=device, dtype=dtype if x.dtype == np.float64 else None) for x in _tables()
    )


def _restype(restype, shape, device) -> torch.Tensor:
    aa = torch.as_tensor(restype, device=device).long()
    try:
        return aa.expand(shape)
    except RuntimeError as err:
        raise ValueError(
            f"restype of shape {tuple(aa.shape)} does not broadcast to the residues' {tuple(shape)}"
        ) from err


def _check_pos(pos, who: str) -> None:
    if not isinstance(pos, torch.Tensor):
        raise TypeError(f"{who}: positions must be a torch.Tensor, got {type(pos).__name__}")
    if pos.ndim < 3 or pos.shape[-2:] != (N_SLOTS, 3):
        raise ValueError(f"{who}: positions must have shape (..., L, {N_SLOTS}, 3), got {tuple(pos.shape)}")


def nucleotide_positions(c):
    """The nucleotides of a structure in the slot layout, modified ones as their parent.

    Args:
        c: a :class:`~zmat.structure.complex.Complex` (``zmat.protein.from_pdb`` of a file with
            DNA or RNA). A modified nucleotide in a chain (5MU, PSU, OMC, 2MG: ``c.res_types``, its
            CCD parent) takes its parent's slots, its atoms under their parent's names
            (``zmat/structure/modified.py``: pseudouridine's ``C5`` in the ``N1`` slot); its atoms
            beyond its parent's (methyls, 2'-O-methyl, wybutosine's side chain) are left out.

    Returns:
        ``pos`` ``(L, 23, 3)`` (0 where absent), ``mask`` ``(L, 23)`` bool, ``restype`` ``(L,)``
        int64 (:data:`NUCLEIC_RESTYPES` order, a modified one its parent's) and ``residue``
        ``(L,)``: each one's residue index in ``c``. Hydrogens and a 5' phosphate's ``OP3`` are not
        in RhoFold's layout and are left out; any other atom of a standard nucleotide that the
        layout lacks raises ``ValueError``.
    """
    names, types = [str(n) for n in c.res_names], [str(n) for n in c.res_types]
    keep = [i for i, n in enumerate(types) if n in NUCLEIC_RESTYPES]
    pos = torch.zeros(len(keep), N_SLOTS, 3, dtype=c.xyz.dtype)
    mask = torch.zeros(len(keep), N_SLOTS, dtype=torch.bool)
    row = {r: k for k, r in enumerate(keep)}
    res = c.residue_index.tolist()
    for a, (i, name) in enumerate(zip(res, c.atom_names, strict=True)):
        if i not in row:
            continue
        slots = NUCLEIC_ATOM_NAMES[types[i]]
        modified = names[i] != types[i]
        if modified:  # its own atoms beyond its parent's: not in the layout
            if name not in parent_atoms(names[i]):
                continue
            name = parent_name(names[i], name)
        if name not in slots:
            if not name.startswith("H") and name != "OP3":  # hydrogens, 5' OP3: not modelled
                raise ValueError(
                    f"nucleotide_positions: residue {i} ({names[i]}) has atom {name!r} not in its slots"
                )
            continue
        k = slots.index(name)
        pos[row[i], k], mask[row[i], k] = c.xyz[a], True
    restype = torch.tensor([NUCLEIC_RESTYPES.index(types[i]) for i in keep], dtype=torch.long)
    return pos, mask, restype, torch.tensor(keep, dtype=torch.long)


def nucleotide_frames(pos: torch.Tensor):
    """Nucleotide frames of positions: ``rigid_from_three_points(C4', C1', N)``.

    Args:
        pos: ``(..., L, 23, 3)`` in the slot layout (``C4', C1', N`` in slots 0, 1, 2).

    Returns:
        ``R`` ``(..., L, 3, 3)`` (axes as columns) and ``t`` ``(..., L, 3)`` (``C1'``); finite for
        absent (zero) atoms.
    """
    _check_pos(pos, "nucleotide_frames")
    return rigid_from_three_points(pos[..., 0, :], pos[..., 1, :], pos[..., 2, :])


def nucleotide_torsions(pos: torch.Tensor, restype, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The four torsions (radians, IUPAC sign) of each nucleotide, as dihedrals of its quads.

    Args:
        pos: ``(..., L, 23, 3)``; restype: ``(L,)`` or ``(..., L)`` (read on the device).
        mask: optional ``(..., L, 23)`` bool; a torsion with an absent atom is NaN.

    Returns:
        ``(..., L, 4)``, differentiable in ``pos``.
    """
    _check_pos(pos, "nucleotide_torsions")
    quads = _tensors(pos.dtype, pos.device)[3][
        _restype(restype, pos.shape[:-2], pos.device)
    ]  # (..., L, 4, 4)
    p = torch.gather(
        pos[..., None, :, :].expand(*quads.shape[:-1], N_SLOTS, 3),
        -2,
        quads[..., None].expand(*quads.shape, 3),
    )
    p0, p1, p2, p3 = p.unbind(-2)
    tor = dihedral_from_bonds(p1 - p0, p2 - p1, p3 - p2)
    if mask is None:
        return tor
    present = torch.gather(mask[..., None, :].expand(*quads.shape[:-1], N_SLOTS), -1, quads).all(-1)
    return torch.where(present, tor, torch.nan)


def _rot_x(angle: torch.Tensor) -> torch.Tensor:
    """``(..., 3, 3)`` rotations by ``angle`` about x."""
    c, s = torch.cos(angle), torch.sin(angle)
    one, zero = torch.ones_like(c), torch.zeros_like(c)
    return torch.stack([one, zero, zero, zero, c, -s, zero, s, c], -1).unflatten(-1, (3, 3))


def nucleotide_atoms_from_frames(R: torch.Tensor, t: torch.Tensor, restype, torsions: torch.Tensor):
    """Every heavy atom of each nucleotide from its frame and four torsions (RhoFold's geometry).

    Args:
        R, t: ``(..., L, 3, 3)``, ``(..., L, 3)`` nucleotide frames (:func:`nucleotide_frames`).
        restype: ``(L,)`` or ``(..., L)`` int, :data:`NUCLEIC_RESTYPES` order.
        torsions: ``(..., L, 4)`` radians (:func:`nucleotide_torsions`); NaN means "not given":
            :data:`DEFAULT_TORSIONS` there, with a zero gradient.

    Returns:
        ``(..., L, 23, 3)`` positions (0 in empty slots) and the ``(..., L, 23)`` bool mask of the
        types' atoms; differentiable in ``R``, ``t`` and ``torsions``. No host sync.
    """
    if torsions.shape[-1] != 4 or torsions.shape[:-1] != t.shape[:-1] or R.shape[:-2] != t.shape[:-1]:
        raise ValueError(
            f"nucleotide_atoms_from_frames: R {tuple(R.shape)}, t {tuple(t.shape)} and torsions "
            f"{tuple(torsions.shape)} must be (..., L, 3, 3), (..., L, 3) and (..., L, 4)"
        )
    local, group, mask, _, off_R, off_t = _tensors(t.dtype, t.device)
    aa = _restype(restype, t.shape[:-1], t.device)
    default = torch.tensor(DEFAULT_TORSIONS, dtype=t.dtype, device=t.device)
    tor = torch.where(torch.isnan(torsions), default, torsions)
    spin = _rot_x(tor)
    oR, ot = off_R[aa], off_t[aa]  # (..., L, 5, 3, 3), (..., L, 5, 3)
    frames = [(R, t)]
    for g in range(1, 5):  # group g = parent . offset . rotation about x by torsion g - 1
        Rp, tp = frames[_PARENT[g]]
        Rg = Rp @ oR[..., g, :, :]
        frames.append((Rg @ spin[..., g - 1, :, :], tp + (Rp @ ot[..., g, :, None])[..., 0]))
    Rs, ts = torch.stack([f[0] for f in frames], -3), torch.stack([f[1] for f in frames], -2)
    g = group[aa]  # (..., L, 23)
    Ra = torch.gather(Rs, -3, g[..., None, None].expand(*g.shape, 3, 3))
    ta = torch.gather(ts, -2, g[..., None].expand(*g.shape, 3))
    pos = (Ra @ local[aa][..., None])[..., 0] + ta
    m = mask[aa]
    return torch.where(m[..., None], pos, torch.zeros((), dtype=t.dtype, device=t.device)), m
