"""Structural violations: equal to AlphaFold's own functions on the same inputs.

The reference values in ``tests/data/alphafold_reference.npz`` are the outputs
of AlphaFold's ``folding.find_structural_violations``,
``folding.compute_violation_metrics`` and the terms of
``folding.structural_violation_loss`` (default config: tolerance factor 12,
clash overlap 1.5 A) and of ``residue_constants.make_atom14_dists_bounds``,
computed by AlphaFold (JAX, float32) on atom14 inputs stored beside them
(``tests/data/make_alphafold_reference.py``): ubiquitin with 0.3 A noise,
lysozyme as deposited (disulfides, no violation), ubiquitin with a numbering gap
and 0.15 A noise. zmat computes in float64 from the same float32 inputs, so the
tolerance is float32 round-off.
"""

from pathlib import Path

import numpy as np
import pytest
import torch

import zmat.protein as zp
from zmat.protein import violations as V
from zmat.testing import DispatchAudit, GrainAudit

DATA = Path(__file__).parent / "data"
REF = np.load(DATA / "alphafold_reference.npz")
# AlphaFold's nested names -> ours (the rest are the same)
RENAME = {
    "bonds_c_n_loss_mean": "c_n_loss_mean",
    "angles_ca_c_n_loss_mean": "ca_c_n_loss_mean",
    "angles_c_n_ca_loss_mean": "c_n_ca_loss_mean",
    "total_per_residue_violations_mask": "per_residue_violation_mask",
}


def _case(k):
    g = lambda n: torch.as_tensor(REF[f"v{k}_in_{n}"])  # noqa: E731
    pos14, exists, aatype = g("positions").double(), g("exists") > 0, g("aatype").long()
    pos37, mask37 = zp.atom14_to_atom37(pos14, aatype, exists)
    return pos37, aatype, mask37, g("residue_index")


def test_bounds_are_alphafolds():
    lower, upper = V.residue_distance_bounds(1.5, 12.0)
    np.testing.assert_allclose(lower, REF["const_lower_bound"], atol=1e-6)
    np.testing.assert_allclose(upper, REF["const_upper_bound"], rtol=1e-6, atol=1e-6)


def test_constants_are_alphafolds():
    assert V.C_N_LENGTH + V.C_N_STDDEV == tuple(REF["const_c_n"].tolist())
    assert V.COS_CA_C_N == tuple(REF["const_cos_ca_c_n"].tolist())
    assert V.COS_C_N_CA == tuple(REF["const_cos_c_n_ca"].tolist())
    assert V.CA_CA == float(REF["const_ca_ca"])


@pytest.mark.parametrize("k", [0, 1, 2])
def test_equal_to_alphafold(k):
    v = zp.structural_violations(*_case(k))
    names = [n for n in REF.files if n.startswith(f"v{k}_out_")]
    assert len(names) == 17
    for n in names:
        key = n[len(f"v{k}_out_") :]
        ref, mine = REF[n], v[RENAME.get(key, key)].numpy()
        assert mine.shape == ref.shape, key
        if "mask" in key or key == "per_atom_violations":
            np.testing.assert_array_equal(mine, ref, err_msg=key)
        else:
            np.testing.assert_allclose(mine, ref, rtol=1e-5, atol=1e-6, err_msg=key)
    if k == 0:  # the noisy case exercises every term
        for key in ("c_n_loss_mean", "clashes_mean_loss", "loss", "violations_within_residue"):
            assert v[key] > 0, key


