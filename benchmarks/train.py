"""``python -m benchmarks --suite train``: a FoldingDiff-style model trained with and without zmat's losses.

Two trainings of ``examples/torsion_diffusion.py``'s model, identical but for the loss (the
same initial weights, seeds, batches, noise and steps; the steps interleaved, so that both
see the same machine load and their times compare): FoldingDiff's own loss, and the same with
the clash term (``zmat.clash_loss`` and the peptide-bond terms of ``structural_violations`` on
the decoded predicted ``x0``, as a clash-guided noise target at low noise, on the batch and on
sampler chains: ``examples/torsion_diffusion.py``'s ``losses``). Each model is sampled from the
same noise plainly and with clash guidance at each ``--guidance`` scale (the ``clash_loss``
gradient of the decoded predicted ``x0`` on the DDPM mean in the last steps). Samples are
compared with held-out windows (``--validate``: with the training windows, other noise):
clashes (AlphaFold's definition), violations, Ramachandran, radius of gyration, CA(i)-CA(i+2)
distances; and the time per training step. ``--seed 0 1 2``: mean ± sd over training seeds.

    python -m benchmarks --suite train            # quick (a few minutes on 2 cores)
    python -m benchmarks --suite train --full     # longer windows, bigger model, more steps
    python -m benchmarks --suite train --size tiny --out /tmp/t   # seconds (the test)

Writes ``results.json``, ``table.md``, ``ramachandran.png`` and ``clashes.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import wasserstein_distance

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "results" / "train"

#: window length, window stride, model width / depth, training steps, batch, diffusion steps T,
#: number of samples, clash weight, sampler chains the clash term sees, the term ("states": the
#: clash of the chains' predicted x0; "target": the clash-guided noise target), clash guidance
#: scales at sampling time (examples' ``sample``)
SIZES = {
    "tiny": dict(
        length=12, stride=8, width=32, depth=1, steps=20, batch=16, T=10, samples=16, weight=0.03, chains=8,
        term="states", guidance=(1.0,),
    ),
    "quick": dict(
        length=24, stride=4, width=64, depth=3, steps=600, batch=32, T=100, samples=256, weight=0.03,
        chains=16, term="states", guidance=(3.0,),
    ),
    "full": dict(
        length=48, stride=2, width=128, depth=4, steps=4000, batch=64, T=400, samples=1024, weight=0.03,
        chains=32, term="states", guidance=(3.0,),
    ),
}  # fmt: skip
#: the other terms' own settings: "target" (last session's choice on validation: weight 3, 8
#: chains); "unroll" (the states term through ``unroll`` sampler steps, every ``every`` steps:
#: every 6 keeps it near 21% of a step); "distill" (the rule's choice on validation: FoldingDiff's
#: loss on ``pairs`` states per step of the last ``keep`` clash-guided (scale ``guided``) sampler
#: chains at ``t < low T``, against the noise that leads each to its chain's guided sample)
TERM_SIZES = {
    "target": dict(weight=3.0, chains=8),
    "unroll": dict(unroll=4, every=6),
    "distill": dict(weight=0.125, low=0.5, guided=3.0, pairs=4, keep=16),
}
MODELS = {"own": "own loss", "own+clash": "own + clash"}
RAMA_BINS = 18  # 20-degree bins: a few thousand angles fill them (36 x 36 would be mostly sampling noise)


def example():
    """The example module (one copy of the model, loss and decoder for users and this benchmark)."""
    path = ROOT / "examples" / "torsion_diffusion.py"
    spec = importlib.util.spec_from_file_location("torsion_diffusion", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, mod)
    spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------------ metrics
def js_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen-Shannon divergence (base 2: in [0, 1]) of two histograms (normalised here)."""
    p = np.asarray(p, np.float64).ravel()
    q = np.asarray(q, np.float64).ravel()
    if p.shape != q.shape or p.sum() <= 0 or q.sum() <= 0:
        raise ValueError(
            f"js_divergence: histograms of shapes {p.shape}, {q.shape} with positive mass needed"
        )
    p, q = p / p.sum(), q / q.sum()
    m = (p + q) / 2
    kl = lambda a: float(np.sum(a[a > 0] * np.log2(a[a > 0] / m[a > 0])))  # noqa: E731
    return 0.5 * kl(p) + 0.5 * kl(q)


