"""Edges, second round (issue 31): ragged losses, flows' orientation chart, the round trip at straight
angles, MD topologies with partial bonds, and Hypothesis fuzzers of those entry points."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import zmat
import zmat.protein as zp

DATA = Path(__file__).parent / "data"


# ---------------------------------------------------------------- ragged violation losses
def _trp_cage(noise=0.8, seed=1):
    p = zp.from_pdb(DATA / "1l2y.pdb")
    pos, mask = p.to_atom37()
    pos = pos + torch.tensor(np.random.default_rng(seed).normal(scale=noise, size=pos.shape))
    return p, pos, mask


def _loop(pos, aatype, mask, batch, count):
    """Per-structure calls of structural_violations, per-residue outputs scattered back."""
    sel = [batch == k for k in range(count)]
    parts = [zp.structural_violations(pos[s], aatype[s], mask[s]) for s in sel]
    out = {}
    for key, first in parts[0].items():
        if first.ndim and ("per_residue_" in key or "per_atom_" in key):
            full = first.new_zeros(len(batch), *first.shape[1:])
            for k, part in enumerate(parts):
                full[batch == k] = part[key]
            out[key] = full
        else:
            out[key] = torch.stack([part[key] for part in parts])
    return out


def test_violations_of_one_residue():
    """Issue 31: L = 1 gave per-residue outputs of shape (0,), and ptr=[0, 1] crashed in index_add_."""
    p = zp.Protein.from_sequence("G")
    pos, mask = p.to_atom37()
    v = zp.structural_violations(pos, p.aatype, mask)
    assert v["per_residue_violation_mask"].shape == v["connections_per_residue_loss_sum"].shape == (1,)
    r = zp.structural_violations(pos, p.aatype, mask, ptr=torch.tensor([0, 1]))
    assert r["per_residue_violation_mask"].shape == (1,) and r["loss"].shape == (1,)
    assert torch.equal(r["loss"][0], v["loss"]) and float(v["loss"]) >= 0


def test_violations_unsorted_batch_is_the_per_structure_calls():
    """Issue 31: an unsorted batch= was accepted and gave other values than the per-structure calls."""
    p, pos, mask = _trp_cage()
    batch = torch.tensor([0, 1] * (len(p) // 2))
    got = zp.structural_violations(pos, p.aatype, mask, batch=batch)
    want = _loop(pos, p.aatype, mask, batch, 2)
    assert got.keys() == want.keys()
    for key in got:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=1e-12, msg=key)
    assert float(got["c_n_loss_mean"].min()) > 0.1  # the bonds are seen inside each structure
    with pytest.raises(ValueError, match="pairs= needs a sorted batch"):
        pairs = zp.clash_pairs(*zp.atom37_to_atom14(pos, p.aatype, mask), p.aatype, torch.arange(len(p)))
        zp.structural_violations(pos, p.aatype, mask, batch=batch, pairs=pairs)


def test_ptr_and_batch_that_disagree_raise():
    """Issue 31: ptr= and batch= that disagree were accepted (batch silently won)."""
    xyz = torch.rand(10, 3, dtype=torch.float64) * 3
    r = torch.full((10,), 1.7, dtype=torch.float64)
    ptr, batch = torch.tensor([0, 3, 10]), torch.tensor([0] * 5 + [1] * 5)
    with pytest.raises(ValueError, match="clash_loss: ptr and batch disagree: row 3 is in structure 1"):
        zmat.clash_loss(xyz, r, ptr=ptr, batch=batch)
    same = zmat.clash_loss(xyz, r, ptr=ptr, batch=torch.tensor([0] * 3 + [1] * 7))
    assert torch.equal(same, zmat.clash_loss(xyz, r, ptr=ptr))
    p, pos, mask = _trp_cage()
    with pytest.raises(ValueError, match="structural_violations: ptr and batch disagree: row 10"):
        zp.structural_violations(pos, p.aatype, mask, ptr=[0, 10, 20], batch=[0] * 11 + [1] * 9)


def _ragged_clash_case(sizes, seed, dtype=torch.float64):
    g = np.random.default_rng(seed)
    parts = [torch.tensor(g.normal(size=(n, 3)) * 3, dtype=dtype) for n in sizes]
    radii = [torch.tensor(g.uniform(1, 2, size=n), dtype=dtype) for n in sizes]
    return parts, radii


def test_ragged_clash_loss_is_the_loop_bitwise():
    """Issue 31: clash_loss(ptr=..., method='neighbors') differed from the per-structure calls in the
    last bits (the cells' pair order); pairs are now summed in (i, j) order."""
    sizes = [25, 31, 12, 0, 1]
    parts, radii = _ragged_clash_case(sizes, 0)
    ptr = torch.as_tensor(np.concatenate([[0], np.cumsum(sizes)]))
    for kind in ("softplus", "flat_bottom", "lennard_jones"):
        got = zmat.clash_loss(torch.cat(parts), torch.cat(radii), ptr=ptr, kind=kind, method="neighbors")
        loop = torch.stack(
            [zmat.clash_loss(x, r, kind=kind, method="neighbors") for x, r in zip(parts, radii, strict=True)]
        )
        assert torch.equal(got, loop), kind


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=5),
    seed=st.integers(0, 2**31),
    unsorted=st.booleans(),
    dtype=st.sampled_from([torch.float64, torch.float32]),
)
def test_fuzz_ragged_clash_batches(sizes, seed, unsorted, dtype):
    """Ragged clash batches with empty segments, sorted (ptr) or shuffled (batch=): each structure's
    value is its own call's; float64 bitwise, float32 within the rounding of the per-pair penalties
    (the CPU's vector and scalar exp differ in the last bit: documented in docs/deployment.md)."""
    parts, radii = _ragged_clash_case(sizes, seed, dtype)
    loop = torch.stack([zmat.clash_loss(x, r, method="neighbors") for x, r in zip(parts, radii, strict=True)])
    x, r = torch.cat(parts), torch.cat(radii)
    if unsorted:
        batch = torch.as_tensor(np.repeat(np.arange(len(sizes)), sizes))
        perm = torch.as_tensor(np.random.default_rng(seed).permutation(len(batch)))
        got = zmat.clash_loss(x[perm], r[perm], batch=batch[perm], method="neighbors")
        got = torch.cat([got, got.new_zeros(len(sizes) - len(got))])  # batch= cannot see trailing empties
    else:
        ptr = torch.as_tensor(np.concatenate([[0], np.cumsum(sizes)]))
        got = zmat.clash_loss(x, r, ptr=ptr, method="neighbors")
    if dtype == torch.float64 and not unsorted:
        assert torch.equal(got, loop)
    else:
        torch.testing.assert_close(got, loop, rtol=4 * torch.finfo(dtype).eps, atol=1e-30)


