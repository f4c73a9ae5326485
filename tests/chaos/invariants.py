"""The four promises every chaos scenario ends on, checked from outside (EC2, DynamoDB, Kubernetes, SQS, logs).

1. Every GPU pod is bound, or was reported unschedulable with a reason (an `unschedulable` list of pod and
   reason in a function's log: the packer's for pods it cannot place, the fleet's for the pods of a claim that
   could not launch).
2. No owned instance without a live claim, and no launched claim without its instance — once the garbage
   collector's grace has passed (the scenario waits for it: `wait_for_invariants`).
3. No pod provisioned twice: no pod is on two live claims at once, and no claim ever had two instances
   (EC2 lists terminated instances for a while: a duplicate launch shows even after the collector ended it).
4. Every dead-letter message carries its reason: a function logged an error or warning naming the message, or
   (a scheduled function's tick that failed, which Lambda does not retry past its age: consolidate's not at all)
   Lambda's invocation record in the scheduler DLQ names the error (`responsePayload.errorType`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
from gpu_autoscaler.models.claims import ClaimState
from gpu_autoscaler.models.labels import TAG_CLAIM, TAG_CLUSTER
from gpu_autoscaler.models.resources import GPU
from tests import kube_reads

if TYPE_CHECKING:
    from collections.abc import Iterable

    from gpu_autoscaler.models.claims import NodeClaim
    from tests.chaos.rig import ChaosRig

__all__ = ["Report", "check_invariants", "released_pods", "wait_for_invariants"]

LIVE_INSTANCE = ("pending", "running")
PROVISIONING = (ClaimState.PENDING, ClaimState.LAUNCHED, ClaimState.REGISTERED)
"""Claims that stand for capacity being bought or held for their pods (a Draining claim's pods are being
moved to its replacement, so they appear on both for a while)."""


@dataclass
class Report:
    violations: list[str] = field(default_factory=list)
    pods: int = 0
    bound: int = 0
    released: int = 0
    instances: int = 0
    claims: int = 0
    dead_letters: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations

    def snapshot(self) -> Report:
        """A copy, to keep one phase's figures while the next phase goes on adding to this report."""
        return dataclasses.replace(self, violations=list(self.violations))

    def __str__(self) -> str:
        figures = (f"{self.bound}/{self.pods} pods bound, {self.released} released with a reason, "
                   f"{self.instances} instances, {self.claims} live claims, {self.dead_letters} dead letters")
        return figures if self.ok else figures + "\n  " + "\n  ".join(self.violations)


def check_invariants(rig: ChaosRig) -> Report:
    report = Report()
    records = rig.log_records()
    _pods(rig, records, report)
    _capacity(rig, report)
    _dead_letters(rig, records, report)
    return report


def wait_for_invariants(rig: ChaosRig, timeout: float) -> Report:
    """Check until all hold or `timeout` passes (work still in flight, the grace not over); the last report."""
    deadline = time.monotonic() + timeout
    while True:
        report = check_invariants(rig)
        if report.ok or time.monotonic() >= deadline:
            return report
        time.sleep(0.5)


def released_pods(records: list[dict[str, Any]]) -> dict[str, str]:
    """Pod uid → the reason a function gave for leaving it unplaced."""
    reasons: dict[str, str] = {}
    for record in records:
        for item in record.get("unschedulable") or ():
            if isinstance(item, dict) and item.get("pod") and item.get("reason"):
                reasons[str(item["pod"])] = str(item["reason"])
    return reasons


def _pods(rig: ChaosRig, records: list[dict[str, Any]], report: Report) -> None:
    released = released_pods(records)
    for pod in rig.pods():
        requests = {} if not pod.spec.containers else (pod.spec.containers[0].resources.requests or {})
        if GPU not in requests or pod.metadata.deletion_timestamp:
            continue
        report.pods += 1
        if pod.spec.node_name:
            report.bound += 1
        elif pod.metadata.uid in released:
            report.released += 1
        else:
            report.violations.append(f"pod {pod.metadata.name} is neither bound nor reported unschedulable")


