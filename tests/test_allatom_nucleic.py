"""DNA and RNA in zmat.protein: every atom kept and rebuilt exactly, IUPAC torsions and
the Altona-Sundaralingam pucker against an independent computation from atom names and
against MDAnalysis's nucleic-acid analysis, on 1bna (B-DNA), 4p5j (RNA), 5ugo (protein-DNA)."""

import math
import os

import numpy as np
import pytest
import torch

import zmat
from zmat._align import superpose
from zmat.protein import Complex, Protein, from_pdb, from_structure
from zmat.structure.ccd import has_ccd_entry
from zmat.structure.nucleic import NUCLEOTIDES, PURINES, pucker

pytest.importorskip("biotite")
from biotite.structure.io import pdb, pdbx  # noqa: E402

DATA = os.path.join(os.path.dirname(__file__), "data")
FILES = ["1bna", "4p5j", "5ugo"]
pytestmark = pytest.mark.filterwarnings("ignore:The coordinates are missing")


def _atoms(name):
    return pdbx.get_structure(pdbx.CIFFile.read(os.path.join(DATA, f"{name}.cif")), model=1)


@pytest.fixture(scope="module", params=FILES)
def structure(request):
    return request.param, _atoms(request.param), from_pdb(os.path.join(DATA, f"{request.param}.cif"))


def test_every_polymer_atom_kept_and_rebuilt_exactly(structure):
    name, atoms, p = structure
    assert isinstance(p, Complex)
    heavy = atoms.element != "H"
    # A23: 4p5j's 3' residue, a 2',3'-cyclic phosphate adenosine linked into the chain
    polymer = np.isin(atoms.res_name, NUCLEOTIDES + tuple(zmat.protein.RESIDUES) + ("A23",))
    assert p.n_atoms == int((heavy & polymer).sum())
    # same atoms, same order, same coordinates as the file
    arr = p.to_structure()
    sel = atoms[heavy & polymer]
    assert (arr.atom_name == sel.atom_name).all() and (arr.res_id == sel.res_id).all()
    assert (arr.chain_id == sel.chain_id).all() and (arr.res_name == sel.res_name).all()
    np.testing.assert_array_equal(arr.coord, sel.coord)
    x = zmat.to_xyz(p.internal, p.table)
    err = (superpose(x, p.xyz) - p.xyz).abs().max()
    assert err < 1e-8, f"{name}: rebuild error {float(err):.2e} A"


def _dihedral(p0, p1, p2, p3):
    b0, b1, b2 = p0 - p1, p2 - p1, p3 - p2
    b1 = b1 / np.linalg.norm(b1)
    v = b0 - np.dot(b0, b1) * b1
    w = b2 - np.dot(b2, b1) * b1
    return math.atan2(np.dot(np.cross(b1, v), w), np.dot(v, w))


def _independent(atoms):
    """Per nucleotide (chain, res_id): torsions from atom names, numpy only (neighbours:
    nucleotides of the same chain with O3'-P under 2 A). 4p5j's 3' A23 (a 2',3'-cyclic
    phosphate adenosine) is a nucleotide of its parent type A."""
    import biotite.structure as struc

    res = list(struc.residue_iter(atoms[atoms.element != "H"]))
    xyz = [{a: r.coord[i].astype(np.float64) for i, a in enumerate(r.atom_name)} for r in res]
    out = {}
    for k, r in enumerate(res):
        name = {"A23": "A"}.get(r.res_name[0], r.res_name[0])
        if name not in NUCLEOTIDES:
            continue
        x = xyz[k]

        def linked(j, k=k, chain=r.chain_id[0]):
            linking = NUCLEOTIDES + ("A23",)  # 4p5j's in-chain modified 3' residue
            if not (0 <= j < len(res) and res[j].chain_id[0] == chain and res[j].res_name[0] in linking):
                return False
            lo, hi = min(j, k), max(j, k)
            return np.linalg.norm(xyz[lo]["O3'"] - xyz[hi]["P"]) < 2.0

        prev = xyz[k - 1] if linked(k - 1) else {}
        nxt = xyz[k + 1] if linked(k + 1) else {}
        glyco = ("N9", "C4") if name in PURINES else ("N1", "C2")
        quads = {
            "alpha": (prev.get("O3'"), x.get("P"), x["O5'"], x["C5'"]),
            "beta": (x.get("P"), x["O5'"], x["C5'"], x["C4'"]),
            "gamma": (x["O5'"], x["C5'"], x["C4'"], x["C3'"]),
            "delta": (x["C5'"], x["C4'"], x["C3'"], x["O3'"]),
            "epsilon": (x["C4'"], x["C3'"], x["O3'"], nxt.get("P")),
            "zeta": (x["C3'"], x["O3'"], nxt.get("P"), nxt.get("O5'")),
            "chi": (x["O4'"], x["C1'"], x[glyco[0]], x[glyco[1]]),
        }
        t = {n: (math.nan if any(q is None for q in v) else _dihedral(*v)) for n, v in quads.items()}
        ring = [x[a] for a in ("C4'", "O4'", "C1'", "C2'", "C3'")] * 2
        nu = [_dihedral(*ring[j : j + 4]) for j in range(5)]
        num = (nu[4] + nu[1]) - (nu[3] + nu[0])
        phase = math.atan2(num, 2 * nu[2] * (math.sin(math.radians(36)) + math.sin(math.radians(72))))
        t["pucker_phase"] = phase % (2 * math.pi)
        t["pucker_amplitude"] = nu[2] / math.cos(phase)
        out[r.chain_id[0], int(r.res_id[0])] = t
    return out


