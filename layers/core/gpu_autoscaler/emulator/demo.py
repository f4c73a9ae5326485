"""The demo's story, told on a running emulator through the Kubernetes API, the event bus and the queues only.

Every step is something a user or AWS does — create pods (the agent reports them), put a Spot warning on
the bus, delete pods — and every result is observed from outside: instances in EC2, Nodes and pods in the
Kubernetes API, invocations of the functions, queues and dead-letter queues. Nothing here calls the domain.

The configuration and the pods are `demo_workload`'s. The emulator plays the Deployment controller for the
inference pods: an evicted replica is created again, so it goes Pending and flows through the pipeline like any
other pod.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpu_autoscaler.emulator.demo_workload import DEPLOYMENTS, NAMESPACE, SPOT_NOTICE, workload
from gpu_autoscaler.lambda_context import DEFAULT_ACCOUNT
from gpu_autoscaler.models import labels as L
from gpu_autoscaler.models.resources import GPU

if TYPE_CHECKING:
    from collections.abc import Callable

    from gpu_autoscaler.domain.catalog import Catalog
    from gpu_autoscaler.emulator.instances import LaunchedInstance
    from gpu_autoscaler.emulator.lambdas import Invocation
    from gpu_autoscaler.emulator.session import EmulatorSession

__all__ = ["DemoResult", "DemoStory", "TimelineEntry"]

# ---- what the story records ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimelineEntry:
    seconds: float
    kind: str
    """`story`, `lambda`, `ec2`, `node`, `pods`, `missing`."""
    text: str

    def as_json(self) -> dict[str, Any]:
        return {"t": round(self.seconds, 2), "kind": self.kind, "text": self.text}


@dataclass(frozen=True)
class Sample:
    seconds: float
    usd_per_hour: float
    instances: int
    nodes: int
    gpus: int
    gpus_allocated: int
    pods_bound: int


@dataclass
class DemoResult:
    timeline: list[TimelineEntry]
    samples: list[Sample]
    summary: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {
            "timeline": [e.as_json() for e in self.timeline],
            "usdPerHour": [{"t": round(s.seconds, 1), "usdPerHour": round(s.usd_per_hour, 2),
                            "instances": s.instances, "nodes": s.nodes, "gpus": s.gpus,
                            "gpusAllocated": s.gpus_allocated, "podsBound": s.pods_bound} for s in self.samples],
            "summary": self.summary,
        }


@dataclass
class _Observed:
    bound: dict[str, float] = field(default_factory=dict)
    """Pod name → when it was first seen bound."""
    ready_nodes: set[str] = field(default_factory=set)
    gpu_nodes: set[str] = field(default_factory=set)
    """Nodes whose device plugin advertised GPUs."""
    replicas: dict[str, int] = field(default_factory=dict)
    """app → replicas the stand-in Deployment controller keeps (emptied when demand ends)."""
    recreated: list[str] = field(default_factory=list)


class DemoStory:
    """Runs the story on a started session; `on_entry` sees each timeline entry as it happens."""

    def __init__(self, session: EmulatorSession, catalog: Catalog, *,
                 on_entry: Callable[[TimelineEntry], None] | None = None, step_timeout: float = 20.0) -> None:
        self.session = session
        self.catalog = catalog
        self.on_entry = on_entry
        self.step_timeout = step_timeout
        self.core = k8s.CoreV1Api(session.kube.client())
        self.ec2 = session.aws.clients.client("ec2")
        self.began = time.monotonic()
        self.timeline: list[TimelineEntry] = []
        self.samples: list[Sample] = []
        self._observed = _Observed()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None
        self._marks: dict[str, float] = {}
        self._spot: dict[str, Any] = {}
        """What became of the Spot warning: instance, cordoned, terminated, seconds."""
        self._events: Counter[str] = Counter()
        """Interruption-queue events put on the bus, by detail-type: the story's warnings and EC2's state changes."""

    # ---- recording ---------------------------------------------------------------------------------------

    def _now(self) -> float:
        return time.monotonic() - self.began

    def record(self, kind: str, text: str) -> None:
        entry = TimelineEntry(self._now(), kind, text)
        with self._lock:
            self.timeline.append(entry)
        if self.on_entry is not None:
            self.on_entry(entry)

    def _on_invocation(self, invocation: Invocation) -> None:
        detail = _describe_response(invocation)
        if not invocation.records and not detail and invocation.error is None:
            return  # a schedule tick that found nothing to do: counted in the summary, not narrated
        counts = f"{invocation.records} record(s), {invocation.failures} failed" if invocation.records else "tick"
        error = f" — ERROR {invocation.error}" if invocation.error else ""
        self.record("lambda", f"λ {invocation.function} ← {invocation.trigger}: {counts}, "
                              f"{invocation.duration_ms:.0f} ms{detail}{error}")

    def _on_instance(self, instance: LaunchedInstance, previous: str | None) -> None:
        if previous is None and instance.state in ("pending", "running"):
            tags = {k.removeprefix("gpu-autoscaler/"): v for k, v in instance.tags.items()
                    if k.startswith("gpu-autoscaler/") and k != L.TAG_CLUSTER}
            self.record("ec2", f"EC2 launched {instance.instance_id} {instance.instance_type} {instance.capacity_type} "
                               f"in {instance.zone} (tags {', '.join(f'{k}={v}' for k, v in sorted(tags.items()))})")
        elif instance.state != previous:
            # The emulated EC2 puts one `EC2 Instance State-change Notification` per state change it observes.
            self._events["EC2 Instance State-change Notification"] += 1
            self.record("ec2", f"EC2 {instance.instance_id} {instance.instance_type}: {previous} → {instance.state}")

    # ---- sampling ----------------------------------------------------------------------------------------

    def _sample_loop(self) -> None:
        while not self._stop.wait(0.25):
            with contextlib.suppress(Exception):  # a sample missed while the emulator stops is of no account
                self.sample()

    def sample(self) -> Sample:
        pods = self.session.kube.objects("pods")
        nodes = self.session.kube.objects("nodes")
        now = self._now()
        newly_bound = []
        with self._lock:
            for pod in pods:
                name = pod["metadata"]["name"]
                if pod.get("spec", {}).get("nodeName") and name not in self._observed.bound:
                    self._observed.bound[name] = now
                    newly_bound.append(name)
        ready = {n["metadata"]["name"]: n for n in nodes if _ready(n)}
        joined = set(ready) - self._observed.ready_nodes
        left = self._observed.ready_nodes - set(ready)
        self._observed.ready_nodes = set(ready)
        for name in sorted(joined):
            node = ready[name]
            labels = node["metadata"].get("labels", {})
            self.record("node", f"node {name} joined Ready: {labels.get(L.INSTANCE_TYPE)} "
                                f"{labels.get(L.CAPACITY_TYPE)}, pool {labels.get(L.NODE_POOL)}")
        for name in sorted(ready):
            advertised = node_gpus(ready[name])
            if advertised and name not in self._observed.gpu_nodes:
                self._observed.gpu_nodes.add(name)
                slots = ", ".join(f"{v} {k}" for k, v in sorted(advertised.items()))
                self.record("node", f"node {name}: the NVIDIA device plugin advertises {slots}")
        for name in sorted(left):
            self.record("node", f"node {name} left the cluster")
        if newly_bound:
            self.record("pods", f"{len(newly_bound)} pod(s) bound: {_names(newly_bound)}")
        self._replace_evicted(pods)
        sample = self._measure(pods, nodes, now)
        with self._lock:
            self.samples.append(sample)
        return sample

    def _measure(self, pods: list[dict[str, Any]], nodes: list[dict[str, Any]], now: float) -> Sample:
        running = [i for i in self.session.pipeline.instances.instances().values() if i.state in ("pending", "running")]
        usd = sum(self.catalog.price((i.instance_type, i.zone, i.capacity_type)) or 0.0 for i in running)
        gpus = sum(int(n.get("status", {}).get("allocatable", {}).get(GPU, "0")) for n in nodes if _ready(n))
        bound = [p for p in pods if p.get("spec", {}).get("nodeName")]
        allocated = sum(_gpu_request(p) for p in bound)
        return Sample(now, usd, len(running), len([n for n in nodes if _ready(n)]), gpus, allocated, len(bound))

    def _replace_evicted(self, pods: list[dict[str, Any]]) -> None:
        """The Deployment controller's part: an evicted replica is created again (and goes Pending)."""
        for app, wanted in list(self._observed.replicas.items()):
            live = [p for p in pods if p["metadata"].get("labels", {}).get("app") == app
                    and not p["metadata"].get("deletionTimestamp")]
            for _ in range(max(0, wanted - len(live))):
                make = DEPLOYMENTS[app][1]
                manifest = make(100 + len(self._observed.recreated))
                with contextlib.suppress(ApiException):
                    self._create_pod(manifest)
                    self._observed.recreated.append(manifest["metadata"]["name"])
                    self.record("pods", f"Deployment {app} recreated an evicted replica: "
                                        f"{manifest['metadata']['name']}")

    def _create_pod(self, manifest: Any) -> None:
        """As kubectl would: the client sends a plain manifest as it is."""
        self.core.create_namespaced_pod(NAMESPACE, manifest)

    # ---- the story ---------------------------------------------------------------------------------------

    def run(self) -> DemoResult:
        pipeline = self.session.pipeline
        pipeline.on_invocation(self._on_invocation)
        pipeline.instances.listeners.append(self._on_instance)
        self._sampler = threading.Thread(target=self._sample_loop, name="demo-sampler", daemon=True)
        self._sampler.start()
        try:
            self._story()
        finally:
            self._stop.set()
            self._sampler.join(timeout=5)
            pipeline.host.listeners.remove(self._on_invocation)
            pipeline.instances.listeners.remove(self._on_instance)
        return DemoResult(list(self.timeline), list(self.samples), self._summary())

    def _story(self) -> None:
        visibility = self.session.aws.clients.client("sqs").get_queue_attributes(
            QueueUrl=self.session.aws.queue_url("launch"), AttributeNames=["VisibilityTimeout"]
        )["Attributes"]["VisibilityTimeout"]
        self.record("story", f"Emulator up: AWS at {self.session.aws.endpoint_url}, Kubernetes API at "
                             f"{self.session.kube.url}; schedules and node boots run ×{self.session.speed:g}, "
                             f"failed messages are retried after {visibility} s")
        missing = self.session.pipeline.missing
        if missing:
            self.record("missing", f"not written yet: {', '.join(missing)} — the steps that need them say so")
        self._burst()
        self._interruption()
        self._window()
        self._demand_ends()

    def _wait(self, condition: Callable[[], bool], timeout: float | None = None) -> bool:
        deadline = time.monotonic() + (timeout if timeout is not None else self.step_timeout)
        while time.monotonic() < deadline:
            if condition():
                return True
            time.sleep(0.25)
        return condition()

    def _burst(self) -> None:
        self.record("story", "1. A burst of pending GPU pods: 4 inference replicas (1 GPU), 6 time-sliced notebooks, "
                             "an 8-pod training gang (kueue pod group train-42, H100, do-not-disrupt)")
        with contextlib.suppress(ApiException):  # already there: an emulator that ran the demo before
            namespace: Any = {"metadata": {"name": NAMESPACE}}  # the client sends plain manifests as they are
            self.core.create_namespace(namespace)
        pods = workload()
        # The next heading goes first: what it announces starts as soon as the first pod exists.
        self.record("story", "2. The agent reports them; the packer decides; CreateFleet launches; nodes join; "
                             "pods bind")
        self._marks["burst"] = self._now()
        for manifest in pods:
            self._create_pod(manifest)
        self._observed.replicas = {app: replicas for app, (replicas, _) in DEPLOYMENTS.items()}
        names = [p["metadata"]["name"] for p in pods]
        placed = self._wait(lambda: all(n in self._observed.bound for n in names), self.step_timeout + 25)
        if placed:
            self._marks["capacity"] = max(self._observed.bound[n] for n in names)
            self.record("story", f"   all {len(names)} pods bound "
                                 f"{self._marks['capacity'] - self._marks['burst']:.1f} s after they were created")
        else:
            waiting = [n for n in names if n not in self._observed.bound]
            self.record("story", f"   {len(waiting)} pod(s) still pending after {self.step_timeout + 25:.0f} s: "
                                 f"{_names(waiting)}")

    def _interruption(self) -> None:
        target = self._spot_instance_with_pods()
        if target is None:
            self.record("story", "3. Spot interruption: no Spot node with pods to interrupt — step skipped")
            return
        instance, node = target
        self._spot.update(instance=instance.instance_id, node=node, cordoned=False, terminated=False)
        self.record("story", f"3. EC2 warns that Spot instance {instance.instance_id} ({instance.instance_type}, "
                             f"node {node}) will be reclaimed in {SPOT_NOTICE.seconds} seconds (two minutes on AWS)")
        action = (datetime.now(UTC) + SPOT_NOTICE).strftime("%Y-%m-%dT%H:%M:%SZ")
        self._events["EC2 Spot Instance Interruption Warning"] += 1
        self.session.pipeline.put_event(
            "aws.ec2", "EC2 Spot Instance Interruption Warning",
            {"instance-id": instance.instance_id, "instance-action": "terminate", "instance-action-time": action},
            [f"arn:aws:ec2:{self.session.config.region}:{DEFAULT_ACCOUNT}:instance/{instance.instance_id}"],
        )
        self._marks["interruption"] = self._now()
        if "interruption" in self.session.pipeline.missing:
            self.record("missing", "   the interruption function is not written yet: the warning waits in its queue")
            return
        cordoned = self._wait(lambda: self._cordoned(node))
        self._spot["cordoned"] = cordoned
        self.record("story", f"   node {node} cordoned" if cordoned else f"   node {node} not cordoned in time")
        if "drain" in self.session.pipeline.missing:
            self.record("missing", "   the drain function is not written yet: nobody evicts the pods")
            return
        terminated = self._wait(lambda: self._instance_state(instance.instance_id) in ("shutting-down", "terminated"),
                                self.step_timeout + 10)
        self._spot["terminated"] = terminated
        if terminated:
            self._spot["seconds"] = round(self._now() - self._marks["interruption"], 2)
            self.record("story", f"   drained and terminated {self._now() - self._marks['interruption']:.1f} s after "
                                 "the warning")
            replaced = self._wait(lambda: all(n in self._observed.bound for n in self._observed.recreated))
            self._spot["replicasRebound"] = len([n for n in self._observed.recreated if n in self._observed.bound])
            if self._observed.recreated:
                self.record("story", f"   {self._spot['replicasRebound']} of {len(self._observed.recreated)} evicted "
                                     f"replica(s) running again" + ("" if replaced else " (the rest still pending)"))
        else:
            self.record("story", f"   {instance.instance_id} still running {self.step_timeout + 10:.0f} s after the "
                                 "warning (the drain is waiting; see the function log)")

    def _window(self) -> None:
        window = self.session.config.scaling_windows[0] if self.session.config.scaling_windows else None
        if window is None:
            self.record("story", "4. No scaling window configured — pre-warm step skipped")
            return
        self.record("story", f"4. Scaling window {window.name} ({window.schedule} {window.timezone}) needs "
                             f"{window.warm.gpus} warm GPUs in {window.node_pool}; the prewarm tick asks ahead")
        if "prewarm" in self.session.pipeline.missing:
            self.record("missing", "   the prewarm function is not written yet")
            return
        warmed = self._wait(lambda: self._launched_by_prewarm() > 0, self.step_timeout + 15)
        self.record("story", f"   prewarm launched {self._launched_by_prewarm()} warm claim(s)" if warmed
                    else "   no warm capacity launched in time")

    def _demand_ends(self) -> None:
        self.record("story", "5. Demand ends: every workload pod is deleted; consolidation gives capacity back")
        self._observed.replicas = {}
        before = self._live_instances()
        self.core.delete_collection_namespaced_pod(NAMESPACE)
        self._marks["demand-ends"] = self._now()
        if "consolidate" in self.session.pipeline.missing:
            self.record("missing", "   the consolidate function is not written yet: the idle capacity stays "
                                   f"({before} instance(s) running)")
            return
        pipeline = self.session.pipeline
        given_back = self._wait(lambda: self._live_instances() <= self._warm_instances() and pipeline.idle(),
                                self.step_timeout)
        after = self._live_instances()
        self.record("story", f"   {before} → {after} instance(s) running ({self._warm_instances()} held warm for the "
                             f"window){'' if given_back else ' — consolidation not finished in time'}")

    # ---- observations ------------------------------------------------------------------------------------

    def _physical_gpus(self) -> dict[str, int]:
        """Peak physical GPUs (the instance types' count) against the GPU slots the nodes advertised: with
        time-slicing, a device plugin advertises each GPU `replicas` times (NVIDIA k8s-device-plugin, "Shared
        Access to GPUs with CUDA Time-Slicing"), so slots exceed GPUs."""
        gpus_by_type = {t.name: t.gpus for t in self.catalog.instance_types()}
        launched = self.session.pipeline.instances.instances().values()
        physical = sum(int(gpus_by_type.get(i.instance_type, 0)) for i in launched)
        return {"launched": physical, "peakSlots": max((s.gpus for s in self.samples), default=0)}

    def _spot_instance_with_pods(self) -> tuple[LaunchedInstance, str] | None:
        by_node: Counter[str] = Counter(
            p["spec"]["nodeName"] for p in self.session.kube.objects("pods") if p.get("spec", {}).get("nodeName")
        )
        nodes = {n["spec"].get("providerID", "").rsplit("/", 1)[-1]: n["metadata"]["name"]
                 for n in self.session.kube.objects("nodes")}
        for instance in self.session.pipeline.instances.instances().values():
            node = nodes.get(instance.instance_id)
            if instance.capacity_type == "spot" and instance.state == "running" and node and by_node[node]:
                return instance, node
        return None

    def _cordoned(self, node: str) -> bool:
        for n in self.session.kube.objects("nodes"):
            if n["metadata"]["name"] == node:
                return bool(n["spec"].get("unschedulable"))
        return True  # already gone

    def _instance_state(self, instance_id: str) -> str | None:
        instance = self.session.pipeline.instances.instances().get(instance_id)
        return instance.state if instance else None

    def _live_instances(self) -> int:
        return sum(1 for i in self.session.pipeline.instances.instances().values() if i.state in ("pending", "running"))

    def _warm_instances(self) -> int:
        """Running instances of the claims prewarm launched (held for the window, not consolidation's to take)."""
        history = self.session.pipeline.host.history
        warm = {c.get("claim") for i in history if i.function == "prewarm" and isinstance(i.response, dict)
                for c in i.response.get("launched", [])}
        return sum(1 for i in self.session.pipeline.instances.instances().values()
                   if i.state in ("pending", "running") and i.tags.get(L.TAG_CLAIM) in warm)

    def _launched_by_prewarm(self) -> int:
        return sum(len(i.response.get("launched", [])) for i in self.session.pipeline.host.history
                   if i.function == "prewarm" and isinstance(i.response, dict))

    # ---- summary -----------------------------------------------------------------------------------------

    def _summary(self) -> dict[str, Any]:
        history = self.session.pipeline.host.history
        by_function: dict[str, dict[str, int]] = {}
        for invocation in history:
            entry = by_function.setdefault(invocation.function, {"invocations": 0, "records": 0, "failures": 0,
                                                                 "errors": 0})
            entry["invocations"] += 1
            entry["records"] += invocation.records
            entry["failures"] += invocation.failures
            entry["errors"] += invocation.error is not None
        interruptions = sum(i.records - i.failures for i in history if i.function == "interruption")
        letters = self.session.pipeline.dead_letters()
        instances = self.session.pipeline.instances.instances()
        peak = max(self.samples, key=lambda s: s.usd_per_hour, default=None)
        last = self.samples[-1] if self.samples else None
        capacity = self._marks.get("capacity")
        return {
            "podsPlaced": len(self._observed.bound),
            "podsCreated": len(workload()) + len(self._observed.recreated),
            "timeToCapacitySeconds": round(capacity - self._marks["burst"], 2) if capacity is not None else None,
            "instancesLaunched": len(instances),
            "instancesRunning": sum(1 for i in instances.values() if i.state in ("pending", "running")),
            "instanceTypes": dict(Counter(f"{i.instance_type} {i.capacity_type}" for i in instances.values())),
            "interruptionsHandled": interruptions,
            "interruptionEvents": dict(sorted(self._events.items())),
            "speed": self.session.speed,
            "spotWarning": dict(self._spot),
            "usdPerHour": {"peak": round(peak.usd_per_hour, 2) if peak else 0.0,
                           "end": round(last.usd_per_hour, 2) if last else 0.0,
                           "samples": _usd_series(self.samples)},
            "gpuAllocation": _allocation(self.samples),
            "physicalGpus": self._physical_gpus(),
            "invocations": by_function,
            "deadLetters": len(letters),
            "deadLetterMessages": [{"queue": d.queue, "body": d.body[:500]} for d in letters],
            "functionsMissing": self.session.pipeline.missing,
            "durationSeconds": round(self._now(), 1),
        }