def test_parts_equal_to_alphafold():
    """The AlphaFold-named parts on their own (atom14 in, AlphaFold's signatures)."""
    g = lambda n: torch.as_tensor(REF[f"v0_in_{n}"])  # noqa: E731
    pos14, exists, aatype, ri = g("positions").double(), g("exists"), g("aatype").long(), g("residue_index")
    lower, upper = (torch.as_tensor(b)[aatype] for b in V.residue_distance_bounds())
    w = V.within_residue_violations(pos14, exists, lower, upper)
    np.testing.assert_allclose(w["per_atom_loss_sum"].numpy(), REF["v0_out_per_atom_loss_sum"], atol=1e-5)
    np.testing.assert_array_equal(w["per_atom_violations"].numpy(), REF["v0_out_per_atom_violations"])
    b = V.between_residue_bond_loss(pos14, exists, ri, aatype)
    np.testing.assert_allclose(b["c_n_loss_mean"].numpy(), REF["v0_out_bonds_c_n_loss_mean"], rtol=1e-5)
    ca = V.extreme_ca_ca_distance_violations(pos14, exists, ri)
    assert float(ca) == float(REF["v0_out_violations_extreme_ca_ca_distance"])


def test_float32_close_to_alphafold():
    pos, aatype, mask, ri = _case(0)
    v = zp.structural_violations(pos.float(), aatype, mask, ri)
    for key in ("loss", "c_n_loss_mean", "ca_c_n_loss_mean", "c_n_ca_loss_mean", "clashes_mean_loss"):
        ref = REF[f"v0_out_{next((k for k, n in RENAME.items() if n == key), key)}"]
        assert v[key].dtype == torch.float32
        np.testing.assert_allclose(v[key].numpy(), ref, rtol=1e-4, err_msg=key)


def test_ragged_batch_equals_one_by_one():
    cases = [_case(0), _case(1), _case(2)]
    Lm = max(c[0].shape[0] for c in cases)

    def pad(x, value=0):
        out = torch.full((Lm, *x.shape[1:]), value, dtype=x.dtype)
        out[: len(x)] = x
        return out

    pos = torch.stack([pad(c[0]) for c in cases])
    aatype = torch.stack([pad(c[1], 20) for c in cases])
    mask = torch.stack([pad(c[2]) for c in cases])
    ri = torch.stack([pad(c[3], -100) for c in cases])
    vb = zp.structural_violations(pos, aatype, mask, ri)
    for b, c in enumerate(cases):
        v = zp.structural_violations(*c)
        L = len(c[0])
        for key, val in v.items():
            got = vb[key][b]
            if key == "connections_per_residue_loss_sum":
                # unmasked in AlphaFold: the last residue also sums its pair with the padding
                got, val = got[: L - 1], val[:-1]
            elif val.ndim >= 1:
                got = got[:L]
            torch.testing.assert_close(got, val, rtol=1e-10, atol=1e-12, msg=key)


def _moving(pos, mask, k):
    """``f(d)``: positions with residue ``k``'s atoms moved by ``d`` (few inputs keep
    gradcheck fast)."""
    cols = torch.nonzero(mask[k])[:, 0]
    d0 = torch.zeros(len(cols), 3, dtype=pos.dtype)
    return d0, lambda d: pos.index_put((torch.full_like(cols, k), cols), pos[k, cols] + d)


def test_gradients():
    pos, aatype, mask, ri = _case(2)
    sl = slice(20, 23)  # three noisy residues: bond, angle and within-residue terms active
    d0, moved = _moving(pos[sl], mask[sl], 1)
    f = lambda d: zp.structural_violations(moved(d), aatype[sl], mask[sl], ri[sl])["loss"]  # noqa: E731
    assert f(d0) > 0
    d = (d0 + 0.01).requires_grad_()
    assert torch.autograd.gradcheck(f, (d,))
    assert torch.autograd.gradgradcheck(f, (d,))


def test_clash_gradient_through_clash_loss():
    """Two residues pushed together: the clash term drives the gradient."""
    p = zp.Protein.from_sequence("GG")
    pos, mask = p.to_atom37()
    pos = pos.clone()
    pos[1] = pos[0] + torch.tensor([0.3, 2.6, 0.0], dtype=pos.dtype)  # residue 1 on top of residue 0
    x = pos.requires_grad_()
    v = zp.structural_violations(x, p.aatype, mask)
    assert v["clashes_mean_loss"] > 0 and abs(v["violations_between_residue_clash"] - 1) < 1e-9
    v["clashes_mean_loss"].backward()
    assert x.grad[1].abs().sum() > 0  # pushes residue 1 away
    d0, moved = _moving(pos.detach(), mask, 1)
    f = lambda d: zp.structural_violations(moved(d), p.aatype, mask)["clashes_mean_loss"]  # noqa: E731
    assert torch.autograd.gradcheck(f, ((d0 + 0.01).requires_grad_(),))
    # the gradient of clash_loss's pair sum, as AlphaFold's per-atom sums count each pair twice
    per_atom = v["clashes_per_atom_loss_sum"].sum()
    assert per_atom > 0


