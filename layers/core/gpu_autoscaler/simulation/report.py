"""What a simulation hands back: `report.json` and the table on the terminal."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.simulation.costs import COST_PARTS
from gpu_autoscaler.simulation.metrics import percentile

if TYPE_CHECKING:
    from pathlib import Path

    from rich.console import Console

    from gpu_autoscaler.config import Config
    from gpu_autoscaler.domain.catalog import Catalog
    from gpu_autoscaler.simulation.metrics import RunResult
    from gpu_autoscaler.simulation.settings import SimulationSettings
    from gpu_autoscaler.simulation.trace import Trace

__all__ = ["LOWER_BOUND", "METRICS", "SimulationReport"]

LOWER_BOUND = (
    "each pod's GPU-seconds as it ran (num_gpu × gpu_milli / 1000 × seconds run) at the cheapest USD per "
    "GPU-second of any offering in the configured zones that can hold it (CPU, memory, GPU devices, GPU model, "
    "x86-64); no policy can cost less"
)
METRICS = {
    "cost": "USD: every instance from launch to termination at its offering's price",
    "lowerBound": LOWER_BOUND,
    "gpuAllocation": "GPU-hours the running pods asked for (their trace share) ÷ GPU-hours of instances provisioned",
    "waitP50/P95/P99": "seconds a pod that ran spent pending for capacity, over every time it was (interruptions "
                       "included)",
    "interruptions": "Spot interruption warnings handled",
    "neverRan": "pods the trace ran that never started here, by reason",
    "cancelledWhilePending": "pods the trace itself deleted while pending (they never ran there either) that were "
                             "not started here before that, by reason; not counted as never ran",
    "costBreakdown": {**COST_PARTS, "other": "the cost less the parts above: what accrued outside the ledger"},
    "costByPool": "per node pool, costliest first: its instances' cost, their count, the same parts as "
                  "costBreakdown, and each instance type and capacity type with its cost, count and hours up",
}


@dataclass(frozen=True)
class SimulationReport:
    trace: Trace
    config: Config
    catalog: Catalog
    settings: SimulationSettings
    results: tuple[RunResult, ...]
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "policies": [r.to_json() for r in self.results],
            "trace": self.trace.summary(),
            "gpuMapping": self.trace.mapping(self.catalog),
            "settings": {
                **self.settings.to_json(),
                "configuration": json.loads(self.config.to_json()),
                "cluster": self.config.cluster_name,
                "region": self.config.region,
                "zones": self.config.zones,
                "catalog": {"instanceTypes": len(self.catalog.instance_types()),
                            "offerings": len(self.catalog.all_offerings()),
                            "note": "bundled price snapshots (On-Demand) and Spot Advisor estimates; GPU types "
                                    "whose devices are partitions of a GPU (g6f, gr6f) left out, as trace "
                                    "fractions are shares of a whole GPU"},
                "pods": "x86-64 containers; whole-GPU pods on pools without GPU sharing, fractional ones on the "
                        "first time-slicing pool (⌈milli × replicas / 1000⌉ slices) where there is one",
                "runSeconds": round(self.seconds, 2),
            },
            "metrics": METRICS,
        }

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")

    def print_table(self, console: Console) -> None:
        console.print(self.table())
        console.print(self.cost_table())
        console.print(self.pool_table())

    def cost_table(self) -> Any:
        """Where each policy's dollars go: the bound, then each kind of waste, as shares of its cost."""
        from rich.table import Table

        table = Table(title="where the cost goes (% of each policy's cost)",
                      caption="bound: the pods' own work at the cheapest price that could hold them; the rest is waste "
                              "by kind; report.json has them in USD (costBreakdown) and says what each counts")
        parts = [*COST_PARTS, "other"]
        table.add_column("policy")
        table.add_column("cost", justify="right")
        for part in parts:
            table.add_column(_SHORT.get(part, part), justify="right")
        for r in self.results:
            shares = [r.cost_breakdown.get(part, 0.0) / r.cost if r.cost > 0 else 0.0 for part in parts]
            table.add_row(r.name, f"{r.cost:,.0f}", *(f"{100 * share:.1f}" for share in shares))
        return table

    def pool_table(self) -> Any:
        """Where each policy's dollars go by node pool: the pool's share, its main parts and its costliest type."""
        from rich.table import Table

        table = Table(title="where the cost goes by node pool (% of each pool's cost)",
                      caption="share: % of the policy's cost; rest: boot, warm, overhead, lag and Spot interruption; "
                              "costliest: the instance type and capacity type costing the pool most, its nodes, USD; "
                              "report.json has every part and every instance type of each pool (costByPool)")
        for title in ("policy", "pool", "cost", "share", "nodes", "bound", "frag.", "premium", "rest", "costliest"):
            table.add_column(title, justify="left" if title in ("policy", "pool", "costliest") else "right")
        main = ("lowerBound", "fragmentation", "pricePremium")
        for r in self.results:
            for i, (name, pool) in enumerate(r.cost_by_pool.items()):
                parts = pool.breakdown()
                shares = [parts[p] / pool.cost if pool.cost > 0 else 0.0 for p in main]
                rest = 1.0 - sum(shares) if pool.cost > 0 else 0.0
                (kind, capacity), costliest = max(pool.types.items(), key=lambda kv: (kv[1].cost, kv[0]))
                table.add_row(
                    r.name if i == 0 else "", name, f"{pool.cost:,.0f}",
                    f"{100 * pool.cost / r.cost:.1f}" if r.cost > 0 else "–", f"{pool.nodes:,}",
                    *(f"{100 * share:.1f}" for share in (*shares, rest)),
                    f"{kind} {capacity} ×{costliest.nodes:,}: {costliest.cost:,.0f}",
                    end_section=i == len(r.cost_by_pool) - 1,
                )
        return table

    def table(self) -> Any:
        from rich.table import Table

        first, last = self.trace.span
        table = Table(
            title=f"{self.trace.source.rsplit('/', 1)[-1]}: {len(self.trace.pods)} GPU pods over "
                  f"{(last - first) / 86400:.1f} days, seed {self.settings.seed}",
            caption="cost in USD; ÷ bound: cost over the clairvoyant lower bound; waits in seconds; never ran: pods "
                    "the trace ran (those it deleted while pending are in report.json, cancelledWhilePending)",
        )
        for title in ("policy", "cost", "÷ bound", "GPU alloc", "wait p50", "wait p95", "wait p99",
                      "interruptions", "never ran"):
            table.add_column(title, justify="left" if title == "policy" else "right")
        for r in self.results:
            ratio = r.cost / r.lower_bound if r.lower_bound > 0 else math.inf
            table.add_row(
                r.name, f"{r.cost:,.0f}", f"{ratio:.2f}" if math.isfinite(ratio) else "–",
                f"{100 * r.gpu_allocation:.1f} %", f"{percentile(r.waits, 50):.0f}", f"{percentile(r.waits, 95):.0f}",
                f"{percentile(r.waits, 99):.0f}", str(r.interruptions), str(sum(r.never_ran.values())),
            )
        return table


_SHORT = {"lowerBound": "bound", "booting": "boot", "warmIdle": "warm", "fragmentation": "frag.",
          "nodeOverhead": "overhead", "pricePremium": "premium", "consolidationLag": "lag",
          "spotInterruption": "spot int."}
