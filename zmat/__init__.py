"""zmat: batched, differentiable z-matrix <-> Cartesian transforms for PyTorch.

The public API (stable names, see ``docs/conventions.md``)::

    xyz = zmat.to_xyz(C, table, method="auto")  # (..., N, 3), differentiable in C
    C = zmat.to_internal(xyz, table)             # (..., N, 3), differentiable in xyz
    table = zmat.ConstructionTable(refs)         # validated once, reusable
    loss = zmat.clash_loss(xyz, radii, exclude=table)

``zmat.gaussian`` reads and writes Gaussian z-matrix text; ``zmat.testing``
(imported on its own) has checks for your own code.
"""

from . import batch, chemcoord, clash, flows, gaussian, optimize, protein
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
    "superpose",
    "to_internal",
    "to_xyz",
    "vdw_radii",
]
__version__ = "0.1.0"
