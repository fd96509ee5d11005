"""zmat: batched, differentiable z-matrix <-> Cartesian transforms for PyTorch."""

from . import chemcoord, protein
from .table import ConstructionTable
from .transform import METHODS, to_internal, to_xyz
from .zmatrix import ZMatrix

__all__ = ["METHODS", "ConstructionTable", "ZMatrix", "chemcoord", "protein", "to_internal", "to_xyz"]
__version__ = "0.1.0"
