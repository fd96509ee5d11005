"""The issue-8 examples run at their default size and show what they claim; the docs build.

Each example runs as a user runs it: ``python examples/NAME.py`` with no
arguments, in a subprocess. Its printed facts are parsed and checked.
"""

import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import zmat

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
# Small models: one thread each is fastest and keeps a loaded machine from
# oversubscribing its cores (the distributed example sets its own threads).
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def run(args, timeout=300):
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, *map(str, args)], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout
    )
    seconds = time.perf_counter() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{args} exited with {proc.returncode}:\n{out[-4000:]}"
    print(f"{' '.join(map(str, args))}: {seconds:.1f} s\n{proc.stdout}")
    return proc.stdout


def floats(pattern, text):
    m = re.search(pattern, text)
    assert m, f"{pattern!r} not found in:\n{text}"
    return [float(g) for g in m.groups()]


def test_seed_migration():
    out = run([EXAMPLES / "seed_migration.py"])
    # the users' two failures, as facts
    assert "raises RuntimeError" in out
    assert "modified by an inplace operation" in out
    assert "weight.grad = None" in out
    assert "requires_grad=False" in out
    # zmat reproduces the users' loop (float64) ...
    (dev,) = floats(r"users' loop \(float64\): ([\d.e+-]+) A", out)
    assert dev < 1e-9
    # ... with a finite, nonzero gradient ...
    (gnorm,) = floats(r"gradient norm ([\d.e+-]+) \(the hard count", out)
    assert math.isfinite(gnorm) and gnorm > 0
    # ... and training on the smooth loss removes the clashes
    before, after = floats(r"clash loss ([\d.]+) -> ([\d.]+) A", out)
    count_before, count_after = floats(r"per conformation ([\d.]+) -> ([\d.]+)", out)
    assert after < 0.1 * before
    assert count_after < 0.1 * count_before


def test_wgan_gp():
    out = run([EXAMPLES / "wgan_gp.py"])
    assert "nan" not in out.lower()
    for method in zmat.METHODS:
        row = re.search(rf"^{method}\s+(.*)$", out, re.M)
        assert row, f"no summary row for {method}"
        nums = [float(x) for x in re.findall(r"-?\d+\.\d+(?:e[+-]\d+)?", row.group(1))]
        w0, w1, gp0, gp1, grad_d, grad_g, hist0, hist1, phi_mean, phi_std, ms = nums
        assert all(math.isfinite(x) for x in nums)
        assert grad_d > 0 and grad_g > 0
        assert hist1 < 0.7 * hist0  # the generator moves towards the data (60 +- 15 degrees)
        assert 30 < phi_mean < 90
    # second derivatives through to_xyz agree between methods
    (diff,) = floats(r"max relative difference between methods: ([\d.e+-]+)", out)
    assert diff < 1e-3


def check_distributed(out, world=2):
    for rank in range(world):
        assert f"[rank {rank}] before" in out and f"[rank {rank}] after" in out
    before, after = floats(r"global loss ([\d.]+) -> ([\d.]+)", out)
    assert after < 0.5 * before
    (diff,) = floats(r"max \|difference\| = ([\d.e+-]+)", out)
    assert diff == 0.0


def test_distributed_spawn():
    check_distributed(run([EXAMPLES / "distributed.py"]))


def test_distributed_torchrun():
    args = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    check_distributed(run([*args, EXAMPLES / "distributed.py", "--epochs", "8"]))


def test_conformer_torsions():
    pytest.importorskip("rdkit")
    out = run([EXAMPLES / "conformer_torsions.py"])
    before, after = floats(r"clash loss ([\d.]+) -> ([\d.]+)", out)
    assert after < 0.5 * before
    rg0, rg1 = floats(r"radius of gyration\^2 ([\d.]+) -> ([\d.]+)", out)
    assert rg1 < rg0
    (bond,) = floats(r"max bond length change ([\d.e+-]+) A", out)
    assert bond < 1e-9
    assert "stereo unchanged (RDKit, from 3-D): True" in out
    assert re.search(r"wrote 24 conformers to ", out)


def test_docs_build(tmp_path):
    for module in ("mkdocs", "mkdocstrings", "mkdocstrings_handlers.python"):
        pytest.importorskip(module, reason="the docs need the test extra: pip install -e '.[test]'")
    site = tmp_path / "site"
    run(["-m", "mkdocs", "build", "--strict", "-f", ROOT / "mkdocs.yml", "-d", site], timeout=120)
    api = (site / "api" / "index.html").read_text()
    for name in ("zmat.to_xyz", "zmat.to_internal", "zmat.ConstructionTable", "zmat.ZMatrix", "clash_loss"):
        assert name in api, name
    assert "zmat.chemcoord.from_chemcoord_arrays" in api and "zmat.protein.ProteinBatch" in api


def test_frames_and_violations():
    out = run([EXAMPLES / "frames_and_violations.py"])
    before, after = floats(r"residues violating ([\d.]+) -> ([\d.]+);", out)
    loss_before, loss_after = floats(r"violation loss ([\d.]+) -> ([\d.]+);", out)
    rmsd_before, rmsd_after = floats(r"atom RMSD ([\d.]+) -> ([\d.]+) A", out)
    assert after < before and loss_after < 0.5 * loss_before and rmsd_after < rmsd_before


