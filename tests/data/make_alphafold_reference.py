"""Write ``alphafold_reference.npz``: AlphaFold's own outputs on small inputs.

Not part of the test suite (AlphaFold needs JAX and haiku, too heavy for CI):
it was run once, and its output is what ``tests/test_atom37.py``,
``tests/test_frames.py`` and ``tests/test_violations.py`` compare against.
Everything in the file comes from AlphaFold's functions, nothing from zmat.

Run, from a checkout of google-deepmind/alphafold (commit c77e5d2, with
``alphafold/common/stereo_chemical_props.txt`` from commit 8d4b942) with jax,
dm-haiku, dm-tree, ml_collections and biopython importable::

    cd alphafold-checkout && python /path/to/tests/data/make_alphafold_reference.py /path/to/tests/data

Contents (``<case>`` in ``1ubi``, ``1aki``, ``3wip``, ``7pfl``; ``v<k>`` a violation case):

* ``<case>_positions/_mask/_aatype/_residue_index/_chain_index``:
  ``alphafold.common.protein.from_pdb_string`` of the file (atom37).
* ``<case>_frame_rot/_frame_trans``: backbone rigid group (group 0) of
  ``all_atom.atom37_to_frames`` (``rigidgroups_gt_frames``), ``(L, 3, 3)``
  with rotation columns the frame axes, and ``(L, 3)``.
* ``const_*``: ``residue_constants`` values (atom order, atom14 names, radii,
  peptide-bond statistics, ``make_atom14_dists_bounds(1.5, 12.0)``).
* ``v<k>_in_*``: atom14 inputs of a violation case; ``v<k>_out_*``: every
  field of ``folding.find_structural_violations`` and
  ``folding.compute_violation_metrics`` (default config: tolerance factor 12,
  clash overlap 1.5), and ``v<k>_out_loss`` the sum of
  ``folding.structural_violation_loss``'s terms.
"""

import sys


