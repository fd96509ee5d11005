"""zmat.rdkit against RDKit itself: torsions set by zmat and by SetDihedralRad agree.

Every molecule is embedded with ETKDG (fixed seed, hydrogens added). For each
rotatable bond, the torsion is set with ``TorsionSpace.to_xyz`` and with
``rdMolTransforms.SetDihedralRad`` on a copy of the conformer; the structures
must agree to 1e-8 A after superposition (and, by the frame convention, also
without it), and RDKit's stereo perception of the result must not change.
"""

import ast
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

Chem = pytest.importorskip("rdkit.Chem")
from rdkit.Chem import AllChem, rdMolDescriptors, rdMolTransforms  # noqa: E402

import zmat  # noqa: E402
from zmat.rdkit import STRICT_SMARTS, TorsionSpace, rotatable_bonds  # noqa: E402

# Real drug-like molecules: amides, biaryls, stereocentres, E/Z double bonds,
# charged groups, salts with two fragments and a macrocycle.
SMILES = {
    "ibuprofen": "CC(C)Cc1ccc(cc1)[C@@H](C)C(=O)O",
    "aspirin": "CC(=O)Oc1ccccc1C(=O)O",
    "paracetamol": "CC(=O)Nc1ccc(O)cc1",
    "diphenhydramine": "CN(C)CCOC(c1ccccc1)c1ccccc1",
    "imatinib": "Cc1ccc(NC(=O)c2ccc(CN3CCN(C)CC3)cc2)cc1Nc1nccc(-c2cccnc2)n1",
    "losartan": "CCCCc1nc(Cl)c(CO)n1Cc1ccc(-c2ccccc2-c2nn[nH]n2)cc1",
    "tamoxifen": "CC/C(=C(\\c1ccccc1)c1ccc(OCCN(C)C)cc1)c1ccccc1",
    "sertraline": "CN[C@H]1CC[C@@H](c2ccc(Cl)c(Cl)c2)c2ccccc21",
    "ibuprofen_sodium": "CC(C)Cc1ccc(cc1)[C@H](C)C(=O)[O-].[Na+]",
    "acetylcholine_chloride": "C[N+](C)(C)CCOC(C)=O.[Cl-]",
    "phenylalanine_zwitterion": "[NH3+][C@@H](Cc1ccccc1)C(=O)[O-]",
    "cyclododecyl_ether": "C1CCCCCCCCCCC1CCOc1ccccc1",
    "fluvoxamine": "COCCCC/C(=N/OCCN)c1ccc(C(F)(F)F)cc1",
    "biphenyl": "Cc1ccccc1-c1ccccc1C",
    "lidocaine": "CCN(CC)CC(=O)Nc1c(C)cccc1C",
    "amoxicillin": "CC1(C)S[C@@H]2[C@H](NC(=O)[C@H](N)c3ccc(O)cc3)C(=O)N2[C@H]1C(=O)O",
    "celecoxib": "Cc1ccc(-c2cc(C(F)(F)F)nn2-c2ccc(S(N)(=O)=O)cc2)cc1",
    "fluoxetine": "CNCCC(Oc1ccc(C(F)(F)F)cc1)c1ccccc1",
    "nicotine": "CN1CCC[C@H]1c1cccnc1",
    "propranolol": "CC(C)NC[C@H](O)COc1cccc2ccccc12",
    "warfarin": "CC(=O)C[C@@H](c1ccccc1)c1c(O)c2ccccc2oc1=O",
    "sildenafil": "CCCc1nn(C)c2c(=O)[nH]c(-c3cc(S(=O)(=O)N4CCN(C)CC4)ccc3OCC)nc12",
    "ethyl_cinnamate": "CCOC(=O)/C=C/c1ccccc1",
    "z_stilbene": "c1ccc(cc1)/C=C\\c1ccccc1",
    "oseltamivir": "CCC(CC)O[C@@H]1C=C(C[C@@H]([C@H]1NC(C)=O)N)C(=O)OCC",
    "valsartan": "CCCCC(=O)N(Cc1ccc(-c2ccccc2-c2nn[nH]n2)cc1)[C@@H](C(C)C)C(=O)O",
    "metoprolol": "COCCc1ccc(OCC(O)CNC(C)C)cc1",
    "verapamil_like": "COc1ccc(CCN(C)CCCC(C#N)(C(C)C)c2ccc(OC)c(OC)c2)cc1OC",
}