def ramachandran(angles, bins: int = RAMA_BINS) -> np.ndarray:
    """``(bins, bins)`` histogram of (phi, psi) of ``(n, L, 6)`` angles (radians, FoldingDiff order),
    over residues 1..L-2, where both are defined inside a window."""
    a = np.asarray(angles)
    edges = np.linspace(-math.pi, math.pi, bins + 1)
    return np.histogram2d(a[:, 1:-1, 0].ravel(), a[:, 1:-1, 1].ravel(), [edges, edges])[0]


def radius_of_gyration(ca: torch.Tensor) -> torch.Tensor:
    """``(..., L, 3)`` -> ``(...)`` CA radius of gyration."""
    return (ca - ca.mean(-2, keepdim=True)).square().sum(-1).mean(-1).sqrt()


def ca_i_i2(ca: torch.Tensor) -> torch.Tensor:
    """``(..., L, 3)`` -> ``(..., L - 2)`` CA(i)-CA(i+2) distances."""
    return (ca[..., 2:, :] - ca[..., :-2, :]).norm(dim=-1)


def hist_js(a: np.ndarray, b: np.ndarray, bins: int = 40) -> float:
    """JS divergence of two samples' histograms on the bins of their common range."""
    edges = np.linspace(min(a.min(), b.min()), max(a.max(), b.max()) + 1e-9, bins + 1)
    return js_divergence(np.histogram(a, edges)[0], np.histogram(b, edges)[0])


def structure_metrics(ex, bb, x: torch.Tensor) -> dict:
    """Per-set arrays of ``(n, L, 6)`` normalised angles: clashes, violations, geometry."""
    with torch.no_grad():
        xyz = bb.xyz(x)
        clash = bb.clash(xyz)
        v = bb.violations(xyz)
        ca = xyz.unflatten(-2, (bb.L, 4))[..., 1, :]
    return {
        "angles": ex.wrap(x + bb.mean).numpy(),
        "clash": clash.numpy(),
        "bond_violation": v["violations_between_residue_bond"].numpy(),
        "within_violation": v["violations_within_residue"].numpy(),
        "rg": radius_of_gyration(ca).numpy(),
        "ca_i_i2": ca_i_i2(ca).reshape(-1).numpy(),
    }


def compare(m: dict, ref: dict) -> dict:
    """The table's numbers for one set ``m`` against the held-out set ``ref``."""
    return {
        "clashing_fraction": float((m["clash"] > 0).mean()),
        "clash_per_sample": float(m["clash"].mean()),
        "bond_violation_residues": float(m["bond_violation"].mean()),
        "within_violation_residues": float(m["within_violation"].mean()),
        "rama_js": js_divergence(ramachandran(m["angles"]), ramachandran(ref["angles"])),
        "rg_mean": float(m["rg"].mean()),
        "rg_js": hist_js(m["rg"], ref["rg"]),
        "rg_w1": float(wasserstein_distance(m["rg"], ref["rg"])),
        "ca_i_i2_js": hist_js(m["ca_i_i2"], ref["ca_i_i2"]),
        "ca_i_i2_w1": float(wasserstein_distance(m["ca_i_i2"], ref["ca_i_i2"])),
    }


# ------------------------------------------------------------------ the two trainings
def columns(cfg: dict) -> list[tuple[str, str]]:
    """The table's sets: (key, header): the training windows, both models, each model guided at each scale."""
    cols = [("train", "train windows"), *MODELS.items()]
    for g in cfg["guidance"]:
        cols += [(f"{m}+guidance {g:g}", f"{h} + guidance {g:g}") for m, h in MODELS.items()]
    return cols


