"""Nucleotides (DNA: DA, DC, DG, DT; RNA: A, C, G, U): tree, torsions, sugar pucker.

Atom names are the PDB v3 / CCD ones (``P, OP1, OP2, O5', C5', ...``).

Construction tree (the bond reference of every heavy atom; the rows follow
from it, ``zmat/structure/allatom.py``). It runs down the backbone and out to
the base, so that the IUPAC torsions are the dihedral columns of single rows:

=========  =====================  ==========================================
atom       bond reference          dihedral column
=========  =====================  ==========================================
``P``      ``O3'`` of ``i - 1``    epsilon of ``i - 1``
``O5'``    ``P``                   zeta of ``i - 1``
``C5'``    ``O5'``                 alpha
``C4'``    ``C5'``                 beta
``C3'``    ``C4'``                 gamma
``O3'``    ``C3'``                 delta
``O4'``    ``C4'``                 fixed (offset on ``C3'``)
``C1'``    ``O4'``                 ring
``C2'``    ``C1'``                 ring (nu0); ``C2'-C3'`` closes the ring
``N9/N1``  ``C1'``                 fixed (offset on ``C2'``)
``C4/C2``  ``N9/N1``               chi
=========  =====================  ==========================================

Torsions (IUPAC-IUB 1983; Saenger, *Principles of Nucleic Acid Structure*):
alpha ``O3'(i-1)-P-O5'-C5'``, beta ``P-O5'-C5'-C4'``, gamma
``O5'-C5'-C4'-C3'``, delta ``C5'-C4'-C3'-O3'``, epsilon
``C4'-C3'-O3'-P(i+1)``, zeta ``C3'-O3'-P(i+1)-O5'(i+1)``, chi
``O4'-C1'-N9-C4`` (purines) or ``O4'-C1'-N1-C2`` (pyrimidines).

Sugar pucker (Altona and Sundaralingam, J. Am. Chem. Soc. 94, 8205, 1972),
from the endocyclic torsions nu0 ``C4'-O4'-C1'-C2'``, nu1
``O4'-C1'-C2'-C3'``, nu2 ``C1'-C2'-C3'-C4'``, nu3 ``C2'-C3'-C4'-O4'``, nu4
``C3'-C4'-O4'-C1'``:

    tan P = ((nu4 + nu1) - (nu3 + nu0)) / (2 nu2 (sin 36 deg + sin 72 deg)),
    tau_m = nu2 / cos P,

with P in ``[0, 2 pi)`` (C3'-endo near 18 deg, C2'-endo near 162 deg) and
``nu_j ~ tau_m cos(P + 4 pi (j - 2) / 5)``.
"""

from __future__ import annotations

import math

import torch

from .._geometry import safe_norm

__all__ = [
    "DNA",
    "NUCLEIC_TORSIONS",
    "NUCLEOTIDES",
    "PURINES",
    "RNA",
    "RING_ATOMS",
    "nucleic_parents",
    "pucker",
    "torsion_atoms",
]

DNA = ("DA", "DC", "DG", "DT")
RNA = ("A", "C", "G", "U")
NUCLEOTIDES = DNA + RNA
PURINES = frozenset({"DA", "DG", "A", "G"})

#: Names of the nucleotide entries of ``Protein.torsions``, in this order.
NUCLEIC_TORSIONS = (
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "chi",
    "pucker_phase",
    "pucker_amplitude",
)

#: The five ring atoms, nu0's first atom first: nu_j = dihedral(ring[j:j+4] cyclically).
RING_ATOMS = ("C4'", "O4'", "C1'", "C2'", "C3'")

_BACKBONE_PARENT = {
    "P": "-O3'",
    "OP1": "P",
    "OP2": "P",
    "OP3": "P",
    "O5'": "P",
    "C5'": "O5'",
    "C4'": "C5'",
    "C3'": "C4'",
    "O3'": "C3'",
    "O4'": "C4'",
    "C1'": "O4'",
    "C2'": "C1'",
    "O2'": "C2'",
}
_PURINE_PARENT = {
    "N9": "C1'",
    "C4": "N9",
    "C8": "N9",
    "N3": "C4",
    "C5": "C4",
    "N7": "C5",
    "C6": "C5",
    "N1": "C6",
    "N6": "C6",
    "O6": "C6",
    "C2": "N1",
    "N2": "C2",
}
_PYRIMIDINE_PARENT = {
    "N1": "C1'",
    "C2": "N1",
    "C6": "N1",
    "O2": "C2",
    "N3": "C2",
    "C4": "N3",
    "N4": "C4",
    "O4": "C4",
    "C5": "C4",
    "C7": "C5",
}


def nucleic_parents(res_name: str) -> dict[str, str]:
    """Heavy atom -> its preferred bond reference (``-`` prefix: previous residue)."""
    base = _PURINE_PARENT if res_name in PURINES else _PYRIMIDINE_PARENT
    return {**_BACKBONE_PARENT, **base}


def torsion_atoms(res_name: str) -> dict[str, tuple[str, str, str, str]]:
    """The four atoms of alpha..zeta, chi and nu0..nu4 (``-``/``+``: previous/next residue)."""
    glyco = ("O4'", "C1'", "N9", "C4") if res_name in PURINES else ("O4'", "C1'", "N1", "C2")
    out = {
        "alpha": ("-O3'", "P", "O5'", "C5'"),
        "beta": ("P", "O5'", "C5'", "C4'"),
        "gamma": ("O5'", "C5'", "C4'", "C3'"),
        "delta": ("C5'", "C4'", "C3'", "O3'"),
        "epsilon": ("C4'", "C3'", "O3'", "+P"),
        "zeta": ("C3'", "O3'", "+P", "+O5'"),
        "chi": glyco,
    }
    ring = RING_ATOMS + RING_ATOMS
    for j in range(5):
        out[f"nu{j}"] = tuple(ring[j : j + 4])
    return out


#: ``2 (sin 36 deg + sin 72 deg)``, the denominator of tan P.
PUCKER_DENOMINATOR = 2.0 * (math.sin(math.radians(36.0)) + math.sin(math.radians(72.0)))


def pucker(nu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pseudorotation phase ``P`` in ``[0, 2 pi)`` and amplitude ``tau_m`` (radians).

    Args:
        nu: ``(..., 5)`` endocyclic torsions nu0..nu4 (radians); NaN propagates.

    Returns:
        ``(P, tau_m)``, each ``(...)``. ``tau_m = nu2 / cos P`` is computed as
        the norm of ``(nu2, numerator / denominator)``, which equals it, stays
        finite where ``cos P = 0`` and has finite gradients at a flat ring.
    """
    nu0, nu1, nu2, nu3, nu4 = nu.unbind(-1)
    y = ((nu4 + nu1) - (nu3 + nu0)) / PUCKER_DENOMINATOR
    phase = torch.remainder(torch.atan2(y, nu2), 2 * math.pi)
    amplitude = safe_norm(torch.stack([nu2, y], -1))
    return phase, amplitude
