"""AlphaFold's structural violation losses (supplement 1.9.11), batched, in torch.

Definitions are AlphaFold's (``all_atom.between_residue_bond_loss``,
``between_residue_clash_loss``, ``within_residue_violations``,
``extreme_ca_ca_distance_violations`` and ``folding.find_structural_violations``
/ ``compute_violation_metrics`` / ``structural_violation_loss``), with the same
epsilons, so values agree with AlphaFold's on the same inputs
(``tests/test_violations.py`` compares with AlphaFold's own outputs):

* **peptide bond** C(i)-N(i+1): length ``l`` against 1.329 +- 0.014 A (1.341 +-
  0.016 before a proline); angles CA-C-N and C-N-CA through their cosines
  against -0.4473 +- 0.0311 and -0.5203 +- 0.0353. Per pair of consecutive
  residues (``residue_index`` differing by exactly 1) the loss is
  ``relu(sqrt(1e-6 + (x - mean)**2) - tolerance_factor * std)``, averaged over
  the pairs where the atoms exist; a pair violates where the error exceeds
  ``tolerance_factor * std``.
* **between-residue clashes**: atoms of different residues closer than
  ``r_i + r_j - 1.5`` A (AlphaFold's radii C 1.7, N 1.55, O 1.52, S 1.8), the
  C(i)-N(i+1) bond excluded, penalised by ``relu(r_i + r_j - 1.5 - d)``. This
  is ``zmat.clash_loss`` with ``kind="flat_bottom"``, on a pair list from its
  neighbour search (``clash_pairs``), so it scales to long chains; the mean is
  over every existing pair of atoms of different residues, as AlphaFold's.
  As in AlphaFold, pairs of atom14 slot 5 (CYS SG, so disulfides) are excluded
  for every residue type.
* **within-residue**: every pair of atoms of a residue kept within
  ``[lower, upper]`` from AlphaFold's stereochemical table (``_stereo.py``):
  bonds and the 1-3 distances of bond angles at ``mean +- tolerance_factor *
  std``, other pairs above ``r_i + r_j - 1.5``.

Positions are atom37 ``(..., L, 37, 3)`` (converted to atom14 inside) with any
leading batch dimensions; padding residues (mask 0) take no part, so ragged
batches can be padded batches; or flat, ``(L, 37, 3)`` with ``ptr=`` /
``batch=`` (PyTorch Geometric's layout): one call, per-structure values, the
same as one call per structure, no host sync.

Two published versions: the default follows AlphaFold's 2025 fix of the
CA-C-N angle term (its tolerance is ``tolerance_factor`` times that cosine's
own std); ``openfold_compatible=True`` reproduces OpenFold and AlphaFold <= 2.3,
which take the C-N bond length's std there, and OpenFold's ``masked_mean``
in the metrics (``tests/test_violations.py`` compares with OpenFold's own
functions). OpenFold pools the clash mean (and the clash part of the loss)
over a batch; zmat reports each structure's.

Threads: on the CPU, with a pair list (``pairs=``, the training path) and a
padded batch, the terms are computed by numpy (forward and first backward,
the clash sum by ``clash_loss``'s serial path), so no torch op opens a
parallel region, which would wait for a core another process holds. The
thread setting is left alone; double backward recomputes by torch.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from .._segments import on_host, per_row_t, segments
from .._segments import ptr as segment_ptr
from .._serial import serial
from ..clash import candidate_pairs, clash_loss
from . import _stereo
from .atom37 import (
    ATOM14_NAMES,
    ATOM37_RADIUS,
    RESTYPE_3,
    RESTYPE_ATOM14_TO_ATOM37,
    VAN_DER_WAALS_RADIUS,
    atom37_to_atom14,
)

__all__ = [
    "between_residue_bond_loss",
    "between_residue_clash_loss",
    "clash_pairs",
    "extreme_ca_ca_distance_violations",
    "residue_distance_bounds",
    "structural_violations",
    "within_residue_violations",
]

#: AlphaFold's peptide-bond statistics (``residue_constants``): C-N length
#: (trans, before proline) and its std, cosines of CA-C-N and C-N-CA with std.
C_N_LENGTH, C_N_STDDEV = (1.329, 1.341), (0.014, 0.016)
COS_CA_C_N, COS_C_N_CA = (-0.4473, 0.0311), (-0.5203, 0.0353)
#: AlphaFold's CA-CA distance of a trans peptide (``residue_constants.ca_ca``).
CA_CA = 3.80209737096
_PRO = RESTYPE_3.index("PRO")
_SG_SLOT = ATOM14_NAMES["CYS"].index("SG")


def _sum(x, seg=None, count=None):
    """Sum over the last axis, per structure: ``(...)``, or ``(..., count)`` in a ragged
    batch (``seg``: the structure of each entry, on the device)."""
    if seg is None:
        return x.sum(-1)
    return x.new_zeros(*x.shape[:-1], count).index_add(-1, seg, x)


def _pairs_mean(mask, value, eps, seg=None, count=None):
    return _sum(mask * value, seg, count) / (_sum(mask, seg, count) + eps)


def _consecutive(residue_index, seg, dtype):
    """``(..., L - 1)``: residues k and k + 1 are bonded neighbours (numbers differ by
    exactly 1, and the same structure of a ragged batch)."""
    ri = residue_index.to(dtype)
    ok = (ri[..., 1:] - ri[..., :-1]) == 1.0
    if seg is not None:
        ok = ok & (seg[1:] == seg[:-1])
    return ok


def _pad_both(x: torch.Tensor, reduce):
    """Per residue from per consecutive pair: combine pair k-1 and pair k."""
    z = x.new_zeros(*x.shape[:-1], 1)  # not zeros_like(x[..., :1]): one residue has no pair
    return reduce(torch.cat([x, z], -1), torch.cat([z, x], -1))


def between_residue_bond_loss(
    pos, mask, residue_index, aatype, tolerance_factor_soft=12.0, tolerance_factor_hard=12.0,
    openfold_compatible=False, seg=None, count=None,
):  # fmt: skip
    """Peptide-bond length and angle losses (AlphaFold's ``between_residue_bond_loss``).

    Args:
        pos: ``(..., L, A, 3)`` with N, CA, C in columns 0, 1, 2 (atom14 or atom37).
        mask: ``(..., L, A)`` atom mask.
        residue_index: ``(..., L)`` residue numbers (gaps break the chain).
        aatype: ``(..., L)`` residue types (``RESTYPES`` order).
        openfold_compatible: the CA-C-N term's tolerance is ``tolerance_factor *
            0.014`` (the C-N bond length's std), as in OpenFold and AlphaFold <= 2.3,
            instead of the CA-C-N cosine's own std 0.0311 (AlphaFold's fix).
        seg, count: ragged batch (flat ``L``): ``(L,)`` structure of each residue
            and the number of structures; the means are then per structure.

    Returns:
        dict: ``c_n_loss_mean``, ``ca_c_n_loss_mean``, ``c_n_ca_loss_mean``
        ``(...)`` (ragged: ``(count,)``); ``per_residue_loss_sum``,
        ``per_residue_violation_mask`` ``(..., L)``.
    """
    eps = 1e-6
    m = mask.to(pos.dtype)
    ca, c, n_next, ca_next = pos[..., :-1, 1, :], pos[..., :-1, 2, :], pos[..., 1:, 0, :], pos[..., 1:, 1, :]
    m_ca, m_c, m_n, m_ca_next = m[..., :-1, 1], m[..., :-1, 2], m[..., 1:, 0], m[..., 1:, 1]
    ri = torch.as_tensor(residue_index, device=pos.device)
    no_gap = _consecutive(ri, seg, pos.dtype).to(pos.dtype)
    pro = (torch.as_tensor(aatype, device=pos.device)[..., 1:] == _PRO).to(pos.dtype)
    ca_c_n_std = C_N_STDDEV[0] if openfold_compatible else COS_CA_C_N[1]
    pair_seg = None if seg is None else seg[:-1]

    def length(a, b):
        return torch.sqrt(eps + ((a - b) ** 2).sum(-1))

    c_n = length(c, n_next)
    ca_c, n_ca = length(ca, c), length(n_next, ca_next)
    u_c_ca = (ca - c) / ca_c[..., None]
    u_c_n = (n_next - c) / c_n[..., None]
    u_n_ca = (ca_next - n_next) / n_ca[..., None]
    terms = [
        (c_n, C_N_LENGTH[0] + pro * (C_N_LENGTH[1] - C_N_LENGTH[0]),
         C_N_STDDEV[0] + pro * (C_N_STDDEV[1] - C_N_STDDEV[0]), m_c * m_n),
        ((u_c_ca * u_c_n).sum(-1), COS_CA_C_N[0], ca_c_n_std, m_ca * m_c * m_n),
        ((-u_c_n * u_n_ca).sum(-1), COS_C_N_CA[0], COS_C_N_CA[1], m_c * m_n * m_ca_next),
    ]  # fmt: skip
    out, per_pair, violation = {}, 0.0, torch.zeros_like(c_n)
    for key, (x, mean, std, pm) in zip(("c_n", "ca_c_n", "c_n_ca"), terms, strict=True):
        pm = pm * no_gap
        err = torch.sqrt(eps + (x - mean) ** 2)
        loss = torch.relu(err - tolerance_factor_soft * std)
        out[f"{key}_loss_mean"] = _pairs_mean(pm, loss, eps, pair_seg, count)
        per_pair = per_pair + loss
        violation = torch.maximum(violation, pm * (err > tolerance_factor_hard * std).to(pos.dtype))
    if seg is not None:  # as each structure alone: no pair across a boundary
        per_pair = per_pair * (seg[1:] == seg[:-1]).to(pos.dtype)
    out["per_residue_loss_sum"] = 0.5 * _pad_both(per_pair, torch.add)
    out["per_residue_violation_mask"] = _pad_both(violation, torch.maximum)
    return out


def extreme_ca_ca_distance_violations(pos, mask, residue_index, max_angstrom_tolerance=1.5, eps=1e-10,
                                      seg=None, count=None):  # fmt: skip
    """Fraction of consecutive CA pairs more than ``max_angstrom_tolerance`` beyond
    ``CA_CA`` (AlphaFold's metric; OpenFold's mean takes ``eps=1e-4``); ``(...)``."""
    ca = pos[..., 1, :]
    d = torch.sqrt(1e-6 + ((ca[..., :-1, :] - ca[..., 1:, :]) ** 2).sum(-1))
    ri = torch.as_tensor(residue_index, device=pos.device)
    m = mask[..., 1].to(pos.dtype)
    pm = m[..., :-1] * m[..., 1:] * _consecutive(ri, seg, pos.dtype).to(pos.dtype)
    bad = (d - CA_CA > max_angstrom_tolerance).to(pos.dtype)
    return _pairs_mean(pm, bad, eps, None if seg is None else seg[:-1], count)


# ------------------------------------------------------------ within residue
def _parse(text: str):
    rows = {}
    for line in text.strip().splitlines():
        atoms, res, mean, std = line.split()
        rows.setdefault(res, []).append((atoms.split("-"), float(mean), float(std)))
    return rows


@functools.lru_cache(maxsize=8)
def residue_distance_bounds(overlap_tolerance: float = 1.5, bond_length_tolerance_factor: float = 12.0):
    """AlphaFold's within-residue distance bounds (``make_atom14_dists_bounds``).

    Bonds of the stereochemical table bound their length to ``mean +- factor *
    std``; a bond angle a-b-c bounds the 1-3 distance ``|a - c|`` (law of
    cosines on the tabulated bond lengths) with a std propagated to first
    order from the independent errors of both bonds and the angle; other
    pairs are bounded below by ``r_a + r_b - overlap_tolerance`` and above by
    1e10 (the diagonal stays 0).

    Returns:
        ``lower``, ``upper`` numpy arrays ``(21, 14, 14)`` (zeros for unknown).
    """
    bonds, angles = _parse(_stereo.BONDS), _parse(_stereo.ANGLES)
    lower, upper = np.zeros((21, 14, 14)), np.zeros((21, 14, 14))
    for r, name in enumerate(RESTYPE_3[:20]):
        atoms = ATOM14_NAMES[name]
        radius = np.array([VAN_DER_WAALS_RADIUS[a[0]] for a in atoms])
        k = len(atoms)
        lower[r, :k, :k] = radius[:, None] + radius[None, :] - overlap_tolerance
        upper[r, :k, :k] = 1e10
        lower[r, range(k), range(k)] = upper[r, range(k), range(k)] = 0.0  # AlphaFold leaves the diagonal 0
        length = {frozenset(ab): mean for ab, mean, _ in bonds.get(name, [])}
        limits = [(ab, mean, std) for ab, mean, std in bonds.get(name, [])]
        std_of = {frozenset(ab): std for ab, _, std in bonds.get(name, [])}
        for (a, b, c), deg, std_deg in angles.get(name, []):
            k1, k2 = frozenset((a, b)), frozenset((b, c))
            b1, b2, g = length[k1], length[k2], math.radians(deg)
            d = math.sqrt(b1 * b1 + b2 * b2 - 2 * b1 * b2 * math.cos(g))
            # first-order propagation of independent errors in b1, b2 and the angle
            grad = ((b1 - b2 * math.cos(g)) / d, (b2 - b1 * math.cos(g)) / d, b1 * b2 * math.sin(g) / d)
            sig = (std_of[k1], std_of[k2], math.radians(std_deg))
            limits.append(((a, c), d, math.sqrt(sum((x * y) ** 2 for x, y in zip(grad, sig, strict=True)))))
        for (a, b), mean, std in limits:
            i, j = atoms.index(a), atoms.index(b)
            lo, hi = mean - bond_length_tolerance_factor * std, mean + bond_length_tolerance_factor * std
            lower[r, i, j] = lower[r, j, i] = lo
            upper[r, i, j] = upper[r, j, i] = hi
    return lower, upper


_I, _J = np.triu_indices(14, 1)  # the 91 atom pairs of a residue (bounds are symmetric)


@functools.lru_cache(maxsize=16)
def _pair_bounds(overlap_tolerance, factor, dtype, device):
    """:func:`residue_distance_bounds` on the 91 pairs, ``(21, 91)`` tensors, one copy per device."""
    return tuple(
        torch.as_tensor(b[:, _I, _J], dtype=dtype, device=device)
        for b in residue_distance_bounds(overlap_tolerance, factor)
    )


def within_residue_violations(pos14, exists14, lower, upper, tighten_bounds_for_loss=0.0):
    """Within-residue bound violations (AlphaFold's ``within_residue_violations``).

    Args:
        pos14: ``(..., L, 14, 3)``; exists14 ``(..., L, 14)``; lower, upper
            ``(..., L, 14, 14)`` symmetric bounds (``residue_distance_bounds()[k][aatype]``).

    Returns:
        dict: ``per_atom_loss_sum`` and ``per_atom_violations`` ``(..., L, 14)``.
    """
    return _within(pos14, exists14, lower[..., _I, _J], upper[..., _I, _J], tighten_bounds_for_loss)


def _within(pos14, exists14, lower, upper, tighten=0.0):
    """:func:`within_residue_violations` on the 91 pairs ``i < j`` (``(..., L, 91)``
    bounds): half the work of the dense 14 x 14 form, same values."""
    i, j = (torch.as_tensor(x, device=pos14.device) for x in (_I, _J))
    e = exists14.to(pos14.dtype)
    pm = e[..., i] * e[..., j]
    d = torch.sqrt(1e-10 + ((pos14[..., i, :] - pos14[..., j, :]) ** 2).sum(-1))
    loss = pm * (torch.relu(lower + tighten - d) + torch.relu(d - (upper - tighten)))
    bad = pm * ((d < lower) | (d > upper)).to(pos14.dtype)
    ij = torch.cat([i, j])
    zero = torch.zeros_like(e)
    # AlphaFold sums the symmetric 14 x 14 loss over both axes: each pair counts twice per atom
    per_atom = 2 * zero.index_add(-1, ij, torch.cat([loss, loss], -1))
    worst = zero.scatter_reduce(-1, ij.expand(*bad.shape[:-1], -1), torch.cat([bad, bad], -1), "amax")
    return {"per_atom_loss_sum": per_atom, "per_atom_violations": worst}


# ------------------------------------------------------------ between residues
def _radii14(aatype, exists14, dtype):
    idx = torch.as_tensor(RESTYPE_ATOM14_TO_ATOM37, device=exists14.device)[aatype.long().clamp(0, 20)]
    r = torch.as_tensor(ATOM37_RADIUS, dtype=dtype, device=exists14.device)[idx.clamp(min=0)]
    return r * exists14.to(dtype)


def _atom_segments(seg, L: int):
    """Atom-level ``ptr``/``batch`` for ``clash_loss`` from a ragged batch's residues
    (14 atom14 slots a residue); None for a padded batch."""
    if seg is None:
        return {}
    out = {"batch": per_row_t(seg.index, 14, 14 * L)}
    if seg.starts is not None:
        out["ptr"] = 14 * torch.cat([seg.starts, seg.starts.new_full((1,), L)])
    return out


def clash_pairs(pos14, exists14, aatype, residue_index, overlap_tolerance=1.5, skin=0.0, memory_budget=None,
                ptr=None, batch=None):  # fmt: skip
    """Candidate pairs of AlphaFold's between-residue clash, for ``pairs=``.

    ``zmat.clash.candidate_pairs`` (cell list) on the flattened atom14 atoms,
    minus pairs within a residue, pairs of equal residue number, the peptide
    bond C(i)-N(i+1) and (as AlphaFold) slot-5/slot-5 pairs. With ``skin > 0``
    the list stays valid while atoms move less than ``skin / 2``, so one
    search serves many steps. Synchronises with the device (a data-dependent
    number of pairs). ``memory_budget``: as ``candidate_pairs`` (the list, 16
    bytes a pair, may not exceed it). ``ptr``/``batch``: a ragged batch of
    residues, as :func:`structural_violations`.

    Returns:
        ``(P, 2)`` int64 indices into ``pos14.reshape(-1, 3)``.
    """
    L = pos14.shape[-3]
    x = pos14.detach().flatten(-3, -2)
    radii = _radii14(torch.as_tensor(aatype, device=pos14.device), exists14, pos14.dtype).flatten(-2)
    seg = (
        None
        if ptr is None and batch is None
        else segments(ptr, batch, L, pos14.device, "clash_pairs", "pos14")
    )
    pairs = candidate_pairs(
        x, radii, mask=exists14.bool().flatten(-2), tolerance=overlap_tolerance, skin=skin,
        memory_budget=memory_budget, **_atom_segments(seg, L),
    )  # fmt: skip
    n = 14 * L
    ri = torch.as_tensor(residue_index, device=pos14.device).expand(pos14.shape[:-2]).reshape(-1, L)
    b, a = pairs // n, pairs % n
    res, slot = a // 14, a % 14
    num = ri[b, res]  # residue numbers of both atoms
    lo = torch.where(num[:, :1] <= num[:, 1:], 0, 1)  # column of the lower-numbered residue
    s_lo, s_hi = slot.gather(1, lo).squeeze(1), slot.gather(1, 1 - lo).squeeze(1)
    n_lo, n_hi = num.gather(1, lo).squeeze(1), num.gather(1, 1 - lo).squeeze(1)
    peptide = (n_lo + 1 == n_hi) & (s_lo == 2) & (s_hi == 0)
    keep = (n_lo != n_hi) & ~peptide & ~((slot[:, 0] == _SG_SLOT) & (slot[:, 1] == _SG_SLOT))
    return pairs[keep]  # boolean indexing: syncs, as the search itself


def _n_between_pairs(exists14, residue_index, seg=None, count=None):
    """Number of pairs in AlphaFold's clash mask (no pair list needed): pairs of
    existing atoms of different residues, minus peptide bonds and slot-5 pairs."""
    e = exists14.to(torch.float64)
    per_res = e.sum(-1)
    n = _sum(per_res, seg, count)
    ri = torch.as_tensor(residue_index, device=e.device)
    consecutive = _consecutive(ri, seg, e.dtype)
    bonds = _sum(e[..., :-1, 2] * e[..., 1:, 0] * consecutive, None if seg is None else seg[:-1], count)
    sg = _sum(e[..., _SG_SLOT], seg, count)
    return 0.5 * (n * n - _sum(per_res * per_res, seg, count)) - bonds - 0.5 * sg * (sg - 1)


def between_residue_clash_loss(pos14, exists14, aatype, residue_index, overlap_tolerance_soft=1.5,
                               overlap_tolerance_hard=1.5, pairs=None, seg=None):  # fmt: skip
    """Between-residue clashes (AlphaFold's ``between_residue_clash_loss``) on ``zmat.clash_loss``.

    Args:
        pos14: ``(..., L, 14, 3)``; exists14 ``(..., L, 14)``; aatype, residue_index ``(..., L)``.
        pairs: optional list from :func:`clash_pairs` (default: searched now,
            with ``overlap_tolerance = min(soft, hard)``).
        seg: ragged batch (flat ``L``): the ``Segments`` of the residues.

    Returns:
        dict: ``mean_loss`` ``(...)`` (differentiable, through ``clash_loss``;
        ragged: one per structure), ``per_atom_loss_sum`` and
        ``per_atom_clash_mask`` ``(..., L, 14)`` (per-atom diagnostics, same
        values as AlphaFold's; not differentiated). The mean is per structure;
        OpenFold's pools it over a batch (sum over the batch / pairs of the batch).
    """
    aatype = torch.as_tensor(aatype, device=pos14.device)
    L = pos14.shape[-3]
    ragged = _atom_segments(seg, L)
    if pairs is None:
        tol = min(overlap_tolerance_soft, overlap_tolerance_hard)
        pairs = clash_pairs(pos14, exists14, aatype, residue_index, overlap_tolerance=tol,
                            **({} if seg is None else {"batch": seg.index}))  # fmt: skip
    x = pos14.flatten(-3, -2)
    radii = _radii14(aatype, exists14, pos14.dtype).expand(exists14.shape).flatten(-2)
    total = clash_loss(
        x, radii, pairs=pairs, tolerance=overlap_tolerance_soft, mask=exists14.bool().flatten(-2), **ragged
    )
    with torch.no_grad():
        xf, rf = x.detach().reshape(-1, 3), radii.reshape(-1)
        i, j = pairs[:, 0], pairs[:, 1]
        d = torch.sqrt(1e-10 + ((xf[i] - xf[j]) ** 2).sum(-1))
        pen = torch.relu(rf[i] + rf[j] - overlap_tolerance_soft - d)
        hit = (d < rf[i] + rf[j] - overlap_tolerance_hard).to(xf.dtype)
        per_atom = torch.zeros_like(rf).index_add(0, i, pen).index_add(0, j, pen)
        mask = torch.zeros_like(rf).scatter_reduce(0, torch.cat([i, j]), torch.cat([hit, hit]), "amax")
    count = None if seg is None else seg.count
    n_pairs = _n_between_pairs(exists14, residue_index, None if seg is None else seg.index, count)
    return {
        "mean_loss": total / (1e-6 + n_pairs.to(total.dtype)),
        "total": total,
        "per_atom_loss_sum": per_atom.reshape(exists14.shape),
        "per_atom_clash_mask": mask.reshape(exists14.shape),
    }


# ------------------------------------------------------------------ together
def _inputs(atom37, aatype, mask, residue_index, ragged: bool):
    """Checked, broadcast inputs of :func:`structural_violations` (errors name the argument)."""
    name = "structural_violations"
    if not isinstance(atom37, torch.Tensor) or atom37.ndim < 3 or atom37.shape[-2:] != (37, 3):
        raise ValueError(
            f"{name}: atom37 must have shape (..., L, 37, 3), got {tuple(getattr(atom37, 'shape', ()))}"
        )
    shape, dev = atom37.shape[:-2], atom37.device
    if shape[-1] == 0:
        raise ValueError(f"{name}: atom37 has no residues (shape {tuple(atom37.shape)}, L = 0)")
    if ragged and atom37.ndim != 3:
        raise ValueError(f"{name}: with ptr/batch, atom37 must be flat (L, 37, 3), got {tuple(atom37.shape)}")
    if residue_index is None:
        residue_index = torch.arange(shape[-1], device=dev)
    out = []
    for arg, value, want in (("aatype", aatype, shape), ("mask", mask, atom37.shape[:-1]),
                             ("residue_index", residue_index, shape)):  # fmt: skip
        t = value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
        if not _broadcasts(t.shape, want):
            tail = "(..., L, 37)" if arg == "mask" else "(L,) or (..., L)"
            raise ValueError(
                f"{name}: {arg} of shape {tuple(t.shape)} does not match atom37 of shape "
                f"{tuple(atom37.shape)}; expected {tail} with L = {shape[-1]}"
            )
        out.append(t.to(dev).expand(want))
    aatype, mask, residue_index = out
    if aatype.dtype.is_floating_point or aatype.dtype == torch.bool:
        raise TypeError(f"{name}: aatype must hold integers, got {aatype.dtype}")
    aatype = aatype.long()
    if on_host(aatype) and aatype.numel():  # host memory: checking it involves no device
        host = aatype.reshape(-1, shape[-1]).numpy()
        bad = ((host < 0) | (host > 20)).any(0)
        if bad.any():
            k = int(np.argmax(bad))
            raise ValueError(
                f"{name}: aatype must lie in [0, 20] (AlphaFold's order, 20 = unknown); residue {k} "
                f"has {sorted(set(host[:, k].tolist()))}"
            )
    else:  # on a device (no sync to check): out-of-range types are unknown (20) in every term
        aatype = torch.where((aatype < 0) | (aatype > 20), 20, aatype)
    return aatype, mask.bool(), residue_index


def _broadcasts(a, b) -> bool:
    """Whether shape ``a`` (at least the trailing dims of ``b``) expands to ``b``."""
    if len(a) < (2 if len(b) > 1 and b[-1] == 37 else 1) or len(a) > len(b):
        return False
    return all(x == y or x == 1 for x, y in zip(a[::-1], b[::-1], strict=False)) and a[-1] == b[-1]


def structural_violations(atom37, aatype, mask, residue_index=None, tolerance_factor=12.0,
                          clash_overlap_tolerance=1.5, pairs=None, openfold_compatible=False,
                          ptr=None, batch=None) -> dict[str, torch.Tensor]:  # fmt: skip
    """All of AlphaFold's structural violations, metrics and loss, batched.

    ``find_structural_violations`` + ``compute_violation_metrics`` +
    ``structural_violation_loss`` of AlphaFold, in one flat dict. The atoms
    are those of ``mask`` (AlphaFold uses every atom of the residue type,
    which is the same for a full-atom prediction); the residue mask of the
    metrics is "has any atom", so padded residues of a ragged batch are left out.

    Two published versions: by default the CA-C-N angle term's tolerance is
    ``tolerance_factor`` times that cosine's own std (0.0311), as AlphaFold since
    its 2025 fix (commit 06a8da6). ``openfold_compatible=True`` reproduces
    OpenFold and AlphaFold <= 2.3, which take the C-N bond length's std (0.014)
    there (a tighter tolerance: ``ca_c_n_loss_mean`` is larger), and OpenFold's
    ``masked_mean`` (``eps = 1e-4``) in the metrics. Either way, the values here
    are per structure, where OpenFold pools over a batch: its
    ``clashes_mean_loss`` is the batch's clash sum over the batch's pairs, and
    its loss's clash part the batch's per-atom sums over the batch's atoms.
    For one structure the values agree.

    Args:
        atom37: ``(..., L, 37, 3)`` positions; with ``ptr``/``batch``, ``(L, 37, 3)``:
            the residues of B structures back to back.
        aatype: ``(L,)`` or ``(..., L)`` residue types (AlphaFold order, in
            ``[0, 20]``; out of range raises on the CPU, and counts as unknown (20)
            on other devices, where checking would sync).
        mask: ``(L, 37)`` or ``(..., L, 37)`` atom mask.
        residue_index: ``(..., L)`` residue numbers; default ``0..L-1`` (ragged:
            consecutive within each structure).
        tolerance_factor: AlphaFold's ``violation_tolerance_factor`` (12).
        clash_overlap_tolerance: AlphaFold's ``clash_overlap_tolerance`` (1.5 A).
        pairs: optional clash pair list from :func:`clash_pairs` (then no host sync).
        openfold_compatible: OpenFold's (and AlphaFold <= 2.3's) values, above.
        ptr, batch: a ragged batch of residues, PyTorch Geometric's way: ``ptr``
            ``(B + 1,)`` offsets, or ``batch`` ``(L,)`` the structure of each residue
            (as ``zmat.clash_loss``). No pair across two structures counts, and
            the per-structure values are ``(B,)``: the same as B calls. An unsorted
            ``batch`` (host data) is sorted (stably) first: structure ``b`` is its
            residues in input order, per-residue outputs come back in input order.
            Where both are host data, ``ptr`` and ``batch`` must agree.

    Returns:
        dict of tensors (``...`` the batch shape, or ``(B,)`` for a ragged
        batch): ``c_n_loss_mean``,
        ``ca_c_n_loss_mean``, ``c_n_ca_loss_mean``, ``clashes_mean_loss``,
        ``loss`` (AlphaFold's violation loss, differentiable) ``(...)``;
        ``connections_per_residue_loss_sum``,
        ``connections_per_residue_violation_mask``, ``per_residue_violation_mask``
        (any violation) ``(..., L)`` (the loss sum is unmasked, as AlphaFold's:
        it also counts pairs across gaps and into padding); ``clashes_per_atom_loss_sum``,
        ``clashes_per_atom_clash_mask``, ``per_atom_loss_sum``,
        ``per_atom_violations`` ``(..., L, 14)``; metrics ``(...)``:
        ``violations_extreme_ca_ca_distance``, ``violations_between_residue_bond``,
        ``violations_between_residue_clash``, ``violations_within_residue``,
        ``violations_per_residue`` (fraction of residues violating).

    Raises:
        ValueError: for an atom37 without residues, shapes of ``aatype``,
            ``mask``, ``residue_index``, ``ptr`` or ``batch`` that do not match
            atom37 (or each other), ``pairs`` with an unsorted ``batch``, or (CPU)
            an ``aatype`` out of range.

    Example:
        >>> p = zmat.protein.from_pdb("tests/data/1ubi.pdb")
        >>> pos, mask = p.to_atom37()
        >>> v = structural_violations(pos, p.aatype, mask)
        >>> rate = float(v["violations_per_residue"])  # fraction of residues violating
    """
    ragged = ptr is not None or batch is not None
    numbered = residue_index is not None
    aatype, mask, residue_index = _inputs(atom37, aatype, mask, residue_index, ragged)
    if not ragged and pairs is not None and serial(atom37):
        args = (tolerance_factor, clash_overlap_tolerance, pairs, openfold_compatible)
        return _host_violations(atom37, aatype, mask, residue_index, *args)
    dev, L = atom37.device, atom37.shape[-3]
    seg = segments(ptr, batch, L, dev, "structural_violations", "atom37") if ragged else None
    if seg is not None and seg.starts is None:  # an unsorted batch: each structure's residues in order
        if pairs is not None:
            raise ValueError("structural_violations: pairs= needs a sorted batch (residues by structure)")
        args = (tolerance_factor, clash_overlap_tolerance, None, openfold_compatible)
        return _sorted_first(seg, atom37, aatype, mask, residue_index if numbered else None, args)
    res, count = (None, None) if seg is None else (seg.index, seg.count)
    pos14, exists14 = atom37_to_atom14(atom37, aatype, mask)
    bonds = between_residue_bond_loss(
        pos14,
        exists14,
        residue_index,
        aatype,
        tolerance_factor,
        tolerance_factor,
        openfold_compatible,
        res,
        count,
    )
    clashes = between_residue_clash_loss(
        pos14, exists14, aatype, residue_index, clash_overlap_tolerance, clash_overlap_tolerance, pairs, seg
    )
    lower, upper = (
        b[aatype] for b in _pair_bounds(clash_overlap_tolerance, tolerance_factor, atom37.dtype, dev)
    )
    within = _within(pos14, exists14, lower, upper)
    clash_res = clashes["per_atom_clash_mask"].amax(-1)
    within_res = within["per_atom_violations"].amax(-1)
    per_residue = torch.maximum(torch.maximum(bonds["per_residue_violation_mask"], clash_res), within_res)
    n_atoms = _sum(exists14.to(atom37.dtype).sum(-1), res, count)
    loss = (
        bonds["c_n_loss_mean"]
        + bonds["ca_c_n_loss_mean"]
        + bonds["c_n_ca_loss_mean"]
        + (2 * clashes["total"] + _sum(within["per_atom_loss_sum"].sum(-1), res, count)) / (1e-6 + n_atoms)
    )  # sum of the per-atom clash sums = twice the pair sum; the gradient flows through clash_loss
    seq = exists14.any(-1).to(atom37.dtype)
    eps = 1e-4 if openfold_compatible else 1e-10  # OpenFold's masked_mean, AlphaFold's mask_mean
    metric = lambda v: _pairs_mean(seq, v, eps, res, count)  # noqa: E731
    return {
        "c_n_loss_mean": bonds["c_n_loss_mean"],
        "ca_c_n_loss_mean": bonds["ca_c_n_loss_mean"],
        "c_n_ca_loss_mean": bonds["c_n_ca_loss_mean"],
        "connections_per_residue_loss_sum": bonds["per_residue_loss_sum"],
        "connections_per_residue_violation_mask": bonds["per_residue_violation_mask"],
        "clashes_mean_loss": clashes["mean_loss"],
        "clashes_per_atom_loss_sum": clashes["per_atom_loss_sum"],
        "clashes_per_atom_clash_mask": clashes["per_atom_clash_mask"],
        "per_atom_loss_sum": within["per_atom_loss_sum"],
        "per_atom_violations": within["per_atom_violations"],
        "per_residue_violation_mask": per_residue,
        "violations_extreme_ca_ca_distance": extreme_ca_ca_distance_violations(
            pos14, exists14, residue_index, eps=eps, seg=res, count=count
        ),
        "violations_between_residue_bond": metric(bonds["per_residue_violation_mask"]),
        "violations_between_residue_clash": metric(clash_res),
        "violations_within_residue": metric(within_res),
        "violations_per_residue": metric(per_residue),
        "loss": loss,
    }


def _sorted_first(seg, atom37, aatype, mask, residue_index, args):
    """:func:`structural_violations` of an unsorted ragged batch (``seg``, sizes on the host): the
    residues sorted stably by structure, the per-residue and per-atom outputs put back in input
    order."""
    order = torch.sort(seg.index, stable=True).indices
    inv = torch.empty_like(order).scatter_(0, order, torch.arange(len(order), device=order.device))
    take = lambda x: None if x is None else x.index_select(0, order)  # noqa: E731
    sorted_ptr = torch.as_tensor(segment_ptr(seg.sizes))
    inputs = (take(atom37), take(aatype), take(mask), take(residue_index))
    v = structural_violations(*inputs, *args, ptr=sorted_ptr)
    per_row = lambda k: "per_residue_" in k or "per_atom_" in k  # noqa: E731
    return {k: x.index_select(0, inv) if per_row(k) else x for k, x in v.items()}


# ------------------------------------------------------------- serial CPU path
# With several threads, each torch op over a batch (a parallel region) waits for
# every thread, so a busy core stalls the step (zmat._serial). On the CPU, a
# padded batch is computed in numpy instead (single-threaded), forward and
# first backward (analytic), the clash sum by clash_loss's own serial path; the
# torch functions above stay for traces, other devices, ragged batches and
# double backward (a differentiable recomputation).


def _torch_core(atom37, aatype, mask, residue_index, tolerance_factor, clash_tol, openfold_compatible):
    """The differentiable parts of :func:`structural_violations` by torch: pos14,
    the three bond means, the per-residue bond sum, the within-residue per-atom sum
    and its per-structure total."""
    pos14, exists14 = atom37_to_atom14(atom37, aatype, mask)
    tf = tolerance_factor
    bonds = between_residue_bond_loss(pos14, exists14, residue_index, aatype, tf, tf, openfold_compatible)
    lower, upper = (b[aatype] for b in _pair_bounds(clash_tol, tf, atom37.dtype, atom37.device))
    per_atom = _within(pos14, exists14, lower, upper)["per_atom_loss_sum"]
    means = [bonds[f"{k}_loss_mean"] for k in ("c_n", "ca_c_n", "c_n_ca")]
    return pos14, *means, bonds["per_residue_loss_sum"], per_atom, per_atom.sum(-1).sum(-1)


def _unit(v, eps):
    """``(u, l)``: ``l = sqrt(eps + |v|^2)``, ``u = v / l``."""
    length = np.sqrt(eps + (v * v).sum(-1))
    return v / length[..., None], length


def _host_bonds(h, P, E):
    """:func:`between_residue_bond_loss` in numpy on ``(S, L, 14, 3)`` (keeps what the
    backward needs in ``h``)."""
    eps, dt = 1e-6, P.dtype
    v = {"a": P[:, :-1, 1] - P[:, :-1, 2], "b": P[:, 1:, 0] - P[:, :-1, 2], "w": P[:, 1:, 1] - P[:, 1:, 0]}
    (u1, la), (u2, lb), (u3, lw) = (_unit(v[k], eps) for k in "abw")
    pro = (h["aa"][:, 1:] == _PRO).astype(dt)
    m_ca, m_c, m_n, m_ca_next = E[:, :-1, 1], E[:, :-1, 2], E[:, 1:, 0], E[:, 1:, 1]
    ca_c_n_std = C_N_STDDEV[0] if h["openfold"] else COS_CA_C_N[1]
    terms = [
        (lb, C_N_LENGTH[0] + pro * (C_N_LENGTH[1] - C_N_LENGTH[0]),
         C_N_STDDEV[0] + pro * (C_N_STDDEV[1] - C_N_STDDEV[0]), m_c * m_n),
        ((u1 * u2).sum(-1), COS_CA_C_N[0], ca_c_n_std, m_ca * m_c * m_n),
        ((-u2 * u3).sum(-1), COS_C_N_CA[0], COS_C_N_CA[1], m_c * m_n * m_ca_next),
    ]  # fmt: skip
    tol = h["tolerance_factor"]
    means, per_pair, violation, saved = [], 0.0, np.zeros_like(lb), []
    for x, mean, std, pm in terms:
        pm = pm * h["no_gap"]
        err = np.sqrt(eps + (x - mean) ** 2)
        loss = np.maximum(err - tol * std, 0.0)
        norm = pm.sum(-1) + eps
        means.append((pm * loss).sum(-1) / norm)
        per_pair = per_pair + loss
        violation = np.maximum(violation, pm * (err > tol * std).astype(dt))
        saved.append((pm / norm[:, None], (err - tol * std > 0) * (x - mean) / err))
    h["bonds"] = (v, (u1, la), (u2, lb), (u3, lw), saved)
    z = np.zeros_like(per_pair[:, :1])
    prl = 0.5 * (np.concatenate([per_pair, z], -1) + np.concatenate([z, per_pair], -1))
    vz = np.zeros_like(violation[:, :1])
    viol = np.maximum(np.concatenate([violation, vz], -1), np.concatenate([vz, violation], -1))
    return means, prl, viol


def _host_bonds_grad(h, g_means, g_prl, gP):
    """Adds the bond terms' gradient to ``gP`` (in place)."""
    v, (u1, la), (u2, lb), (u3, lw), saved = h["bonds"]
    S, L = gP.shape[:2]
    g_pp = 0.0 if g_prl is None else 0.5 * (g_prl[:, :-1] + g_prl[:, 1:])
    g_x = []
    for g_m, (w_mean, d_err) in zip(g_means, saved, strict=True):
        g_loss = g_pp if g_m is None else g_pp + g_m[:, None] * w_mean
        g_x.append(g_loss * d_err)
    g_u1 = g_x[1][..., None] * u2
    g_u2 = g_x[1][..., None] * u1 - g_x[2][..., None] * u3
    g_u3 = -g_x[2][..., None] * u2
    g_v = {}
    for k, length, g_u, g_l in (
        ("a", la, g_u1, 0.0),
        ("b", lb, g_u2, g_x[0]),
        ("w", lw, g_u3, 0.0),
    ):
        g_l = g_l - (g_u * v[k]).sum(-1) / (length * length)  # u = v / l
        g_v[k] = g_u / length[..., None] + (g_l / length)[..., None] * v[k]
    gP[:, :-1, 1] += g_v["a"]
    gP[:, :-1, 2] -= g_v["a"] + g_v["b"]
    gP[:, 1:, 0] += g_v["b"] - g_v["w"]
    gP[:, 1:, 1] += g_v["w"]


# pairs (_I, _J) to atoms by blocks: _I is sorted, _J sorted by _J_ORDER; every atom but
# 13 leads a block of _I (atoms 0..12), every atom but 0 one of _J (1..13)
_J_ORDER = np.argsort(_J, kind="stable")
_I_BLOCKS = [slice(*np.searchsorted(_I, [a, a + 1])) for a in range(13)]
_J_BLOCKS = [slice(*np.searchsorted(_J[_J_ORDER], [a, a + 1])) for a in range(1, 14)]


def _to_atoms(x, ufunc, sign=1.0):
    """``(..., 91, R)`` per pair -> ``(..., 14, R)`` per atom: ``ufunc`` over the pairs of
    each atom as first (``_I``) and, times ``sign``, as second (``_J``) atom."""
    out = np.zeros((*x.shape[:-2], 14, x.shape[-1]), dtype=x.dtype)
    xj = x[..., _J_ORDER, :]
    for a in range(13):  # block sums over contiguous rows (numpy's reduceat is slower here)
        out[..., a, :] = ufunc.reduce(x[..., _I_BLOCKS[a], :], axis=-2)
    for a in range(13):
        second = ufunc.reduce(xj[..., _J_BLOCKS[a], :], axis=-2)
        out[..., a + 1, :] = ufunc(out[..., a + 1, :], second if sign == 1.0 else sign * second)
    return out


def _host_within(h, P, E):
    """:func:`_within` in numpy: ``(per_atom_loss_sum, per_atom_violations)``; pair-major
    ``(91, R)`` arrays over the R = S L residues (row gathers, reductions over rows)."""
    bounds = _pair_bounds(h["clash_tol"], h["tolerance_factor"], h["torch_dtype"], torch.device("cpu"))
    lower, upper = (np.ascontiguousarray(b.numpy().T)[:, h["aa"].reshape(-1)] for b in bounds)
    et = np.ascontiguousarray(E.reshape(-1, 14).T)
    pc = np.ascontiguousarray(P.reshape(-1, 14, 3).transpose(2, 1, 0))  # (3, 14, R)
    pm = et[_I] * et[_J]
    diff = pc[:, _I] - pc[:, _J]
    d = np.sqrt(1e-10 + (diff[0] * diff[0] + diff[1] * diff[1] + diff[2] * diff[2]))
    lo, hi = lower - d, d - upper
    loss = pm * (np.maximum(lo, 0.0) + np.maximum(hi, 0.0))
    bad = pm * ((d < lower) | (d > upper)).astype(P.dtype)
    h["within"] = (diff, pm * ((hi > 0).astype(P.dtype) - (lo > 0)) / d)
    atoms = lambda t: t.T.reshape(E.shape)  # noqa: E731  (14, R) -> (S, L, 14)
    return atoms(2 * _to_atoms(loss, np.add)), atoms(_to_atoms(bad, np.maximum))


def _host_within_grad(h, g_pa, gP):
    diff, slope = h["within"]
    gt = g_pa.reshape(-1, 14).T
    g = (2 * (gt[_I] + gt[_J]) * slope) * diff
    gP.reshape(-1, 14, 3)[...] += _to_atoms(g, np.add, -1.0).transpose(2, 1, 0)


class _HostCore(torch.autograd.Function):
    """:func:`_torch_core` in numpy, analytic first backward."""

    @staticmethod
    def forward(atom37, h):
        X = atom37.detach().numpy().reshape(-1, *atom37.shape[-3:])
        S, L = X.shape[:2]
        idx, valid = h["idx"], h["valid"]
        P = np.take_along_axis(X, np.maximum(idx, 0)[..., None], 2) * valid[..., None]
        E = valid.astype(X.dtype)
        h["P"], h["E"] = P, E
        means, prl, h["bond_viol"] = _host_bonds(h, P, E)
        per_atom, h["worst"] = _host_within(h, P, E)
        lead = tuple(atom37.shape[:-3])
        outs = [P.reshape(*lead, L, 14, 3), *(m.reshape(lead) for m in means), prl.reshape(*lead, L)]
        outs += [per_atom.reshape(*lead, L, 14), per_atom.sum((-1, -2)).reshape(lead)]
        return tuple(torch.from_numpy(np.asarray(o, order="C")) for o in outs)  # 0-d stays 0-d

    @staticmethod
    def setup_context(ctx, inputs, output):
        atom37, ctx.h = inputs
        ctx.save_for_backward(atom37)
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, *grads):
        (atom37,) = ctx.saved_tensors
        h = ctx.h
        if torch.is_grad_enabled():  # double backward: the differentiable torch path
            with torch.enable_grad():
                outs = _torch_core(atom37, *h["torch_args"])
                used = [(o, g) for o, g in zip(outs, grads, strict=True) if g is not None]
                outs, gs = zip(*used, strict=True)
                (gx,) = torch.autograd.grad(outs, [atom37], gs, create_graph=True)
            return gx, None
        S, L = h["P"].shape[:2]
        g = [None if t is None else t.detach().numpy().reshape(S, *t.shape[len(t.shape) - _NDIM[k] :])
             for k, t in enumerate(grads)]  # fmt: skip
        gP = np.zeros_like(h["P"]) if g[0] is None else g[0].copy()
        _host_bonds_grad(h, g[1:4], g[4], gP)
        g_pa = g[5]
        if g[6] is not None:
            g_pa = np.broadcast_to(g[6][:, None, None], gP.shape[:3]) + (0.0 if g_pa is None else g_pa)
        if g_pa is not None:
            _host_within_grad(h, g_pa, gP)
        gX = np.zeros((S * L * 37, 3), dtype=gP.dtype)
        gX[h["dst"]] = gP.reshape(-1, 3)[h["valid"].reshape(-1)]
        return torch.from_numpy(gX.reshape(atom37.shape)), None


_NDIM = (3, 0, 0, 0, 1, 2, 0)  # trailing dims of _HostCore's outputs after (S,)


def _host_violations(atom37, aatype, mask, residue_index, tolerance_factor, clash_tol, pairs, openfold):
    """:func:`structural_violations` of a padded CPU batch, serial (see above)."""
    lead, L = tuple(atom37.shape[:-3]), atom37.shape[-3]
    dt = atom37.detach().numpy().dtype
    aa = aatype.numpy().reshape(-1, L)
    S = aa.shape[0]
    idx = RESTYPE_ATOM14_TO_ATOM37[aa]
    m37 = np.broadcast_to(mask.numpy(), atom37.shape[:-1]).reshape(S, L, 37)
    valid = (idx >= 0) & np.take_along_axis(m37, np.maximum(idx, 0), 2)
    ri = np.broadcast_to(residue_index.numpy(), atom37.shape[:-2]).reshape(S, L).astype(dt)
    no_gap = ((ri[:, 1:] - ri[:, :-1]) == 1.0).astype(dt)
    dst = (np.arange(S * L).reshape(S, L, 1) * 37 + idx)[valid]
    h = {"aa": aa, "idx": idx, "valid": valid, "no_gap": no_gap, "dst": dst, "openfold": openfold,
         "tolerance_factor": tolerance_factor, "clash_tol": clash_tol, "torch_dtype": atom37.dtype,
         "torch_args": (aatype, mask, residue_index, tolerance_factor, clash_tol, openfold)}  # fmt: skip
    pos14, *means, prl, per_atom, within_sum = _HostCore.apply(atom37, h)
    P, E = h["P"], h["E"]
    # between-residue clashes: the sum by clash_loss (serial), the diagnostics in numpy
    radii = ATOM37_RADIUS.astype(dt)[np.maximum(idx, 0)] * E
    exists = torch.from_numpy(valid.reshape(*lead, L * 14))
    total = clash_loss(pos14.flatten(-3, -2), torch.from_numpy(radii.reshape(*lead, L * 14)), pairs=pairs,
                       tolerance=clash_tol, mask=exists)  # fmt: skip
    xf, rf = P.reshape(-1, 3), radii.reshape(-1)
    i, j = (np.ascontiguousarray(c) for c in pairs.numpy().T)
    diff = xf[i] - xf[j]
    d = np.sqrt(1e-10 + (diff * diff).sum(-1))
    pen = np.maximum(rf[i] + rf[j] - clash_tol - d, 0.0)
    hit = d < rf[i] + rf[j] - clash_tol
    clash_atom = (np.bincount(i, pen, len(rf)) + np.bincount(j, pen, len(rf))).astype(dt).reshape(S, L, 14)
    clash_mask = (np.bincount(np.concatenate([i[hit], j[hit]]), minlength=len(rf)) > 0).astype(dt)
    clash_mask = clash_mask.reshape(S, L, 14)
    e = valid.astype(np.float64)
    per_res = e.sum(-1)
    n = per_res.sum(-1)
    bonds = (e[:, :-1, 2] * e[:, 1:, 0] * no_gap).sum(-1)
    sg = e[..., _SG_SLOT].sum(-1)
    n_pairs = 0.5 * (n * n - (per_res * per_res).sum(-1)) - bonds - 0.5 * sg * (sg - 1)
    clash_mean = total / (1e-6 + torch.from_numpy(n_pairs.reshape(lead)).to(total.dtype))
    # per residue and metrics
    worst = h["worst"]
    per_residue = np.maximum(np.maximum(h["bond_viol"], clash_mask.max(-1)), worst.max(-1))
    n_atoms = torch.from_numpy(E.sum((-1, -2)).reshape(lead))
    loss = means[0] + means[1] + means[2] + (2 * total + within_sum) / (1e-6 + n_atoms)
    seq = valid.any(-1).astype(dt)
    eps = 1e-4 if openfold else 1e-10
    metric = lambda v: (seq * v).sum(-1) / (seq.sum(-1) + eps)  # noqa: E731
    ca = P[:, :, 1]
    d_ca = np.sqrt(1e-6 + ((ca[:, :-1] - ca[:, 1:]) ** 2).sum(-1))
    pm = E[:, :-1, 1] * E[:, 1:, 1] * no_gap
    far = (d_ca - CA_CA > 1.5).astype(dt)
    t = lambda a, *tail: torch.from_numpy(np.ascontiguousarray(a).reshape((*lead, *tail)))  # noqa: E731
    return {
        "c_n_loss_mean": means[0],
        "ca_c_n_loss_mean": means[1],
        "c_n_ca_loss_mean": means[2],
        "connections_per_residue_loss_sum": prl,
        "connections_per_residue_violation_mask": t(h["bond_viol"], L),
        "clashes_mean_loss": clash_mean,
        "clashes_per_atom_loss_sum": t(clash_atom, L, 14),
        "clashes_per_atom_clash_mask": t(clash_mask, L, 14),
        "per_atom_loss_sum": per_atom,
        "per_atom_violations": t(worst, L, 14),
        "per_residue_violation_mask": t(per_residue, L),
        "violations_extreme_ca_ca_distance": t((pm * far).sum(-1) / (pm.sum(-1) + eps)),
        "violations_between_residue_bond": t(metric(h["bond_viol"])),
        "violations_between_residue_clash": t(metric(clash_mask.max(-1))),
        "violations_within_residue": t(metric(worst.max(-1))),
        "violations_per_residue": t(metric(per_residue)),
        "loss": loss,
    }
