"""The train suite (benchmarks/train.py) and its model (examples/torsion_diffusion.py): metrics,
decoder and a tiny end-to-end run."""

import math

import numpy as np
import pytest
import torch

from benchmarks import train as bench
from zmat.protein import six_angles_from_backbone

ex = bench.example()


@pytest.fixture(scope="module")
def held():
    """Held-out windows of 16 residues and their decoder."""
    w = ex.load_windows(16, 8, held_out=True)
    mean = ex.circular_mean(ex.load_windows(16, 8, held_out=False))
    return ex.wrap(w - mean), ex.Backbone(16, mean)


def test_js_divergence_against_scipy():
    scipy_distance = pytest.importorskip("scipy.spatial.distance")
    rng = np.random.default_rng(0)
    p, q = rng.random(50), rng.random(50) * (rng.random(50) > 0.3)
    assert bench.js_divergence(p, q) == pytest.approx(
        scipy_distance.jensenshannon(p, q, base=2) ** 2, rel=1e-12
    )
    assert bench.js_divergence(p, 3 * p) == pytest.approx(0.0, abs=1e-15)  # normalised
    assert bench.js_divergence([1, 0], [0, 1]) == pytest.approx(1.0)  # disjoint: the maximum
    with pytest.raises(ValueError, match="shapes"):
        bench.js_divergence([1, 2], [1, 2, 3])


def test_geometry_metrics():
    ca = torch.tensor([[[-1.0, 0, 0], [1.0, 0, 0], [3.0, 0, 0]]])
    assert bench.radius_of_gyration(ca).tolist() == pytest.approx([math.sqrt(8 / 3)])
    assert bench.ca_i_i2(ca).tolist() == [[4.0]]
    a = torch.zeros(2, 5, 6)
    a[..., 0], a[..., 1] = -1.0, 2.5  # one (phi, psi) bin
    h = bench.ramachandran(a)
    assert h.sum() == 2 * 3 and h.max() == 6  # residues 1..L-2 of each window


def test_decoder_reproduces_the_angles(held):
    """``Backbone.xyz`` builds N, CA, C whose six angles are the input, and an ideal O."""
    x, bb = held
    xyz = bb.xyz(x[:4].double())
    nca_c = xyz.unflatten(-2, (16, 4))[..., :3, :].flatten(-3, -2)
    got, _ = six_angles_from_backbone(nca_c)
    want = ex.wrap(x[:4].double() + bb.mean)
    diff = ex.wrap(got[:, 1:-1] - want[:, 1:-1]).abs().max()
    assert diff < 1e-4  # float32 data, float64 decode
    res = xyz.unflatten(-2, (16, 4))
    assert torch.allclose((res[..., 3, :] - res[..., 2, :]).norm(dim=-1), torch.tensor(ex.O_BOND).double())
    # O trans to N(i+1) about CA-C: the four atoms in one plane, O opposite N(i+1)
    u, v = res[:, :-1, 1] - res[:, :-1, 2], res[:, 1:, 0] - res[:, :-1, 2]
    w = res[:, :-1, 3] - res[:, :-1, 2]
    assert torch.linalg.det(torch.stack([u, v, w], -1)).abs().max() < 1e-9
    assert ((w * v).sum(-1) < 0).all()


def af_clash_reference(xyz: np.ndarray, L: int) -> np.ndarray:
    """AlphaFold's between-residue clash amount, brute force in numpy: heavy-atom pairs of
    different residues closer than r_i + r_j - 1.5 A, the peptide C(i)-N(i+1) left out."""
    radii = np.tile([1.55, 1.7, 1.7, 1.52], L)
    res, slot = np.repeat(np.arange(L), 4), np.tile(np.arange(4), L)
    out = []
    for x in xyz:
        d = np.linalg.norm(x[:, None] - x[None], axis=-1)
        keep = np.triu(res[:, None] != res[None], 1)
        keep &= ~((res[None] == res[:, None] + 1) & (slot[:, None] == 2) & (slot[None] == 0))
        out.append(np.maximum(radii[:, None] + radii[None] - 1.5 - d, 0)[keep].sum())
    return np.array(out)


def test_clash_metric_on_clashing_and_clean_windows(held):
    x, bb = held
    xyz = bb.xyz(x[:8].double())
    clean = bb.clash(xyz)
    assert (clean == 0).all()  # real windows do not clash
    bad = xyz.clone().unflatten(-2, (16, 4))
    bad[:, 10] = bad[:, 3] + torch.tensor([0.5, 0.0, 0.0], dtype=bad.dtype)  # residue 10 onto residue 3
    bad = bad.flatten(-3, -2)
    got = bb.clash(bad)
    ref = af_clash_reference(bad.numpy(), 16)
    assert (got > 0).all() and got.numpy() == pytest.approx(ref, rel=1e-6)  # float32 radii
    v = bb.violations(bad[:2])  # zmat's AlphaFold violations agree (per-atom sums count each pair twice)
    assert v["clashes_per_atom_loss_sum"].sum((-1, -2)).numpy() / 2 == pytest.approx(ref[:2], rel=1e-6)


def test_extra_loss_has_a_gradient(held):
    x, bb = held
    xt = x[:4].clone().requires_grad_()
    xyz = bb.xyz(xt)
    (bb.clash(xyz).sum() + bb.violation_loss(xyz).sum() + 1e-3 * xyz.square().sum()).backward()
    assert torch.isfinite(xt.grad).all() and xt.grad.abs().sum() > 0


def test_tiny_benchmark_runs(tmp_path, capsys):
    """``python -m benchmarks --suite train --size tiny``: both columns, every output file."""
    import json

    from benchmarks.__main__ import main

    torch.set_num_threads(1)
    assert main(["--suite", "train", "--size", "tiny", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "own + clash" in text and "Ramachandran JS" in text and "% of a training step" in text
    res = json.loads((tmp_path / "results.json").read_text())
    rows = res["rows"]
    for name in ("own", "own+clash"):
        assert all(math.isfinite(v) for v in rows[name].values()), rows[name]
        assert rows[name]["ms_per_step"] > 0
    assert rows["train"]["clashing_fraction"] == 0.0  # real windows: the data's own floor
    assert res["data"]["train_windows"] > 0 and res["data"]["held_out_windows"] > 0
    for name in ("table.md", "ramachandran.png", "clashes.png"):
        assert (tmp_path / name).stat().st_size > 0
