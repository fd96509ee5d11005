"""The torsion-space model example runs at its tiny size and learns."""

import importlib.util
from pathlib import Path

import torch

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "protein_torsion_model.py"


def test_protein_torsion_model_example(tmp_path):
    spec = importlib.util.spec_from_file_location("protein_torsion_model", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.main(["--steps", "25", "--out", str(tmp_path)])
    hist = torch.tensor(out["history"])  # (steps, [loss, torsion, geometry, clash])
    assert torch.isfinite(hist).all()
    assert hist[-5:, 0].mean() < 0.8 * hist[:3, 0].mean()
    assert len(list(tmp_path.glob("*.pdb"))) == 2
