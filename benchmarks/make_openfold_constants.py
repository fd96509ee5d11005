"""Write ``benchmarks/data/openfold_constants.npz``: AlphaFold's rigid-group tables, as OpenFold builds them.

Not run by the benchmarks: it was run once. The four arrays are the constants
OpenFold's ``torsion_angles_to_frames`` and
``frames_and_literature_positions_to_atom14_pos`` read (AlphaFold's literature
positions, ``residue_constants.rigid_group_atom_positions``, and the default
frames derived from them), taken from ``openfold/np/residue_constants.py`` of a
public checkout of aqlaboratory/openfold (commit ce0029e), executed with a
minimal stand-in for ``dm-tree``'s ``map_structure`` (used only for a table
not written here)::

    python benchmarks/make_openfold_constants.py /path/to/openfold-checkout

Arrays (AlphaFold's residue order, 21 types with unknown last):
``default_frames`` (21, 8, 4, 4), ``group_idx`` (21, 14), ``atom_mask``
(21, 14), ``lit_positions`` (21, 14, 3), float32/int64 as OpenFold has them.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np


def main(checkout: str) -> None:
    def map_structure(fn, x):
        return [map_structure(fn, y) for y in x] if isinstance(x, (list, tuple)) else fn(x)

    sys.modules.setdefault("tree", types.SimpleNamespace(map_structure=map_structure))
    path = Path(checkout) / "openfold" / "np" / "residue_constants.py"
    rc = types.ModuleType("residue_constants")
    exec(compile(path.read_text(), str(path), "exec"), rc.__dict__)
    out = Path(__file__).parent / "data" / "openfold_constants.npz"
    np.savez_compressed(
        out,
        default_frames=rc.restype_rigid_group_default_frame,
        group_idx=rc.restype_atom14_to_rigid_group.astype(np.int64),
        atom_mask=rc.restype_atom14_mask,
        lit_positions=rc.restype_atom14_rigid_group_positions,
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1])
