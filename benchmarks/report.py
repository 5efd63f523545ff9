"""The run's JSON (tables, measures, ratios) and the chart drawn from that JSON.

``speed ratio`` is how ours compares with an anchor of its backend on one
metric in one mode, oriented so that **≥ 1.0 means ours is at or ahead**:
anchor / ours for times, bytes and requests, ours / anchor for rates.

    python -m benchmarks.report results.json    # print the summary, redraw results.png from a saved run
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .harness import Measure, Table

#: Where ``python -m benchmarks.run`` saves its runs by default.
RESULTS = Path(__file__).resolve().parent / "results"

__all__ = ["CHART_METRICS", "chart", "speed_ratios", "summary", "write_json"]


def speed_ratios(measures: Iterable[Measure]) -> list[dict[str, Any]]:
    """Ours against every anchor of the same family, per (workload, metric, mode)."""
    measures = list(measures)
    anchors: dict[tuple[str, str, str, str], list[Measure]] = {}
    for m in measures:
        if not m.ours and not m.saver.startswith("floor:"):
            anchors.setdefault((m.workload, m.metric, m.family, m.mode), []).append(m)
    out = []
    for m in measures:
        if not m.ours:
            continue
        for a in anchors.get((m.workload, m.metric, m.family, m.mode), []):
            if m.value > 0 and a.value > 0:
                r = m.value / a.value if m.higher_is_better else a.value / m.value
                out.append({"workload": m.workload, "metric": m.metric, "family": m.family, "mode": m.mode,
                            "ours": m.label, "anchor": a.saver, "anchor_label": a.label, "speed_ratio": r})
    return out


def write_json(path: Path, meta: dict[str, Any], tables: Sequence[Table]) -> dict[str, Any]:
    measures = [m for t in tables for m in t.measures]
    data = {
        "meta": meta,
        "tables": [{"title": t.title, "headers": t.headers, "rows": t.rows, "notes": t.notes} for t in tables],
        "measures": [asdict(m) for m in measures],
        "ratios": speed_ratios(measures),
    }
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False), encoding="utf-8")
    return data


def _metric_order(history: int, whole: int, conc: str) -> list[str]:
    big = f" @{history:,}"
    return ["put", "put_writes", "get_tuple @10", "get_tuple(id) @10", "list(10) @10",
            f"list(thread) @{whole:,}", "get_tuple" + big, "list(10)" + big,
            "graph steps/s", "bytes/put (3 x 1 KB)", conc]


#: What the chart shows when the JSON's sizes are the full ones (the metric names carry the sizes).
CHART_METRICS = _metric_order(5_000, 100, "puts/s (20x100 concurrent)")


def chart_metrics(data: dict[str, Any]) -> list[str]:
    sizes = data.get("meta", {}).get("sizes", {})
    if not sizes:
        return CHART_METRICS
    conc = f"puts/s ({sizes['conc_threads']}x{sizes['conc_puts']} concurrent)"
    return _metric_order(sizes["history"], sizes["whole"], conc)


def chart(data: dict[str, Any], png: Path) -> Path:
    """Bars of speed ratio per metric, one group per (backend, anchor), sync and async panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = chart_metrics(data)
    ratios = [r for r in data["ratios"] if r["metric"] in metrics]
    groups = sorted({(r["family"], r["anchor"]) for r in ratios},
                    key=lambda g: (["memory", "sqlite", "redis", "s3", "postgres"].index(g[0])
                                   if g[0] in ("memory", "sqlite", "redis", "s3", "postgres") else 9, g[1]))
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 1.9 * len(groups) + 3), 9), sharey=True)
    colors = plt.get_cmap("tab20")
    width = 0.8 / len(metrics)
    for ax, mode in zip(axes, ("sync", "async"), strict=True):
        for i, metric in enumerate(metrics):
            xs, ys = [], []
            for g, (family, anchor) in enumerate(groups):
                hit = next((r["speed_ratio"] for r in ratios if (r["family"], r["anchor"], r["metric"])
                            == (family, anchor, metric) and r["mode"] == mode), None)
                if hit is not None:
                    xs.append(g - 0.4 + (i + 0.5) * width)
                    ys.append(hit)
            ax.bar(xs, ys, width, color=colors(i % 20), label=metric)
        ax.axhline(1.0, color="black", linewidth=1)
        ax.set_yscale("log")
        ax.set_title(f"{mode}: speed ratio of ours vs the anchor (≥ 1 = ours at or ahead; bytes: smaller is ahead)",
                     fontsize=10)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([f"{family}\nvs {_anchor_label(ratios, family, anchor, mode)}"
                            for family, anchor in groups], fontsize=8)
        ax.grid(axis="y", which="both", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, ncol=6, loc="lower center", frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def summary(data: dict[str, Any]) -> str:
    """A markdown table of the chart's numbers: speed ratio of ours vs each backend's reference anchor."""
    from .savers import FAMILIES, REFERENCE

    metrics = chart_metrics(data)
    ratios = [r for r in data["ratios"] if r["anchor"] == REFERENCE.get(r["family"])]
    columns = [(f, m) for f in FAMILIES for m in ("sync", "async")
               if any((r["family"], r["mode"]) == (f, m) for r in ratios)]
    lines = ["### Summary: speed ratio of ours vs the reference anchor (≥1.00x = ours at or ahead)", "",
             "| metric | " + " | ".join(f"{f} {m}" for f, m in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for metric in metrics:
        cells = []
        for family, mode in columns:
            hit = next((r["speed_ratio"] for r in ratios
                        if (r["family"], r["mode"], r["metric"]) == (family, mode, metric)), None)
            cells.append("" if hit is None else f"{hit:.2f}x")
        lines.append(f"| {metric} | " + " | ".join(cells) + " |")
    anchors = ", ".join(f"{f}: {REFERENCE[f]}" for f, _ in dict.fromkeys((f, 0) for f, _ in columns))
    return "\n".join([*lines, "", f"- anchors: {anchors}; bytes/put: anchor bytes / ours."]) + "\n"


def _anchor_label(ratios: list[dict[str, Any]], family: str, anchor: str, mode: str) -> str:
    labels = [r["anchor_label"] for r in ratios if (r["family"], r["anchor"]) == (family, anchor)]
    exact = [r["anchor_label"] for r in ratios if (r["family"], r["anchor"], r["mode"]) == (family, anchor, mode)]
    return (exact or labels or [anchor])[0]


def main(argv: list[str]) -> int:
    """``python -m benchmarks.report [RUN.json ...]``: print each run's summary and redraw its chart."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.report",
        description="Print the summary table of saved benchmark runs and redraw each run's chart "
                    "(the PNG beside the JSON, same name).")
    parser.add_argument("runs", nargs="*", type=Path, metavar="RUN.json",
                        help="JSON files written by `python -m benchmarks.run --json` "
                             "(default: benchmarks/results/full.json, else quick.json)")
    args = parser.parse_args(argv)
    runs: list[Path] = args.runs or [p for p in (RESULTS / "full.json", RESULTS / "quick.json") if p.exists()][:1]
    if not runs:
        parser.error(f"no run given and none saved in {RESULTS}: run `python -m benchmarks.run` first")
    for path in runs:
        if not path.is_file():
            parser.error(f"{path}: no such file (give the JSON of a run, e.g. {RESULTS / 'run-1bd9205.json'})")
        data = json.loads(path.read_text(encoding="utf-8"))
        print(summary(data))
        print(chart(data, path.with_suffix(".png")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