def run(
    size: str = "quick", seed: int = 0, weight: float | None = None, log=print, guidance=None,
    validate: bool = False, term: str | None = None, **over,
) -> dict:  # fmt: skip
    """Both trainings, each sampled without and with clash guidance, and their metrics; a dict
    ready for JSON (plus ``_sets`` for the plots and ``_models``, ``_bb``, ``_sched``).

    ``validate``: for choosing hyper-parameters without looking at the held-out windows: the
    samples (drawn from other noise, seed ``1000 + seed``) are compared with the training windows.
    """
    ex, cfg = example(), dict(SIZES[size])
    if term is not None and term != cfg["term"]:
        cfg.update(term=term, **TERM_SIZES.get(term, {}))
    if weight is not None:
        cfg["weight"] = weight
    cfg.update({k: v for k, v in over.items() if v is not None})  # any SIZES key; unroll, every, low, ...
    if guidance is not None:
        cfg["guidance"] = tuple(guidance)
    L = cfg["length"]
    train_w = ex.load_windows(L, cfg["stride"], held_out=False)
    held_w = ex.load_windows(L, cfg["stride"], held_out=True)
    mean = ex.circular_mean(train_w)
    bb, sched = ex.Backbone(L, mean), ex.Schedule(cfg["T"])
    data = ex.wrap(train_w - mean)
    torch.manual_seed(seed)
    models = {"own": ex.Denoiser(L, cfg["width"], cfg["depth"])}
    models["own+clash"] = copy.deepcopy(models["own"])  # the same initial weights
    kw = dict(steps=cfg["steps"], batch=cfg["batch"], seed=seed)
    steps = {
        "own": ex.trainer(models["own"], data, sched, bb, clash_weight=0.0, **kw),
        "own+clash": ex.trainer(
            models["own+clash"],
            data,
            sched,
            bb,
            **kw,
            clash_weight=cfg["weight"],
            chains=cfg["chains"],
            term=cfg["term"],
            **{k: cfg[k] for k in ("unroll", "every", "low", "guided", "pairs", "keep") if k in cfg},
        ),
    }
    times = {k: [] for k in steps}
    t0 = time.perf_counter()
    for k in range(cfg["steps"]):
        for name, step in steps.items():  # interleaved: the same load on both
            ls, sec = step()
            times[name].append(sec)
        if log and (k % max(1, cfg["steps"] // 5) == 0 or k == cfg["steps"] - 1):
            log(f"step {k:5d}  own+clash: eps {float(ls.eps):.4f} extra {float(ls.extra):.4f}  "
                f"({time.perf_counter() - t0:.0f} s)")  # fmt: skip
    # as many training windows as samples: the same finite-sample floor under each JS
    pick = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))[: cfg["samples"]]
    sets = {"held-out": structure_metrics(ex, bb, data if validate else ex.wrap(held_w - mean)),
            "train": structure_metrics(ex, bb, data[pick])}  # fmt: skip
    sample_s = {}
    for name, model in models.items():  # the same noise for all
        for g in (0.0, *cfg["guidance"]):
            key = name + (f"+guidance {g:g}" if g else "")
            gen = torch.Generator().manual_seed(seed + (1000 if validate else 1))
            t1 = time.perf_counter()
            x = ex.sample(model, sched, cfg["samples"], L, gen, bb=bb, guidance=g)
            sample_s[key] = time.perf_counter() - t1
            sets[key] = structure_metrics(ex, bb, x)
    rows = {name: compare(sets[name], sets["held-out"]) for name, _ in columns(cfg)}
    for name, sec in sample_s.items():
        rows[name]["sample_s"] = sec
    # the mean over the steps where the term is on (it runs every other step: a median would miss it)
    on = slice(min(max(5, math.ceil(cfg["steps"] / 3)), cfg["steps"] - 1), None)
    for name in steps:
        rows[name]["ms_per_step"] = 1000 * float(np.mean(times[name][on]))
    n_chains = _data_counts()
    return {
        "size": size, "seed": seed, "validate": validate, "config": cfg, "threads": torch.get_num_threads(),
        "data": {**n_chains, "train_windows": len(train_w), "held_out_windows": len(held_w)},
        "rows": rows, "wall_s": round(time.perf_counter() - t0, 1), "_sets": sets,
        "_models": models, "_bb": bb, "_sched": sched,
    }  # fmt: skip