def test_pairs_given_no_host_sync():
    pos, aatype, mask, ri = _case(0)
    pos14, ex14 = zp.atom37_to_atom14(pos, aatype, mask)
    pairs = zp.clash_pairs(pos14, ex14, aatype, ri, skin=1.0)
    ref = zp.structural_violations(pos, aatype, mask, ri)
    zp.structural_violations(pos, aatype, mask, ri, pairs=pairs)  # warm the caches
    x = pos.clone().requires_grad_()
    with DispatchAudit() as audit:
        v = zp.structural_violations(x, aatype, mask, ri, pairs=pairs)
        v["loss"].backward()
    assert audit.syncs == [], audit.syncs
    for key in ref:
        torch.testing.assert_close(v[key].detach(), ref[key], msg=key)


def test_errors():
    with pytest.raises(ValueError, match=r"\(\.\.\., L, 37, 3\)"):
        zp.structural_violations(torch.zeros(5, 14, 3), torch.zeros(5, dtype=torch.long), torch.ones(5, 14))


def test_bad_inputs_raise_naming_the_argument():
    pos, aatype, mask, ri = _case(0)
    sv = zp.structural_violations
    with pytest.raises(ValueError, match="atom37 has no residues"):
        sv(torch.zeros(0, 37, 3), torch.zeros(0, dtype=torch.long), torch.zeros(0, 37, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"aatype of shape \(75,\) does not match"):
        sv(pos, aatype[:-1], mask, ri)
    with pytest.raises(ValueError, match=r"mask of shape \(76, 14\) does not match"):
        sv(pos, aatype, mask[:, :14], ri)
    with pytest.raises(ValueError, match=r"residue_index of shape \(2, 76\) does not match"):
        sv(pos, aatype, mask, ri.expand(2, -1))
    for bad in (-1, 21):
        a = aatype.clone()
        a[7] = bad  # -1 was ALA for the atom14 gather but unknown for the bounds; 21 an IndexError
        with pytest.raises(ValueError, match=rf"aatype must lie in \[0, 20\].*residue 7 has \[{bad}\]"):
            sv(pos, a, mask, ri)
    with pytest.raises(TypeError, match="aatype must hold integers"):
        sv(pos, aatype.double(), mask, ri)


# ------------------------------------------------------------ OpenFold
OF = np.load(DATA / "openfold_reference.npz")
OF_CASES = ("1ubi", "1aki", "3wip", "7pfl")
OF_RENAME = RENAME | {"within_per_atom_loss_sum": "per_atom_loss_sum"}
SCALARS = ("c_n_loss_mean", "ca_c_n_loss_mean", "c_n_ca_loss_mean", "clashes_mean_loss", "loss")


def _of_case(case):
    g = lambda n: torch.as_tensor(OF[f"{case}_in_{n}"])  # noqa: E731
    pos37, mask37 = zp.atom14_to_atom37(g("positions"), g("aatype").long(), g("exists") > 0)
    return pos37, g("aatype").long(), mask37, g("residue_index")


def _of_outputs(case):
    """OpenFold's outputs under our names (its atom-count outputs have no counterpart)."""
    out = {}
    for n in OF.files:
        if n.startswith(f"{case}_out_") and "num_clash" not in n:
            key = n[len(f"{case}_out_") :]
            out[OF_RENAME.get(key, key)] = OF[n]
    return out


@pytest.mark.parametrize("case", OF_CASES)
def test_openfold_compatible_equals_openfold(case):
    """OpenFold's own functions (tests/data/make_openfold_reference.py) on noisy real
    proteins where every term is non-zero; float64 on both sides. The tolerance is
    float32 round-off of constants: OpenFold's C-N target length is a float32 tensor
    (bool * float), and its within-residue bounds AlphaFold's float32 table."""
    v = zp.structural_violations(*_of_case(case), openfold_compatible=True)
    ref = _of_outputs(case)
    assert len(ref) == 17
    for key in SCALARS + ("violations_within_residue",):
        assert ref[key] > 0, key  # every term exercised
    for key, want in ref.items():
        got = v[key].numpy()
        assert got.shape == want.shape, key
        if "mask" in key or key.startswith("violations") or key == "per_atom_violations":
            np.testing.assert_array_equal(got, want, err_msg=key)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=2e-6, err_msg=key)