def embed(smiles: str, seed: int = 7):
    mol = Chem.AddHs(Chem.MolFromSmiles(smiles))
    params = AllChem.ETKDGv3()
    params.randomSeed = seed
    assert AllChem.EmbedMolecule(mol, params) == 0, smiles
    return mol


@pytest.fixture(scope="module")
def mols():
    return {name: embed(s) for name, s in SMILES.items()}


def positions(mol, conf_id=-1):
    return torch.as_tensor(mol.GetConformer(conf_id).GetPositions())


def stereo_labels(mol):
    """RDKit's perception of the 3-D stereo: CIP labels of atoms and double bonds."""
    mol = Chem.Mol(mol)
    Chem.AssignStereochemistryFrom3D(mol)
    atoms = {a.GetIdx(): a.GetProp("_CIPCode") for a in mol.GetAtoms() if a.HasProp("_CIPCode")}
    bonds = {
        b.GetIdx(): str(b.GetStereo()) for b in mol.GetBonds() if b.GetStereo() != Chem.BondStereo.STEREONONE
    }
    return atoms, bonds


def rdkit_set(mol, quads, values):
    """Torsions set one by one with RDKit on a copy of the conformer."""
    copy = Chem.Mol(mol)
    conf = copy.GetConformer()
    for q, v in zip(quads.tolist(), values.tolist(), strict=True):
        rdMolTransforms.SetDihedralRad(conf, *q, float(v))
    return copy, positions(copy)


# ------------------------------------------------------------- the space
def test_default_rotatable_bonds_are_rdkits_strict_count(mols):
    for name, mol in mols.items():
        heavy = Chem.RemoveHs(mol)
        expected = rdMolDescriptors.CalcNumRotatableBonds(
            heavy, rdMolDescriptors.NumRotatableBondsOptions.Strict
        )
        assert len(rotatable_bonds(mol)) == expected, name


def test_reproduces_the_conformer_in_its_frame(mols):
    for name, mol in mols.items():
        ts = TorsionSpace.from_mol(mol)
        x0 = positions(mol)
        assert ts.torsions.dtype == torch.float64
        assert (ts.to_xyz(ts.torsions) - x0).abs().max() < 1e-10, name
        # torsions are exactly the quads' dihedrals, measured by RDKit
        conf = mol.GetConformer()
        ref = [rdMolTransforms.GetDihedralRad(conf, *q) for q in ts.quads.tolist()]
        np.testing.assert_allclose(ts.torsions.numpy(), ref, atol=1e-12)
        assert torch.allclose(ts.from_xyz(x0), ts.torsions, atol=1e-12)


def test_quads_are_bonded_and_off_rings(mols):
    for name, mol in mols.items():
        ts = TorsionSpace.from_mol(mol)
        for a, b, c, d in ts.quads.tolist():
            for i, j in ((a, b), (b, c), (c, d)):
                assert mol.GetBondBetweenAtoms(i, j) is not None, name
            assert not mol.GetBondBetweenAtoms(b, c).IsInRing(), name


def test_every_bond_matches_rdkit_set_dihedral(mols):
    """Each rotatable bond alone, then all at once, against SetDihedralRad (the figures in the report)."""
    rng = np.random.default_rng(0)
    worst, n_bonds = 0.0, 0
    for name, mol in mols.items():
        ts = TorsionSpace.from_mol(mol)
        ref_stereo = stereo_labels(mol)
        k = len(ts.quads)
        for j in range(k):
            t = ts.torsions.clone()
            t[j] = rng.uniform(-np.pi, np.pi)
            x = ts.to_xyz(t)
            _, xr = rdkit_set(mol, ts.quads[j : j + 1], t[j : j + 1])
            worst = max(worst, float(zmat.rmsd(x, xr)), float((x - xr).abs().max()))
            n_bonds += 1
        t = torch.as_tensor(rng.uniform(-np.pi, np.pi, k))
        x = ts.to_xyz(t)
        copy, xr = rdkit_set(mol, ts.quads, t)
        worst = max(worst, float(zmat.rmsd(x, xr)), float((x - xr).abs().max()))
        assert stereo_labels(ts.to_mols(x)[0]) == ref_stereo, name
        assert stereo_labels(copy) == ref_stereo, name
    print(f"{len(mols)} molecules, {n_bonds} rotatable bonds, worst deviation from RDKit {worst:.2e} A")
    assert n_bonds > 100
    assert worst < 1e-8