def aggregate(results: list[dict]) -> dict:
    """Mean and standard deviation over seeds of every row of ``results`` (runs of :func:`run`)."""
    out = {k: v for k, v in results[0].items() if not k.startswith("_")}
    out["seed"] = [r["seed"] for r in results]
    out["per_seed"] = [r["rows"] for r in results]
    rows = {}
    for name, row in results[0]["rows"].items():
        vals = {k: np.array([r["rows"][name][k] for r in results]) for k in row}
        rows[name] = {k: float(v.mean()) for k, v in vals.items()}
        rows[name].update({k + "_sd": float(v.std(ddof=1)) if len(v) > 1 else 0.0 for k, v in vals.items()})
    out["rows"] = rows
    return out


def _data_counts() -> dict:
    d = np.load(example().DATA)
    held = d["held_out"][d["segment_entry"]]
    n = np.diff(d["segment_ptr"])
    return {
        "entries": int(len(d["entries"])),
        "held_out_entries": [str(e) for e in d["entries"][d["held_out"]]],
        "segments": int(len(n)),
        "train_residues": int(n[~held].sum()),
        "held_out_residues": int(n[held].sum()),
    }


# ------------------------------------------------------------------ output
ROWS = [  # key, label, format
    ("clashing_fraction", "samples with a clash (AlphaFold)", "{:.3f}"),
    ("clash_per_sample", "clash per sample (A, sum of overlaps)", "{:.3f}"),
    ("bond_violation_residues", "residues violating peptide bond/angles", "{:.4f}"),
    ("within_violation_residues", "residues violating within-residue bounds", "{:.4f}"),
    ("rama_js", f"Ramachandran JS to held-out ({RAMA_BINS}x{RAMA_BINS})", "{:.4f}"),
    ("rg_mean", "radius of gyration, mean (A)", "{:.2f}"),
    ("rg_js", "radius of gyration JS", "{:.4f}"),
    ("rg_w1", "radius of gyration W1 (A)", "{:.3f}"),
    ("ca_i_i2_js", "CA(i)-CA(i+2) JS", "{:.4f}"),
    ("ca_i_i2_w1", "CA(i)-CA(i+2) W1 (A)", "{:.4f}"),
    ("ms_per_step", "ms per training step", "{:.1f}"),
    ("sample_s", "s to draw the samples (T steps)", "{:.2f}"),
]


