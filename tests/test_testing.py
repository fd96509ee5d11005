"""zmat.testing: the checks users run on their own code, and that they fail when they should."""

import math

import pytest
import torch
from strategies import chain_table, random_internal

import zmat
import zmat.transform
from zmat.testing import DispatchAudit, assert_methods_agree, assert_rigid_invariant, default_atol


def test_methods_agree_passes_on_a_batch(dtype, tol):
    assert default_atol(dtype) == tol
    c = random_internal(12, batch=(2,), seed=4).to(dtype)
    assert_methods_agree(c, chain_table(12))


def test_methods_agree_names_a_wrong_position(monkeypatch):
    levels = zmat.transform._PLACERS["levels"]
    monkeypatch.setitem(zmat.transform._PLACERS, "levels", lambda c, t: levels(c, t) + 1e-6)
    with pytest.raises(AssertionError, match="'levels' differs from 'reference'"):
        assert_methods_agree(random_internal(6), chain_table(6))


def test_methods_agree_names_a_wrong_gradient(monkeypatch):
    prefix = zmat.transform._PLACERS["prefix"]

    def wrong_gradient(c, t):  # same values, gradient off by 1e-3 per entry
        s = c.sum()
        return prefix(c, t) + 1e-3 * (s - s.detach())

    monkeypatch.setitem(zmat.transform._PLACERS, "prefix", wrong_gradient)
    with pytest.raises(AssertionError, match="gradient of method 'prefix'"):
        assert_methods_agree(random_internal(6), chain_table(6))


def test_rigid_invariant_passes_for_internal_coordinates_and_distances():
    c = random_internal(10, seed=2)
    c[5, 2] = math.pi  # a dihedral that may come back as -pi after the motion
    xyz = zmat.to_xyz(c, chain_table(10))
    assert_rigid_invariant(lambda x: zmat.to_internal(x, chain_table(10)), xyz, period=2 * math.pi)
    assert_rigid_invariant(lambda x: torch.cdist(x, x), xyz)
    assert_rigid_invariant(lambda x: torch.cdist(x, x), xyz.float())


def test_rigid_invariant_fails_for_positions_and_mirror_images():
    xyz = zmat.to_xyz(random_internal(6, seed=3), chain_table(6))
    with pytest.raises(AssertionError, match="not invariant"):
        assert_rigid_invariant(lambda x: x, xyz)
    # a reflection is not a rigid motion: a dihedral changes sign
    mirror = torch.diag(torch.tensor([1.0, 1.0, -1.0], dtype=torch.float64))
    with pytest.raises(AssertionError, match="not invariant"):
        assert_rigid_invariant(lambda x: zmat.to_internal(x, chain_table(6)), xyz, rotation=mirror)


def test_dispatch_audit_flags_a_host_sync():
    x = torch.arange(4.0)
    with DispatchAudit() as audit:
        (x * 2).sum().item()
    assert "_local_scalar_dense" in audit.syncs and audit.count >= 3