@settings(max_examples=15)
@given(name=st.sampled_from(sorted(SMILES)), data=st.data())
def test_hypothesis_torsions_match_rdkit(mols, name, data):
    mol = mols[name]
    ts = TorsionSpace.from_mol(mol)
    k = len(ts.quads)
    t = torch.tensor(data.draw(st.lists(st.floats(-4.0, 4.0), min_size=k, max_size=k)), dtype=torch.float64)
    x = ts.to_xyz(t)
    _, xr = rdkit_set(mol, ts.quads, t)
    assert zmat.rmsd(x, xr) < 1e-8
    dt = torch.remainder(ts.from_xyz(x) - t + torch.pi, 2 * torch.pi) - torch.pi
    assert dt.abs().max() < 1e-9


def test_invariants_under_random_torsions(mols):
    """Bond lengths, bond angles, ring closures and signed volumes of stereocentres are frozen."""
    for name in ("amoxicillin", "oseltamivir", "cyclododecyl_ether", "tamoxifen", "ibuprofen_sodium"):
        mol = mols[name]
        ts = TorsionSpace.from_mol(mol)
        x0 = positions(mol)
        x = ts.to_xyz(ts.torsions + torch.randn(4, len(ts.quads), dtype=torch.float64))
        bonds = torch.tensor([(b.GetBeginAtomIdx(), b.GetEndAtomIdx()) for b in mol.GetBonds()])
        length = [(p[..., bonds[:, 0], :] - p[..., bonds[:, 1], :]).norm(dim=-1) for p in (x, x0)]
        assert (length[0] - length[1]).abs().max() < 1e-10, name
        angles = torch.tensor(
            [
                (i.GetIdx(), a.GetIdx(), j.GetIdx())
                for a in mol.GetAtoms()
                for i in a.GetNeighbors()
                for j in a.GetNeighbors()
                if i.GetIdx() < j.GetIdx()
            ]
        )

        arms = [[p[..., angles[:, k], :] - p[..., angles[:, 1], :] for k in (0, 2)] for p in (x, x0)]
        cos = [(a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1)) for a, b in arms]
        assert (cos[0] - cos[1]).abs().max() < 1e-10, name
        chiral = [a.GetIdx() for a in mol.GetAtoms() if a.GetChiralTag() != Chem.ChiralType.CHI_UNSPECIFIED]
        for c in chiral:
            nb = [n.GetIdx() for n in mol.GetAtomWithIdx(c).GetNeighbors()][:3]

            def vol(p, c=c, nb=nb):
                e = p[..., nb, :] - p[..., c : c + 1, :]
                return torch.linalg.det(e)

            assert (vol(x) - vol(x0)).abs().max() < 1e-9, name


@pytest.mark.parametrize("method", ["rigid", "table"])
def test_gradcheck_and_gradgradcheck(mols, method):
    ts = TorsionSpace.from_mol(mols["lidocaine"])
    t = (ts.torsions + 0.3).clone().requires_grad_(True)
    w = torch.randn(ts.table.n_atoms, 3, dtype=torch.float64)

    def f(t):
        return (ts.to_xyz(t, method=method) * w).sum(-1)

    assert torch.autograd.gradcheck(f, (t,))
    assert torch.autograd.gradgradcheck(f, (t,))


def test_rigid_and_table_methods_agree(mols):
    """The rigid-body composition and the z-matrix route are independent; they must agree."""
    gen = torch.Generator().manual_seed(1)
    for name in ("imatinib", "valsartan", "ibuprofen_sodium", "cyclododecyl_ether", "verapamil_like"):
        ts = TorsionSpace.from_mol(mols[name])
        t = ts.torsions + 3 * torch.randn(3, len(ts.quads), generator=gen, dtype=torch.float64)
        assert (ts.to_xyz(t) - ts.to_xyz(t, method="table")).abs().max() < 1e-10, name
    with pytest.raises(ValueError, match="unknown method"):
        ts.to_xyz(t, method="nerf")


@pytest.mark.parametrize("method", ["rigid", "table"])
def test_float32_batch(mols, method):
    ts = TorsionSpace.from_mol(mols["lidocaine"])
    x = ts.to_xyz(ts.torsions.float().expand(3, -1), method=method)
    assert x.shape == (3, ts.table.n_atoms, 3) and x.dtype == torch.float32
    assert (x - positions(mols["lidocaine"]).float()).abs().max() < 1e-4


