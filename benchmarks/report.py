"""Results: the printed table, Markdown, JSON, the PNG, and the README's targets.

A *group* is one problem (case, size, batch, dtype, device, mode); within it
every implementation gets a row: median seconds per call (the whole batch),
seconds per structure, the ratio to the fastest implementation of the group,
the cold first call, the peak extra memory, and a status.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from .cases import CASES

__all__ = ["groups", "markdown", "plot", "summary", "table", "targets", "write_json", "write_outputs"]

GROUP_KEYS = ("case", "size", "batch", "dtype", "device", "mode")


def fmt_s(s: float | None) -> str:
    if s is None:
        return "-"
    for unit, f in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= f or unit == "us":
            v = s / f
            return f"{v:.3g} {unit}" if v < 1000 else f"{v:.0f} {unit}"
    return "-"


#: below this, CPU peaks are not resolved: smaller buffers come from memory the allocator already holds
CPU_RESOLUTION = 65536


def fmt_bytes(b: int | None, memory: str | None = None) -> str:
    if b is None:
        return "-"
    if memory == "rss-peak" and b < CPU_RESOLUTION:
        return "<64 kB"
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= f:
            return f"{b / f:.3g} {unit}"
    return f"{b} B"


def _ok(r: dict) -> bool:
    return r.get("status") == "ok"


def groups(records: list[dict]) -> list[tuple[tuple, list[dict]]]:
    """Records grouped by problem, in run order; within a group, fastest first."""
    out: dict[tuple, list[dict]] = {}
    for r in records:
        out.setdefault(tuple(r[k] for k in GROUP_KEYS), []).append(r)
    return [(k, sorted(v, key=lambda r: (not _ok(r), r.get("median_s") or math.inf))) for k, v in out.items()]


def _title(key: tuple, rows: list[dict]) -> str:
    case, size, batch, dtype, device, mode = key
    unit = CASES.get(case, "")
    src = next((r.get("source") for r in rows if r.get("source")), "")
    atoms = next((r.get("atoms") for r in rows if r.get("atoms")), None)
    extra = f", {atoms} atoms" if atoms and unit != "atoms" else ""
    return f"{case} {size} {unit}{extra}, batch {batch}, {dtype}, {device}, {mode}" + (
        f"  [{src}]" if src else ""
    )


def _rows(rows: list[dict]) -> list[list[str]]:
    best = min((r["median_s"] for r in rows if _ok(r)), default=None)
    out = []
    for r in rows:
        if _ok(r):
            ratio = r["median_s"] / best
            per = r["median_s"] / r["batch"]
            cells = [fmt_s(r["median_s"]), fmt_s(per), f"{ratio:.3g}x", fmt_s(r.get("first_s"))]
            cells += [
                str(r.get("ops", "-")),
                fmt_bytes(r.get("peak_bytes"), r.get("memory")),
                r.get("note") or "",
            ]
        else:
            cells = ["-", "-", "-", "-", "-", "-", r["status"]]
        out.append([r["impl"], *cells])
    return out


HEAD = [
    "implementation",
    "median",
    "per structure",
    "x fastest",
    "first call",
    "ops/call",
    "peak mem",
    "note",
]


def table(records: list[dict], width: int = 110) -> str:
    """The plain-text table printed at the end of a run."""
    lines = []
    for key, rows in groups(records):
        body = _rows(rows)
        w = [max(len(HEAD[i]), *(len(b[i]) for b in body)) for i in range(len(HEAD) - 1)]
        lines.append("")
        lines.append(_title(key, rows))
        lines.append("  " + "  ".join(h.ljust(w[i]) for i, h in enumerate(HEAD[:-1])) + "  " + HEAD[-1])
        for b in body:
            note = b[-1] if len(b[-1]) <= width else b[-1][: width - 3] + "..."
            lines.append("  " + "  ".join(c.ljust(w[i]) for i, c in enumerate(b[:-1])) + "  " + note)
    return "\n".join(lines)


def markdown(records: list[dict]) -> str:
    """One Markdown table of every record (for the README)."""
    head = ["case", "size", "batch", "mode", *HEAD]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, rows in groups(records):
        case, size, batch, _, _, mode = key
        unit = {"atoms": "at", "residues": "res"}.get(CASES.get(case, ""), "")
        for b in _rows(rows):
            b[-1] = b[-1].replace("|", "/")
            lines.append("| " + " | ".join([case, f"{size} {unit}", str(batch), mode, *b]) + " |")
    return "\n".join(lines)


def summary(records: list[dict]) -> str:
    """A compact Markdown table: one row per problem, one column per implementation.

    Cells: median seconds per call (the fastest in bold), ``fails`` (it
    raised), ``slow`` (skipped: extrapolated past the budget) or blank.
    """
    impls = list(dict.fromkeys(r["impl"] for r in records))
    lines = ["| problem | " + " | ".join(impls) + " |", "|---|" + "---:|" * len(impls)]
    for key, rows in groups(records):
        case, size, batch, dtype, device, mode = key
        unit = {"atoms": "atoms", "residues": "res"}.get(CASES.get(case, ""), "")
        by = {r["impl"]: r for r in rows}
        best = min((r["median_s"] for r in rows if _ok(r)), default=None)
        cells = []
        for name in impls:
            r = by.get(name)
            if r is None:
                cells.append("")
            elif _ok(r):
                t = fmt_s(r["median_s"])
                cells.append(f"**{t}**" if r["median_s"] == best else t)
            elif r["status"].startswith("failed"):
                cells.append("fails")
            elif "too slow" in r["status"] or "timed out" in r["status"]:
                cells.append("slow")
            else:
                cells.append("")
        label = f"{case} {size} {unit} x{batch} {mode}"
        if (dtype, device) != ("float32", "cpu"):
            label += f" {dtype} {device}"
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_outputs(out: Path, records: list[dict]) -> tuple[str, bool]:
    """``table.txt``, ``table.md``, ``summary.md`` and ``results.png`` into ``out``; the text table."""
    text = table(records)
    checks = targets(records)
    if checks:
        text += "\n\ntargets:\n" + "\n".join("  " + c for c in checks)
    (out / "table.txt").write_text(text + "\n")
    (out / "table.md").write_text(markdown(records) + "\n")
    (out / "summary.md").write_text(summary(records) + "\n")
    return text, plot(records, out / "results.png")


def write_json(path: Path, meta: dict, records: list[dict]) -> None:
    path.write_text(json.dumps({"meta": meta, "records": records}, indent=1))


# ---------------------------------------------------------------- plot
def plot(records: list[dict], path: Path) -> bool:
    """Log-log time against size, one panel per (series, mode), one line per implementation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in records if _ok(r)]
    if not ok:
        return False
    series = sorted({(r["case"], r["batch"], r["dtype"], r["device"]) for r in ok}, key=str)
    modes = [m for m in ("fwd", "fwd+bwd") if any(r["mode"] == m for r in ok)]
    from .registry import IMPLS

    impls = [n for n in IMPLS if any(r["impl"] == n for r in records)]
    colors = plt.get_cmap("tab10").colors + ("black",)  # fixed per implementation, across runs
    style = {n: (colors[i % len(colors)], "os^vDP*Xhp<>"[i % 12]) for i, n in enumerate(IMPLS)}
    dash = {"zmat": "-", "seed": "--"}  # peers dotted
    fig, axes = plt.subplots(
        len(series), len(modes), figsize=(5.2 * len(modes), 3.6 * len(series)), squeeze=False
    )
    for i, (case, batch, dtype, device) in enumerate(series):
        for j, mode in enumerate(modes):
            ax = axes[i][j]
            drawn = False
            for name in impls:
                pts = sorted(
                    (r["size"], r["median_s"])
                    for r in ok
                    if (r["impl"], r["case"], r["batch"], r["dtype"], r["device"], r["mode"])
                    == (name, case, batch, dtype, device, mode)
                )
                if pts:
                    c, m = style[name]
                    ls = dash.get(name.split("-")[0], ":")
                    ax.plot(*zip(*pts, strict=True), color=c, marker=m, ls=ls, label=name)
                    drawn = True
            if not drawn:  # this case/batch was not run in this mode
                ax.set_axis_off()
                continue
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel(f"{case} size ({CASES.get(case, '')})")
            ax.set_ylabel("median seconds per call")
            ax.set_title(f"{case}, batch {batch}, {dtype}, {device}: {mode}", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
    handles = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(lab, h)
    fig.legend(handles.values(), handles.keys(), loc="upper center", ncol=min(6, len(handles)), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / (3.6 * len(series)) - 0.02))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