@settings(max_examples=12, deadline=None)
@given(
    cuts=st.lists(st.integers(0, 20), min_size=1, max_size=4),
    seed=st.integers(0, 2**31),
    shuffle=st.booleans(),
)
def test_fuzz_ragged_violation_batches(cuts, seed, shuffle):
    """Trp-cage's residues split into structures (empty ones dropped: a structure needs residues),
    sorted or shuffled: every output equals the per-structure calls'."""
    p, pos, mask = _trp_cage(0.5, seed % 1000)
    bounds = sorted({0, len(p), *(c for c in cuts if 0 < c < len(p))})
    batch = torch.as_tensor(np.repeat(np.arange(len(bounds) - 1), np.diff(bounds)))
    if shuffle:
        batch = batch[torch.as_tensor(np.random.default_rng(seed).permutation(len(batch)))]
    got = zp.structural_violations(pos, p.aatype, mask, batch=batch)
    want = _loop(pos, p.aatype, mask, batch, len(bounds) - 1)
    for key in got:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=1e-12, msg=key)


# ---------------------------------------------------------------- flows: the orientation chart
def test_cos_beta_outside_its_range_is_clamped_not_a_bad_rotation():
    """Issue 31: cos beta = 1.5 built a non-orthonormal rotation (the first bond 1.5x too long); it is
    clamped to the pole (a proper rotation), with a zero gradient there."""
    from zmat.flows import InternalCoordinateTransform
    from zmat.testing import DispatchAudit

    table = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [-1, -1, -1], [4, -1, -1]]  # two trees
    T = InternalCoordinateTransform(table)
    xyz = torch.randn(2, 6, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    q = T.inv(xyz)
    torch.testing.assert_close(T(q), xyz, atol=1e-12, rtol=0)
    cos_beta = torch.nonzero(T.kind == 4).reshape(-1)  # COS_BETA
    bad = q.clone()
    bad[0, cos_beta[0]], bad[1, cos_beta[1]] = 1.5, -3.0
    pole = q.clone()
    pole[0, cos_beta[0]], pole[1, cos_beta[1]] = 1.0, -1.0
    x = T(bad.requires_grad_(True))
    assert torch.equal(x, T(pole))
    r = zmat.to_internal(x.detach(), table)
    bonds = zmat.to_internal(xyz, table)[..., 0]
    torch.testing.assert_close(r[..., 0], bonds, atol=1e-12, rtol=0)  # the bonds are kept
    (g,) = torch.autograd.grad(x.sum(), bad)
    assert g[0, cos_beta[0]] == 0 and g[1, cos_beta[1]] == 0
    with DispatchAudit() as audit:
        T(q)
    assert audit.syncs == []


# ---------------------------------------------------------------- zmat.md
def _sf6():
    import MDAnalysis as mda

    r = 1.56
    pos = [[0, 0, 0]] + [[s * r if k == ax else 0 for k in range(3)] for ax in range(3) for s in (1, -1)]
    u = mda.Universe.empty(7, trajectory=True)
    u.atoms.positions = np.array(pos, float)
    u.add_TopologyAttr("bonds", [(0, i) for i in range(1, 7)])
    u.add_TopologyAttr("masses", [32.06] + [19.0] * 6)
    return u


def test_md_root_atoms_are_not_collinear():
    """Issue 31: for octahedral SF6 BAT's root rule picks three collinear atoms (T(T.inv(x)) 1.56 A off)."""
    pytest.importorskip("MDAnalysis")
    from zmat import md

    u = _sf6()
    T, q = md.flow_coordinates(u.atoms)
    x = md.positions(u.atoms)
    assert float((T(q) - x).abs().max()) < 1e-12
    refs = md.construction_table(u.atoms).refs
    root = int(np.flatnonzero((refs < 0).all(1))[0])
    third = int(np.flatnonzero((refs[:, 0] == 0) & (refs[:, 1] == root) & (refs[:, 2] < 0))[0])
    assert abs(float(np.dot(x[0, root] - x[0, 0], x[0, third] - x[0, 0]))) < 1e-9  # at 90 degrees


def _partial_conect_pdb(tmp_path, keep_atoms=6, box=12.0):
    lines = (DATA / "alanine_dipeptide.pdb").read_text().splitlines()
    ours = lambda ln: all(int(t) <= keep_atoms for t in ln[6:].split())  # noqa: E731
    keep = [ln for ln in lines if not ln.startswith("CONECT") or ours(ln)]
    path = tmp_path / "partial_conect.pdb"
    cryst = f"CRYST1{box:9.3f}{box:9.3f}{box:9.3f}  90.00  90.00  90.00 P 1           1"
    path.write_text(cryst + "\n" + "\n".join(keep) + "\n")
    return path


def test_md_partial_bonds_are_completed_with_a_warning(tmp_path):
    """Issue 31: CONECT records for some atoms only (OpenMM's and the PDB's way) split one molecule into
    16 trees, silently, and the molecule was not made whole across the box."""
    mda = pytest.importorskip("MDAnalysis")
    from zmat import md

    u = mda.Universe(_partial_conect_pdb(tmp_path))
    with pytest.warns(UserWarning, match=r"16 atoms in residues of several atoms have no bond \(ALA2:N, "):
        table = md.construction_table(u.atoms)
    full = md.construction_table(mda.Universe(DATA / "alanine_dipeptide.pdb").atoms)
    assert np.array_equal(table.refs, full.refs)  # one tree, the complete topology's
    pos = u.atoms.positions.copy()
    pos[10:] += np.array([12.0, 0, 0])  # the molecule split across the periodic box
    u.atoms.positions = pos
    with pytest.warns(UserWarning, match="bonds guessed"):
        x = md.positions(u.atoms)
    b = full.bonds
    assert float((x[0, b[:, 0]] - x[0, b[:, 1]]).norm(dim=-1).max()) < 1.7
    assert not hasattr(u.atoms[10], "bonds") or len(u.atoms[10].bonds) == 0  # the Universe is left as it was


# ---------------------------------------------------------------- fuzz: malformed Gaussian input
_GZMAT = (DATA / "baker_ts_09.gzmat").read_text()
_NOISE = "|-|--|+|=|,|0|1|-1|1e400|nan|inf|180.5|X|Bq|D1|Variables:|Constants:|#|%chk=a|!|1.0D".split("|")
_NOISE += [" ", "\t", "\n", "\n\n", "1 1"]
_SECTION = ("no z-matrix lines found", "missing title section", "missing charge/multiplicity")


@settings(max_examples=150, deadline=None)
@given(
    edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 3), st.sampled_from(_NOISE)), max_size=4)
)  # noqa: E501
def test_fuzz_malformed_gaussian_input_raises_a_value_error_naming_the_line(edits):
    """Random edits of a real z-matrix file: it reads, or raises ValueError naming the line (or the
    missing section); never another exception, and what reads builds a ZMatrix or a line-naming error."""
    tokens = _GZMAT.split(" ")
    for at, how, text in edits:
        k = at % len(tokens)
        if how == 0:
            tokens.insert(k, text)
        elif how == 1:
            tokens[k] = text
        elif how == 2 and len(tokens) > 1:
            del tokens[k]
        else:
            tokens[k] = tokens[k] + text
    text = " ".join(tokens)
    try:
        zmat.ZMatrix.from_string(text)
    except ValueError as e:
        msg = str(e)
        assert msg.startswith("line ") or msg.startswith(_SECTION) or "variable" in msg or "row" in msg, msg


