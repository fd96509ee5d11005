"""Van der Waals radii for :func:`zmat.clash_loss`: ASE's table and AlphaFold's four."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = ["ALPHAFOLD_RADII", "alphafold_radii", "vdw_radii"]

# Heavy-atom van der Waals radii (Angstrom) of AlphaFold's clash loss.
ALPHAFOLD_RADII = {"C": 1.7, "N": 1.55, "O": 1.52, "S": 1.8}


def _as_radii(values: Sequence[float], dtype, device) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype or torch.get_default_dtype(), device=device)


def vdw_radii(symbols: Sequence[str], *, fallback: float = 2.0, dtype=None, device=None) -> torch.Tensor:
    """Van der Waals radii of elements, from ``ase.data.vdw_radii`` (Angstrom).

    ASE's table (Bondi 1964, Mantina 2009 for main-group elements) has no value
    for most transition metals, lanthanides and actinides; they get
    ``fallback`` (2.0 A, a conventional default for an atom without a tabulated
    radius). Dummy atoms (``"X"``) get 0, so they never clash.

    Args:
        symbols: N element symbols (``"C"``, ``"Fe"``; case as in the periodic
            table).
        fallback: radius for elements ASE has no value for.
        dtype, device: of the result (default dtype, CPU by default).

    Returns:
        Tensor of shape (N,).

    Raises:
        ValueError: for an unknown symbol.

    Example:
        >>> vdw_radii(["C", "O", "Fe", "X"], dtype=torch.float64).tolist()
        [1.7, 1.52, 2.0, 0.0]
    """
    from ase.data import atomic_numbers
    from ase.data import vdw_radii as table

    out = []
    for k, s in enumerate(symbols):
        if s not in atomic_numbers:
            raise ValueError(f"vdw_radii: unknown element symbol {s!r} at index {k}")
        z = atomic_numbers[s]
        r = float(table[z]) if z > 0 else 0.0
        out.append(fallback if math.isnan(r) else r)
    return _as_radii(out, dtype, device)


def alphafold_radii(
    elements: Sequence[str], *, default: float | None = None, dtype=None, device=None
) -> torch.Tensor:
    """AlphaFold's heavy-atom radii: C 1.7, N 1.55, O 1.52, S 1.8 (Angstrom).

    Args:
        elements: N element symbols (case-insensitive).
        default: radius for other elements; if None they raise.
        dtype, device: of the result (default dtype, CPU by default).

    Returns:
        Tensor of shape (N,).

    Raises:
        ValueError: for an element not in ``ALPHAFOLD_RADII`` when ``default``
            is None.

    Example:
        >>> alphafold_radii(["N", "C", "C", "O"], dtype=torch.float64).tolist()
        [1.55, 1.7, 1.7, 1.52]
    """
    out = []
    for k, e in enumerate(elements):
        r = ALPHAFOLD_RADII.get(str(e).upper(), default)
        if r is None:
            raise ValueError(
                f"alphafold_radii: no radius for element {e!r} at index {k}; "
                f"known: {sorted(ALPHAFOLD_RADII)} (pass default=...)"
            )
        out.append(r)
    return _as_radii(out, dtype, device)