def _by_residue(p):
    res = np.flatnonzero(p.polymer)
    return {(p.res_chain_ids[r], int(p.res_ids[r])): k for k, r in enumerate(res)}


def test_torsions_equal_independent_computation(structure):
    name, atoms, p = structure
    ref = _independent(atoms)
    index = _by_residue(p)
    assert len(ref) == int((p.family == "nucleic").sum())
    n_defined = 0
    for key, t in ref.items():
        k = index[key]
        for tname, value in t.items():
            got = float(p.torsions[tname][k])
            assert math.isnan(got) == math.isnan(value), (name, key, tname, got, value)
            if not math.isnan(value):
                n_defined += 1
                diff = (got - value + math.pi) % (2 * math.pi) - math.pi
                assert abs(diff) < 1e-9, (name, key, tname, got, value)
    assert n_defined > 8 * len(ref)
    # protein residues have no nucleotide torsion, and the other way round
    prot = p.family[p.polymer] == "protein"
    assert torch.isnan(p.torsions["alpha"][prot]).all() and torch.isnan(p.torsions["chi1"][~prot]).all()


def test_torsions_agree_with_mdanalysis(tmp_path):
    """MDAnalysis's nuclinfo (IUPAC torsions; its phase_as is the Fourier form of the
    Altona-Sundaralingam phase, which differs from the 1972 tan P formula by under 2 deg
    on real rings) on the same PDB file zmat reads."""
    mda = pytest.importorskip("MDAnalysis")
    from MDAnalysis.analysis import nuclinfo

    funcs = {
        "alpha": nuclinfo.tors_alpha,
        "beta": nuclinfo.tors_beta,
        "gamma": nuclinfo.tors_gamma,
        "delta": nuclinfo.tors_delta,
        "epsilon": nuclinfo.tors_eps,
        "zeta": nuclinfo.tors_zeta,
        "chi": nuclinfo.tors_chi,
        "pucker_phase": nuclinfo.phase_as,
    }
    tol = {"pucker_phase": 2.0}
    for name in FILES:
        path = str(tmp_path / f"{name}.pdb")
        f = pdb.PDBFile()
        f.set_structure(_atoms(name))
        f.write(path)
        u = mda.Universe(path)
        p = from_pdb(path, ligands=True)  # 4p5j: the 3' A23 is a modified nucleotide
        worst = dict.fromkeys(funcs, 0.0)
        for (chain, rid), k in _by_residue(p).items():
            if p.family[np.flatnonzero(p.polymer)[k]] != "nucleic":
                continue
            for tname, fn in funcs.items():
                got = float(p.torsions[tname][k])
                if math.isnan(got):
                    continue
                ref = fn(u, chain, rid)
                diff = abs((math.degrees(got) - ref + 180) % 360 - 180)
                worst[tname] = max(worst[tname], diff)
        for tname, w in worst.items():
            assert w < tol.get(tname, 2e-3), (name, tname, w)


@pytest.mark.parametrize("phase_deg", [0.0, 18.0, 90.0, 162.0, 180.0, 270.0, 359.0])
def test_pucker_of_ideal_pseudorotation(phase_deg):
    P, tm = math.radians(phase_deg), 0.65
    nu = torch.tensor([tm * math.cos(P + 4 * math.pi * (j - 2) / 5) for j in range(5)], dtype=torch.float64)
    phase, amp = pucker(nu)
    diff = (float(phase) - P + math.pi) % (2 * math.pi) - math.pi
    assert abs(diff) < 1e-12 and abs(float(amp) - tm) < 1e-12
    assert 0 <= float(phase) < 2 * math.pi


def test_pucker_gradients_finite_at_flat_ring():
    nu = torch.zeros(5, dtype=torch.float64, requires_grad=True)
    phase, amp = pucker(nu)
    (phase + amp).backward()
    assert torch.isfinite(nu.grad).all()
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: pucker(v), (x,))


def test_backbone_torsions_are_rows_that_move_atoms():
    p = from_pdb(os.path.join(DATA, "1bna.cif"))
    rows = p.torsion_rows()
    for name in ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "chi"):
        defined = ~torch.isnan(p.torsions[name])
        assert (rows[name][defined] >= 0).all(), name
    new = {name: torch.full((len(p),), 1.0, dtype=torch.float64) for name in ("alpha", "gamma", "chi")}
    x = zmat.to_xyz(p.internal_with_torsions(new), p.table)
    t = p.measure_torsions(x)
    for name in new:
        defined = ~torch.isnan(p.torsions[name])
        torch.testing.assert_close(t[name][defined], new[name][defined], atol=1e-10, rtol=0)
    # untouched torsions stay (the ring and bond geometry too)
    torch.testing.assert_close(t["beta"], p.torsions["beta"], atol=1e-10, rtol=0, equal_nan=True)
    torch.testing.assert_close(t["pucker_phase"], p.torsions["pucker_phase"], atol=1e-10, rtol=0)


def test_protein_only_files_stay_proteins():
    assert isinstance(from_pdb(os.path.join(DATA, "1aki.pdb")), Protein)
    # a protein chain of the protein-DNA complex alone is a Protein too
    assert isinstance(from_structure(_atoms("5ugo"), chain="A"), Protein)


def test_unknown_residue_without_ccd_entry_names_it():
    atoms = _atoms("1bna")
    assert not has_ccd_entry("ZZQ9")
    atoms.res_name[atoms.res_name == "HOH"] = "ZZQ9"
    with pytest.raises(ValueError, match="ZZQ9"):
        from_structure(atoms, ligands=True)