# ------------------------------------------------------------- targets
def _best_zmat(rows):
    z = [r for r in rows if _ok(r) and r["impl"].startswith("zmat-")]
    return min(z, key=lambda r: r["median_s"]) if z else None


def _get(rows, name):
    return next((r for r in rows if r["impl"] == name and _ok(r)), None)


def targets(records: list[dict]) -> list[str]:
    """The README's performance claims, checked on the records that bear on them."""
    out = []
    idx = {k: rows for k, rows in groups(records)}
    for key, rows in idx.items():
        case, size, batch, dtype, device, mode = key
        z = _best_zmat(rows)
        if z is None:
            continue
        zs = f"{z['impl']} {fmt_s(z['median_s'])}"
        if case == "protein" and 800 <= size <= 1300 and mode == "fwd":
            for peer in ("mp_nerf", "mp_nerf-fold"):
                p = _get(rows, peer)
                if p:
                    ratio = p["median_s"] / z["median_s"]
                    verdict = "met" if ratio >= 10 else "NOT met"
                    out.append(
                        f"[{verdict}] protein {size} res x{batch} {dtype} {device} fwd: {zs} is "
                        f"{ratio:.1f}x faster than {peer} {fmt_s(p['median_s'])} (target >= 10x)"
                    )
                fb = idx.get((case, size, batch, dtype, device, "fwd+bwd"))
                zb = _best_zmat(fb) if fb else None
                if p and zb:
                    verdict = "met" if zb["median_s"] < p["median_s"] else "NOT met"
                    out.append(
                        f"[{verdict}] protein {size} res x{batch} {dtype} {device}: {zb['impl']} fwd+bwd "
                        f"{fmt_s(zb['median_s'])} vs {peer} fwd alone {fmt_s(p['median_s'])} (target: faster)"
                    )
        if case == "chain" and size == 8000 and batch == 16 and mode == "fwd+bwd":
            s = next((r for r in rows if r["impl"] == "seed-cat"), None)
            if s and _ok(s):
                ratio = s["median_s"] / z["median_s"]
                verdict = "met" if ratio >= 100 else "NOT met"
                out.append(
                    f"[{verdict}] chain 8000 x16 {dtype} {device} fwd+bwd: {zs} is {ratio:.0f}x faster than "
                    f"seed-cat {fmt_s(s['median_s'])}, {fmt_bytes(s.get('peak_bytes'))} (target >= 100x)"
                )
            elif s:
                out.append(f"[not measured] chain 8000 x16 fwd+bwd: seed-cat {s['status']}")
        if batch >= 16:
            c = _get(rows, "chemcoord-kernel")
            if c:
                verdict = "met" if z["median_s"] < c["median_s"] else "NOT met"
                out.append(
                    f"[{verdict}] {case} {size} x{batch} {dtype} {device} {mode}: per structure {z['impl']} "
                    f"{fmt_s(z['median_s'] / batch)} vs chemcoord-kernel {fmt_s(c['median_s'] / batch)}"
                )
    return out
