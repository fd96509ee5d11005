"""The generic batching of torsion spaces (``zmat._torsion_arrays.TorsionArrays``, issue 21):
its concatenate and take against the rule written out by hand here, field by field, on
molecules built one at a time (nested rotors, two fragments, none to rotate)."""

from __future__ import annotations

import pickle
import weakref

import numpy as np
import pytest
import torch

Chem = pytest.importorskip("rdkit.Chem")

from strategies import embedded_mols  # noqa: E402

from zmat._torsion_arrays import TorsionArrays  # noqa: E402
from zmat.rdkit import TorsionSpace  # noqa: E402

SMILES = {
    "lidocaine": "CCN(CC)CC(=O)Nc1c(C)cccc1C",  # nested rotors: bond_parent >= 0 and -1
    "ibuprofen_sodium": "CC(C)Cc1ccc(cc1)[C@H](C)C(=O)[O-].[Na+]",  # two fragments
    "toluene": "Cc1ccccc1",  # no rotatable bond: empty per-torsion rows
    "butanol": "CCCCO",
}

#: written out here, independently of the fields' declarations: what each field's values index
ATOM_INDEX = ("quads", "dof")
TORSION_INDEX = ("owner", "bond_parent")


@pytest.fixture(scope="module")
def spaces():
    return {name: TorsionSpace.from_mol(mol) for name, mol in embedded_mols(SMILES, seed=5).items()}


def by_hand(parts: list[TorsionArrays]) -> dict:
    """The batch's arrays by the rule: rows one after the other; atom (torsion)
    indices increased by the atoms (torsions) of the parts before; -1 stays."""
    out = {}
    for name in TorsionArrays.__dataclass_fields__:
        rows, n_atoms, n_tors = [], 0, 0
        for a in parts:
            v = getattr(a, name).copy()
            if name in ATOM_INDEX:
                v += n_atoms
            elif name in TORSION_INDEX:
                v[v >= 0] += n_tors
            rows.append(v)
            n_atoms, n_tors = n_atoms + len(a.positions), n_tors + len(a.quads)
        out[name] = np.concatenate(rows)
    return out


def assert_arrays(a: TorsionArrays, expected: dict) -> None:
    for name, value in expected.items():
        got = getattr(a, name)
        assert got.dtype == value.dtype and np.array_equal(got, value), name
        assert got.flags.c_contiguous, name  # (tensors made of them are plain, too)


def test_concatenate_is_the_rule_by_hand(spaces):
    names = ["lidocaine", "toluene", "ibuprofen_sodium", "butanol", "lidocaine"]
    parts = [spaces[n].arrays for n in names]
    assert (parts[0].owner == -1).any() and (parts[0].owner >= 0).any()  # both cases are tested
    assert (parts[0].bond_parent == -1).any() and (parts[0].bond_parent >= 0).any()
    batch = TorsionArrays.concatenate(parts)
    assert_arrays(batch, by_hand(parts))
    # a batch of batches is the flat batch
    nested = TorsionArrays.concatenate(
        [TorsionArrays.concatenate(parts[:2]), TorsionArrays.concatenate(parts[2:])]
    )
    assert_arrays(nested, by_hand(parts))
    assert_arrays(TorsionArrays.concatenate(parts[1:2]), by_hand(parts[1:2]))  # one part: itself


@pytest.mark.parametrize("index", [[1, 0], [3, 3, 1], [2], [0, 1, 2, 3], [1, 2, 0]])
def test_take_is_the_batch_of_the_molecules_taken(spaces, index):
    names = ["lidocaine", "toluene", "ibuprofen_sodium", "butanol"]
    parts = [spaces[n].arrays for n in names]
    data = TorsionArrays.concatenate(parts)
    taken = data.take(np.array(index))
    assert_arrays(taken, by_hand([parts[i] for i in index]))
    # and through TorsionSpace: the same positions as each molecule alone
    ts = TorsionSpace.batch([spaces[n] for n in names]).take(index)
    t = ts.torsions + 0.3
    x = ts.atoms.unbatch(ts.to_xyz(t), dim=-2)
    for i, part in zip(index, x, strict=True):
        alone = spaces[names[i]]
        assert torch.equal(part, alone.to_xyz(alone.torsions + 0.3))


def test_pickled_arrays_batch_alike(spaces):
    """Pickled without the packed copy, and batching the copies gives the same arrays."""
    parts = [spaces[n].arrays for n in ("butanol", "lidocaine")]
    batch = TorsionArrays.concatenate(parts)
    copies = [pickle.loads(pickle.dumps(a)) for a in parts]
    assert all("packed" not in c.__dict__ for c in copies)
    assert_arrays(TorsionArrays.concatenate(copies), {k: getattr(batch, k) for k in by_hand(parts)})


def test_check_names_the_bad_field(spaces):
    a = spaces["butanol"].arrays
    assert a.check() is a
    values = {k: getattr(a, k) for k in TorsionArrays.__dataclass_fields__}
    with pytest.raises(ValueError, match=r"TorsionArrays\.quads: expected int64 of shape \(2, 4\)"):
        TorsionArrays(**{**values, "quads": a.quads[:, :3]}).check()
    with pytest.raises(ValueError, match=r"TorsionArrays\.positions: expected float64"):
        TorsionArrays(**{**values, "positions": a.positions.astype(np.float32)}).check()


@pytest.mark.parametrize("method", ["rigid", "table"])
def test_a_dropped_batch_is_freed_at_once(spaces, method):
    """No reference cycle between a space and its routes: a training step's batch
    (its plans, its table) is freed when dropped, without waiting for the cyclic GC."""
    data = TorsionSpace.batch(list(spaces.values()))
    ts = data.take([2, 0])
    ts.to_xyz(ts.torsions, method=method)
    ref = weakref.ref(ts)
    del ts
    assert ref() is None
