"""Every python snippet of the README runs on its own, in a fresh interpreter (issue 32); the extras
bring what their documentation pages (and the scripts those pages name) import."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SNIPPET = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
#: modules a snippet needs beyond zmat's own dependencies, and the extra that brings them
OPTIONAL = {"rdkit": "rdkit", "zuko": "flows", "normflows": "flows", "MDAnalysis": "md", "openmm": "md"}


def snippets(text: str) -> list[str]:
    return SNIPPET.findall(text)


def imported(code: str) -> set[str]:
    """Top-level package names a piece of code imports (anywhere in it)."""
    out = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module.split(".")[0])
    return out


def test_snippets_are_found():
    code = snippets((ROOT / "README.md").read_text())
    assert len(code) >= 5 and all("import" in c for c in code)
    assert snippets("```bash\nls\n```\ntext\n```python\nx = 1\n```\n") == ["x = 1\n"]


@pytest.mark.slow
def test_every_readme_snippet_runs_alone(tmp_path):
    """In a fresh interpreter each, from an empty folder (``tests/data`` linked in, as the snippets
    read it); started together, so the suite waits for the slowest, not for their sum."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "data").symlink_to(ROOT / "tests" / "data")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = []
    for i, code in enumerate(snippets((ROOT / "README.md").read_text())):
        missing = [m for m in imported(code) if m in OPTIONAL and not _importable(m)]
        if missing:
            continue  # the extra is not installed here (CI installs them all)
        cmd = [sys.executable, "-c", code]
        procs.append(
            (
                i,
                code,
                subprocess.Popen(
                    cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
                ),
            )
        )
    assert procs
    for i, code, proc in procs:
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"README snippet {i} fails on its own:\n{code}\n{out[-3000:]}"


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_extras_bring_what_their_pages_use():
    """The python on a page, and the scripts it names (``tests/data/x.py``, ``examples/x.py``), import
    nothing optional that the page's extra lacks: ``md`` brings OpenMM, which makes the MD page's
    trajectory."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    dists = {e: {re.split(r"[<>=\[ ]", r)[0].lower() for r in reqs} for e, reqs in extras.items()}
    for page, extra in {"md.md": "md", "flows.md": "flows"}.items():
        text = (ROOT / "docs" / page).read_text()
        code = [*snippets(text)]
        code += [(ROOT / p).read_text() for p in re.findall(r"`((?:tests/data|examples)/\w+\.py)`", text)]
        needed = {m for c in code for m in imported(c) if m in OPTIONAL and OPTIONAL[m] == extra}
        assert needed <= {"MDAnalysis", "openmm", "zuko", "normflows"}
        assert {m.lower() for m in needed} <= dists[extra], (page, needed, dists[extra])
    assert {"mdanalysis", "openmm"} <= dists["md"]
