"""What a deployment holds right now, read from AWS (or the emulator): claims, instances, queue depths.

`invoke` compares two of these to say what a handler did; `status` shows one. Reads only.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
from gpu_autoscaler.models.labels import TAG_CLAIM, TAG_CLUSTER, TAG_NODE_POOL

if TYPE_CHECKING:
    from gpu_autoscaler.adapters.aws.clients import AwsClients
    from gpu_autoscaler.emulator.resources import StackResources
    from gpu_autoscaler.models.claims import NodeClaim

__all__ = ["AccountSnapshot", "Instance", "read_account", "what_changed"]


@dataclass(frozen=True)
class Instance:
    instance_id: str
    instance_type: str
    zone: str
    state: str
    capacity_type: str
    pool: str
    claim: str
    launched_at: Any = None


@dataclass(frozen=True)
class AccountSnapshot:
    claims: list[NodeClaim] = field(default_factory=list)
    instances: list[Instance] = field(default_factory=list)
    queue_depths: dict[str, int] = field(default_factory=dict)
    """Logical queue name (`launch`, `launch-dlq`, …) → messages visible plus in flight."""


def read_account(clients: AwsClients, resources: StackResources) -> AccountSnapshot:
    store = DynamoStateStore(clients.client("dynamodb"), resources.table_name, resources.cluster)
    return AccountSnapshot(
        claims=store.list_claims(),
        instances=_instances(clients.client("ec2"), resources.cluster),
        queue_depths=_depths(clients.client("sqs"), resources.queue_urls),
    )


def _instances(ec2: Any, cluster: str) -> list[Instance]:
    found = []
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster]}]
    )
    for page in pages:
        for reservation in page["Reservations"]:
            for raw in reservation["Instances"]:
                tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
                found.append(Instance(
                    instance_id=raw["InstanceId"], instance_type=raw["InstanceType"],
                    zone=raw["Placement"]["AvailabilityZone"], state=raw["State"]["Name"],
                    capacity_type="spot" if raw.get("InstanceLifecycle") == "spot" else (
                        "reserved" if raw.get("CapacityReservationId") else "on-demand"),
                    pool=tags.get(TAG_NODE_POOL, ""), claim=tags.get(TAG_CLAIM, ""), launched_at=raw.get("LaunchTime"),
                ))
    return found


def _depths(sqs: Any, urls: dict[str, str]) -> dict[str, int]:
    depths = {}
    for logical, url in sorted(urls.items()):
        attributes = sqs.get_queue_attributes(
            QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        )["Attributes"]
        depths[logical] = sum(int(v) for v in attributes.values())
    return depths


def what_changed(before: AccountSnapshot, after: AccountSnapshot) -> list[str]:
    """One line per kind of change: claims made or moved, instances launched or changed state, messages queued."""
    lines = []
    old_claims = {c.id: c for c in before.claims}
    made = [c for c in after.claims if c.id not in old_claims]
    moved = Counter(f"{old_claims[c.id].state}→{c.state}" for c in after.claims
                    if c.id in old_claims and old_claims[c.id].state != c.state)
    if made:
        lines.append(f"claims created: {len(made)}")
        lines += [f"  {c.id} {c.pool}: {c.capacity_type} {c.instance_types[0] if c.instance_types else '?'}"
                  f"{' (+' + str(len(c.instance_types) - 1) + ' types)' if len(c.instance_types) > 1 else ''}"
                  f" in {','.join(c.zones)}, {c.price_per_hour:.2f} USD/h, {len(c.pods)} pod(s)" for c in made]
    if moved:
        lines.append("claims moved: " + ", ".join(f"{n}× {m}" for m, n in sorted(moved.items())))
    old_instances = {i.instance_id: i for i in before.instances}
    launched = [i for i in after.instances if i.instance_id not in old_instances]
    if launched:
        lines.append(f"instances launched: {len(launched)}")
        lines += [f"  {i.instance_id} {i.instance_type} {i.zone} {i.capacity_type} ({i.pool})" for i in launched]
    changed = [(old_instances[i.instance_id].state, i) for i in after.instances
               if i.instance_id in old_instances and old_instances[i.instance_id].state != i.state]
    if changed:
        lines.append("instances changed: " + ", ".join(f"{i.instance_id} {old}→{i.state}" for old, i in changed))
    queued = {q: after.queue_depths.get(q, 0) - before.queue_depths.get(q, 0) for q in after.queue_depths}
    sent = [f"{q} {n:+d}" for q, n in queued.items() if n]
    if sent:
        lines.append("queue messages: " + ", ".join(sent))
    return lines or ["no change to claims, instances or queues"]
