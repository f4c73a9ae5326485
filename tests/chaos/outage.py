"""Scenario 7: the Kubernetes API goes away during a drain, and the agent's watch breaks and resumes.

Pods sharing one node (time-sliced GPUs), guarded by a PodDisruptionBudget that lets one of them be away at a
time; the node gets a rebalance recommendation, so its replacement boots and a voluntary drain starts evicting.
As soon as the node is cordoned the local API server goes down (`LocalKubernetes.begin_outage`: 503
ServiceUnavailable to every request, or refused connections; the kubelets and the scheduler cannot reach it
either) for `seconds`, then comes back with its watch history compacted, as a restarted API server's is.

What must hold: the drain's calls fail and it retries (the drain message comes back), and completes after the
API returns — never deleting a pod past its budget, never lost to the dead-letter queue; the agent's watch
reconnects and, since the control plane's own controllers kept writing (the Deployment controller recreates
the evicted pod) and the history is compacted, is told 410 Gone for its old resourceVersion and lists again;
every pod bound in the end, and the suite's four invariants. Observed from the API server's store (not through
the API, which is down): the number of guarded pods running, sampled throughout.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kubernetes import client as k8s

from tests import kube_reads
from tests.chaos.invariants import Report
from tests.chaos.rig import NAMESPACE, gpu_pod
from tests.chaos.scenarios import STEP_TIMEOUT, LifecycleResult, _settle

if TYPE_CHECKING:
    from tests.chaos.rig import ChaosRig

__all__ = ["OutageResult", "api_outage_during_drain"]

GUARD_LABEL = "chaos/outage"


@dataclass
class OutageResult:
    report: Report
    pods: int
    outage_seconds: float
    mode: str
    seconds: dict[str, float] = field(default_factory=dict)
    """`drain done`, `pods bound`, `watch back`: seconds after the API came back."""
    min_running: int = 0
    """The fewest guarded pods running at any sample once the drain started (the budget allows pods − 1)."""
    deleted_past_budget: list[str] = field(default_factory=list)
    """Pods the drain deleted rather than evicted (a voluntary drain must not)."""
    relisted: bool = False
    """The agent's watch was told 410 Gone and listed again."""
    drain_retries: int = 0
    """Drain invocations that found the API failing."""
    changed_during: bool = False
    """Something was written while the agent could not watch (then its version is too old once the history is
    compacted, and it must have been told 410 and listed again)."""


class _RunningSampler:
    """Counts the guarded pods bound and running (not terminating) in the API server's store, every 50 ms."""

    def __init__(self, rig: ChaosRig) -> None:
        self._store = rig.session.kube.store
        self._stop = threading.Event()
        self.minimum: int | None = None
        self._thread = threading.Thread(target=self._run, name="chaos-pdb-sampler", daemon=True)

    def _count(self) -> int:
        from gpu_autoscaler.emulator.kube_objects import PODS

        with self._store.lock:
            pods = self._store.objects(PODS)
            return sum(1 for p in pods if (p["metadata"].get("labels") or {}).get(GUARD_LABEL)
                       and p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
                       and (p.get("status") or {}).get("phase") == "Running")

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            count = self._count()
            self.minimum = count if self.minimum is None else min(self.minimum, count)

    def __enter__(self) -> _RunningSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2)


class _DrainWarnings(logging.Handler):
    """Counts the drain's "Kubernetes API failed" warnings for one node (its log, as CloudWatch would show it)."""

    def __init__(self, node_name: str) -> None:
        super().__init__(logging.WARNING)
        self.node_name = node_name
        self.api_failures = 0
        self._logger = logging.getLogger("gpu_autoscaler.services.drain")

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if self.node_name in message and "Kubernetes API failed" in message:
            self.api_failures += 1

    def __enter__(self) -> _DrainWarnings:
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)


def _guarded_pods(prefix: str, count: int) -> list[dict[str, Any]]:
    pods = []
    for i in range(count):
        pod = gpu_pod(f"{prefix}-{i}", pool="gpu-shared", cpu="1", memory="2Gi")
        pod["metadata"]["labels"][GUARD_LABEL] = prefix
        pods.append(pod)
    return pods


def _budget(prefix: str) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": prefix, "namespace": NAMESPACE},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {GUARD_LABEL: prefix}}}}


def _busiest_instance(rig: ChaosRig, prefix: str) -> tuple[str, str]:
    """(instance id, node name) of the node running the most guarded pods."""
    counts: dict[str, int] = {}
    for pod in rig.pods():
        if (pod.metadata.labels or {}).get(GUARD_LABEL) == prefix and pod.spec.node_name:
            counts[pod.spec.node_name] = counts.get(pod.spec.node_name, 0) + 1
    node_name = max(counts, key=lambda n: counts[n])
    return kube_reads.instance_id(rig.core.read_node(node_name)), node_name


