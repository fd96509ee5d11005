"""Adapters for the peers (installed with the ``bench`` extra): mp_nerf and chemcoord.

What they cannot do, and how they are run here:

* **mp_nerf** (``mp_nerf.proteins``): proteins only (sidechainnet's 14-atom
  residues), one structure per call (the batch is a Python loop), forward only:
  ``protein_fold`` writes its coordinate buffer in place, and its backward
  raises "one of the variables needed for gradient computation has been
  modified by an inplace operation" (reported as the fwd+bwd result). Runs on
  CPU and CUDA. It gets a random sequence of the same length (seeded) and
  random angles; ``mp_nerf`` times ``build_scaffolds_from_scn_angles`` +
  ``protein_fold`` (what a step with new angles runs), ``mp_nerf-fold`` only
  ``protein_fold`` on prebuilt scaffolds (a lower bound).
* **chemcoord** (``Zmat.get_cartesian``): numpy/numba, CPU, float64, one
  structure per call, no autograd; its derivative is the full Jacobian
  ``get_grad_cartesian`` (``(3, N, N, 3)``: O(N^2) memory and time), contracted
  here with the upstream gradient to stand for a backward pass.
  ``chemcoord`` goes through the pandas ``Zmat`` object; ``chemcoord-kernel``
  calls the compiled numba functions it wraps (``get_X``, ``get_grad_X``) on
  plain arrays, its best case. Rows are put in construction order first
  (chemcoord needs references to earlier rows); the first atoms use its
  absolute references, as in :mod:`benchmarks.seeds`.
"""

from __future__ import annotations

import numpy as np
import torch

from .seeds import E_X, E_Y, E_Z, ORIGIN, users_internal, users_table

__all__ = ["available", "chemcoord_arrays", "chemcoord_zmats", "mp_nerf_inputs"]

_LABELS = {ORIGIN: "origin", E_X: "e_x", E_Y: "e_y", E_Z: "e_z"}


def available(name: str) -> str | None:
    """``None`` if peer ``name`` imports, else why not."""
    try:
        if name == "mp_nerf":
            import mp_nerf.proteins  # noqa: F401
        else:
            import chemcoord  # noqa: F401
            from chemcoord._zmat_internal_coordinates import _zmat_transformation  # noqa: F401
    except Exception as e:
        return f"{name} not installed (pip install zmat[bench]): {type(e).__name__}: {e}"
    return None


def version(name: str) -> str | None:
    try:
        from importlib.metadata import version as v

        return v({"mp_nerf": "mp-nerf"}.get(name, name))
    except Exception:
        return None


# ----------------------------------------------------------------- mp_nerf
AMINO = "ACDEFGHIKLMNPQRSTVWY"


def mp_nerf_inputs(n_res: int, n: int, dtype, device, seed: int = 0):
    """``n`` (sequence, angles) pairs: random sequences of ``n_res`` residues, angles ``(L, 12)``.

    Angles follow sidechainnet's layout: 3 backbone torsions, 3 bond angles
    (about 110-120 degrees), 6 side-chain torsions.
    """
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        seq = "".join(rng.choice(list(AMINO), n_res))
        ang = rng.uniform(-np.pi, np.pi, (n_res, 12))
        ang[:, 3:6] = rng.uniform(1.9, 2.1, (n_res, 3))
        out.append((seq, torch.tensor(ang, dtype=dtype, device=device)))
    return out


def mp_nerf_atoms(seq: str) -> int:
    from mp_nerf.proteins import scn_cloud_mask

    return int(scn_cloud_mask(seq).sum())


# --------------------------------------------------------------- chemcoord
def chemcoord_arrays(C: torch.Tensor, table):
    """zmat ``(B, N, 3)`` + table -> chemcoord's kernel inputs, in construction order.

    Returns:
        ``(Cc, c_table, inverse)``: ``Cc`` ``(B, 3, N)`` float64 numpy (bond,
        angle rad, dihedral rad with chemcoord's sign), ``c_table`` ``(3, N)``
        int64 with chemcoord's sentinels, and ``inverse`` such that
        ``X[:, inverse]`` puts a result ``(3, N)`` back in zmat's row order.
    """
    c_rows, order = users_table(table)
    order = np.asarray(order)
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    rows = np.asarray(c_rows, dtype=np.int64)[order]  # (N, 3), original atom ids
    c_table = np.where(rows >= 0, inverse[np.maximum(rows, 0)], rows).T.copy()
    Cc = users_internal(C.detach().to(torch.float64).cpu(), table).numpy()[:, :, order].copy()
    return Cc, c_table, inverse


def chemcoord_zmats(C: torch.Tensor, table, n: int) -> list:
    """The first ``n`` structures of ``C`` as ``chemcoord.Zmat`` objects (degrees, its sign)."""
    import chemcoord as cc
    import pandas as pd

    Cc, c_table, _ = chemcoord_arrays(C[:n], table)
    refs = [[_LABELS.get(int(v), int(v)) for v in col] for col in c_table]
    out = []
    for k in range(Cc.shape[0]):
        frame = pd.DataFrame(
            {
                "atom": ["C"] * Cc.shape[2],
                "b": refs[0],
                "bond": Cc[k, 0],
                "a": refs[1],
                "angle": np.degrees(Cc[k, 1]),
                "d": refs[2],
                "dihedral": np.degrees(Cc[k, 2]),
            }
        )
        out.append(cc.Zmat(frame))
    return out


def chemcoord_kernel():
    """chemcoord's compiled ``(get_X, get_grad_X)``."""
    from chemcoord._zmat_internal_coordinates import _zmat_transformation as t

    return t.get_X, t.get_grad_X