def _describe_response(invocation: Invocation) -> str:
    """What a scheduled function did, from its response: warm claims, registrations, consolidation decisions."""
    response = invocation.response
    if not isinstance(response, dict):
        return ""
    parts = []
    for key in ("launched", "released"):
        value = response.get(key)
        if isinstance(value, list) and value:
            parts.append(f"{key} {len(value)} warm claim(s)")
    registered = (response.get("reconcile") or {}).get("registered") if isinstance(response.get("reconcile"), dict) \
        else None
    if registered:
        parts.append(f"{len(registered)} claim(s) registered")
    for decision in response.get("decisions") or []:
        if isinstance(decision, dict):
            parts.append(f"{decision.get('reason')} → {decision.get('action')} {', '.join(decision.get('nodes', []))} "
                         f"in {decision.get('pool')} (saves {float(decision.get('savingPerHour', 0)):.2f} USD/h)")
    return f" ({'; '.join(parts)})" if parts else ""


def node_gpus(node: dict[str, Any]) -> dict[str, str]:
    """The GPU resources a node's device plugin advertises (`nvidia.com/gpu`, `nvidia.com/mig-…`)."""
    return {k: v for k, v in (node.get("status", {}).get("allocatable") or {}).items()
            if k.startswith("nvidia.com/") and v not in ("0", "")}