def _capacity(rig: ChaosRig, report: Report) -> None:
    store = DynamoStateStore(rig.aws.clients.client("dynamodb"), rig.aws.table_name, rig.aws.config.cluster_name)
    claims = store.list_claims()
    live = {c.id: c for c in claims if c.state is not ClaimState.TERMINATED}
    report.claims = len(live)
    owned = [i for i in rig.instances(*LIVE_INSTANCE)
             if {t["Key"]: t["Value"] for t in i.get("Tags", [])}.get(TAG_CLUSTER) == rig.aws.config.cluster_name]
    report.instances = len(owned)
    by_claim: dict[str, list[str]] = defaultdict(list)
    for instance in owned:
        claim_id = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}.get(TAG_CLAIM, "")
        by_claim[claim_id].append(instance["InstanceId"])
        claim = live.get(claim_id)
        if claim is None:
            report.violations.append(f"instance {instance['InstanceId']} ({instance['State']['Name']}) has no live "
                                     f"claim (tag {TAG_CLAIM}={claim_id or '-'})")
        elif claim.instance_id != instance["InstanceId"]:
            report.violations.append(f"instance {instance['InstanceId']} is not the one claim {claim_id} "
                                     f"({claim.state.value}) records ({claim.instance_id})")
    running = {i["InstanceId"] for i in owned}
    for claim in live.values():
        if claim.state in (ClaimState.LAUNCHED, ClaimState.REGISTERED) and claim.instance_id not in running:
            report.violations.append(f"claim {claim.id} ({claim.state.value}) has no running instance "
                                     f"({claim.instance_id})")
    _launched_once(rig, report)
    for uid, ids in _covering(rig, live.values()).items():
        if len(ids) > 1:
            report.violations.append(f"pod {uid} is provisioned twice: claims {', '.join(sorted(ids))}")


def _covering(rig: ChaosRig, claims: Iterable[NodeClaim]) -> dict[str, list[str]]:
    """Pod uid → the live claims that stand for capacity for it.

    A claim in flight stands for every pod it lists: that room is being bought for them. A Registered claim's list
    is what it was bought for, not what runs on it: kube-scheduler binds each pending pod to whichever node has
    room (oldest pods first, to the emptiest node), so the pods two claims launched together were planned for
    often run on the other's node, and nothing rewrites the lists. A Spot warning on one of those nodes then
    plans a replacement for the pods running there, which the other (healthy) claim still lists: one node
    bought per pod all the same, yet read from the lists as "provisioned twice" until that claim ends
    (`test_a_crash_at_each_point_is_redelivered_and_done_exactly_once[0]`, once at load ~6). So a Registered
    claim stands for a listed pod only while the pod exists and is not bound to another node; a pod still
    pending on it, or bound to it, counts (a second claim for it is a second node bought)."""
    pods = {p.metadata.uid: p.spec.node_name for p in rig.pods() if not p.metadata.deletion_timestamp}
    node_of = kube_reads.instance_nodes(rig.core.list_node().items)
    covering: dict[str, list[str]] = defaultdict(list)
    for claim in claims:
        if claim.state not in PROVISIONING:
            continue
        node = claim.node_name or node_of.get(claim.instance_id or "")
        for uid in claim.pods:
            if claim.state is ClaimState.REGISTERED and (uid not in pods or pods[uid] not in (None, node)):
                continue
            covering[uid].append(claim.id)
    return covering


def _launched_once(rig: ChaosRig, report: Report) -> None:
    ever: dict[str, set[str]] = defaultdict(set)
    for instance in rig.instances():
        if instance["InstanceId"] in rig.earlier_instances:
            continue  # another scenario's (EC2 keeps listing terminated instances)
        claim_id = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}.get(TAG_CLAIM)
        if claim_id:
            ever[claim_id].add(instance["InstanceId"])
    for claim_id, ids in ever.items():
        if len(ids) > 1:
            report.violations.append(f"claim {claim_id} was launched {len(ids)} times: {', '.join(sorted(ids))}")


def _dead_letters(rig: ChaosRig, records: list[dict[str, Any]], report: Report) -> None:
    letters = [d for d in rig.pipeline.dead_letters() if d.message_id not in rig.earlier_letters]
    report.dead_letters = len(letters)
    explained = [json.dumps(r) for r in records if r.get("level") in ("ERROR", "WARNING", "CRITICAL")]
    for letter in letters:
        if not any(letter.message_id in line for line in explained) and not _failed_invocation(letter.body):
            report.violations.append(f"dead letter {letter.message_id} in {letter.queue} has no logged reason: "
                                     f"{letter.body[:120]}")


def _failed_invocation(body: str) -> bool:
    """Lambda's on-failure record of an asynchronous invocation, naming the function's error."""
    try:
        record = json.loads(body)
    except ValueError:
        return False
    return isinstance(record, dict) and bool((record.get("responsePayload") or {}).get("errorType")) \
        and "requestContext" in record