def test_default_is_alphafolds_fix_not_openfold():
    # the CA-C-N tolerance differs (0.0311 against OpenFold's 0.014); nothing else does
    v = zp.structural_violations(*_of_case("1ubi"))
    ref = _of_outputs("1ubi")
    assert v["ca_c_n_loss_mean"] < 0.7 * ref["ca_c_n_loss_mean"]
    for key in ("c_n_loss_mean", "c_n_ca_loss_mean", "clashes_mean_loss"):
        np.testing.assert_allclose(v[key].numpy(), ref[key], rtol=1e-6, err_msg=key)


# ------------------------------------------------------------ ragged batches
def test_ptr_batch_equals_one_by_one():
    cases = [_case(0), _case(1), _case(2)]
    flat = [torch.cat([c[k] for c in cases]) for k in range(4)]
    sizes = [len(c[0]) for c in cases]
    ptr = torch.tensor([0, *np.cumsum(sizes)])
    for kw in (dict(ptr=ptr), dict(batch=torch.repeat_interleave(torch.arange(3), torch.tensor(sizes)))):
        vb = zp.structural_violations(*flat, **kw)
        for b, c in enumerate(cases):
            v = zp.structural_violations(*c)
            sl = slice(int(ptr[b]), int(ptr[b + 1]))
            for key, val in v.items():
                got = vb[key][b] if val.ndim == 0 else vb[key][sl]
                torch.testing.assert_close(got, val, rtol=1e-10, atol=1e-12, msg=f"{key} {b}")
    pos14, ex14 = zp.atom37_to_atom14(flat[0], flat[1], flat[2])
    pairs = zp.clash_pairs(pos14, ex14, flat[1], flat[3], skin=1.0, ptr=ptr)
    x = flat[0].clone().requires_grad_()
    with DispatchAudit() as audit:
        v = zp.structural_violations(x, *flat[1:], pairs=pairs, ptr=ptr)
        v["loss"].sum().backward()
    assert audit.syncs == [], audit.syncs
    torch.testing.assert_close(v["loss"].detach(), vb["loss"])


class _Threads:
    def __init__(self, n):
        self.n, self.old = n, torch.get_num_threads()

    def __enter__(self):
        torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        torch.set_num_threads(self.old)


_DIFFERENTIABLE = (
    *("c_n_loss_mean", "ca_c_n_loss_mean", "c_n_ca_loss_mean", "connections_per_residue_loss_sum"),
    *("clashes_mean_loss", "per_atom_loss_sum", "loss"),
)


def _noisy_batch(n, length, seed):
    """``n`` x ``length`` residues, backbones near-helical, side chains random (all terms active)."""
    rng = np.random.default_rng(seed)
    batch = zp.ProteinBatch(["".join(rng.choice(list("ACDEFGHIKLMNPQRSTVWY"), length)) for _ in range(n)])
    tors = torch.from_numpy(rng.uniform(-np.pi, np.pi, (n, batch.L_max, 7)))
    tors[..., :3] = torch.tensor([-57.0, -47.0, 180.0], dtype=tors.dtype).deg2rad()
    with torch.no_grad():
        pos37, mask37 = zp.atom37.to_atom37(batch, batch.to_xyz(tors))
    pos37 = pos37 + 0.2 * torch.from_numpy(rng.standard_normal(pos37.shape)) * mask37[..., None]
    aatype = zp.atom37.aatype_of(batch)
    pos14, mask14 = zp.atom37_to_atom14(pos37, aatype, mask37)
    return pos37, aatype, mask37, zp.clash_pairs(pos14, mask14, aatype, torch.arange(batch.L_max), skin=1.0)


