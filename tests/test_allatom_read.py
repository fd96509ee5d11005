"""Reading all-atom structures with the tables stamped from residue templates and the missing
hydrogens placed all at once (``hydrogens.plan`` / ``place_all``, ``templates.stamp``):

* every array equals what the per-residue, per-hydrogen code read before (stored expectations,
  ``tests/data/allatom_fingerprints.json``, written by ``tests/data/make_allatom_fingerprints.py``
  from the commit before the change);
* independent checks: hydrogen counts of internal residues against the textbook pH 7 counts,
  completed hydrogens' bond lengths against the CCD's ideal coordinates (biotite's own), the
  file's hydrogens kept where they are, and ``place_all`` equal bit for bit to ``place`` on
  degenerate and random references."""

from __future__ import annotations

import json
import os
import sys
import warnings

import numpy as np
import pytest

from zmat.protein.io import read_atoms
from zmat.structure import hydrogens
from zmat.structure.allatom import parse_complex

pytest.importorskip("biotite")
import biotite.structure.info as info  # noqa: E402

DATA = os.path.join(os.path.dirname(__file__), "data")
sys.path.insert(0, DATA)
from make_allatom_fingerprints import fingerprint, options  # noqa: E402

with open(os.path.join(DATA, "allatom_fingerprints.json")) as f:
    REFERENCE = json.load(f)
#: Hydrogens of an amino acid inside a chain at pH 7 (Asp/Glu deprotonated, Lys/Arg
#: protonated, His HIE; a disulfide cysteine has no HG), counted by hand from the residues'
#: chemistry, and of a DNA nucleotide inside a strand (deprotonated phosphate).
INTERNAL_H = {
    "ALA": 5, "ARG": 13, "ASN": 6, "ASP": 4, "CYS": 5, "GLN": 8, "GLU": 6, "GLY": 3, "HIS": 7,
    "ILE": 11, "LEU": 11, "LYS": 13, "MET": 9, "PHE": 9, "PRO": 7, "SER": 5, "THR": 7, "TRP": 10,
    "TYR": 9, "VAL": 9, "DA": 11, "DC": 11, "DG": 11, "DT": 12,
}  # fmt: skip


def _read(name, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return parse_complex(read_atoms(os.path.join(DATA, name)), **kw)


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=[pytest.mark.slow] if c["file"] == "1igy.pdb" else []) for c in REFERENCE],
    ids=lambda c: f"{c['file']}-{'-'.join(c['options'])}",
)
def test_arrays_equal_the_stored_reading(case):
    got = fingerprint(_read(case["file"], **options(case["options"])))
    for key, want in case.items():
        if key in ("file", "options"):
            continue
        if key == "xyz":  # a machine's ddot moves completed H by ulps; any real change is >= 1e-6 A
            np.testing.assert_allclose(got[key]["sum"], want["sum"], rtol=0, atol=1e-6)
            assert abs(got[key]["sumsq"] - want["sumsq"]) < 1e-12 * want["sumsq"]
        else:
            assert got[key] == want, f"{case['file']}: {key} differs from the stored reading"


def _heavy_of(c) -> np.ndarray:
    """Each atom's first bonded heavy atom (-1: none)."""
    out = np.full(len(c.atom_names), -1)
    for i, j in c.bonds[::-1].tolist():  # the first bond wins
        if c.elements[j] != "H":
            out[i] = j
        if c.elements[i] != "H":
            out[j] = i
    return out


@pytest.mark.parametrize("name", ["1aki.pdb", "1bna.cif"])
def test_internal_residues_have_their_ph7_hydrogens(name):
    c = _read(name, hydrogens=True)
    R = len(c.res_names)
    nxt = np.r_[c.linked[1:], False]
    n_h = np.bincount(c.residue[c.elements == "H"], minlength=R)
    bridged = set(c.residue[c.bonds[(c.atom_names[c.bonds] == "SG").all(1)]].ravel().tolist())
    inside = np.flatnonzero(c.linked & nxt)
    assert len(inside) > 0.8 * R
    for k in inside.tolist():
        want = INTERNAL_H[c.res_names[k]] - (k in bridged)
        assert n_h[k] == want, f"{c.res_names[k]} {c.res_ids[k]}: {n_h[k]} hydrogens, {want} expected"


