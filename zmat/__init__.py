"""zmat: batched, differentiable z-matrix <-> Cartesian transforms for PyTorch.

The public API (stable names, see ``docs/conventions.md``)::

    xyz = zmat.to_xyz(C, table, method="auto")  # (..., N, 3), differentiable in C
    C = zmat.to_internal(xyz, table)             # (..., N, 3), differentiable in xyz
    table = zmat.ConstructionTable(refs)         # validated once, reusable
    loss = zmat.clash_loss(xyz, radii, exclude=table)

``zmat.gaussian`` reads and writes Gaussian z-matrix text; ``zmat.testing``
(imported on its own) has checks for your own code.

The protein, all-atom and optimisation packages (``zmat.protein``, ``zmat.structure``,
``zmat.optimize``) are
imported on first use (``zmat.protein.from_pdb`` or ``import zmat.protein``):
their residue templates are most of what ``import zmat`` would otherwise cost.
"""

import importlib

from . import batch, chemcoord, clash, flows, gaussian
from ._align import rmsd, superpose
from .clash import alphafold_radii, clash_loss, exclusions_from_bonds, exclusions_from_table, vdw_radii
from .flows import log_det_jacobian
from .table import ConstructionTable
from .transform import METHODS, dihedrals, to_internal, to_xyz
from .zmatrix import ZMatrix

__all__ = [
    "METHODS",
    "ConstructionTable",
    "ZMatrix",
    "alphafold_radii",
    "batch",
    "chemcoord",
    "clash",
    "clash_loss",
    "dihedrals",
    "exclusions_from_bonds",
    "exclusions_from_table",
    "flows",
    "gaussian",
    "log_det_jacobian",
    "optimize",
    "protein",
    "rmsd",
    "structure",
    "superpose",
    "to_internal",
    "to_xyz",
    "vdw_radii",
]
__version__ = "0.1.0"

#: subpackages imported on first attribute access (PEP 562), not by ``import zmat``
_LAZY = ("optimize", "protein", "structure")


def __getattr__(name: str):
    if name in _LAZY:
        return importlib.import_module(f"{__name__}.{name}")  # binds zmat.<name> for the next access
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_LAZY])
