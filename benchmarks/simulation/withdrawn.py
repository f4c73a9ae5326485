"""Why a policy runs fewer of the trace's pods: what each pod the trace withdrew while it waited here waited for.

    python -m benchmarks.simulation.withdrawn [--trace FILE] [--config FILE] [--limit N | --from-day D --to-day D]
        [--policy ours --policy karpenter-like ...]

The trace deletes 861 of its GPU pods while they are pending (760 within 312 s of arriving, before any new node
could be Ready), so a policy runs such a pod only if room for it is up when it comes. Per policy this replays the
slice (the simulator unchanged; a few of `PolicyRun`'s handlers are wrapped to look, never to decide) and, for
every withdrawn pod that never started, records what the cluster held at the moment of its deletion:

- `tainted room`: a Ready node whose free room holds the pod, kept off by a taint added after it joined
  (consolidation's disruption taint, a cordon);
- `removed <= N min`: a node that would have held the pod (empty: its allocatable) was removed within N minutes
  before the pod arrived or while it waited;
- `own claim booting`: the claim the packer planned for it is launched, not yet Ready;
- `booting`: else, a launched instance, not yet Ready, whose type (empty) would hold it;
- `no room`: none of these.

Then, for pods one policy ran and another did not, how the one that ran it placed it (on a node of which age,
on a node the packer bought with room, on a warm node). Printed; nothing is written.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks import ALIBABA_TRACE
from gpu_autoscaler.config import load_config
from gpu_autoscaler.domain.packing.fit import allocatable, fits
from gpu_autoscaler.domain.user_data import node_labels
from gpu_autoscaler.models import labels as L
from gpu_autoscaler.simulation.cluster import SimNode
from gpu_autoscaler.simulation.engine import PolicyRun
from gpu_autoscaler.simulation.policies import build_policy
from gpu_autoscaler.simulation.run import simulation_catalog
from gpu_autoscaler.simulation.settings import SimulationSettings
from gpu_autoscaler.simulation.trace import read_trace

if TYPE_CHECKING:
    from gpu_autoscaler.simulation.cloud import SimulatedInstance
    from gpu_autoscaler.simulation.cluster import SimPod

__all__ = ["main", "observe"]

_RECENT = (5, 15, 60)
"""Minutes: a node removed this long before (or while) the pod waited counts as `removed <= N min`."""


def _shape(pod: SimPod) -> str:
    t = pod.trace
    gpus = f"{t.gpu_milli / 1000:g}" if t.gpus == 1 and t.gpu_milli < 1000 else f"{t.gpus:g}"
    return f"{gpus} GPU {t.cpu_milli / 1000:g} vCPU"


def _fractional(shape: str) -> bool:
    return float(shape.split()[0]) < 1


def _probe_node(run: PolicyRun, instance: SimulatedInstance) -> SimNode:
    """The node `instance` registers as once Ready, empty (the cluster's join, not added to it)."""
    pool = run.config.pool(instance.pool)
    t = instance.instance_type
    labels, _ = node_labels(pool, instance.capacity_type, instance_type=t, claim_id=instance.claim_id)  # type: ignore[arg-type]
    labels.update({L.INSTANCE_TYPE: t.name, L.ARCH: t.labels[L.ARCH], L.ZONE: instance.zone, L.OS: "linux"})
    room = allocatable(t, pool, run.config.overhead).as_dict()
    return SimNode(name="probe", instance=instance, pool=pool, labels=labels, taints=tuple(pool.taints),
                   allocatable=room, free=dict(room), created_at=run.t, order=0)


def observe(run: PolicyRun) -> dict[str, Any]:
    """Wrap `run`'s handlers to record, per withdrawn pod, what it waited for and where started pods went."""
    removed: list[tuple[float, SimNode]] = []
    waited: dict[str, list[str]] = {}
    placed: dict[str, dict[str, Any]] = {}
    cluster = run.cluster
    original_remove, original_delete, original_bind = cluster.remove, run._delete, run._bind

    def remove(node: SimNode, why: str) -> None:
        if node.name in cluster.nodes:
            removed.append((run.t, node))
        original_remove(node, why)

    def holds_empty(pod: SimPod, node: SimNode) -> bool:
        return fits(pod.requests, node.allocatable) and cluster._allowed(cluster._ids(pod)[0], pod, node)

    def delete(pod: SimPod) -> None:
        if pod.state == "pending" and pod.first_started is None and pod.trace.duration is None:
            found = []
            for node in cluster.nodes.values():
                extra = node.cordoned or len(node.taints) != len(node.pool.taints)
                if extra and fits(pod.requests, node.free) and cluster._allowed(cluster._ids(pod)[0], pod, node):
                    found.append("tainted room")
                    break
            for minutes in _RECENT:
                since = pod.trace.arrival - 60 * minutes
                if any(at >= since and holds_empty(pod, node) for at, node in removed):
                    found.append(f"removed <= {minutes} min")
                    break
            joined = {n.instance.instance_id for n in cluster.nodes.values()}
            booting = [i for i in run.cloud.instances.values() if i.alive and i.instance_id not in joined]
            own = run.store.assignments([pod.uid]).get(pod.uid)
            if any(i.claim_id == own for i in booting):
                found.append("own claim booting")
            elif any(holds_empty(pod, _probe_node(run, i)) for i in booting):
                found.append("booting")
            waited[pod.uid] = found or ["no room"]
        original_delete(pod)

    def bind(bindings: list[tuple[SimPod, SimNode]]) -> None:
        for pod, node in bindings:
            if pod.trace.duration is None and pod.uid not in placed:
                claim = run.store.get_claim(node.claim_id) if node.claim_id else None
                placed[pod.uid] = {
                    "age": run.t - node.created_at, "type": node.instance.instance_type.name,
                    "warm": bool(claim is not None and claim.warm), "pods": len(node.pods),
                    "pool": node.pool.name,
                }
        original_bind(bindings)

    cluster.remove = remove  # type: ignore[method-assign]
    run._delete = delete  # type: ignore[method-assign]
    run._bind = bind  # type: ignore[method-assign]
    return {"waited": waited, "placed": placed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="withdrawn")
    parser.add_argument("--trace", default=str(ALIBABA_TRACE))
    parser.add_argument("--config", default=str(Path(__file__).resolve().parent / "config.json"))
    parser.add_argument("--policy", action="append")
    parser.add_argument("--limit", type=int, default=2500)
    parser.add_argument("--from-day", type=float, default=None)
    parser.add_argument("--to-day", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", help="write what each policy saw to this JSON file (and print nothing more)")
    parser.add_argument("--load", action="append", default=[],
                        help="compare runs saved with --save instead of running (repeatable)")
    args = parser.parse_args(argv)
    logging.getLogger("gpu_autoscaler").setLevel(logging.ERROR)
    seen: dict[str, dict[str, Any]] = {}
    shapes: dict[str, str] = {}
    for saved in args.load:
        data = json.loads(Path(saved).read_text())
        seen.update(data["seen"])
        shapes.update(data["shapes"])
    policies = list(seen) if args.load else args.policy or ["ours", "karpenter-like"]
    for name in [] if args.load else policies:
        config = load_config(args.config)
        trace = read_trace(args.trace)
        if args.from_day is not None or args.to_day is not None:
            trace = trace.between(86400 * (args.from_day or 0.0), 86400 * (args.to_day or 1e9))
        elif args.limit:
            trace = trace.head(args.limit)
        catalog = simulation_catalog(config)
        settings = SimulationSettings(seed=args.seed)
        policy = build_policy(name, config, catalog, trace.pods, settings.fixed_instance_type)
        run = PolicyRun(policy, trace, catalog, settings)
        seen[name] = observe(run)
        result = run.run()
        shapes.update({p.uid: _shape(p) for p in run.pods if p.trace.duration is None})
        waited = seen[name]["waited"]
        causes = Counter(c for found in waited.values() for c in found)
        print(f"{name}: cost {result.cost:,.0f} USD, {len(waited)} withdrawn pods never started, "
              f"{len(seen[name]['placed'])} withdrawn pods started")
        for cause, count in causes.most_common():
            print(f"  {cause:18} {count:5}")
        fractional = sum(_fractional(shapes[u]) for u in waited)
        print(f"  never started: {fractional} fractional-GPU pods, {len(waited) - fractional} whole-GPU pods")
    if args.save:
        Path(args.save).write_text(json.dumps({"seen": seen, "shapes": shapes}))
        return 0
    for name in policies:
        for other in policies:
            if other == name:
                continue
            lost = [u for u in seen[name]["waited"] if u in seen[other]["placed"]]
            if not lost:
                continue
            print(f"\n{len(lost)} withdrawn pods {other} ran and {name} did not")
            print("  what they waited for under " + name + ": " + ", ".join(
                f"{c} {n}" for c, n in Counter(c for u in lost for c in seen[name]["waited"][u]).most_common()))
            common = Counter(shapes[u] for u in lost).most_common(8)
            print("  their shapes: " + ", ".join(f"{s} × {n}" for s, n in common))
            where = [seen[other]["placed"][u] for u in lost]
            print(f"  under {other}: pools " + ", ".join(
                f"{p} {n}" for p, n in Counter(w["pool"] for w in where).most_common()) + "; types " + ", ".join(
                f"{t} {n}" for t, n in Counter(w["type"] for w in where).most_common(6)))
            fractional = sum(_fractional(shapes[u]) for u in lost)
            print(f"  {fractional} fractional-GPU pods, {len(lost) - fractional} whole-GPU pods")
            ages = sorted(w["age"] for w in where)
            print(f"  node age when placed: median {ages[len(ages) // 2] / 60:.0f} min; under 10 min "
                  f"{sum(a < 600 for a in ages)}; on a warm node {sum(w['warm'] for w in where)}; "
                  f"alone on it {sum(w['pods'] == 0 for w in where)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