def test_serial_cpu_path_opens_no_parallel_region():
    # with two threads and a pair list, no op at or above torch's parallel grain, forward
    # and backward (the torch path ran ~130 over 16 x 256 residues); the same values and
    # gradients as the torch path (one thread)
    pos, aatype, mask, pairs = _noisy_batch(4, 96, seed=3)
    assert pos.numel() > GrainAudit.GRAIN and len(pairs) > 0
    gen = torch.Generator().manual_seed(4)
    results, grads = {}, None
    for threads in (2, 1):
        with _Threads(threads):
            x = pos.clone().requires_grad_()
            v = zp.structural_violations(x, aatype, mask, pairs=pairs)
            if grads is None:
                grads = [torch.rand(v[k].shape, generator=gen, dtype=pos.dtype) for k in _DIFFERENTIABLE]
            x = pos.clone().requires_grad_()
            with GrainAudit() as big:
                v = zp.structural_violations(x, aatype, mask, pairs=pairs)
                (g,) = torch.autograd.grad([v[k] for k in _DIFFERENTIABLE], x, grads)
            results[threads] = (v, g, big.ops)
    (v2, g2, ops2), (v1, g1, ops1) = results[2], results[1]
    assert ops2 == [], sorted(set(ops2))
    assert len(ops1) > 50  # the torch path: the audit sees its ops
    assert all(bool((v1[k] > 0).any()) for k in _DIFFERENTIABLE), "every term active"
    for key in v1:
        torch.testing.assert_close(v2[key], v1[key], rtol=1e-10, atol=1e-12, msg=key)
    assert g1.abs().max() > 0
    torch.testing.assert_close(g2, g1, rtol=1e-10, atol=1e-10)


def test_serial_cpu_path_float32_and_gradgradcheck():
    pos, aatype, mask, pairs = _noisy_batch(2, 4, seed=5)
    with _Threads(1):
        want = zp.structural_violations(pos.float(), aatype, mask, pairs=pairs)
    cols = torch.nonzero(mask[1, 2])[:, 0]  # residue 2 of structure 1 moves (few inputs: fast)

    def f(d):
        x = pos.index_put((torch.ones_like(cols), torch.full_like(cols, 2), cols), pos[1, 2, cols] + d)
        return [zp.structural_violations(x, aatype, mask, pairs=pairs)[k] for k in _DIFFERENTIABLE]

    with _Threads(2):
        got = zp.structural_violations(pos.float(), aatype, mask, pairs=pairs)
        for key in want:
            torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-5, msg=key)
        d = torch.full((len(cols), 3), 0.01, dtype=pos.dtype, requires_grad=True)
        assert torch.autograd.gradcheck(f, (d,))
        assert torch.autograd.gradgradcheck(f, (d,), fast_mode=True)  # random projections: minutes faster


def test_benchmark_runs(tmp_path):
    """benchmarks/protein_tensors.py at its tiny size, so it never rots."""
    import json
    import sys

    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root))
    try:
        from benchmarks import protein_tensors
    finally:
        sys.path.remove(str(root))
    assert protein_tensors.main(["--tiny", "--out", str(tmp_path)]) == 0
    recs = json.loads((tmp_path / "protein_tensors.json").read_text())["records"]
    assert {r["op"] for r in recs} >= {"to_atom37", "violations", "atom14_from_frames"}
    assert all(r["fwd"] > 0 and r["fwd+bwd"] > 0 for r in recs)
