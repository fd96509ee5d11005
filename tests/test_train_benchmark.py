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


def af_clash_reference(xyz: np.ndarray, L: int, tolerance: float = 1.5) -> np.ndarray:
    """AlphaFold's between-residue clash amount, brute force in numpy: heavy-atom pairs of
    different residues closer than r_i + r_j - tolerance (1.5 A), the peptide C(i)-N(i+1) left out."""
    radii = np.tile([1.55, 1.7, 1.7, 1.52], L)
    res, slot = np.repeat(np.arange(L), 4), np.tile(np.arange(4), L)
    out = []
    for x in xyz:
        d = np.linalg.norm(x[:, None] - x[None], axis=-1)
        keep = np.triu(res[:, None] != res[None], 1)
        keep &= ~((res[None] == res[:, None] + 1) & (slot[:, None] == 2) & (slot[None] == 0))
        out.append(np.maximum(radii[:, None] + radii[None] - tolerance - d, 0)[keep].sum())
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
    margin = bb.clash(bad, tolerance=1.2)  # the loss's margin: overlaps counted from 0.3 A earlier
    assert margin.numpy() == pytest.approx(af_clash_reference(bad.numpy(), 16, 1.2), rel=1e-6)
    assert (margin > got).all() and (bb.clash(xyz, tolerance=0.0) > 0).all()


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
    assert "own + clash + guidance 1" in text and "s to draw the samples" in text
    res = json.loads((tmp_path / "results.json").read_text())
    rows = res["rows"]
    for name in ("own", "own+clash", "own+guidance 1", "own+clash+guidance 1"):
        assert all(math.isfinite(v) for v in rows[name].values()), rows[name]
        assert rows[name]["sample_s"] > 0
    for name in ("own", "own+clash"):
        assert rows[name]["ms_per_step"] > 0
        # the same model and noise: guidance lowers the (heavy, untrained) clashes
        assert rows[name + "+guidance 1"]["clash_per_sample"] < rows[name]["clash_per_sample"]
    assert rows["train"]["clashing_fraction"] == 0.0  # real windows: the data's own floor
    assert res["data"]["train_windows"] > 0 and res["data"]["held_out_windows"] > 0
    for name in ("table.md", "ramachandran.png", "clashes.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_clash_guidance_lowers_the_clash_at_one_step(held):
    """The sampler's guidance step (only at t = 0 here) lowers the clash of a fixed clashing batch:
    the same noise with and without guidance, a network that predicts no noise."""
    _, bb = held
    sched = ex.Schedule(10)
    zero = lambda x, t, T: torch.zeros_like(x)  # noqa: E731

    def draw(g):
        return ex.sample(
            zero, sched, 32, 16, torch.Generator().manual_seed(3), bb=bb, guidance=g, guide_frac=0.1
        )

    plain, guided = draw(0.0), draw(0.1)
    before, after = bb.clash(bb.xyz(plain)), bb.clash(bb.xyz(guided))
    assert (before > 0).all()  # random angles clash
    assert 0 < ex.wrap(plain - guided).abs().max() < 0.5  # one small step
    assert after.sum() < 0.98 * before.sum() and (after <= before + 1e-4).float().mean() > 0.9
    g = ex.clash_grad(bb, plain)
    assert g.shape == plain.shape and torch.isfinite(g).all()
    with pytest.raises(ValueError, match="needs the decoder"):
        ex.sample(zero, sched, 2, 16, torch.Generator(), guidance=1.0)


def test_chains_step_like_the_sampler_and_restart(held):
    """``Chains.advance`` is the sampler's DDPM step (noise-free at ``t = 0``) and restarts a
    finished chain from a noised training window at ``t0 - 1``."""
    x, _ = held
    sched = ex.Schedule(10)
    ch = ex.Chains(x, sched, 2, 4, torch.Generator().manual_seed(0))
    assert ch.t.tolist() == [3, 1]
    ch.advance(torch.zeros_like(ch.x))
    assert ch.t.tolist() == [2, 0]
    at0 = ch.x[1].clone()
    eps = 0.1 * torch.ones_like(ch.x)
    ch.advance(eps)  # chain 1 takes its last, noise-free step, then restarts
    ab, b = sched.abar[0], sched.beta[0]
    last = ex.wrap((at0 - b / (1 - ab).sqrt() * eps[1]) / (1 - b).sqrt())
    assert ch.t.tolist() == [1, 3]
    assert not torch.allclose(ch.x[1], last)  # restarted: a fresh noised window, not the end point
    assert ex.wrap(ch.x[1] - last).abs().max() > 0.1


def test_clash_term_moves_the_target_against_the_clash(held):
    """The clash term moves the noise target of the low-noise states only, so that the predicted
    ``x0`` it implies clashes less; at high noise the target is the own loss's."""
    x, bb = held
    bad = ex.wrap(x[:8] + 1.5 * torch.randn(x[:8].shape, generator=torch.Generator().manual_seed(1)))
    assert (bb.clash(bb.xyz(bad)) > 0).all()
    sched, gen = ex.Schedule(10), torch.Generator().manual_seed(0)
    seen = {}

    def net(xt, t, T):  # predicts the noise that leads back to ``bad``: x0_hat = bad
        ab = sched.abar[t][:, None, None]
        e = (xt - ab.sqrt() * bad) / (1 - ab).sqrt()
        seen.update(xt=xt, t=t, eps_hat=e)
        return e.requires_grad_()

    ls = ex.losses(net, bad, sched, bb, 0.1, gen)
    t, ab = seen["t"], sched.abar[seen["t"]][:, None, None]
    gen = torch.Generator().manual_seed(0)  # the same draws again: the noise the own loss targets
    t2 = torch.randint(0, 10, (8,), generator=gen)
    eps = torch.randn(bad.shape, generator=gen)
    assert (t2 == t).all() and (t < 2).any() and (t >= 2).any()
    g, _ = ex.penalty_grad(bb, bad)
    low = (t < 2)[:, None, None]
    target = eps + low * 0.1 * ((1 - ab) / ab).sqrt() * g
    eps_hat = seen["eps_hat"]
    want = torch.nn.functional.smooth_l1_loss(
        ex.wrap(eps_hat - target), torch.zeros_like(eps), beta=0.1 * math.pi
    )
    assert float(ls.total.detach()) == pytest.approx(float(want.detach()), rel=1e-5)
    ls.total.backward()  # the clash term's part of the gradient: zero at high noise, and
    grad = eps_hat.grad  # descending it moves x0_hat against the clash
    ex.losses(net, bad, sched, bb, 0.0, torch.Generator().manual_seed(0)).total.backward()
    grad = grad - seen["eps_hat"].grad
    l = t < 2
    assert grad[~l].abs().max() == 0 and grad[l].abs().max() > 0
    x0_after = (
        seen["xt"] - (1 - ab).sqrt() * (eps_hat.detach() - 5e-2 * grad / grad.abs().max())
    ) / ab.sqrt()
    before, after = bb.clash(bb.xyz(bad[l])), bb.clash(bb.xyz(x0_after[l]))
    assert after.sum() < 0.99 * before.sum() and (after <= before + 1e-4).all()


def test_aggregate_over_seeds():
    """Several seeds: the mean and sample standard deviation of every number, ``mean ± sd`` in the table."""
    cfg = dict(bench.SIZES["tiny"], guidance=(1.0,))
    data = dict(entries=2, held_out_entries=["x"], train_residues=1, held_out_residues=1, train_windows=1,
                held_out_windows=1)  # fmt: skip

    def fake(seed, v):
        rows = {name: {key: v for key, _, _ in bench.ROWS} for name, _ in bench.columns(cfg)}
        return dict(seed=seed, config=cfg, data=data, threads=1, rows=rows, _sets=None)

    res = bench.aggregate([fake(0, 1.0), fake(1, 2.0), fake(2, 6.0)])
    assert res["seed"] == [0, 1, 2] and "_sets" not in res
    row = res["rows"]["own+clash+guidance 1"]
    assert row["rama_js"] == pytest.approx(3.0) and row["rama_js_sd"] == pytest.approx(
        np.std([1, 2, 6], ddof=1)
    )
    assert "| 3.0000 ± 2.6458 |" in bench.table(res)


def test_sampler_chains_step_like_the_sampler_from_noise():
    """``SamplerChains``: staggered over all ``T`` steps, the sampler's DDPM step (noise-free at
    ``t = 0``), and a finished chain restarts from fresh noise at ``T - 1``."""
    sched = ex.Schedule(10)
    ch = ex.SamplerChains(3, 5, sched, torch.Generator().manual_seed(0))
    assert ch.t.tolist() == [9, 6, 3] and ch.x.shape == (3, 5, 6) and ch.x.abs().max() <= math.pi
    for _ in range(3):
        ch.advance(torch.zeros_like(ch.x))
    assert ch.t.tolist() == [6, 3, 0]
    at0, eps = ch.x[2].clone(), 0.1 * torch.ones_like(ch.x)
    ch.advance(eps)  # chain 2's last step, then a restart
    ab, b = sched.abar[0], sched.beta[0]
    last = ex.wrap((at0 - b / (1 - ab).sqrt() * eps[2]) / (1 - b).sqrt())
    assert ch.t.tolist() == [5, 2, 9]
    assert ex.wrap(ch.x[2] - last).abs().max() > 0.5  # fresh noise, not the end point
    ab, b = sched.abar[2], sched.beta[2]  # chain 1 at t = 2: the mean plus sqrt(beta) noise
    x1 = ch.x[1].clone()
    gen = torch.Generator().manual_seed(5)
    ch.gen = torch.Generator().manual_seed(5)
    ch.advance(eps)
    z = torch.randn((3, 5, 6), generator=gen)[1]
    want = ex.wrap((x1 - b / (1 - ab).sqrt() * eps[1]) / (1 - b).sqrt() + b.sqrt() * z)
    assert torch.allclose(ch.x[1], want, atol=1e-6)


@pytest.mark.parametrize("unroll", [0, 3])
def test_chain_clash_is_the_penalty_of_the_predicted_x0(held, unroll):
    """``chain_clash``: the penalty (clash with the margin + peptide-bond loss) of the decoded
    ``x0_hat`` of the chains' low-noise states only (``unroll``: of the states ``unroll`` steps
    later), differentiable in the network, whose gradient step lowers it; the chains advance one
    step."""
    x, bb = held
    bad = ex.wrap(x[0] + 1.5 * torch.randn(x[0].shape, generator=torch.Generator().manual_seed(1)))
    sched = ex.Schedule(10)
    bias = torch.zeros(16, 6, requires_grad=True)

    def net(xt, t, T):  # x0_hat = bad - sqrt((1 - abar) / abar) bias
        ab = sched.abar[t][:, None, None]
        return (xt - ab.sqrt() * bad) / (1 - ab).sqrt() + bias

    ch = ex.SamplerChains(5, 16, sched, torch.Generator().manual_seed(0))  # t = 9, 7, 5, 3, 1
    per = ex.chain_clash(net, ch, bb, 4, tolerance=1.3, unroll=unroll)
    assert ch.t.tolist() == [8, 6, 4, 2, 0]
    xyz = bb.xyz(bad[None].double())
    want = float(bb.clash(xyz, 1.3) + bb.violation_loss(xyz))
    assert per.shape == (2,) and per.detach().numpy() == pytest.approx([want, want], rel=1e-4)
    per.sum().backward()
    assert bias.grad.abs().max() > 0
    with torch.no_grad():
        bias -= 1e-2 * bias.grad / bias.grad.abs().max()
    after = ex.chain_clash(
        net, ex.SamplerChains(5, 16, sched, torch.Generator().manual_seed(0)), bb, 4, 1.3, unroll
    )
    assert (after < per.detach()).all()


def test_trainer_terms():
    """Every clash term trains; a wrong term name is refused."""
    sched = ex.Schedule(6)
    data = ex.wrap(ex.load_windows(8, 16, held_out=True)[:16])
    bb = ex.Backbone(8, torch.zeros(6))
    seen = {}
    for term in ex.TERMS:
        torch.manual_seed(0)  # the same weights: "unroll" starts from the same chains as "states"
        n, every = (7, 1) if term == "distill" else (3, 2)  # distill: after its first whole chain
        step = ex.trainer(ex.Denoiser(8, 16, 1), data, sched, bb, steps=6, batch=4, clash_weight=0.03,
                          seed=0, chains=6, term=term, start=0.0, unroll=2, low=0.5, every=every)  # fmt: skip
        extras = seen[term] = [float(step()[0].extra) for _ in range(n)]
        assert all(math.isfinite(e) for e in extras) and max(extras) > 0, (term, extras)
    assert seen["unroll"][0] != pytest.approx(seen["states"][0], rel=1e-3)  # the unrolled states' clash
    with pytest.raises(ValueError, match="term must be"):
        ex.trainer(ex.Denoiser(8, 16, 1), data, sched, bb, steps=2, batch=4, clash_weight=1, seed=0, term="x")


def test_unroll_steps_is_the_sampler_with_its_graph():
    """``unroll_steps`` from pure noise at ``T - 1`` through all ``T`` steps ends at the sampler's
    own sample (its ``x0_hat`` at ``t = 0``; the same noise), holds a state at ``t = 0``, and keeps
    the graph: gradcheck in float64 through two steps, in the states and the network's weights."""
    sched, T = ex.Schedule(8), 8
    w = 0.3 * torch.randn(6, generator=torch.Generator().manual_seed(4), dtype=torch.float64)

    def net(x, t, T_):
        return 0.5 * torch.sin(x + w) + w * (t[:, None, None] + 1) / T_

    def unrolled(k, extra=0):
        gen = torch.Generator().manual_seed(3)
        x = ex.wrap(torch.randn(4, 5, 6, generator=gen)).double()  # the sampler's draws
        t = torch.full((4,), T - 1)
        xs, s, e = ex.unroll_steps(net, sched, x, t, net(x, t, T), k + extra, gen)
        a = sched.abar[s][:, None, None].double()
        return s, ex.wrap((xs - (1 - a).sqrt() * e) / a.sqrt())

    want = ex.sample(net, sched, 4, 5, torch.Generator().manual_seed(3))
    s, got = unrolled(T - 1)
    assert (s == 0).all() and torch.allclose(got, want.double(), atol=1e-5)
    assert torch.equal(unrolled(T - 1, extra=2)[1], got)  # at t = 0 a state stays
    x = 0.4 * torch.randn(2, 5, 6, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    t = torch.tensor([5, 1])  # one state reaches t = 0 after one step and stays

    def f(x, w_):
        nonlocal w
        w = w_
        return ex.unroll_steps(net, sched, x, t, net(x, t, T), 2, torch.Generator().manual_seed(6))[0]

    assert torch.autograd.gradcheck(f, (x.requires_grad_(), w.clone().requires_grad_()))


def _toward(bad, sched):
    """A network whose predicted clean angles are always ``bad``."""

    def net(xt, t, T):
        ab = sched.abar[t][:, None, None]
        return (xt - ab.sqrt() * bad) / (1 - ab).sqrt()

    return net


def test_guided_chains_step_like_the_guided_sampler_and_keep_their_pairs(held):
    """``GuidedChains``: the guided sampler's DDPM step (the clash gradient of the decoded ``x0_hat``
    on the mean at low ``t``, the plain step above), each whole chain's low-noise states recorded with
    the sample it ends at, and noise targets that lead each state to that sample; guidance lowers the
    clash of the samples reached from the same noise."""
    x, bb = held
    bad = ex.wrap(x[0] + 1.5 * torch.randn(x[0].shape, generator=torch.Generator().manual_seed(1)))
    sched = ex.Schedule(6)
    net = _toward(bad, sched)

    def chains(g):
        return ex.GuidedChains(
            2, 16, sched, torch.Generator().manual_seed(0), bb, g, 3, keep=4, guide_frac=0.5
        )

    ch = chains(0.1)
    assert ch.t.tolist() == [5, 2] and ch.whole.tolist() == [True, False]
    seen = []
    for i in range(6):  # chain 0 (from noise at T - 1) ends at the 6th step; chain 1 ends mid-way
        x_t, t = ch.x.clone(), ch.t.clone()
        seen.append(x_t[0])
        gen = torch.Generator()
        gen.set_state(ch.gen.get_state())
        ch.advance(net(x_t, t, 6))
        z = torch.randn(x_t.shape, generator=gen) * (t > 0)[:, None, None]
        ab, b = (v[t][:, None, None] for v in (sched.abar, sched.beta))
        mean = (x_t - b / (1 - ab).sqrt() * net(x_t, t, 6)) / (1 - b).sqrt()
        g = (t < 3)[:, None, None] * ex.clash_grad(bb, bad.expand(2, 16, 6))
        want = ex.wrap(mean - 0.1 * b / ab.sqrt() * g + b.sqrt() * z)
        if i < 5:
            assert torch.allclose(ch.x[0], want[0], atol=1e-5)
        if t[1] > 0:
            assert torch.allclose(ch.x[1], want[1], atol=1e-5)
    assert len(ch.ends) == 1 and torch.allclose(
        ch.ends[0], want[0], atol=1e-5
    )  # chain 1's first run: not whole
    assert torch.equal(ch.states[0], torch.stack(seen[3:][::-1]))  # its states at t = 0, 1, 2
    xs, ts, eps = ch.draw(8)
    ab = sched.abar[ts][:, None, None]
    x0_hat = ex.wrap((xs - (1 - ab).sqrt() * eps) / ab.sqrt())
    plain = (xs - ab.sqrt() * ch.ends[0]).abs() < math.pi  # no 2 pi folded into the noise
    assert ex.wrap(x0_hat - ch.ends[0])[plain].abs().max() < 1e-4 and plain.float().mean() > 0.9
    un = chains(0.0)
    for _ in range(6):
        un.advance(net(un.x, un.t, 6))
    assert float(bb.clash(bb.xyz(ch.ends))) < float(bb.clash(bb.xyz(un.ends)))  # the same noise


def test_distill_term_is_foldingdiffs_loss_on_the_pairs(held):
    """``losses(pairs=)``: the own loss unchanged plus ``pair_weight`` x FoldingDiff's wrapped smooth L1
    of the network's noise on the pairs' states against their targets, in one network call; its gradient
    reaches the network only through the pairs."""
    x, bb = held
    sched = ex.Schedule(10)
    torch.manual_seed(0)
    model = ex.Denoiser(16, 16, 1)
    xs, ts = x[8:11], torch.tensor([0, 1, 2])
    eps = torch.randn(xs.shape, generator=torch.Generator().manual_seed(2))
    plain = ex.losses(model, x[:4], sched, bb, 0.0, torch.Generator().manual_seed(0))
    ls = ex.losses(model, x[:4], sched, bb, 0.0, torch.Generator().manual_seed(0), pairs=(xs, ts, eps),
                   pair_weight=0.5)  # fmt: skip
    want = torch.nn.functional.smooth_l1_loss(
        ex.wrap(model(xs, ts, 10) - eps), torch.zeros_like(eps), beta=0.1 * math.pi
    )
    w = float(want.detach())
    assert float(ls.eps) == pytest.approx(float(plain.eps), rel=1e-5)
    assert float(ls.extra) == pytest.approx(w, rel=1e-5) and w > 0
    assert float(ls.total.detach()) == pytest.approx(float(plain.total.detach()) + 0.5 * w, rel=1e-5)
    p = model.out.weight
    (g_plain,) = torch.autograd.grad(plain.total, p)
    (g,) = torch.autograd.grad(ls.total, p)
    (g_pairs,) = torch.autograd.grad(0.5 * want, p)
    assert torch.allclose(g - g_plain, g_pairs, atol=1e-6) and g_pairs.abs().max() > 0
