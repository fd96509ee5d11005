"""zmat's modules import each other without a circle, and none imports one of zmat's own
modules inside a function except at an optional extra's boundary (issue 21): read from the
sources, so a new circle or a lazy import fails here. The one documented exception: the
subpackages ``zmat/__init__.py`` loads on first attribute access (``LAZY_PACKAGES``), which
``import zmat`` must not import (issue 32), timed against ``import torch``."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import zmat

ROOT = Path(zmat.__file__).parent
#: (importer, imported): lazy on purpose, each for the reason given
LAZY = {
    ("zmat.zmatrix", "zmat.rdkit"): "zmat.rdkit imports RDKit, an optional extra `import zmat` must not need",
}
#: attributes of the package imported on first access by its module ``__getattr__``
LAZY_PACKAGES = {
    "optimize": "geometry optimisation (ase.data, scipy): chemists' tool, not needed by a loss",
    "protein": "residue templates and ideal geometry: most of what `import zmat` would cost",
    "structure": "the all-atom package (CCD, nucleotides, ligands), imported by zmat.protein",
}
#: (importer, imported): the one circle on purpose: zmat.protein is the public facade of the
#: structure package (it re-exports its names), while the structure modules build on protein's
#: modules; so zmat.structure makes zmat.protein first (test_every_structure_module_imports_first)
FACADE = {("zmat.structure", "zmat.protein")}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, root: Path = ROOT) -> list[tuple[str, bool]]:
    """``(module, at top level)`` of every import of a module of ``root``'s package in ``path``."""
    name, tree = module_name(path, root), ast.parse(path.read_text())
    own = root.name
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top = {id(n) for n in tree.body} | {
        id(n) for s in tree.body if isinstance(s, ast.If | ast.Try) for n in ast.walk(s)
    }
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *filter(None, [base])])
            targets = [base] if node.module else [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        for t in targets:
            if t == own or t.startswith(own + "."):
                out.append((t, id(node) in top))
    return out


def graph(root: Path = ROOT) -> tuple[dict[str, set[str]], list[tuple[str, str]]]:
    edges, lazy = {}, []
    names = {module_name(p, root) for p in root.rglob("*.py")}
    for path in root.rglob("*.py"):
        src = module_name(path, root)
        for target, at_top in imports(path, root):
            while target not in names:  # `from .x import name`: the module x
                target = target.rpartition(".")[0]
            if at_top:
                edges.setdefault(src, set()).add(target)
            else:
                lazy.append((src, target))
    return edges, lazy


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle found by a depth-first search (a package importing its own
    submodules is no circle: it is how a package is built)."""
    found, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if node.startswith(nxt + "."):  # a submodule importing its package (made first)
                continue
            if state.get(nxt) == "open":
                found.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return found


def test_no_import_circle():
    edges, _ = graph()
    for src, target in FACADE:
        edges.get(src, set()).discard(target)
    assert "zmat.rdkit" in edges and "zmat.batch" in edges["zmat.rdkit"]  # the graph is read
    assert cycles(edges) == []


def test_no_import_circle_in_benchmarks():
    """Counting imports inside functions too: benchmarks import each other lazily."""
    edges, lazy = graph(ROOT.parent / "benchmarks")
    for src, target in lazy:
        edges.setdefault(src, set()).add(target)
    assert "benchmarks.sections" in edges["benchmarks.limits"]  # the graph is read
    assert cycles(edges) == []


def test_a_circle_is_found():
    assert cycles({"zmat.a": {"zmat.b"}, "zmat.b": {"zmat.c"}, "zmat.c": {"zmat.a"}}) == [
        ["zmat.a", "zmat.b", "zmat.c", "zmat.a"]
    ]


def test_no_lazy_import_of_zmat_modules():
    _, lazy = graph()
    assert sorted(set(lazy) - set(LAZY)) == []


def test_the_lazy_packages_are_the_documented_ones():
    assert zmat._LAZY == tuple(LAZY_PACKAGES)
    assert set(LAZY_PACKAGES) <= set(zmat.__all__) and set(LAZY_PACKAGES) <= set(dir(zmat))
    try:
        zmat.no_such_attribute  # noqa: B018
    except AttributeError as err:
        assert "no_such_attribute" in str(err)
    else:
        raise AssertionError("an unknown attribute must raise AttributeError")


def _python(code: str, env: dict) -> str:
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_every_structure_module_imports_first():
    """Each module of zmat.structure imported first in a fresh interpreter (forked after torch):
    none meets a partially initialised module through zmat.protein's facade."""
    names = sorted(module_name(p) for p in (ROOT / "structure").glob("*.py"))
    code = (
        "import importlib, os, torch\n"
        f"for name in {names!r}:\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        try:\n"
        "            importlib.import_module(name)\n"
        "        except ImportError as err:\n"
        "            print(name, err)\n"
        "        os._exit(0)\n"
        "    os.waitpid(pid, 0)\n"
    )
    assert _python(code, {**os.environ, "PYTHONPATH": str(ROOT.parent)}) == ""


def test_import_zmat_is_light(tmp_path):
    """In a fresh interpreter: ``import zmat`` after ``import torch`` imports no lazy package and
    no third-party module (issue 32: it cost 0.3 s beside torch; what it imports is checked here,
    since a timed assertion fails on a loaded machine), and every way of reaching the packages
    still works."""
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(tmp_path), "PYTHONPATH": str(ROOT.parent)}
    out = _python(
        "import sys, torch\n"
        "before = set(sys.modules); import zmat\n"
        "new = {m.partition('.')[0] for m in set(sys.modules) - before} - {'zmat'}\n"
        "print(*sorted(new - set(sys.stdlib_module_names)) or ['-'],"
        f" *['zmat.' + name in sys.modules for name in {tuple(LAZY_PACKAGES)}])\n"
        "assert zmat.protein.from_pdb and zmat.structure.complex.Complex and 'zmat.protein' in sys.modules\n"
        "import zmat.protein.atom37\n"
        "from zmat import protein\n"
        "from zmat.protein import from_pdb\n",
        env,
    )
    assert out.split() == ["-"] + ["False"] * len(LAZY_PACKAGES), out