def test_rotatable_selection(mols):
    mol = mols["ibuprofen"]
    default = rotatable_bonds(mol)
    assert np.array_equal(rotatable_bonds(mol, STRICT_SMARTS + ""), rotatable_bonds(mol, STRICT_SMARTS))
    # the plain pattern also rotates methyl and OH groups
    loose = rotatable_bonds(mol, "[!$(*#*)&!D1]-&!@[!$(*#*)&!D1]")
    assert len(loose) > len(default)
    ts = TorsionSpace.from_mol(mol, rotatable=[tuple(default[0])[::-1]])
    assert len(ts.quads) == 1 and set(ts.quads[0, 1:3].tolist()) == set(default[0].tolist())
    none = TorsionSpace.from_mol(mol, rotatable=[])
    assert none.quads.shape == (0, 4)
    assert (none.to_xyz(torch.zeros(0, dtype=torch.float64)) - positions(mol)).abs().max() < 1e-10


def test_zmatrix_from_rdkit(mols):
    for name in ("ibuprofen_sodium", "acetylcholine_chloride", "cyclododecyl_ether", "z_stilbene"):
        mol = mols[name]
        zm = zmat.ZMatrix.from_rdkit(mol)
        assert zm.symbols == [a.GetSymbol() for a in mol.GetAtoms()]
        assert zmat.rmsd(zm.to_xyz(), positions(mol)) < 1e-10, name
        assert zm.charge == Chem.GetFormalCharge(mol)


def test_rdkit_module_is_a_leaf(mols):
    """zmat.rdkit returns plain data and imports no ZMatrix: no import circle with zmat.zmatrix."""
    tree = ast.parse(Path(zmat.rdkit.__file__).read_text())
    names = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in names if "zmatrix" in m]
    data = zmat.rdkit.zmatrix_from_mol(mols["ibuprofen"])
    assert not isinstance(data, zmat.ZMatrix) and data.internal.shape == (data.table.n_atoms, 3)


def test_multiple_conformers_and_to_mols(mols):
    mol = Chem.Mol(mols["fluoxetine"])
    params = AllChem.ETKDGv3()
    params.randomSeed = 3
    ids = list(AllChem.EmbedMultipleConfs(mol, 3, params))
    ts = TorsionSpace.from_mol(mol, conf_id=ids[2])
    assert (ts.to_xyz(ts.torsions) - positions(mol, ids[2])).abs().max() < 1e-10
    x = ts.to_xyz(ts.torsions + torch.linspace(0, 1, 4, dtype=torch.float64)[:, None])
    (out,) = ts.to_mols(x)
    assert out.GetNumConformers() == 4
    assert np.allclose(out.GetConformer(3).GetPositions(), x[3].numpy(), atol=1e-12)


def test_batch_of_different_molecules(mols):
    names = ["ibuprofen", "imatinib", "acetylcholine_chloride", "z_stilbene"]
    spaces = [TorsionSpace.from_mol(mols[n]) for n in names]
    batch = zmat.batch.collate(spaces)
    assert batch.atoms.ptr.tolist() == np.cumsum([0] + [s.table.n_atoms for s in spaces]).tolist()
    t = torch.cat([s.torsions + 0.7 for s in spaces])
    x = batch.to_xyz(t)
    assert (batch.to_xyz(t, method="table") - x).abs().max() < 1e-10  # the forest table route
    parts = batch.atoms.unbatch(x, dim=-2)
    for s, p in zip(spaces, parts, strict=True):
        assert (p - s.to_xyz(s.torsions + 0.7)).abs().max() < 1e-10
    padded, mask = batch.torsion_index.pad(t)
    assert padded.shape == (4, max(len(s.quads) for s in spaces)) and mask.sum() == len(t)
    assert torch.equal(batch.to_xyz(batch.torsion_index.unpad(padded)), x)
    assert torch.allclose(batch.from_xyz(x), torch.remainder(t + torch.pi, 2 * torch.pi) - torch.pi)
    assert len(batch.to_mols(x)) == 4
    # a batch of batches is the flat batch
    nested = TorsionSpace.batch([TorsionSpace.batch(spaces[:2]), TorsionSpace.batch(spaces[2:])])
    assert nested.atoms.ptr.tolist() == batch.atoms.ptr.tolist()
    assert (nested.to_xyz(t) - x).abs().max() < 1e-12
    assert (nested.to_xyz(t, method="table") - x).abs().max() < 1e-10


