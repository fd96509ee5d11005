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