def test_conformer_example_embeds_distinct_conformers():
    """ETKDG with randomSeed=0 gives identical conformers: the example's seeds must not."""
    pytest.importorskip("rdkit")
    import importlib.util

    import numpy as np

    spec = importlib.util.spec_from_file_location("conformer_torsions", EXAMPLES / "conformer_torsions.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    for k, smiles in enumerate(example.SMILES.values()):  # main() seeds molecule k with k
        mol, ids = example.conformers(smiles, 4, seed=k)
        x = np.stack([mol.GetConformer(i).GetPositions() for i in ids])
        spread = np.abs(x[:, None] - x[None]).max(axis=(2, 3))
        assert len(ids) == 4 and spread[~np.eye(4, dtype=bool)].min() > 0.1, smiles


def test_boltzmann_generator(tmp_path):
    for module in ("MDAnalysis", "zuko", "matplotlib"):
        pytest.importorskip(module)
    png = tmp_path / "rama.png"
    out = run([EXAMPLES / "boltzmann_generator.py", "--out", png])
    train0, test0 = floats(r"Cartesian NLL before: train (-?[\d.]+), held out (-?[\d.]+)", out)
    train1, test1 = floats(r"Cartesian NLL after: train (-?[\d.]+), held out (-?[\d.]+)", out)
    assert all(math.isfinite(x) for x in (train0, test0, train1, test1))
    (ld,) = floats(r"log\|det dxyz/dq\| vs slogdet of the autograd Jacobian: ([\d.e+-]+)", out)
    assert ld < 1e-8
    # maximum likelihood works in Cartesian space, also on frames it never saw (tiny run: ~ -57 / -34)
    assert train1 < train0 - 50 and test1 < test0 - 30
    data, samples = floats(r"alpha-R fraction: data ([\d.]+), samples ([\d.]+)", out)
    assert 0.3 < data < 0.7 and abs(samples - data) < 0.15  # both basins, in about the data's ratio
    lo, hi = floats(r"sampled bond lengths ([\d.]+) to ([\d.]+) A", out)
    assert 0.7 < lo and hi < 2.0  # samples are molecules (bonds from ~1.0 A C-H to ~1.5 A C-C)
    assert png.stat().st_size > 10_000


def test_boltzmann_generator_rotation_augmentation():
    """``--rotate`` turns structures rigidly about their root: internal coordinates and the root
    position stay, the orientation (and the Cartesian log-det: none of it) changes."""
    for module in ("MDAnalysis", "zuko"):
        pytest.importorskip(module)
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("boltzmann_generator", EXAMPLES / "boltzmann_generator.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    ag = example.md.atom_group(
        (example.DATA / "alanine_dipeptide.pdb", example.DATA / "alanine_dipeptide.dcd")
    )
    T, q = example.md.flow_coordinates(ag, normalize_angles=True, stop=16)
    R = example.random_rotations(1000)
    assert torch.allclose(R @ R.transpose(-1, -2), torch.eye(3, dtype=R.dtype).expand(1000, 3, 3), atol=1e-12)
    assert torch.allclose(torch.linalg.det(R), torch.ones(1000, dtype=R.dtype))
    assert abs(float(R[:, 2, 2].mean())) < 0.1  # Haar: cos beta uniform on [-1, 1], mean 0
    q2 = example.rotated(T, q)
    short_row = torch.as_tensor(T.table.refs[:, 2] < 0).repeat_interleave(3)  # the tree's first atoms
    orientation = T.kind.eq(example.flows.COS_BETA) | (T.circular & short_row)  # cos beta, alpha, gamma
    keep = ~orientation
    assert int(orientation.sum()) == 3
    assert (q2[:, keep] - q[:, keep]).abs().max() < 1e-9
    assert (q2[:, orientation] - q[:, orientation]).abs().max() > 0.1
    assert torch.allclose(T.log_abs_det_jacobian(q2), T.log_abs_det_jacobian(q), atol=1e-9)


def test_torsion_diffusion():
    args = ["--steps", "10", "--batch", "8", "--diffusion-steps", "10", "--samples", "4"]
    out = run([EXAMPLES / "torsion_diffusion.py", *args])
    eps, _ = floats(r"step\s+0\s+eps loss ([\d.]+)\s+extra ([\d.]+)", out)
    extras = [float(e) for e in re.findall(r"extra ([\d.]+)", out)]
    assert 0 < eps < 2 and max(extras) > 0  # the clash term is on by default (from step steps / 3)
    (ms,) = floats(r"([\d.]+) ms per training step", out)
    assert ms > 0
    frac, amount = floats(r"guidance 0: samples with a clash: ([\d.]+); clash per sample ([\d.]+) A", out)
    assert 0 <= frac <= 1 and math.isfinite(amount)
    frac, amount = floats(r"guidance 3: samples with a clash: ([\d.]+); clash per sample ([\d.]+) A", out)
    assert 0 <= frac <= 1 and math.isfinite(amount)  # guidance (scale 3) is on by default