_FIELDS = ("quads", "torsions", "positions", "internal", "dof", "delta", "rotation", "shift", "owner")
_FIELDS += ("bond_parent", "level")
_TABLE = ("refs", "kind", "parent", "offset_of", "offset_chain", "dfs_order", "dfs_pos", "subtree_end")
_TABLE += ("dfs_parent", "dfs_depth", "dfs_segment", "max_depth", "constant_anchors")


def assert_same_space(a, b):
    """Every array of two batches equal, and their tables equal to validating
    the offset references from scratch (the trusted paths plan what the general one does)."""
    assert a.atoms.ptr.tolist() == b.atoms.ptr.tolist()
    assert a.torsion_index.ptr.tolist() == b.torsion_index.ptr.tolist()
    assert [m.GetNumAtoms() for m in a.mols] == [m.GetNumAtoms() for m in b.mols]
    for name in _FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert np.array_equal(np.asarray(x), np.asarray(y)), name
    ref = zmat.ConstructionTable(b.table.refs)
    for t in (a.table, b.table):
        for name in _TABLE:
            assert np.array_equal(getattr(t, name), getattr(ref, name)), name
        assert [s.tolist() for s in t.stage_atoms] == [s.tolist() for s in ref.stage_atoms]


def test_take_is_the_batch_of_the_molecules_taken(mols):
    """A batch taken from a data set held as one batch equals batching those
    molecules' spaces (every array, the table, and the coordinates bit for bit)."""
    names = ["ibuprofen", "imatinib", "acetylcholine_chloride", "z_stilbene", "ibuprofen_sodium"]
    spaces = [TorsionSpace.from_mol(mols[n]) for n in names]
    data = TorsionSpace.batch(spaces)
    for index in ([3, 0, 4], [1], [2, 2, 0, 1], [-1, 3]):
        taken = data.take(index)
        ref = TorsionSpace.batch([spaces[i] for i in index])
        assert_same_space(taken, ref)
        t = ref.torsions + torch.linspace(-2, 2, len(ref.torsions), dtype=torch.float64)
        for method in ("rigid", "table"):
            assert torch.equal(taken.to_xyz(t, method=method), ref.to_xyz(t, method=method)), method
        # the batch of batches and a take of a take are the same again
        assert_same_space(TorsionSpace.batch([data.take(index[:1]), data.take(index[1:])]) if len(index) > 1
                          else data.take(index), ref)  # fmt: skip
        assert_same_space(taken.take(list(range(len(index)))), ref)
    for space in (data, taken):  # pickled with its Mols and table made
        copy = pickle.loads(pickle.dumps(space))
        assert_same_space(copy, space)
        assert torch.equal(
            copy.to_xyz(space.torsions, method="table"), space.to_xyz(space.torsions, method="table")
        )
    with pytest.raises(ValueError, match=r"index must be a non-empty integer array in \[-5, 5\)"):
        data.take([5])
    with pytest.raises(ValueError, match="non-empty"):
        data.take([])


def test_batch_tables_equal_the_validated_path(mols):
    """The trusted assembly (packed pieces, ConstructionTable.concatenate) of
    molecules with different offset-chain widths plans what validation does."""
    spaces = [TorsionSpace.from_mol(mols[n]) for n in ("imatinib", "acetylcholine_chloride", "ibuprofen")]
    widths = {s.table.offset_chain.shape[1] for s in spaces}
    batch = TorsionSpace.batch(spaces + spaces[:1])
    assert_same_space(batch, batch)
    assert len(widths) > 1 or batch.table.offset_chain.shape[1] == widths.pop()


