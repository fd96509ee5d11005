"""zmat.flows' pieces around the transform: the box, the masked circular shift, the zuko flow."""

import math
from pathlib import Path

import pytest
import torch

import zmat
from zmat.flows import COS_BETA, BoxTransform, InternalCoordinateTransform, MaskedCircularShift, zuko_flow

DATA = Path(__file__).parent / "data"
TABLE = [[-1, -1, -1], [0, -1, -1], [1, 0, -1], [2, 1, 0], [3, 2, 1]]  # a chain of five atoms


def _data(normalize_angles=True, n=64):
    T = InternalCoordinateTransform(TABLE, normalize_angles=normalize_angles)
    g = torch.Generator().manual_seed(0)
    C = torch.tensor(
        [[0, 0, 0], [1.5, 0, 0], [1.4, 1.9, 0], [1.5, 1.9, 1.0], [1.1, 2.0, -2.0]], dtype=torch.float64
    )
    C = C + 0.05 * torch.randn(n, 5, 3, generator=g, dtype=torch.float64)
    A = torch.randn(n, 3, 3, generator=g, dtype=torch.float64)
    R = torch.linalg.matrix_exp(A - A.mT)  # random rotations: every orientation angle varies
    xyz = zmat.to_xyz(C, TABLE) @ R + torch.randn(n, 1, 3, generator=g, dtype=torch.float64)
    return T, T.inv(xyz)


@pytest.mark.parametrize("normalize_angles", [True, False])
def test_box_maps_every_entry_onto_the_box(normalize_angles):
    """Training data inside ``[-pi, pi]``; periodic entries and ``cos beta`` by the transform's bounds
    (one period onto the box exactly), the others by the data range with the margin, bonds kept > 0;
    the inverse and the log-determinant (against autograd's Jacobian) exact."""
    T, q = _data(normalize_angles)
    box = BoxTransform.fit(T, q, margin=0.5)
    z = box(q)
    assert z.shape == q.shape and z.dtype == q.dtype and z.abs().max() <= math.pi
    torch.testing.assert_close(box.inv(z), q, atol=1e-12, rtol=0)
    fixed = T.circular | (T.kind == COS_BETA)
    assert torch.equal(box.lower[fixed], T.lower[fixed]) and torch.equal(box.upper[fixed], T.upper[fixed])
    period = T.upper[T.circular] - T.lower[T.circular]
    torch.testing.assert_close(box.scale[T.circular], 2 * math.pi / period)
    width = q.amax(0) - q.amin(0)
    free = ~fixed & (T.kind != zmat.flows.CARTESIAN)
    assert (box.lower[free] >= 0).all()
    torch.testing.assert_close(
        (box.upper - box.lower)[~fixed & (T.kind == 0)], 2 * width[~fixed & (T.kind == 0)]
    )
    assert torch.equal(box.circular_indices, torch.nonzero(T.circular).flatten())
    J = torch.autograd.functional.jacobian(box, q[0])
    torch.testing.assert_close(box.log_abs_det_jacobian(q, z)[0], torch.linalg.slogdet(J)[1])
    assert box.log_abs_det_jacobian(q, z).shape == (len(q),)
    with pytest.raises(ValueError, match=r"q\[3, 4\] is not finite"):
        BoxTransform.fit(T, q.index_put((torch.tensor(3), torch.tensor(4)), torch.tensor(math.nan).double()))
    with pytest.raises(ValueError, match=r"shape \(B, 15\)"):
        BoxTransform.fit(T, q[:, :6])


def test_masked_circular_shift_is_its_own_inverse_on_the_masked_entries():
    mask = torch.tensor([True, False, True])
    shift = MaskedCircularShift(mask)
    x = torch.tensor([[-3.0, -3.0, 0.5], [2.0, 7.0, -0.5]])
    y = shift(x)
    torch.testing.assert_close(y[:, 1], x[:, 1])  # identity off the mask
    torch.testing.assert_close(
        y[:, [0, 2]], torch.tensor([[-3.0 + math.pi, 0.5 - math.pi], [2.0 - math.pi, math.pi - 0.5]])
    )
    torch.testing.assert_close(shift.inv(y), x)
    assert torch.equal(shift.log_abs_det_jacobian(x, y), torch.zeros_like(x))


