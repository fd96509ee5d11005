"""The test run is quiet: torch's own deprecation warnings are filtered (pyproject), nothing else is."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import torch, warnings

def test_forward_ad():
    x = torch.randn(3, dtype=torch.float64)
    torch.func.jvp(torch.sin, (x,), (x,))  # torch scripts its forward-AD decompositions here

def test_other_warnings_still_show():
    warnings.warn("a warning of ours", DeprecationWarning)
"""


def test_forward_ad_deprecations_are_filtered_and_others_shown(tmp_path):
    probe = tmp_path / "test_probe.py"
    probe.write_text(PROBE)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", ROOT / "pyproject.toml"]
    out = subprocess.run(
        [*map(str, cmd), "--rootdir", str(tmp_path), str(probe)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "torch.jit.script" not in out.stdout, out.stdout
    assert "a warning of ours" in out.stdout and "1 warning" in out.stdout, out.stdout
