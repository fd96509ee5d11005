"""Write ``openfold_reference.npz``: OpenFold's structural violations on noisy real proteins.

Not part of the test suite: it was run once, and ``tests/test_violations.py``
compares ``zmat.protein.structural_violations(..., openfold_compatible=True)``
against its output. Everything in the outputs comes from OpenFold's functions,
nothing from zmat.

How OpenFold is run (extract and run). OpenFold's ``openfold/utils/loss.py``
imports its model code (rigid frames, multimer geometry, ml_collections, ...),
more than its violation losses need, so this script does not import it: it
reads the source of a public checkout of aqlaboratory/openfold (commit
ce0029e), takes out the functions below with ``ast`` and executes them,
unchanged, in a namespace that holds torch, numpy and OpenFold's own
``openfold/np/residue_constants.py`` (executed with a minimal stand-in for
``dm-tree``'s ``map_structure``, which it only uses for a table not used
here). ``residue_constants.make_atom14_dists_bounds`` reads
``stereo_chemical_props.txt``, which the OpenFold repository does not hold (it
is downloaded by its setup scripts); the bounds are AlphaFold's own
(``const_lower_bound`` / ``const_upper_bound`` of ``alphafold_reference.npz``,
from the same table), handed to OpenFold's ``find_structural_violations``
through that one function. Run with torch and numpy::

    python tests/data/make_openfold_reference.py /path/to/openfold-checkout tests/data

Inputs (``<case>`` in ``1ubi``, ``1aki``, ``3wip``, ``7pfl``): AlphaFold's parse
of the file (``alphafold_reference.npz``: ``<case>_positions`` etc.), standard
residues of the first chain, at most 120 residues (OpenFold's clash term is
dense, ``L^2 x 196`` pairs), atom14 by OpenFold's ``residue_constants`` (as
its ``make_atom14_masks``), plus Gaussian noise (``NOISE`` A per coordinate,
seeded) large enough that every term is non-zero (checked here). Computed in
float64, so the comparison is to float64 round-off.

Contents: ``<case>_in_positions`` ``(L, 14, 3)``, ``_in_exists`` ``(L, 14)``,
``_in_aatype``, ``_in_residue_index`` ``(L,)``; ``<case>_out_<name>``: every
field of ``find_structural_violations`` (nested names flattened), of
``compute_violation_metrics`` (``seq_mask`` all ones) and ``violation_loss``
as ``<case>_out_loss``.
"""

import ast
import sys
import types
import typing

import numpy as np

CASES = ("1ubi", "1aki", "3wip", "7pfl")
NOISE = {"1ubi": 0.35, "1aki": 0.35, "3wip": 0.4, "7pfl": 0.4}
MAX_RESIDUES = 120
FUNCTIONS = (
    "between_residue_bond_loss",
    "between_residue_clash_loss",
    "within_residue_violations",
    "find_structural_violations",
    "extreme_ca_ca_distance_violations",
    "compute_violation_metrics",
    "violation_loss",
)


def _functions(path: str, names, namespace: dict) -> None:
    """Execute the top-level functions ``names`` of the file at ``path`` in ``namespace``."""
    tree = ast.parse(open(path).read())
    body = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in names]
    missing = set(names) - {node.name for node in body}
    assert not missing, missing
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), namespace)


def _residue_constants(checkout: str, bounds) -> types.ModuleType:
    def map_structure(fn, x):
        return [map_structure(fn, y) for y in x] if isinstance(x, (list, tuple)) else fn(x)

    sys.modules.setdefault("tree", types.SimpleNamespace(map_structure=map_structure))
    rc = types.ModuleType("residue_constants")
    path = f"{checkout}/openfold/np/residue_constants.py"
    exec(compile(open(path).read(), path, "exec"), rc.__dict__)
    lower, upper = bounds
    rc.make_atom14_dists_bounds = lambda **kw: {"lower_bound": lower, "upper_bound": upper}
    return rc


def main(checkout: str, out_dir: str) -> None:
    import torch

    ref = np.load(f"{out_dir}/alphafold_reference.npz")
    rc = _residue_constants(checkout, (ref["const_lower_bound"], ref["const_upper_bound"]))
    ns = {"torch": torch, "np": np, "residue_constants": rc, "Dict": dict, "Optional": typing.Optional}
    _functions(f"{checkout}/openfold/utils/tensor_utils.py", ["masked_mean"], ns)
    _functions(f"{checkout}/openfold/utils/loss.py", FUNCTIONS, ns)

    names14 = [rc.restype_name_to_atom14_names[rc.restype_1to3[r]] for r in rc.restypes] + [[""] * 14]
    to37 = np.array([[rc.atom_order[n] if n else 0 for n in row] for row in names14])
    known = np.array([[1.0 if n else 0.0 for n in row] for row in names14])
    rng = np.random.default_rng(2020)
    data = {}
    for case in CASES:
        g = {f: ref[f"{case}_{f}"] for f in ("positions", "mask", "aatype", "residue_index", "chain_index")}
        keep = np.nonzero((g["aatype"] < 20) & (g["chain_index"] == g["chain_index"][0]))[0][:MAX_RESIDUES]
        pos37, mask37, aatype, ri = (g[f][keep] for f in ("positions", "mask", "aatype", "residue_index"))
        idx = to37[aatype]
        exists = known[aatype] * np.take_along_axis(mask37, idx, 1)
        pos14 = np.take_along_axis(pos37, idx[..., None], 1)
        pos14 = (pos14 + NOISE[case] * rng.standard_normal(pos14.shape)) * exists[..., None]
        batch = {
            "aatype": torch.as_tensor(aatype),
            "residue_index": torch.as_tensor(ri),
            "atom14_atom_exists": torch.as_tensor(exists),
            "residx_atom14_to_atom37": torch.as_tensor(idx),
            "seq_mask": torch.ones(len(aatype), dtype=torch.float64),
        }
        x = torch.as_tensor(pos14)
        config = {"violation_tolerance_factor": 12.0, "clash_overlap_tolerance": 1.5}
        v = ns["find_structural_violations"](batch, x, **config)
        m = ns["compute_violation_metrics"](batch, x, v)
        loss = ns["violation_loss"](v, batch["atom14_atom_exists"])
        out = {**v["between_residues"], **v["within_residues"], **m, "loss": loss}
        out["total_per_residue_violations_mask"] = v["total_per_residue_violations_mask"]
        out["within_per_atom_loss_sum"] = out.pop("per_atom_loss_sum")
        out["within_per_atom_num_clash"] = out.pop("per_atom_num_clash")
        for key in ("bonds_c_n_loss_mean", "angles_ca_c_n_loss_mean", "angles_c_n_ca_loss_mean",
                    "clashes_mean_loss", "violations_within_residue"):  # fmt: skip
            assert float(out[key]) > 0, (case, key)  # every term exercised
        data[f"{case}_in_positions"] = pos14
        data[f"{case}_in_exists"] = exists
        data[f"{case}_in_aatype"] = aatype
        data[f"{case}_in_residue_index"] = ri
        for key, val in out.items():
            data[f"{case}_out_{key}"] = val.detach().numpy()
        terms = ("bonds_c_n_loss_mean", "angles_ca_c_n_loss_mean", "angles_c_n_ca_loss_mean")
        print(case, len(aatype), {k: float(out[k]) for k in (*terms, "clashes_mean_loss", "loss")})
    np.savez_compressed(f"{out_dir}/openfold_reference.npz", **data)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
