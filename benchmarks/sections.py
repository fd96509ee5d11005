"""What ``benchmarks/fresh.py`` and ``benchmarks/limits.py`` share: the data, the sections
and their printed tables (plain text and Markdown), so that neither imports the other's."""

from __future__ import annotations

from pathlib import Path

__all__ = ["AMINO", "DATA", "ROOT", "SECTIONS", "markdown", "table"]

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
AMINO = "ACDEFGHIKLMNPQRSTVWY"
SECTIONS = ("fresh", "ratios", "latency", "busy", "scaling", "limits")


def _fmt(v) -> str:
    if isinstance(v, float):
        if v < 1e-3:
            return f"{v * 1e6:.3g} us"
        if v < 1:
            return f"{v * 1e3:.3g} ms"
        return f"{v:.3g}"
    return str(v)


def _ratio_keys(rec: dict) -> set:
    return {
        k
        for k in rec
        if k.endswith(("slowdown", "slowdown old", "slowdown new", "/ cached", "ratio", "/ zmat fwd+bwd"))
    }


def _cell(rec: dict, key: str) -> str:
    if key == "fraction":  # of a machine limit (``benchmarks/limits.py``)
        return f"{rec[key]:.1%}"
    return f"{rec[key]:.2f}x" if key in _ratio_keys(rec) else _fmt(rec.get(key, ""))


def _sections(records: list[dict]):
    """Per section with records: its name, column keys and formatted rows."""
    for section in (*SECTIONS, "compare"):
        recs = [r for r in records if r.get("section") == section]
        if recs:
            keys = [k for k in dict.fromkeys(k for r in recs for k in r) if k != "section"]
            rows = [[_cell(r, k) if k in r else "" for k in keys] for r in recs]
            yield section, keys, rows


def table(records: list[dict]) -> str:
    """Plain-text tables, one per section."""
    lines = []
    for section, keys, cells in _sections(records):
        w = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
        lines += ["", f"{section}:", "  " + "  ".join(k.ljust(w[i]) for i, k in enumerate(keys))]
        lines += ["  " + "  ".join(c.ljust(w[i]) for i, c in enumerate(row)) for row in cells]
    return "\n".join(lines)


def markdown(records: list[dict]) -> str:
    out = []
    for section, keys, rows in _sections(records):
        out += [f"\n**{section}**\n", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        out += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(out)