# ---------------------------------------------------------------- fuzz: MD topologies
@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**31), copies=st.integers(1, 3), kept=st.sampled_from([0.0, 0.3, 0.7, 1.0]))
def test_fuzz_md_topologies_with_partial_bonds_and_several_molecules(seed, copies, kept):
    """Alanine dipeptide copied 1-3 times (rotated, 40 A apart), bonds kept only inside a random set of
    residues (CONECT for some groups): one tree per molecule and an exact flow round trip."""
    mda = pytest.importorskip("MDAnalysis")
    import warnings

    from zmat import md

    rng = np.random.default_rng(seed)
    src = mda.Universe(DATA / "alanine_dipeptide.pdb")
    u = mda.Merge(*([src.atoms] * copies))
    n0, pos = len(src.atoms), u.atoms.positions.copy()
    for k in range(copies):
        rot, _ = np.linalg.qr(rng.normal(size=(3, 3)))
        pos[k * n0 : (k + 1) * n0] = pos[k * n0 : (k + 1) * n0] @ rot.T + np.array([40.0 * k, 0, 0])
    u.atoms.positions = pos
    res, b = u.atoms.resindices, u.bonds.indices
    keep = rng.random(u.atoms.n_residues) < kept
    drop = ~(keep[res[b[:, 0]]] & keep[res[b[:, 1]]])
    if drop.any() and not drop.all():
        u.delete_bonds([tuple(x) for x in b[drop]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        table = md.construction_table(u.atoms)
        T, q = md.flow_coordinates(u.atoms)
    assert int((table.refs < 0).all(1).sum()) == copies
    assert float((T(q) - md.positions(u.atoms, unwrap=False)).abs().max()) < 1e-9