# ------------------------------------------------------------- bad input
def test_bad_input_raises(mols):
    with pytest.raises(ValueError, match="no conformer"):
        TorsionSpace.from_mol(Chem.MolFromSmiles("CCO"))
    with pytest.raises(ValueError, match="no atoms"):
        TorsionSpace.from_mol(Chem.Mol())
    with pytest.raises(ValueError, match="conformer with id 5"):
        TorsionSpace.from_mol(mols["ibuprofen"], conf_id=5)
    with pytest.raises(TypeError, match="Chem.Mol"):
        TorsionSpace.from_mol("CCO")
    mol = mols["cyclododecyl_ether"]
    with pytest.raises(ValueError, match=r"rotatable\[0\] = \(0, 1\) is a ring bond"):
        TorsionSpace.from_mol(mol, rotatable=[(0, 1)])
    with pytest.raises(ValueError, match="is not a bond"):
        TorsionSpace.from_mol(mol, rotatable=[(0, 5)])
    with pytest.raises(ValueError, match="out of range"):
        TorsionSpace.from_mol(mol, rotatable=[(0, 500)])
    with pytest.raises(ValueError, match="no other neighbour"):
        h = next(a.GetIdx() for a in mol.GetAtoms() if a.GetAtomicNum() == 1)
        TorsionSpace.from_mol(mol, rotatable=[(h, mol.GetAtomWithIdx(h).GetNeighbors()[0].GetIdx())])
    with pytest.raises(ValueError, match="SMARTS"):
        TorsionSpace.from_mol(mol, rotatable="not a smarts ((")
    dummy = Chem.AddHs(Chem.MolFromSmiles("*CCO"))
    AllChem.EmbedMolecule(dummy, randomSeed=1)
    with pytest.raises(ValueError, match=r"dummy atoms .* indices \[0\]"):
        TorsionSpace.from_mol(dummy)
    # ETKDG puts the three waters on top of each other: the frames carried through coincident
    # reference atoms rebuild them exactly now (it was an error), and the check still guards
    overlapping = embed("O.O.O", seed=3)
    pos = torch.tensor(overlapping.GetConformer().GetPositions())
    ts = TorsionSpace.from_mol(overlapping)
    assert float((ts.to_xyz(ts.from_xyz(pos[None]))[0] - pos).norm(dim=-1).max()) < 1e-6
    z = zmat.ZMatrix.from_rdkit(overlapping)
    assert float((zmat.superpose(z.to_xyz(), pos) - pos).norm(dim=-1).max()) < 1e-6
    from zmat.rdkit import _check_rebuilt

    with pytest.raises(ValueError, match=r"cannot be rebuilt .*atom 2 off by 0.5"):
        _check_rebuilt(pos + torch.tensor([0.0, 0.0, 0.5]) * (torch.arange(9) == 2)[:, None], pos)
    ts = TorsionSpace.from_mol(mols["ibuprofen"])
    with pytest.raises(ValueError, match=r"shape \(\.\.\., 4\)"):
        ts.to_xyz(torch.zeros(3, dtype=torch.float64))
    with pytest.raises(TypeError, match="float tensor"):
        ts.to_xyz(torch.zeros(4, dtype=torch.long))


def test_to_xyz_makes_no_host_sync(mols):
    from zmat.testing import DispatchAudit

    ts = TorsionSpace.from_mol(mols["valsartan"])
    t = (ts.torsions + 0.1).expand(3, -1).clone().requires_grad_(True)
    ts.to_xyz(t)  # plans are built once, outside the audited call
    with DispatchAudit() as audit:
        ts.to_xyz(t).square().sum().backward()
    assert audit.syncs == []


@pytest.mark.cuda
def test_cuda_matches_cpu(mols):
    ts = TorsionSpace.from_mol(mols["imatinib"])
    t = ts.torsions + torch.linspace(-1, 1, len(ts.quads), dtype=torch.float64)
    x = ts.to_xyz(t.cuda())
    assert x.device.type == "cuda"
    assert (x.cpu() - ts.to_xyz(t)).abs().max() < 1e-10
    assert (ts.from_xyz(x).cpu() - ts.from_xyz(ts.to_xyz(t))).abs().max() < 1e-10


def test_benchmark_smoke():
    """``python -m benchmarks.torsions --tiny``: runs, and the two loops agree with zmat."""
    torsions = pytest.importorskip("benchmarks.torsions")
    res = torsions.main(["--tiny", "--dtype", "float64"])
    assert res["max |zmat - rdkit| A"] < 1e-9 and res["max |zmat - td| A"] < 1e-9
    assert res["max |rigid - table| A"] < 1e-9
    assert res["zmat rigid fwd"] > 0 and res["ragged build"] > 0


def test_fresh_torsion_step_smoke():
    """The fresh-batch benchmark's molecule rows run (tiny pool): every phase timed."""
    fresh = pytest.importorskip("benchmarks.fresh")
    pool = fresh.torsion_dataset(5)
    assert len({Chem.MolToSmiles(s.mols[0]) for s in pool}) == 5
    data = TorsionSpace.batch(pool)
    for method in ("rigid", "table"):
        for source in (data, None):
            rec = fresh.torsion_step(pool, 4, seed=0, method=method, data=source)
            assert all(rec[k] >= 0 for k in (*fresh.PHASES, "cached forward", "cached backward"))
            assert rec["atoms"] > 4 * 40
