"""zmat._align: Kabsch superposition (proper rotations only) and RMSD."""

from pathlib import Path

import ase.io
import numpy as np
import pytest
import torch
from scipy.spatial.transform import Rotation

from zmat import rmsd, superpose

DATA = Path(__file__).parent / "data"


def _rotation(seed):
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(3, 3, generator=g, dtype=torch.float64))
    return q * torch.sign(torch.linalg.det(q))


def test_superpose_and_rmsd_batched():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(3, 7, 3, generator=g, dtype=torch.float64)
    moved = a @ _rotation(2).T + torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    torch.testing.assert_close(superpose(moved, a), a, atol=1e-12, rtol=0)
    assert rmsd(moved, a).shape == (3,)
    assert (rmsd(moved, a) < 1e-12).all()
    mirror = a * torch.tensor([1.0, 1.0, -1.0], dtype=torch.float64)
    assert (rmsd(mirror, a) > 0.1).all()  # proper rotations only
    with pytest.raises(ValueError, match="same shape"):
        rmsd(a, a[..., :5, :])
    with pytest.raises(ValueError, match=r"\(7, 2\)"):
        superpose(a[0, :, :2], a[0, :, :2])


def test_rmsd_gradient():
    g = torch.Generator().manual_seed(3)
    a = torch.randn(6, 3, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, 3, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(rmsd, (a, b))
    assert torch.autograd.gradcheck(superpose, (a, b))


@pytest.mark.parametrize("name", ["cyclohexane_chair", "cis_platin", "MIL53_small"])
def test_rmsd_matches_scipy_kabsch_on_real_structures(name):
    """Against SciPy's Kabsch (``Rotation.align_vectors``) on a perturbed, rotated real structure."""
    ref = np.asarray(ase.io.read(DATA / f"{name}.xyz").positions, np.float64)
    rng = np.random.default_rng(0)
    mobile = ref + 0.1 * rng.standard_normal(ref.shape)
    mobile = mobile @ Rotation.random(random_state=1).as_matrix().T + [3.0, -1.0, 2.0]
    p, q = mobile - mobile.mean(0), ref - ref.mean(0)
    rot, _ = Rotation.align_vectors(q, p)
    expected = np.sqrt(((rot.apply(p) - q) ** 2).sum(1).mean())
    got = rmsd(torch.as_tensor(mobile), torch.as_tensor(ref))
    assert abs(float(got) - expected) < 1e-12
    fitted = superpose(torch.as_tensor(mobile), torch.as_tensor(ref)).numpy()
    np.testing.assert_allclose(fitted, rot.apply(p) + ref.mean(0), atol=1e-10)


def test_rmsd_of_identical_structures_is_finite(dtype, tol):
    """The safe-norm guard: no NaN gradient at a perfect fit; in float64 exactly 0 with zero gradient
    (in float32 the SVD's rounding leaves a residual of ~1e-7 above the 1e-6 threshold)."""
    a = torch.randn(5, 3, dtype=dtype, requires_grad=True)
    value = rmsd(a, a.detach().clone())
    (grad,) = torch.autograd.grad(value, a)
    assert 0 <= value <= tol and torch.isfinite(grad).all()
    if dtype == torch.float64:
        assert value == 0 and torch.equal(grad, torch.zeros_like(grad))


def test_small_rmsd_above_the_threshold_is_exact():
    """Above the safe-norm threshold (1e-12 in float64) the value is the plain RMSD."""
    a = torch.randn(4, 3, dtype=torch.float64)
    b = a.clone()
    b[0, 0] += 1e-9  # moves the centroid too; the rigid fit removes part of it
    expected = rmsd(a * 1e3, b * 1e3) / 1e3  # same fit, scaled far from the threshold
    torch.testing.assert_close(rmsd(a, b), expected, rtol=1e-6, atol=0)
    assert rmsd(a, b) > 1e-11


@pytest.mark.parametrize("name", ["cyclohexane_chair", "MIL53_small"])
def test_superpose_transform_matches_biotite_and_scipy(name):
    """``return_transform=True``: the motion ``(R, t)`` is biotite's ``superimpose``'s (applied to
    other coordinates in the mobile frame) and scipy's ``align_vectors`` rotation, on a batch of
    perturbed, rotated copies of a real structure."""
    struc = pytest.importorskip("biotite.structure")
    ref = np.asarray(ase.io.read(DATA / f"{name}.xyz").positions, np.float64)
    rng = np.random.default_rng(2)
    rots = Rotation.random(3, random_state=4).as_matrix()
    mobile = np.stack([(ref + 0.1 * rng.standard_normal(ref.shape)) @ r.T + rng.normal(size=3) for r in rots])
    mob, tgt = torch.as_tensor(mobile), torch.as_tensor(ref).expand(3, -1, -1)
    moved, R, t = superpose(mob, tgt, return_transform=True)
    assert R.shape == (3, 3, 3) and t.shape == (3, 3)
    other = rng.standard_normal((5, 3))  # coordinates that were not fitted: the same motion moves them
    for k in range(3):
        _, motion = struc.superimpose(ref, mobile[k])  # biotite works in float32
        np.testing.assert_allclose(moved[k].numpy(), motion.apply(mobile[k]), atol=2e-5)
        moved_other = (torch.as_tensor(other) @ R[k].T + t[k]).numpy()
        np.testing.assert_allclose(moved_other, motion.apply(other), atol=2e-5)
        p, q = mobile[k] - mobile[k].mean(0), ref - ref.mean(0)
        np.testing.assert_allclose(R[k].numpy(), Rotation.align_vectors(q, p)[0].as_matrix(), atol=1e-10)
    torch.testing.assert_close(moved, mob @ R.mT + t[:, None, :], atol=1e-12, rtol=0)
    torch.testing.assert_close(superpose(mob, tgt), moved)
