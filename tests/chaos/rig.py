"""The chaos suite's emulator: the whole pipeline (embedded AWS behind the strict layer, local Kubernetes API,
pollers, schedules, instance watcher, agent) in this process, tuned so a scenario settles in seconds.

Scenarios act only as a user or AWS would (pods through the Kubernetes client, events on the bus, messages on
the queues) and observe the same way; faults come from `tests.chaos.faults` (crashes) and the strict layer
(throttling). The handlers write their logs to a file the invariants read (reasons of releases and of dead
letters).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

from kubernetes import client as k8s

from gpu_autoscaler.config import parse_config
from gpu_autoscaler.domain import drain as drain_domain
from gpu_autoscaler.emulator.session import EmulatorSession
from gpu_autoscaler.models import labels as L
from tests.conftest import example_config_data

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

__all__ = ["INTERRUPTION_VISIBILITY", "NAMESPACE", "SPEED", "ChaosRig", "chaos_config", "gpu_pod", "running_rig"]

NAMESPACE = "chaos"
SPEED = 30.0
"""Rate schedules 30× faster (consolidate every 2 s); nodes join 1.5 s after launch."""
VISIBILITY_TIMEOUT = 10
"""Seconds before a failed message is delivered again (the stack's are minutes). Not less: on a loaded machine an
invocation can take seconds, and a message visible again while still being handled is received again, counting
towards the DLQ's maxReceiveCount as it would in SQS."""
INTERRUPTION_TIMEOUT = 6
"""The interruption function's timeout here (the stack's: 60 s). A notice whose invocation died keeps its
idempotency record in progress until the timeout runs out, so its redelivery must come later: the queue's
visibility is the timeout plus 5 s (`INTERRUPTION_VISIBILITY`), keeping the stack's order (visibility >
timeout; there 6 ×) while the retry comes after 11 s instead of 65 s. The emulator does not stop an invocation at
its timeout (it only counts the context's remaining time down), so a slow one on a loaded machine is not cut."""
INTERRUPTION_VISIBILITY = INTERRUPTION_TIMEOUT + 5
TICK_TIMEOUT = 4
"""The scheduled functions' timeout here: the stack's 120 s at the rig's speed (two of their ticks, as there). A tick
that died holds its function's lease (`services.tick_lease`) until its invocation's end, as on Lambda, so the next
ticks skip until then: 4 s here, not the 2 minutes of the stack's timeout, which the rig's clock does not speed."""
SOAK_VISIBILITY = 120
"""The pending-pods and launch queues' visibility at the soak's sizes: a packer batch of ten documents of 100–200
pods each, or a fleet batch of five launches against a table of hundreds of claims under throttling, takes tens of
seconds there (more on a loaded machine), and a visibility shorter than the invocation hands the same messages out
again while they are handled (each time counting towards the DLQ; the first invocation's deletes then fail with
ReceiptHandleIsInvalid), which the stack's (6 × the function's timeout) never does."""
GC_GRACE = "4s"
"""The garbage collector's grace, shortened with everything else."""
SOAK_GC_GRACE = "30s"
"""The grace at the soak's sizes: a launch request for ten claims is one CreateFleet, then each instance gets its
claim's tag (CreateTags) and each claim its instance, one after the other; at the soak's load that takes tens of
seconds (a claim's launch recorded 122 s after it was created), and an instance not yet tagged with its claim
after 4 s was terminated as a leak (its claim then closed as gone, its pods planned again). The stack's is 5 min."""
REPLACEMENT_POLL = timedelta(seconds=2)
"""How often a drain looks whether its replacement is up: every 20 s in the functions, against EC2 boots of a minute
or two; nodes here join 1.5 s after launch, so a drain waiting for one looks every 2 s."""
UNAVAILABLE_TTL = "15s"
"""How long an offering EC2 had no capacity for is left out: the default 3 minutes scaled as the agent's resync is
(60 s → 5 s), so a pod is reported again as often, relative to the marks, as in a deployment."""


def chaos_config(*, consolidate_after: str = "2s", gc_grace: str = GC_GRACE) -> Any:
    """The user's configuration (cdk.json) without windows or forecasts (nothing warm), disruption, garbage
    collection and the unavailable offerings' memory in seconds."""
    data: dict[str, Any] = example_config_data()
    for pool in data["nodePools"]:
        pool.setdefault("disruption", {}).update(
            consolidateAfter=consolidate_after, minNodeAge="0s", emptyKeepLeadTimes=0, budgets=[{"nodes": "100%"}])
    data["scalingWindows"] = []
    data["predictive"] = {**data.get("predictive", {}), "enabled": False}
    data.setdefault("timeouts", {}).update(garbageCollectionGrace=gc_grace, unavailableOfferingTtl=UNAVAILABLE_TTL)
    return parse_config(data)


def gpu_pod(name: str, *, gpus: int = 1, pool: str = "gpu-burst", cpu: str = "4",
            memory: str = "24Gi", family: str | None = None) -> dict[str, Any]:
    """A plain GPU pod for one pool (it selects the pool and tolerates its taint), and one instance family if
    `family` is given (a workload that needs that GPU)."""
    taint_key = "gpu-autoscaler/shared" if pool == "gpu-shared" else "nvidia.com/gpu"
    selector = {L.NODE_POOL: pool, **({L.INSTANCE_FAMILY: family} if family else {})}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": "chaos"}},
        "spec": {
            "nodeSelector": selector,
            "tolerations": [{"key": taint_key, "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
            "containers": [{"name": "main", "image": "busybox", "resources": {
                "requests": {"cpu": cpu, "memory": memory, "nvidia.com/gpu": str(gpus)},
                "limits": {"nvidia.com/gpu": str(gpus)}}}],
        },
    }


class ChaosRig:
    """One running emulator and the handles a scenario needs."""

    def __init__(self, session: EmulatorSession, log_path: Path) -> None:
        self.session = session
        self.log_path = log_path
        self.aws = session.aws
        self.pipeline = session.pipeline
        self.core = k8s.CoreV1Api(session.kube.client())
        self.ec2 = self.aws.clients.client("ec2")
        self.sqs = self.aws.clients.client("sqs")
        self.events = self.aws.clients.client("events")
        self.wanted: dict[str, dict[str, Any]] = {}
        self.earlier_instances: set[str] = set()
        self.earlier_letters: set[str] = set()
        """What earlier scenarios left in EC2's listing and in the dead-letter queues: theirs, not checked again."""
        self._log_offset = 0
        self._records: list[dict[str, Any]] = []

    def begin(self) -> None:
        """A new scenario starts: what is there now belongs to the earlier ones."""
        self.earlier_instances = {i["InstanceId"] for i in self.instances()}
        self.earlier_letters = {d.message_id for d in self.pipeline.dead_letters()}

    # ---- acting ---------------------------------------------------------------------------------------------

    def create_pods(self, pods: list[dict[str, Any]]) -> None:
        """Create the pods and keep them: an evicted one is created again (`replace_evicted`), as its
        Deployment would."""
        for pod in pods:
            self.wanted[pod["metadata"]["name"]] = pod
            # The model the client's types ask for; given the dict, the client validates it into one itself.
            self.core.create_namespaced_pod(NAMESPACE, k8s.V1Pod.model_validate(pod))

    def replace_evicted(self) -> None:
        """The Deployment controller's part: every wanted pod that is gone is created again."""
        present = {p.metadata.name for p in self.pods()}
        for name, pod in self.wanted.items():
            if name not in present:
                with contextlib.suppress(k8s.ApiException):
                    self.core.create_namespaced_pod(NAMESPACE, k8s.V1Pod.model_validate(pod))

    def delete_pods(self) -> None:
        self.wanted.clear()
        self.core.delete_collection_namespaced_pod(NAMESPACE)

    def put_event(self, detail_type: str, instance_id: str, detail: dict[str, Any] | None = None,
                  source: str = "aws.ec2") -> None:
        region = self.aws.config.region
        self.pipeline.put_event(source, detail_type, {"instance-id": instance_id, **(detail or {})},
                                [f"arn:aws:ec2:{region}:123456789012:instance/{instance_id}"])

    # ---- observing ------------------------------------------------------------------------------------------

    def pods(self) -> list[Any]:
        return list(self.core.list_namespaced_pod(NAMESPACE).items)

    def all_bound(self) -> bool:
        pods = self.pods()
        return bool(pods) and all(p.spec.node_name for p in pods)

    def instances(self, *states: str) -> list[dict[str, Any]]:
        """EC2's listing, in these states only if any are given (filtered by EC2: the listing keeps every
        terminated instance of the session, and the waits poll it several times a second)."""
        filters = [{"Name": "instance-state-name", "Values": list(states)}] if states else []
        found: list[dict[str, Any]] = []
        for page in self.ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for reservation in page["Reservations"]:
                found += [i for i in reservation["Instances"] if not states or i["State"]["Name"] in states]
        return found

    def settled(self) -> bool:
        """No work queued or in hand, and no pod waiting for capacity being planned (bound or released)."""
        return self.pipeline.idle()

    def wait(self, condition: Callable[[], bool], timeout: float, what: str) -> float:
        """Seconds until `condition` held; fails the scenario naming `what` after `timeout`."""
        began = time.monotonic()

        def holds() -> bool:
            self.replace_evicted()
            return condition()

        if not self.pipeline.wait_until(holds, timeout, interval=0.25):
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{self.describe()}")
        return time.monotonic() - began

    @contextlib.contextmanager
    def soak_visibility(self, seconds: int = SOAK_VISIBILITY) -> Iterator[None]:
        """The pending-pods and launch queues' visibility for one scenario at the soak's sizes (see
        `SOAK_VISIBILITY`), then the rig's own again: the other scenarios count on a redelivery within seconds (a
        crashed invocation's message, a held writer's launch), and 120 s would outlast their waits. Messages
        already received keep the visibility they were received with, as in SQS."""
        queues = [self.aws.queue_url(name) for name in ("pending-pods", "launch")]
        before = [self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])["Attributes"]
                  ["VisibilityTimeout"] for url in queues]
        for url in queues:
            self.sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": str(seconds)})
        try:
            yield
        finally:
            for url, value in zip(queues, before, strict=True):
                self.sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": value})

    def describe(self) -> str:
        """What is there, for a failure message: instances, claims, pods."""
        from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore

        store = DynamoStateStore(self.aws.clients.client("dynamodb"), self.aws.table_name, self.aws.config.cluster_name)
        lines = [f"instance {i['InstanceId']} {i['State']['Name']} "
                 f"{ {t['Key']: t['Value'] for t in i.get('Tags', [])}.get(L.TAG_CLAIM)}" for i in self.instances()]
        lines += [f"claim {c.id} {c.state.value} {c.instance_id} attrs={sorted(c.attributes)} pods={len(c.pods)} "
                  f"reason={c.reason!r}" for c in store.list_claims()]
        lines += [f"pod {p.metadata.name} node={p.spec.node_name} phase={p.status.phase}" for p in self.pods()]
        lines.append(f"queues {self.pipeline.queue_depths()}")
        return "\n".join(lines)

    def log_records(self) -> list[dict[str, Any]]:
        """The handlers' JSON log lines (Powertools), parsed; other lines skipped. Only the lines written since
        the last call are read and parsed (the file grows over the whole suite, and the waits ask often)."""
        with self.log_path.open("rb") as stream:
            stream.seek(self._log_offset)
            fresh = stream.read()
        complete = fresh[:fresh.rfind(b"\n") + 1]  # a line still being written is read next time
        self._log_offset += len(complete)
        for line in complete.decode("utf-8", errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(json.JSONDecodeError):
                    self._records.append(json.loads(line))
        return list(self._records)


@contextlib.contextmanager
def running_rig(config: Any | None = None, *, agent_resync_seconds: float = 5.0,
                soak_visibility: int | None = None) -> Iterator[ChaosRig]:
    """An emulator session for one scenario, its namespace created; `soak_visibility`: the pending-pods and launch
    queues' visibility when not `VISIBILITY_TIMEOUT` (`SOAK_VISIBILITY` for the soak's sizes)."""
    config = config or chaos_config(gc_grace=GC_GRACE if soak_visibility is None else SOAK_GC_GRACE)
    with tempfile.TemporaryDirectory(prefix="chaos-") as directory:
        log_path = Path(directory) / "functions.log"
        with mock.patch.object(drain_domain, "REPLACEMENT_POLL", REPLACEMENT_POLL), \
                log_path.open("w", buffering=1) as stream, EmulatorSession(
            config, speed=SPEED, visibility_timeout=VISIBILITY_TIMEOUT, state_dir=Path(directory),
            log_stream=stream, agent_resync_seconds=agent_resync_seconds, poll_wait_seconds=1,
            function_timeouts={"interruption": INTERRUPTION_TIMEOUT, "consolidate": TICK_TIMEOUT,
                               "prewarm": TICK_TIMEOUT},
        ) as session:
            rig = ChaosRig(session, log_path)
            # A dead invocation's idempotency record stays in progress until its timeout: the notice's redelivery
            # must come later, as the stack's visibility (6 × the timeout) does, or it is dead-lettered early.
            rig.sqs.set_queue_attributes(QueueUrl=rig.aws.queue_url("interruption"), Attributes={
                "VisibilityTimeout": str(INTERRUPTION_VISIBILITY)})
            for queue in ("pending-pods", "launch") if soak_visibility is not None else ():
                rig.sqs.set_queue_attributes(QueueUrl=rig.aws.queue_url(queue), Attributes={
                    "VisibilityTimeout": str(soak_visibility)})
            rig.core.create_namespace(k8s.V1Namespace.model_validate({"metadata": {"name": NAMESPACE}}))
            yield rig


def now() -> datetime:
    return datetime.now(UTC)