def test_zuko_flow_density_of_q_and_its_buffers():
    """The flow over ``q`` is the box, then the splines, over a uniform base: its log-density is the
    splines' plus the box's constant; the box travels in its state dict; samples are inside the
    transform's bounds; a few steps of maximum likelihood lower the NLL."""
    pytest.importorskip("zuko")
    T, q = _data()
    flow = zuko_flow(T, q, transforms=2, hidden=16, bins=4)
    box = BoxTransform.fit(T, q)
    dist = flow()
    lp = dist.log_prob(q.float())
    assert lp.shape == (len(q),) and torch.isfinite(lp).all()
    z = box(q).float()
    splines = flow.transform.transforms[1]()  # zuko's transforms map data -> base
    u = splines(z)
    expected = flow.base().log_prob(u) + splines.log_abs_det_jacobian(z, u)
    torch.testing.assert_close(lp, expected + box.log_abs_det_jacobian(q, z).float(), atol=1e-4, rtol=1e-5)
    state = flow.state_dict()
    lower = [v for k, v in state.items() if k.startswith("transform.transforms.0")]
    assert any(torch.equal(v, box.lower.float()) for v in lower)
    s = dist.sample((64,)).double()
    finite = torch.isfinite(T.upper)
    assert (s[:, finite] <= T.upper[finite] + 1e-5).all() and (s >= T.lower - 1e-5).all()
    assert torch.isfinite(T(s)).all()
    opt = torch.optim.Adam(flow.parameters(), lr=3e-3)
    with torch.no_grad():
        before = float(-flow().log_prob(q.float()).mean())
    for _ in range(10):
        loss = -flow().log_prob(q.float()).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        assert float(-flow().log_prob(q.float()).mean()) < before - 1.0


def test_box_feeds_normflows_circular_splines():
    """normflows takes the box's tensors as they are: ``ind_circ`` and ``tail_bound``; the density of
    ``q`` is normflows' density of ``box(q)`` plus the box's log-determinant."""
    nf = pytest.importorskip("normflows")
    T, q = _data()
    box = BoxTransform.fit(T, q)
    d = q.shape[1]
    layer = nf.flows.CircularAutoregressiveRationalQuadraticSpline(
        d, 1, 16, ind_circ=box.circular_indices.tolist(), tail_bound=box.bound
    )
    base = nf.distributions.UniformGaussian(d, box.circular_indices.tolist(), torch.full((d,), math.pi))
    model = nf.NormalizingFlow(base, [layer])
    z = box(q).float()
    lp = model.log_prob(z) + box.log_abs_det_jacobian(q, z).float()
    assert lp.shape == (len(q),) and torch.isfinite(lp).all()
    out = model.sample(8)[0].double()
    assert torch.isfinite(T(box.inv(out))).all()


def test_box_inverse_keeps_edge_samples_in_the_chart():
    """A base sample on (or rounded past) the box's edge maps into ``T``'s bounds: ``cos beta``
    stays in ``[-1, 1]``, where ``T`` would give NaN positions."""
    T, q = _data()
    box = BoxTransform.fit(T, q)
    edge = torch.full((3, q.shape[1]), math.pi + 1e-5, dtype=torch.float32) * torch.tensor(
        [[1.0], [-1.0], [1.0]]
    )
    back = box.inv(edge).double()
    lo, hi = box.lower.float().double(), box.upper.float().double()  # the bounds as float32 has them
    assert ((back >= lo) & (back <= hi)).all() and (back[:, T.kind == COS_BETA].abs() <= 1).all()
    assert torch.isfinite(T(back)).all()