def _ready(node: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in node.get("status", {}).get("conditions", []))


def _gpu_request(pod: dict[str, Any]) -> int:
    total = 0
    for container in pod.get("spec", {}).get("containers", []):
        value = container.get("resources", {}).get("requests", {}).get(GPU)
        if value:
            total += int(value)
    return total


def _names(names: list[str]) -> str:
    shown = ", ".join(sorted(names)[:6])
    return shown + (f" and {len(names) - 6} more" if len(names) > 6 else "")


def _usd_series(samples: list[Sample]) -> list[dict[str, float]]:
    """USD/h each time it changed (the full series is in `usdPerHour` of the JSON output)."""
    series: list[dict[str, float]] = []
    for sample in samples:
        if not series or not math.isclose(series[-1]["usdPerHour"], round(sample.usd_per_hour, 2)):
            series.append({"t": round(sample.seconds, 1), "usdPerHour": round(sample.usd_per_hour, 2)})
    return series


def _allocation(samples: list[Sample]) -> dict[str, Any]:
    with_gpus = [s for s in samples if s.gpus]
    if not with_gpus:
        return {"peakGpus": 0, "peakAllocated": 0, "meanAllocation": 0.0}
    return {
        "peakGpus": max(s.gpus for s in with_gpus),
        "peakAllocated": max(s.gpus_allocated for s in with_gpus),
        "meanAllocation": round(sum(s.gpus_allocated / s.gpus for s in with_gpus) / len(with_gpus), 3),
    }
