"""zmat.protein.topology: residue templates against the CCD, chi definitions,
ideal geometry against real structures."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch

import zmat
import zmat.protein as zp

DATA = Path(__file__).parent / "data"


def _angle(a, b, c):
    u, v = a - b, c - b
    return math.degrees(math.acos(u @ v / np.linalg.norm(u) / np.linalg.norm(v)))


def _dihedral(p0, p1, p2, p3):
    """IUPAC dihedral in degrees (numpy, the textbook formula)."""
    b0, b1, b2 = p1 - p0, p2 - p1, p3 - p2
    n1, n2 = np.cross(b0, b1), np.cross(b1, b2)
    return math.degrees(math.atan2(np.linalg.norm(b1) * (b0 @ n2), n1 @ n2))


def test_templates_match_the_ccd():
    """Atom names and bond graph of every template are the CCD's heavy atoms and bonds."""
    from biotite.structure.info import residue

    for name, t in zp.RESIDUES.items():
        ccd = residue(name)
        heavy = ccd.element != "H"
        assert set(t.atoms) == set(ccd.atom_name[heavy].tolist()), name
        ccd_bonds = {
            frozenset((ccd.atom_name[i], ccd.atom_name[j]))
            for i, j, _ in ccd.bonds.as_array()
            if heavy[i] and heavy[j]
        }
        assert {frozenset(b) for b in t.bonds} == ccd_bonds, name
        for b in t.ring_bonds:
            assert frozenset(b) in ccd_bonds


def test_chi_definitions():
    n_chi = {"ALA": 0, "GLY": 0, "SER": 1, "CYS": 1, "VAL": 1, "THR": 1, "PRO": 2, "ASP": 2, "ASN": 2}
    n_chi |= {"LEU": 2, "ILE": 2, "PHE": 2, "TYR": 2, "TRP": 2, "HIS": 2, "MET": 3, "GLU": 3, "GLN": 3}
    n_chi |= {"LYS": 4, "ARG": 4}
    assert {k: len(v) for k, v in zp.CHI_ATOMS.items()} == n_chi
    assert zp.CHI_ATOMS["ILE"][1] == ("CA", "CB", "CG1", "CD1")
    assert zp.CHI_ATOMS["ARG"][3] == ("CG", "CD", "NE", "CZ")


def test_side_chain_geometry_reproducible():
    """SIDE_CHAIN_GEOMETRY is the rounded mean over 1aki, 1ubi and 7pfl."""
    vals = {}
    for f in ("1aki", "1ubi", "7pfl"):
        p = zp.from_pdb(DATA / f"{f}.pdb")
        lay, C = p.layout, p.internal.numpy()
        for v in np.nonzero(lay.ideal_mask.all(1))[0]:
            key = (lay.res_names[lay.residue_index[v]], lay.atom_names[v])
            vals.setdefault(key, []).append(C[v])
    for res, atoms in zp.topology.SIDE_CHAIN_GEOMETRY.items():
        for atom, (r, theta, phi) in atoms.items():
            v = np.array(vals[(res, atom)])
            assert abs(v[:, 0].mean() - r) < 6e-4 and abs(math.degrees(v[:, 1].mean()) - theta) < 0.06
            if phi is not None:
                mean = math.degrees(np.angle(np.exp(1j * v[:, 2]).mean()))
                assert abs((mean - phi + 180) % 360 - 180) < 6, (res, atom, mean, phi)


def test_unknown_residue():
    with pytest.raises(ValueError, match="'X' at position 2"):
        zp.protein_layout("ACX")


def test_cb_improper_gives_the_angles_and_l_chirality():
    """The fixed improper C-N-CA-CB makes C-CA-CB the Engh & Huber angle, and
    is the one real L-residues have (mean within 5 deg, every residue negative)."""
    lay = zp.protein_layout("AA")
    xyz = zmat.to_xyz(zp.internal_from_torsions(torch.zeros(2, 7, dtype=torch.float64), "AA"), lay.table)
    x = dict(zip(lay.atom_names[:5].tolist(), xyz[:5].numpy(), strict=True))  # N CA C O CB of residue 0
    assert abs(_angle(x["C"], x["CA"], x["CB"]) - zp.topology.IDEAL["C-CA-CB"]) < 1e-9
    assert abs(_angle(x["N"], x["CA"], x["CB"]) - zp.topology.IDEAL["N-CA-CB"]) < 1e-9
    ideal = math.degrees(zp.RESIDUES["ALA"].ideal[4, 2])
    assert abs(_dihedral(x["C"], x["N"], x["CA"], x["CB"]) - ideal) < 1e-9
    for f in ("1aki", "1ubi", "7pfl"):
        p = zp.from_pdb(DATA / f"{f}.pdb")
        ri, names, coord = p.layout.residue_index, p.atom_names, p.xyz.numpy()
        vals = []
        for k in range(len(p)):
            at = {str(a): coord[i] for i, a in zip(np.nonzero(ri == k)[0], names[ri == k], strict=True)}
            if {"C", "N", "CA", "CB"} <= set(at):
                vals.append(_dihedral(at["C"], at["N"], at["CA"], at["CB"]))
        assert max(vals) < 0 and abs(np.mean(vals) - ideal) < 5, f