@pytest.mark.parametrize("name", ["1aki.pdb", "1bna.cif", "1ehz_trna.pdb", "1a8o_modified.cif"])
def test_completed_hydrogens_sit_at_their_ideal_bond_length(name):
    c = _read(name, hydrogens=True)
    x = _heavy_of(c)
    added = np.flatnonzero(c.added)
    assert len(added) and (x[added] >= 0).all()
    for i in added.tolist():
        res, h, heavy = c.res_names[c.residue[i]], str(c.atom_names[i]), str(c.atom_names[x[i]])
        if heavy == "N" and h in ("H", "H1", "H2", "H3") and c.family[c.residue[i]] == "protein":
            want = 1.01  # amide H on the bisector, N-terminal H tetrahedral
        elif h == "HO5'":
            want = 0.96
        else:
            ideal = info.residue(res)
            at = {a: p for a, p in zip(ideal.atom_name, ideal.coord.astype(np.float64), strict=True)}
            want = np.linalg.norm(at[h] - at[heavy])
        got = np.linalg.norm(c.xyz[i] - c.xyz[x[i]])
        assert abs(got - want) < 1e-9, f"{res} {c.res_ids[c.residue[i]]} {h}: {got} A, {want} A expected"


def test_file_hydrogens_kept_and_none_added_beside_them():
    raw = read_atoms(os.path.join(DATA, "1igy.pdb"))
    c = _read("1igy.pdb", hydrogens=True, ligands=True)
    file_h = raw[(raw.element == "H") & (raw.res_name != "HOH")]
    kept = ~c.added & (c.elements == "H")
    assert kept.sum() == file_h.array_length() == 2498
    np.testing.assert_array_equal(c.xyz[kept], file_h.coord.astype(np.float64))
    x = _heavy_of(c)
    carries = set(x[kept].tolist())
    assert not carries & set(x[c.added].tolist())  # a heavy atom with file H gets no more


def test_place_all_is_place_bit_for_bit():
    rng = np.random.default_rng(0)
    n = 4000
    xyz = rng.normal(size=(3 * n, 3)) * rng.uniform(0.5, 3, size=(3 * n, 1))
    xyz[: 3 * 200 : 3] = xyz[1 : 3 * 200 : 3]  # coincident references
    xyz[3 * 200 : 3 * 400 : 3] = (
        2 * xyz[3 * 200 + 1 : 3 * 400 : 3] - xyz[3 * 200 + 2 : 3 * 400 : 3]
    )  # collinear
    refs = np.arange(3 * n).reshape(n, 3)
    how = np.where(np.arange(n) % 3 == 0, hydrogens.AMIDE, hydrogens.NERF)
    coef = np.array(
        [hydrogens._coefficients(*v) for v in rng.uniform([0.9, 1.5, -3.2], [1.2, 2.2, 3.2], (n, 3))]
    )
    pos, done = hydrogens.place_all(xyz, how, refs, coef)
    assert 300 < (~done).sum() < 500  # the degenerate rows are left to place()
    for i in range(n):
        b, a, d = xyz[refs[i]]
        if how[i] == hydrogens.AMIDE:  # N, CA, the previous C
            want, ok = hydrogens.place("ALA", "protein", "H", "N", {"N": b, "CA": a}, prev_c=d)
        else:
            want, ok = hydrogens._nerf(b, a, d, coef[i])
        assert ok == done[i]
        if ok:
            assert np.array_equal(pos[i], want), i


def test_the_per_variant_caches_are_bounded():
    """Reading many different files must not grow memory without bound: every cache keyed by what a
    file holds (residue variants, their names and bonds) has a size limit."""
    from zmat.structure import allatom, hydrogens, templates

    for cached in (allatom._own_rotatable, hydrogens.plan, hydrogens._ccd_row, templates._cached):
        assert cached.cache_info().maxsize is not None, cached.__name__
