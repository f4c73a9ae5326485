"""The report's pictures (matplotlib, Agg: no display needed): one line per policy in each.

- `gpus.png`: GPUs provisioned (solid) and requested — running, and pending for capacity that can come —
  (dotted) over time: the whole trace, and its busiest day in detail;
- `cost.png`: cumulative cost over time;
- `waits.png`: the distribution of waits for capacity (share of pods that waited at most x seconds);
- `costs.png`: each policy's cost as a stacked bar of its parts (the bound, then each kind of waste).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gpu_autoscaler.simulation.costs import COST_PARTS

if TYPE_CHECKING:
    from pathlib import Path

    from gpu_autoscaler.simulation.report import SimulationReport

__all__ = ["PLOTS", "write_plots"]

PLOTS = ("gpus.png", "cost.png", "waits.png", "costs.png")
_DAY = 86400.0


def write_plots(report: SimulationReport, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    title = report.trace.source.rsplit("/", 1)[-1]
    paths = []

    busiest = _busiest_day(report)
    fig, axes = plt.subplots(2, 1, figsize=(12, 8))
    for ax, span in zip(axes, (None, (busiest, busiest + 1)), strict=True):
        for i, r in enumerate(report.results):
            t = np.asarray(r.timeline.times) / _DAY
            color = colors[i % len(colors)]
            ax.step(t, r.timeline.provisioned, where="post", color=color, linewidth=0.9,
                    label=f"{r.name}: provisioned")
            ax.step(t, r.timeline.requested, where="post", color=color, linewidth=0.7, linestyle=":",
                    label=f"{r.name}: requested")
        ax.set(xlabel="trace day", ylabel="GPUs")
        ax.grid(alpha=0.3)
        if span is not None:
            ax.set_xlim(*span)
            ax.set_title(f"day {busiest:.0f}, the one with the most arrivals", fontsize=10)
    axes[0].set_title(f"{title}: GPUs provisioned vs requested")
    axes[0].legend(fontsize=7, ncol=2, loc="upper left")
    paths.append(_save(fig, out / PLOTS[0]))

    fig, ax = plt.subplots(figsize=(12, 5))
    for i, r in enumerate(report.results):
        t = np.asarray(r.timeline.times) / _DAY
        ax.plot(t, r.timeline.cumulative_cost(), color=colors[i % len(colors)], label=f"{r.name} (${r.cost:,.0f})")
    ax.set(xlabel="trace day", ylabel="USD spent", title=f"{title}: cost over time")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    paths.append(_save(fig, out / PLOTS[1]))

    fig, ax = plt.subplots(figsize=(8, 5))
    for i, r in enumerate(report.results):
        if not r.waits:
            continue
        waits = np.sort(np.maximum(np.asarray(r.waits), 1.0))
        share = np.arange(1, waits.size + 1) / waits.size
        ax.step(waits, share, where="post", color=colors[i % len(colors)], label=r.name)
    ax.set(xscale="log", xlabel="wait for capacity, seconds (below 1 s drawn at 1 s)", ylabel="share of pods",
           title=f"{title}: waits")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3, which="both")
    paths.append(_save(fig, out / PLOTS[2]))

    fig, ax = plt.subplots(figsize=(11, 5))
    names = [r.name for r in report.results]
    bottom = np.zeros(len(names))
    parts = [*COST_PARTS, "other"]
    for i, part in enumerate(parts):
        values = np.asarray([max(0.0, r.cost_breakdown.get(part, 0.0)) for r in report.results])
        if not values.any():
            continue
        ax.bar(names, values, bottom=bottom, color=colors[i % len(colors)], label=part)
        bottom += values
    for x, r in enumerate(report.results):
        ax.annotate(f"${r.cost:,.0f}", (x, bottom[x]), ha="center", va="bottom", fontsize=8)
    ax.set(ylabel="USD", title=f"{title}: where the cost goes")
    ax.set_ylim(0, max(bottom.max(initial=0.0), 1.0) * 1.08)  # room above the tallest bar for its label
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3, axis="y")
    paths.append(_save(fig, out / PLOTS[3]))
    return paths


def _busiest_day(report: SimulationReport) -> float:
    days = np.floor(np.asarray([p.arrival for p in report.trace.pods]) / _DAY)
    if days.size == 0:
        return 0.0
    values, counts = np.unique(days, return_counts=True)
    return float(values[int(counts.argmax())])


def _save(fig: object, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()  # type: ignore[attr-defined]
    fig.savefig(path, dpi=110)  # type: ignore[attr-defined]
    plt.close(fig)  # type: ignore[arg-type]
    return path
