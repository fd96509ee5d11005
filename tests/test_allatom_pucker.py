"""The sugar ring from its pucker, closed exactly, and the ideal-geometry rebuild of DNA and
RNA from torsions and puckers (Complex.ideal_internal), on 1bna, 4p5j, 5ugo."""

import math
import os

import numpy as np
import pytest
import torch

import zmat
from zmat._align import rmsd
from zmat.protein import from_pdb, from_structure
from zmat.structure.ccd import ccd_residue
from zmat.structure.nucleic import pucker
from zmat.structure.sugar import ring_from_pucker
from zmat.transform import dihedrals

pytest.importorskip("biotite")
from biotite.structure.io import pdbx  # noqa: E402

DATA = os.path.join(os.path.dirname(__file__), "data")
pytestmark = pytest.mark.filterwarnings("ignore:The coordinates are missing")
RING = ("C4'", "O4'", "C1'", "C2'", "C3'")
NU = torch.tensor([[j % 5, (j + 1) % 5, (j + 2) % 5, (j + 3) % 5] for j in range(5)])


def _angle(a, b, c):
    u, v = a - b, c - b
    return torch.acos((u * v).sum(-1) / (u.norm(dim=-1) * v.norm(dim=-1)))


def _ideal(name):
    c = ccd_residue(name)
    x = {a: torch.tensor(v) for a, v in zip(c.atom_names.tolist(), c.ideal, strict=True)}
    fixed = torch.stack([x[a] for a in ("C5'", "C4'", "C3'", "O4'")])
    geom = torch.stack(
        [
            (x["O4'"] - x["C1'"]).norm(),
            (x["C1'"] - x["C2'"]).norm(),
            (x["C2'"] - x["C3'"]).norm(),
            _angle(x["O4'"], x["C1'"], x["C2'"]),
        ]
    )
    u0 = torch.stack(
        [
            _angle(x["C4'"], x["O4'"], x["C1'"]),
            dihedrals(torch.stack([x["C5'"], x["C4'"], x["O4'"], x["C1'"]]), torch.arange(4)),
            dihedrals(torch.stack([x["C4'"], x["O4'"], x["C1'"], x["C2'"]]), torch.arange(4)),
        ]
    )
    return fixed, geom, u0


@pytest.mark.parametrize("name", ["DA", "U"])
def test_ring_closes_exactly_for_any_pucker(name):
    fixed, geom, u0 = _ideal(name)
    phase = torch.cat(
        [torch.tensor([0.0, math.pi, 2 * math.pi - 1e-9]), torch.linspace(0.1, 6.2, 21)]
    ).double()
    for amp in (0.1, 0.4, 0.7, 0.8):
        tm = torch.full_like(phase, amp)
        n = len(phase)
        c1, c2, _ = ring_from_pucker(phase, tm, fixed.expand(n, 4, 3), geom.expand(n, 4), u0.expand(n, 3))
        f = fixed.expand(n, 4, 3)
        ring = torch.stack([f[:, 1], f[:, 3], c1, c2, f[:, 2]], 1)
        P, A = pucker(dihedrals(ring, NU))
        dp = torch.remainder(P - phase + math.pi, 2 * math.pi) - math.pi
        assert dp.abs().max() < 1e-9 and (A - tm).abs().max() < 1e-9, (name, amp)
        # every ring bond has exactly its ideal length, the closing C2'-C3' included
        torch.testing.assert_close((c2 - f[:, 2]).norm(dim=-1), geom[2].expand(n), atol=1e-10, rtol=0)
        torch.testing.assert_close((c1 - f[:, 3]).norm(dim=-1), geom[0].expand(n), atol=1e-10, rtol=0)
        angles = torch.rad2deg(
            torch.stack([_angle(f[:, 1], f[:, 3], c1), _angle(c1, c2, f[:, 2]), _angle(c2, f[:, 2], f[:, 1])])
        )
        assert angles.min() > 90 and angles.max() < 118, (name, amp, angles.min(), angles.max())


def test_ring_gradients_are_the_implicit_ones():
    fixed, geom, u0 = _ideal("DG")
    phase = torch.tensor([2.8], dtype=torch.float64, requires_grad=True)
    amp = torch.tensor([0.62], dtype=torch.float64, requires_grad=True)

    def f(p, a):
        c1, c2, _ = ring_from_pucker(p, a, fixed.expand(1, 4, 3), geom.expand(1, 4), u0.expand(1, 3))
        return torch.cat([c1, c2], -1)

    assert torch.autograd.gradcheck(f, (phase, amp), atol=1e-6, rtol=1e-4)


