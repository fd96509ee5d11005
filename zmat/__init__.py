"""zmat: batched, differentiable z-matrix <-> Cartesian transforms for PyTorch."""

from .table import ConstructionTable
from .transform import METHODS, to_internal, to_xyz

__all__ = ["METHODS", "ConstructionTable", "to_internal", "to_xyz"]
__version__ = "0.1.0"