def _moved(rig: ChaosRig, prefix: str, count: int, node_name: str) -> bool:
    """Every guarded pod there again (the Deployment's part), bound, and none on the drained node."""
    nodes = [p.spec.node_name for p in rig.pods() if (p.metadata.labels or {}).get(GUARD_LABEL) == prefix
             and not p.metadata.deletion_timestamp]
    return len(nodes) == count and all(n and n != node_name for n in nodes)


def _drain_records(rig: ChaosRig, node_name: str) -> list[dict[str, Any]]:
    return [r for r in rig.log_records() if r.get("node") == node_name or node_name in str(r.get("message", ""))]


def api_outage_during_drain(rig: ChaosRig, *, seconds: float = 15.0, mode: str = "unavailable", pods: int = 3,
                            prefix: str = "outage") -> OutageResult:
    """Scenario 7 (see the module's docstring); `seconds` of outage, the issue's 60 in the soak."""
    kube = rig.session.kube
    agent = rig.session.agent
    assert agent is not None, "the chaos rig runs the agent"
    result = OutageResult(Report(), pods, seconds, mode)
    settled = LifecycleResult(result.report)
    rig.begin()
    policy = k8s.PolicyV1Api(rig.core.api_client)
    policy.create_namespaced_pod_disruption_budget(NAMESPACE, k8s.V1PodDisruptionBudget.model_validate(_budget(prefix)))
    try:
        rig.create_pods(_guarded_pods(prefix, pods))
        rig.wait(rig.all_bound, STEP_TIMEOUT, "the guarded pods to be bound")
        _settle(rig, settled)
        instance_id, node_name = _busiest_instance(rig, prefix)
        with _RunningSampler(rig) as sampler, _DrainWarnings(node_name) as warnings:
            rig.put_event("EC2 Instance Rebalance Recommendation", instance_id)
            rig.wait(lambda: kube_reads.cordoned(rig.core.read_node(node_name)), STEP_TIMEOUT,
                     f"the drain of {node_name} to start (its replacement initialized)")
            expired = agent.metrics.value("watch_restarts_total", reason="expired")
            version = kube.store.version
            kube.begin_outage(mode)
            try:
                _control_plane_side(rig, seconds)
            finally:
                kube.end_outage()
            back = time.monotonic()
            result.changed_during = kube.store.version > version
            seen = agent.metrics.total("pods_seen_total")
            result.seconds = _after_return(rig, back, {
                "watch back": lambda: agent.metrics.total("pods_seen_total") > seen,
                "drain done": lambda: any(i["InstanceId"] == instance_id
                                          for i in rig.instances("shutting-down", "terminated")),
                "pods bound": lambda: _moved(rig, prefix, pods, node_name),
            }, timeout=STEP_TIMEOUT * 2)
        result.drain_retries = warnings.api_failures
        result.min_running = sampler.minimum if sampler.minimum is not None else 0
        result.relisted = agent.metrics.value("watch_restarts_total", reason="expired") > expired
        records = _drain_records(rig, node_name)
        result.deleted_past_budget = sorted({d for r in records for d in r.get("deleted") or ()})
        _settle(rig, settled, timeout=60.0)
    finally:
        with contextlib.suppress(k8s.ApiException):
            policy.delete_namespaced_pod_disruption_budget(prefix, NAMESPACE)
    rig.delete_pods()
    rig.wait(lambda: not rig.instances("pending", "running"), STEP_TIMEOUT, "the capacity to be given back")
    _settle(rig, settled)
    return result


def _control_plane_side(rig: ChaosRig, seconds: float) -> None:
    """While the endpoint clients use is down, the control plane's own controllers keep writing to the store
    (kube-controller-manager reaches its API server directly, not through the cluster's endpoint): the
    Deployment controller's part, recreating the evicted pods, through the API server in-process."""
    from gpu_autoscaler.emulator.kube_objects import PODS, ApiError

    kube = rig.session.kube
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        present = {p["metadata"]["name"] for p in kube.objects("pods")
                   if p["metadata"].get("namespace") == NAMESPACE}
        for name, pod in rig.wanted.items():
            if name not in present:
                with contextlib.suppress(ApiError):
                    kube.api.create(PODS, NAMESPACE, pod)
        time.sleep(min(0.5, max(deadline - time.monotonic(), 0.0)))


def _after_return(rig: ChaosRig, back: float, conditions: dict[str, Any], timeout: float) -> dict[str, float]:
    """Seconds from `back` until each condition first held (checked together every 0.2 s, so one slow step
    does not delay the others' figures); fails naming those that never held within `timeout`."""
    seen: dict[str, float] = {}
    while len(seen) < len(conditions):
        rig.replace_evicted()
        for name, holds in conditions.items():
            if name not in seen and holds():
                seen[name] = time.monotonic() - back
        if time.monotonic() - back > timeout:
            missing = ", ".join(n for n in conditions if n not in seen)
            raise AssertionError(f"{missing}: not within {timeout:.0f} s of the API's return\n{rig.describe()}")
        time.sleep(0.2)
    return {name: seen[name] for name in conditions}
