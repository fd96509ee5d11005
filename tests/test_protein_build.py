"""zmat.protein.build: torsion -> coordinates, batches, FoldingDiff backbone."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch

import zmat
import zmat.protein as zp
from zmat import _kernel, rmsd
from zmat._analytic import _kernel_plan
from zmat.protein.layout import ring_atoms
from zmat.table import POSITIONAL

DATA = Path(__file__).parent / "data"
ALL20 = "ARNDCQEGHILKMFPSTWYV"


# ---------------------------------------------------- torsions -> coordinates
def _random_torsions(L, *batch, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*batch, L, 7, generator=g, dtype=torch.float64) * 2 - 1) * math.pi


def test_build_reproduces_torsions_and_ideal_geometry():
    seq = ALL20 * 2
    t = _random_torsions(len(seq))
    xyz = zp.to_xyz_from_torsions(t, seq)
    p = zp.Protein.from_sequence(seq, xyz)
    got = p.torsion_tensor()
    defined = ~torch.isnan(got)
    d = torch.remainder(got - t + math.pi, 2 * math.pi) - math.pi
    assert d[defined].abs().max() < 1e-9
    # every chi the residue has is defined; phi_0, psi/omega of the last are not
    assert defined[:, :3].sum() == 3 * len(seq) - 3
    # all internal coordinates are ideal (or torsions)
    lay = p.layout
    fixed = lay.ideal_mask & ~np.isnan(lay.ideal)
    fixed[lay.proline_rows[:, 3], 1] = False  # proline's CB-CG-CD angle closes its ring
    fixed = torch.as_tensor(fixed)
    diff = p.internal - lay.tensor("ideal")
    diff[:, 2] = torch.remainder(diff[:, 2] + math.pi, 2 * math.pi) - math.pi  # pi == -pi
    assert diff[fixed].abs().max() < 1e-9


def test_dict_input_and_defaults():
    seq = "MKTAYIAK"
    t = _random_torsions(len(seq))
    d = {k: t[:, i] for i, k in enumerate(zp.TORSION_NAMES)}
    assert torch.equal(zp.internal_from_torsions(d, seq), zp.internal_from_torsions(t, seq))
    part = zp.internal_from_torsions({"phi": t[:, 0], "psi": t[:, 1]}, seq)
    nan = t.clone()
    nan[:, 2:] = torch.nan
    assert torch.equal(part, zp.internal_from_torsions(nan, seq))
    xyz = zp.to_xyz_from_torsions(nan, seq)
    assert torch.isfinite(xyz).all()
    omega = zp.Protein.from_sequence(seq, xyz).torsions["omega"][:-1]
    assert torch.allclose(omega.abs(), torch.full_like(omega, math.pi))
    with pytest.raises(ValueError, match="residues"):
        zp.internal_from_torsions(t[:-1], seq)
    with pytest.raises(ValueError, match="unknown torsion"):
        zp.internal_from_torsions({"chi5": t[:, 0]}, seq)


def test_torsion_rebuild_of_a_real_chain_from_sequence():
    """Building 1l2y from its sequence and torsions equals Protein.ideal_internal."""
    p = zp.from_pdb(DATA / "1l2y.pdb")
    t = p.torsion_tensor()
    t[-1, 1] = torch.atan2(*_oxt_psi(p))  # the file's OXT defines the last psi
    x = zp.to_xyz_from_torsions(t, p.sequence)
    assert x.shape == p.xyz.shape
    y = zmat.to_xyz(p.ideal_internal(), p.table)
    print(f"1l2y torsion-only rebuild from sequence: {rmsd(x, p.xyz):.3f} A")
    assert rmsd(x, y) < 1e-6


def _oxt_psi(p):
    i = {n: j for j, n in enumerate(p.atom_names) if p.residue_index[j] == len(p) - 1}
    q = zp.dihedrals(p.xyz, torch.tensor([[i["N"], i["CA"], i["C"], i["OXT"]]]))[0]
    return torch.sin(q), torch.cos(q)


def test_batch_equals_one_by_one():
    seqs = ["MKTAYIAKQR", "GW", "ACDEFGHIKLMNPQRSTVWY", "PPG"]
    batch = zp.ProteinBatch(seqs)
    t = _random_torsions(batch.L_max, 3, len(seqs), seed=1)  # extra leading dim
    xyz = batch.to_xyz(t)
    assert xyz.shape == (3, len(seqs), batch.N_max, 3)
    assert not (batch.table.kind == POSITIONAL).any()
    for b, s in enumerate(seqs):
        one = zp.to_xyz_from_torsions(t[:, b, : len(s)], s)
        n = one.shape[-2]
        assert batch.atom_mask[b].sum() == n
        assert torch.allclose(xyz[:, b, :n], one, atol=1e-10)
        # each protein starts at the origin in the same frame, padding at the origin
        assert (xyz[:, b, n:] == 0).all()


def test_gradients_flow_to_torsions():
    seq = "MKWVHC"
    t = _random_torsions(len(seq)).requires_grad_()
    xyz = zp.to_xyz_from_torsions(t, seq)
    target = zp.to_xyz_from_torsions(_random_torsions(len(seq), seed=3), seq)
    loss = ((xyz - target) ** 2).sum()
    (g,) = torch.autograd.grad(loss, t)
    assert torch.isfinite(g).all() and g[:, :3].abs().sum() > 0 and g[0, 0] == 0  # phi_0 unused
    t2 = _random_torsions(3).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: zp.to_xyz_from_torsions(x, "MKW"), (t2,))


def test_batch_clash_pairs():
    seqs = ["MKTAYIAKQRQISFVKSHFSRQ", "GWACDEF"]
    batch = zp.ProteinBatch(seqs)
    t = _random_torsions(batch.L_max, len(seqs), seed=5)
    xyz = batch.to_xyz(t)
    pairs = batch.clash_pairs(xyz)
    loss = zmat.clash.clash_loss(xyz, batch.radii, mask=batch.atom_mask, pairs=pairs)
    for b, s in enumerate(seqs):
        p = zp.Protein.from_sequence(s, xyz[b, : batch.layouts[b].n_atoms])
        want = zmat.clash.clash_loss(p.xyz, p.radii, exclude=p.exclusions(), method="all_pairs")
        assert torch.allclose(loss[b], want, atol=1e-9), (b, loss[b], want)


def _same(x, y) -> bool:
    """Equal values, dtype and shape (NaN equal to NaN)."""
    if isinstance(x, list):
        return len(x) == len(y) and all(_same(a, b) for a, b in zip(x, y, strict=True))
    x, y = (v.numpy() if isinstance(v, torch.Tensor) else v for v in (x, y))
    if not isinstance(x, np.ndarray):
        return x == y and type(x) is type(y)
    return x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y, equal_nan=x.dtype.kind == "f")


@pytest.mark.parametrize("seed", range(4))
def test_batch_from_pieces_equals_the_general_path(seed):
    """The fast path (table and arrays stamped from per-type pieces, no
    validation) gives exactly the validated general path's table (every array
    of ConstructionTable), padded arrays and coordinates: random batches with
    every residue type, one-residue proteins and padding."""
    rng = np.random.default_rng(seed)
    seqs = ["".join(rng.choice(list(ALL20), int(n))) for n in rng.integers(1, 30, 7)] + ["W", ALL20]
    batch = zp.ProteinBatch(seqs)
    layouts, refs, arrays, L_max, N_max = batch._general  # the general path, for reference
    assert (L_max, N_max) == (batch.L_max, batch.N_max)
    ref = zmat.ConstructionTable(refs)
    fast = batch.table
    for name in zmat.ConstructionTable._ARRAYS:
        assert _same(getattr(ref, name), getattr(fast, name)), name
    assert ref.n_levels == fast.n_levels and np.array_equal(ref.topo_order, fast.topo_order)
    # the compiled kernel's plan, stamped without the table's arrays (in C
    # where the kernel is loaded, else in numpy), as the general path plans it
    planned = _kernel_plan(ref, torch.device("cpu"))
    for compiled in (True, False) if _kernel.load() is not None else (False,):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("ZMAT_NO_KERNEL", "" if compiled else "1")
            ints, flags, *chunks = zp.pieces.kernel_arrays(batch._stamp)
            stamped = _kernel.KernelPlan(ints, flags, None, *chunks)
            filled = zp.pieces.batch_arrays(batch._stamp, ("ideal", "torsion_slot"))
        for name in ("gather", "keep", "trig", "parent", "order", "chunks"):
            assert torch.equal(getattr(stamped, name), getattr(planned, name)), (compiled, name)
        for name, value in filled.items():
            assert _same(value, arrays[name]), (compiled, name)
    got = {**{k: getattr(batch._flat, k) for k in ("ideal", "ideal_mask", "torsion_slot")}}
    got.update({k: getattr(batch, k) for k in ("atom_mask", "residue_mask", "atom_names", "elements")})
    got["residue_index"] = batch.residue_index
    assert set(got) == set(arrays)
    for k, v in arrays.items():
        assert _same(v, got[k]), k
    # proline rings, stamped per residue, as the general path finds them from the atoms
    cg, cd = ring_atoms(arrays["torsion_slot"], batch._flat.is_pro)
    assert len(cg) == sum(s.count("P") for s in seqs) > 0
    assert _same(np.stack([cg - 4, cg - 1, cg, cd], 1), batch._flat.proline_rows)
    t = _random_torsions(batch.L_max, len(seqs), seed=seed)
    C = batch.internal_from_torsions(t)
    assert torch.equal(zmat.to_xyz(C, fast), zmat.to_xyz(C, ref))


def test_batch_table_makes_the_rest_on_first_use_and_pickles():
    # a fresh batch's table makes only what a CPU transform reads; the rest
    # (rows, subtree ends, depths...) on first access, and for pickling
    import pickle

    batch = zp.ProteinBatch(["MKVLA", "GW"])
    table = batch.table
    assert not {"refs", "subtree_end", "dfs_depth"} & set(vars(table))
    copy = pickle.loads(pickle.dumps(table))
    ref = zmat.ConstructionTable(batch._general.refs)
    for name in zmat.ConstructionTable._ARRAYS:
        assert _same(getattr(ref, name), getattr(copy, name)), name
        assert _same(getattr(ref, name), getattr(table, name)), name
    assert "_make_plan" not in vars(table)


@pytest.mark.skipif(_kernel.load() is None, reason="needs the compiled kernel")
def test_the_c_stamps_split_over_trees_give_the_same_bits(monkeypatch):
    # issue 33: a fresh batch's stamps run over runs of whole trees on threads (any
    # count: the same bits as one thread and as numpy), and the kernel's chunks and
    # roots come from the stamp's trees, as the pass over the parents finds them
    from zmat.protein import pieces

    monkeypatch.setattr(_kernel, "CHUNK_ATOMS", 16)  # many chunks on a small batch
    rng = np.random.default_rng(5)
    seqs = ["".join(rng.choice(list(ALL20), int(n))) for n in (40, 1, 23, 40, 7, 31)]
    st = zp.ProteinBatch(seqs)._stamp
    one = pieces.kernel_arrays(st, 1), pieces._fill_arrays(st, 1)
    ints, _, chunks, roots = one[0]
    assert len(chunks) > 10 and np.array_equal(roots, np.flatnonzero(ints[-2] < 0))
    assert np.array_equal(chunks, _kernel._chunks(ints[-2]))
    with monkeypatch.context() as m:
        m.setenv("ZMAT_NO_KERNEL", "1")
        ref = pieces.kernel_arrays(st), pieces._fill_arrays(st)
    for n in (2, 3, 8, 64):
        got = pieces.kernel_arrays(st, n), pieces._fill_arrays(st, n)
        for want in (one, ref):
            for a, b in zip((*got[0], *got[1]), (*want[0], *want[1]), strict=True):
                assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), n
    want = _step_bits(zp.ProteinBatch(seqs))
    monkeypatch.setattr(_kernel, "_chunks", None)  # a fresh step's chunks: the stamp's
    assert all(torch.equal(x, y) for x, y in zip(_step_bits(zp.ProteinBatch(seqs)), want, strict=True))


@pytest.mark.skipif(_kernel.load() is None, reason="needs the compiled kernel")
@pytest.mark.parametrize("k", [3, 4])
def test_the_c_plan_stamp_equals_numpy_with_and_without_a_link_row(k):
    # the C stamp's loop is compiled once per gather-row count (3: no offset row,
    # no link row; 4: one); a batch always has offset rows (k = 4), so k = 3 is
    # asked for directly: the same bits as the numpy reference either way
    from zmat.protein import pieces

    P = pieces._pieces()
    st = zp.ProteinBatch(["MKVLAGP", "W", "GAVDE"])._stamp
    units = (st.piece, st.size, st.atom0, st.last)
    got = _kernel.stamp_plan(
        units, (P.head, P.start, P.prev_rank, P.seq, P.parent_where, P.link, P.flags), st.N, k
    )
    for a, b in zip(got, pieces._kernel_arrays(st, k), strict=True):
        assert a.shape == (k + 2, st.N) and a.dtype == b.dtype and np.array_equal(a, b), k


def _step_bits(batch, seed: int = 0):
    """``to_xyz`` of random torsions and its gradient (float64)."""
    t = _random_torsions(batch.L_max, len(batch), seed=seed).requires_grad_(True)
    xyz = batch.to_xyz(t)
    return xyz, torch.autograd.grad((xyz * torch.linspace(-1, 1, xyz.numel()).view(xyz.shape)).sum(), t)[0]


def test_a_batch_made_in_a_dataloader_worker_is_ready_and_the_same(monkeypatch):
    # issue 33: a DataLoader worker makes the batch (ProteinBatch.collate: the stamp, the
    # fill's arrays and the kernel's plan), which pickles with its arrays; the main
    # process's step then plans nothing and gives the bits of a batch made there
    import pickle

    from torch.utils.data import DataLoader

    from zmat.protein import pieces

    rng = np.random.default_rng(4)
    seqs = ["".join(rng.choice(list("ACDEFGHIKLMNPQRSTVWY"), n)) for n in (30, 7, 1, 22, 15, 40)]
    made = list(DataLoader(seqs, batch_size=3, num_workers=1, collate_fn=zp.ProteinBatch.collate))
    copy = pickle.loads(pickle.dumps(zp.ProteinBatch(seqs[:3]).prepare()))
    with monkeypatch.context() as m:  # the batches made ahead stamp and chunk nothing more here
        m.setattr(pieces, "kernel_arrays", None)
        m.setattr(_kernel, "_chunks", None)
        steps = [_step_bits(b) for b in made]
        pickled = _step_bits(copy)
    for b, got in zip(made, steps, strict=True):
        assert b.sequences in (seqs[:3], seqs[3:])
        want = _step_bits(zp.ProteinBatch(b.sequences))
        assert all(torch.equal(x, y) for x, y in zip(got, want, strict=True))
    assert all(torch.equal(x, y) for x, y in zip(pickled, steps[0], strict=True))


def test_a_worker_that_made_no_step_yet_stamps_in_c(monkeypatch):
    # a DataLoader worker prepares batches before any kernel call: collate loads the
    # library first, so the plan and the fill's arrays are the C stamps, not numpy's
    from zmat.protein import pieces

    if not _kernel.serves(torch.device("cpu")):
        pytest.skip("the compiled kernel is off")
    monkeypatch.setattr(_kernel, "_state", {})  # nothing loaded yet in this process
    monkeypatch.setattr(pieces, "_kernel_arrays", None)  # the numpy plan stamp: unusable
    stamped = []
    atoms = _kernel.stamp_atoms
    monkeypatch.setattr(_kernel, "stamp_atoms", lambda *a, **k: stamped.append(atoms(*a, **k)) or stamped[-1])
    batch = zp.ProteinBatch.collate(["MKVLAG", "PW"])
    assert batch._prepared and len(stamped) == 1 and stamped[0] is not None


def test_batch_with_an_empty_sequence_takes_the_general_path():
    batch = zp.ProteinBatch(["", "MK"])
    assert batch._stamp is None and batch.atom_mask[0].sum() == 0
    xyz = batch.to_xyz(torch.zeros(2, 2, 7, dtype=torch.float64))
    want = zp.to_xyz_from_torsions(torch.zeros(2, 7, dtype=torch.float64), "MK")
    assert torch.equal(xyz[1, : want.shape[0]], want)


# ------------------------------------------------------------- FoldingDiff
def _foldingdiff_nerf(angles, lengths, first):
    """A transcription of FoldingDiff's sequential NERFBuilder loop (numpy)."""
    phi, psi, omega, tau, cacn, cnca = angles.T
    r_nca, r_cac, tau0 = first
    coords = [
        np.zeros(3),
        np.array([r_nca, 0, 0]),
        np.array([r_cac * -math.cos(tau0) + r_nca, r_cac * math.sin(tau0), 0]),
    ]

    def place(a, b, c, angle, length, torsion):
        bc = (c - b) / np.linalg.norm(c - b)
        n = np.cross(b - a, bc)
        n /= np.linalg.norm(n)
        m = np.stack([bc, np.cross(n, bc), n]).T
        d = [
            -length * math.cos(angle),
            length * math.cos(torsion) * math.sin(angle),
            length * math.sin(torsion) * math.sin(angle),
        ]
        return m @ d + c

    for i in range(len(phi) - 1):
        for length, angle, dih in zip(
            lengths[i], (cacn[i], cnca[i], tau[i]), (psi[i], omega[i], phi[i + 1]), strict=True
        ):
            coords.append(place(coords[-3], coords[-2], coords[-1], angle, length, dih))
    return np.array(coords)