@pytest.fixture(scope="module", params=["1bna", "4p5j", "5ugo"])
def structure(request):
    return request.param, from_pdb(os.path.join(DATA, f"{request.param}.cif"))


def _per_residue(p, x):
    """Per standard nucleotide, the RMSD of its atoms. 4p5j's modified 3' A23 is left out: its
    file names OP1 / OP2 the other way round from PDB v3 (measured +121 / -117 deg from O5'
    about O3'(i-1)-P, standard residues -113 / +118), so the ideal phosphate swaps them."""
    res = p.parsed.residue
    return [
        float(rmsd(x[torch.from_numpy(res == k)], p.xyz[torch.from_numpy(res == k)]))
        for k in np.flatnonzero((p.family == "nucleic") & (p.res_types == p.res_names))
    ]


def test_ideal_rebuild_from_own_torsions_and_puckers(structure):
    """Torsions (but delta, which follows the ring) and puckers come back exactly; the
    ring bonds are ideal; per residue the rebuild is within 0.4 A of the file (median
    0.26 A 1bna, 0.14 A 4p5j, 0.13 A 5ugo); the whole structure drifts by lever arm."""
    name, p = structure
    x = zmat.to_xyz(p.ideal_internal(), p.table)
    t = p.measure_torsions(x)
    for key in ("alpha", "beta", "gamma", "epsilon", "zeta", "chi", "pucker_phase", "pucker_amplitude"):
        d = torch.remainder(t[key] - p.torsions[key] + math.pi, 2 * math.pi) - math.pi
        assert d.abs().nan_to_num().max() < 1e-8, (name, key)
        assert torch.equal(torch.isnan(t[key]), torch.isnan(p.torsions[key]))
    res, names = p.parsed.residue, p.atom_names
    for k in np.flatnonzero(p.family == "nucleic")[:6]:
        c = ccd_residue(p.res_names[k])
        ideal = dict(zip(c.atom_names.tolist(), c.ideal, strict=True))
        at = {str(names[i]): i for i in np.flatnonzero(res == k)}
        for a, b in zip(RING, RING[1:] + RING[:1], strict=True):
            got = float((x[at[a]] - x[at[b]]).norm())
            assert abs(got - np.linalg.norm(ideal[a] - ideal[b])) < 1e-8, (name, k, a, b)
    per = _per_residue(p, x)
    assert np.median(per) < 0.3 and max(per) < 0.6, (name, np.median(per), max(per))


def test_ideal_rebuild_with_new_puckers_and_torsions():
    atoms = pdbx.get_structure(pdbx.CIFFile.read(os.path.join(DATA, "1bna.cif")), model=1)
    p = from_structure(atoms[(atoms.chain_id == "A") & (atoms.res_id <= 3)])
    L = len(p)
    want = {
        "pucker_phase": torch.full((L,), math.radians(18.0), dtype=torch.float64),  # C3'-endo (A-form)
        "pucker_amplitude": torch.full((L,), math.radians(38.0), dtype=torch.float64),
        "chi": torch.full((L,), math.radians(-160.0), dtype=torch.float64),
        "gamma": torch.full((L,), math.radians(55.0), dtype=torch.float64),
    }
    x = zmat.to_xyz(p.ideal_internal(want), p.table)
    t = p.measure_torsions(x)
    for key, value in want.items():
        torch.testing.assert_close(
            torch.remainder(t[key] - value + math.pi, 2 * math.pi) - math.pi,
            torch.zeros(L, dtype=torch.float64),
            atol=1e-8,
            rtol=0,
        )
    with pytest.raises(ValueError, match="omega2"):
        p.ideal_internal({"omega2": want["chi"]})
    # differentiable in the puckers: the implicit gradient matches finite differences
    phase = want["pucker_phase"].clone().requires_grad_(True)

    def f(ph):
        xyz = zmat.to_xyz(p.ideal_internal({**want, "pucker_phase": ph}), p.table)
        return xyz[-5:].reshape(-1)

    assert torch.autograd.gradcheck(f, (phase,), atol=1e-5, rtol=1e-4)