def table(res: dict) -> str:
    """Markdown table: one column per set (train windows = the data's own floor) and the ratios
    of each variant to the own loss; ``mean ± sd`` over seeds for an :func:`aggregate`."""
    r, cols = res["rows"], columns(res["config"])
    variants = [c for c, _ in cols[2:]]
    many = isinstance(res["seed"], list) and len(res["seed"]) > 1
    head = [h for _, h in cols] + [f"{h} / own" for _, h in cols[2:]]
    out = ["| metric | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    for key, label, fmt in ROWS:
        cells = [
            (fmt.format(r[s][key]) + (" ± " + fmt.format(r[s][key + "_sd"]) if many else ""))
            if key in r[s] else ""
            for s, _ in cols
        ]  # fmt: skip
        for v in variants:
            a, b = r["own"].get(key), r[v].get(key)
            cells.append(f"{b / a:.2f}" if a and b is not None else ("0 / 0" if a == 0 and b == 0 else ""))
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    a, b = r["own"]["ms_per_step"], r["own+clash"]["ms_per_step"]
    d, c = res["data"], res["config"]
    seeds = ", ".join(str(x) for x in np.atleast_1d(res["seed"]))
    ref = "the training windows (validation)" if res.get("validate") else "the held-out windows"
    out.append("")
    out.append(f"Extra loss: {100 * (b - a) / b:.0f}% of a training step with it (mean over the steps from "
               f"1/3 on; term {c['term']!r}, weight {c['weight']:g}, {c['chains']} sampler chains"
               + (f", {c['unroll']} steps unrolled" if c["term"] == "unroll" else "")
               + (f", {c['pairs']} guided states a step" if c["term"] == "distill" else "")
               + (f", every {c['every']} steps" if "every" in c else "") + "). "
               "Guidance in the last 20% of the steps. Training seed(s) "
               f"{seeds}; samples compared with {ref}; {d['entries']} entries ({len(d['held_out_entries'])} "
               f"held out), {d['train_residues']} + {d['held_out_residues']} residues, {d['train_windows']} "
               f"train / {d['held_out_windows']} held-out windows of {c['length']}; {c['steps']} steps of "
               f"{c['batch']}, T = {c['T']}, {c['samples']} samples per model and seed; {res['threads']} "
               "thread(s).")  # fmt: skip
    return "\n".join(out)


def plots(res: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = res["_sets"]
    names = ["held-out", *[c for c, _ in columns(res["config"])[1:]]]
    fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 4), sharey=True)
    for ax, name in zip(axes, names, strict=True):
        a = sets[name]["angles"]
        ax.hist2d(np.degrees(a[:, 1:-1, 0].reshape(-1)), np.degrees(a[:, 1:-1, 1].reshape(-1)),
                  bins=72, range=[[-180, 180], [-180, 180]], cmap="viridis", cmin=1)  # fmt: skip
        ax.set(title=name if name == "held-out" else f"{name} (JS {res['rows'][name]['rama_js']:.3f})",
               xlabel="phi (deg)")  # fmt: skip
    axes[0].set_ylabel("psi (deg)")
    fig.tight_layout()
    paths = [out / "ramachandran.png"]
    fig.savefig(paths[0], dpi=100)
    fig, ax = plt.subplots(figsize=(6, 4))
    names = names[2:]
    hi = max(float(sets[n]["clash"].max()) for n in names) + 1e-6
    for name in names:
        ax.hist(sets[name]["clash"], bins=np.linspace(0, hi, 30), histtype="step", label=name, density=True)
    ax.set(xlabel="clash per sample (A, AlphaFold's sum of overlaps)", ylabel="density", yscale="log")
    ax.legend()
    fig.tight_layout()
    paths.append(out / "clashes.png")
    fig.savefig(paths[1], dpi=100)
    plt.close("all")
    return paths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks --suite train", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--size", choices=list(SIZES), default="quick")
    p.add_argument("--full", action="store_true", help="same as --size full")
    p.add_argument("--seed", type=int, nargs="+", default=[0], help="training seeds (mean ± sd over several)")
    p.add_argument("--weight", type=float, help="clash weight (default per size and term)")
    p.add_argument("--term", choices=example().TERMS, help="the clash term (default: states)")
    p.add_argument("--chains", type=int, help="sampler chains of the term (default per size and term)")
    p.add_argument("--unroll", type=int, help="'unroll' term: sampler steps differentiated")
    p.add_argument("--every", type=int, help="the term every this many steps")
    p.add_argument("--low", type=float, help="the term sees states at t < low T (default 0.2)")
    p.add_argument("--pairs", type=int, help="'distill' term: guided chain states per step (default 4)")
    p.add_argument("--keep", type=int, help="'distill' term: the last this many guided chains (16)")
    p.add_argument("--guidance", type=float, nargs="+", help="guidance scales at sampling (default per size)")
    p.add_argument("--validate", action="store_true", help="compare with the training windows, other noise")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: a shared machine)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--no-plot", action="store_true")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    runs = [
        run("full" if a.full else a.size, s, a.weight, log=lambda x: print(x, file=sys.stderr),
            guidance=a.guidance, validate=a.validate, term=a.term, chains=a.chains, unroll=a.unroll,
            every=a.every, low=a.low, pairs=a.pairs, keep=a.keep)
        for s in a.seed
    ]  # fmt: skip
    res = aggregate(runs)
    a.out.mkdir(parents=True, exist_ok=True)
    text = table(res)
    (a.out / "table.md").write_text(text + "\n")
    (a.out / "results.json").write_text(json.dumps(res, indent=1))
    print(text)
    if not a.no_plot:  # the first seed's samples
        print("wrote " + ", ".join(str(x) for x in plots({**res, **runs[0], "rows": runs[0]["rows"]}, a.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