def test_foldingdiff_six_angles():
    p = zp.from_pdb(DATA / "1aki.pdb")
    bb = np.isin(p.atom_names, ["N", "CA", "C"])
    xyz = p.xyz[bb]
    angles, lengths = zp.six_angles_from_backbone(xyz)
    L = len(p)
    assert angles.shape == (L, 6) and lengths.shape == (L, 3)
    assert torch.allclose(angles[1:, 0], p.torsions["phi"][1:], atol=1e-12)
    assert torch.isnan(angles[0, 0]) and torch.isnan(angles[-1, 1:]).all()
    first = (float((xyz[1] - xyz[0]).norm()), float((xyz[2] - xyz[1]).norm()), 0.0)
    n, ca, c = xyz[:3]
    first = (*first[:2], float(torch.atan2(torch.linalg.cross(n - ca, c - ca).norm(), (n - ca) @ (c - ca))))
    # measured angles and lengths: exact
    C = zp.internal_from_six_angles(angles, lengths, first=first)
    assert rmsd(zmat.to_xyz(C, zp.backbone_table(L)), xyz) < 1e-8
    # FoldingDiff's default lengths: same as its own sequential builder
    ours = zmat.to_xyz(zp.internal_from_six_angles(angles), zp.backbone_table(L))
    nca, cac, cn = zp.FOLDINGDIFF_LENGTHS
    ref = _foldingdiff_nerf(angles.numpy(), [(cn, nca, cac)] * L, zp.build.FOLDINGDIFF_FIRST)
    assert rmsd(ours, torch.as_tensor(ref)) < 1e-8
    print(f"1aki backbone from six angles with FoldingDiff lengths: {rmsd(ours, xyz):.3f} A")
    # differentiable, batched
    a = angles.nan_to_num().expand(2, L, 6).clone().requires_grad_()
    zmat.to_xyz(zp.internal_from_six_angles(a), zp.backbone_table(L)).sum().backward()
    assert torch.isfinite(a.grad).all()