def main(out_dir: str) -> None:
    """Write ``out_dir/alphafold_reference.npz`` (imports AlphaFold only here, so that
    pytest's module collection can import this file without it)."""
    import jax.numpy as jnp
    import ml_collections
    import numpy as np
    from alphafold.common import protein
    from alphafold.common import residue_constants as rc
    from alphafold.model import all_atom, folding

    data = {}

    for case in ("1ubi", "1aki", "3wip", "7pfl"):
        text = open(f"{out_dir}/{case}.pdb").read()
        p = protein.from_pdb_string(text)
        data[f"{case}_positions"] = p.atom_positions
        data[f"{case}_mask"] = p.atom_mask
        data[f"{case}_aatype"] = p.aatype
        data[f"{case}_residue_index"] = p.residue_index
        data[f"{case}_chain_index"] = p.chain_index
        fr = all_atom.atom37_to_frames(
            jnp.asarray(p.aatype), jnp.asarray(p.atom_positions), jnp.asarray(p.atom_mask)
        )["rigidgroups_gt_frames"]
        fr = np.asarray(fr)[:, 0]  # (L, 12): r3.rigids_to_tensor_flat12, rotation xx, xy, ..., zz then t
        data[f"{case}_frame_rot"] = fr[:, :9].reshape(-1, 3, 3)
        data[f"{case}_frame_trans"] = fr[:, 9:]

    data["const_atom_types"] = np.array(rc.atom_types)
    data["const_atom14_names"] = np.array(
        [rc.restype_name_to_atom14_names[rc.restype_1to3.get(r, "UNK")] for r in rc.restypes + ["X"]]
    )
    data["const_restypes"] = np.array(rc.restypes)
    data["const_vdw"] = np.array([rc.van_der_waals_radius[e] for e in "CNOS"])
    data["const_c_n"] = np.array(rc.between_res_bond_length_c_n + rc.between_res_bond_length_stddev_c_n)
    data["const_cos_ca_c_n"] = np.array(rc.between_res_cos_angles_ca_c_n)
    data["const_cos_c_n_ca"] = np.array(rc.between_res_cos_angles_c_n_ca)
    data["const_ca_ca"] = np.array(rc.ca_ca)
    bounds = rc.make_atom14_dists_bounds(overlap_tolerance=1.5, bond_length_tolerance_factor=12.0)
    data["const_lower_bound"] = bounds["lower_bound"]
    data["const_upper_bound"] = bounds["upper_bound"]

    config = ml_collections.ConfigDict({"violation_tolerance_factor": 12.0, "clash_overlap_tolerance": 1.5})
    rng = np.random.default_rng(12)

    # as AlphaFold's data pipeline (model/tf/data_transforms.make_atom14_masks) builds them
    _names14 = [rc.restype_name_to_atom14_names[rc.restype_1to3[r]] for r in rc.restypes] + [[""] * 14]
    ATOM14_TO_37 = np.array([[rc.atom_order[n] if n else 0 for n in row] for row in _names14])
    ATOM14_MASK = np.array([[1.0 if n else 0.0 for n in row] for row in _names14])

    def violation_case(k, pos37, mask37, aatype, residue_index, noise):
        idx = ATOM14_TO_37[aatype]
        exists = ATOM14_MASK[aatype] * np.take_along_axis(mask37, idx, 1)
        pos14 = np.take_along_axis(pos37, idx[..., None], 1) * exists[..., None]
        pos14 = (pos14 + noise * rng.standard_normal(pos14.shape)).astype(np.float32) * exists[..., None]
        batch = {
            "aatype": jnp.asarray(aatype),
            "residue_index": jnp.asarray(residue_index),
            "atom14_atom_exists": jnp.asarray(exists.astype(np.float32)),
            "residx_atom14_to_atom37": jnp.asarray(idx),
            "seq_mask": jnp.ones(len(aatype), jnp.float32),
        }
        x = jnp.asarray(pos14)
        v = folding.find_structural_violations(batch, x, config)
        m = folding.compute_violation_metrics(batch, x, v)
        data[f"v{k}_in_positions"] = pos14
        data[f"v{k}_in_exists"] = exists.astype(np.float32)
        data[f"v{k}_in_aatype"] = aatype
        data[f"v{k}_in_residue_index"] = residue_index
        for group in ("between_residues", "within_residues"):
            for name, val in v[group].items():
                data[f"v{k}_out_{name}"] = np.asarray(val)
        data[f"v{k}_out_total_per_residue_violations_mask"] = np.asarray(
            v["total_per_residue_violations_mask"]
        )
        for name, val in m.items():
            data[f"v{k}_out_{name}"] = np.asarray(val)
        b, w = v["between_residues"], v["within_residues"]
        n = jnp.sum(batch["atom14_atom_exists"])
        loss = (
            b["bonds_c_n_loss_mean"]
            + b["angles_ca_c_n_loss_mean"]
            + b["angles_c_n_ca_loss_mean"]
            + jnp.sum(b["clashes_per_atom_loss_sum"] + w["per_atom_loss_sum"]) / (1e-6 + n)
        )
        data[f"v{k}_out_loss"] = np.asarray(loss)

    def keep_standard(case):
        keep = data[f"{case}_aatype"] < 20
        return [data[f"{case}_{f}"][keep] for f in ("positions", "mask", "aatype", "residue_index")]

    # v0: ubiquitin, 0.3 A noise (every kind of violation); v1: lysozyme as is
    # (disulfides, a real structure's few violations); v2: ubiquitin with a gap in
    # the numbering after residue 30 and 0.15 A noise.
    pos, mask, aa, ri = keep_standard("1ubi")
    violation_case(0, pos, mask, aa, ri, 0.3)
    pos1, mask1, aa1, ri1 = keep_standard("1aki")
    violation_case(1, pos1, mask1, aa1, ri1, 0.0)
    ri2 = ri.copy()
    ri2[30:] += 5
    violation_case(2, pos, mask, aa, ri2, 0.15)

    np.savez_compressed(f"{out_dir}/alphafold_reference.npz", **data)
    print({k: v.shape for k, v in data.items()})


if __name__ == "__main__":
    main(sys.argv[1])