def test_ideal_rebuild_of_amino_acids_in_a_complex():
    """Protein residues of a complex get the templates' ideal geometry and their
    torsions: 5ugo per-residue RMSD median 0.03 A; 1ubi (read as a complex) drifts by
    2.1 A overall, as Protein.ideal_internal does (lever arm, ``zmat/protein/build.py``)."""
    p = from_pdb(os.path.join(DATA, "5ugo.cif"), ligands=True)
    want = {"chi1": p.torsions["chi1"] + 0.4, "psi": p.torsions["psi"] - 0.2}
    x = zmat.to_xyz(p.ideal_internal(want), p.table)
    t = p.measure_torsions(x)
    for key in ("phi", "psi", "omega", "chi1", "chi2", "chi3", "chi4"):
        ref = want.get(key, p.torsions[key])
        d = torch.remainder(t[key] - ref + math.pi, 2 * math.pi) - math.pi
        assert d.abs().nan_to_num().max() < 1e-8, key
    x = zmat.to_xyz(p.ideal_internal(), p.table)
    res = p.parsed.residue
    per = [
        float(rmsd(x[torch.from_numpy(res == k)], p.xyz[torch.from_numpy(res == k)]))
        for k in np.flatnonzero(p.family == "protein")
    ]
    assert np.median(per) < 0.06 and max(per) < 0.3
    ca = np.flatnonzero(p.atom_names == "CA")
    n = p.parsed.refs[ca, 0]
    inner = (p.atom_names[n] == "N") & (p.parsed.refs[ca, 1] >= 0)
    lengths = (x[ca[inner]] - x[n[inner]]).norm(dim=-1)
    assert float((lengths - 1.458).abs().median()) < 1e-12  # Engh & Huber N-CA
    q = from_pdb(os.path.join(DATA, "1ubi.pdb"), ligands=True)
    drift = float(rmsd(zmat.to_xyz(q.ideal_internal(), q.table), q.xyz))
    assert 1.5 < drift < 3.0, drift


def test_one_residue_pucker_edit_in_own_geometry_is_local():
    """xyz_from_torsions(geometry="own") with one nucleotide's pucker given: that residue is
    rebuilt ideally at the new pucker (its torsions its own), every bond and bond angle
    outside it keeps its measured value and the other strand stays in place (1bna with H;
    the ideal rebuild moved 167 of 816 bonds by more than 0.02 A)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = from_pdb(os.path.join(DATA, "1bna.cif"), hydrogens=True)
    k = 5
    nan = torch.full((len(c),), math.nan, dtype=torch.float64)
    phase = nan.clone()
    phase[k] = math.radians(18.0)  # C3'-endo; the file's DA 6 is C2'-endo (127 deg)
    x = c.xyz_from_torsions({"pucker_phase": phase}, geometry="own")
    poly = c.parsed.polymer_index[c.parsed.residue]
    got = c.measure_torsions(x)
    assert abs(float(got["pucker_phase"][k]) - math.radians(18.0)) < 1e-8
    for name in ("alpha", "beta", "gamma", "epsilon", "zeta", "chi"):  # its own torsions kept
        torch.testing.assert_close(got[name][k], c.torsions[name][k], atol=1e-8, rtol=0, equal_nan=True)
    b = c.bonds.numpy()
    nbrs = {}
    for i, j in b.tolist():
        nbrs.setdefault(i, []).append(j)
        nbrs.setdefault(j, []).append(i)
    ang = torch.tensor([(i, a, j) for a, js in nbrs.items() for m, i in enumerate(js) for j in js[m + 1 :]])
    outside_b = ~torch.from_numpy((poly[b] == k).any(1))
    outside_a = ~torch.from_numpy(poly[ang.numpy()] == k).any(1)

    def geometry(xyz):
        return (xyz[b[:, 0]] - xyz[b[:, 1]]).norm(dim=-1), _angle(
            xyz[ang[:, 0]], xyz[ang[:, 1]], xyz[ang[:, 2]]
        )

    (bl, th), (new_b, new_a) = geometry(c.xyz), geometry(x)
    assert (new_b - bl)[outside_b].abs().max() < 1e-9 and (new_a - th)[outside_a].abs().max() < 1e-9
    assert (new_b - bl)[~outside_b].abs().max() > 0.02  # the edited ring did change
    strand = c.res_chain_ids[np.flatnonzero(c.polymer)[k]]
    other = torch.from_numpy(c.chain_id != strand)
    assert (x - c.xyz)[other].norm(dim=-1).max() < 1e-9
    # the same edit through the ideal rebuild moves bonds outside the residue
    ideal_b, _ = geometry(c.xyz_from_torsions({"pucker_phase": phase}, geometry="ideal"))
    assert (ideal_b - bl)[outside_b].abs().max() > 0.02
