"""EC2 as the rest of the world sees it: instances boot into nodes, and state changes become events.

moto launches an instance instantly and tells nobody. In AWS, an instance boots, its kubelet registers a
Node, and EventBridge announces every state change. The watcher plays both parts for the instances that
carry this cluster's ownership tag:

- an instance seen `pending`/`running` for the first time is handed to the node side (`NodeSide.boot`)
  once its boot delay has passed (divided by the emulator's speed): the kubelet's registration;
- an instance seen `terminated` has its node removed (`NodeSide.shutdown`): the cloud controller manager deletes
  the Node of an instance that no longer exists, and cloud-provider-aws says so of a terminated one only
  (`InstanceExistsByProviderID`); a `shutting-down` one keeps its Node meanwhile;
- an instance seen `stopping`/`stopped` has its kubelet stopped (`NodeSide.stop`): its Node stays, NotReady and
  tainted (`node_lifecycle`), and is its own again if the instance starts (`NodeSide.boot`);
- an `EC2 Instance State-change Notification` is put on the default bus for each state change it observes,
  exactly as EventBridge would carry it. The stack's state-change rule routes the ones it matches to the
  interruption queue; the rest match no rule, as in AWS.
"""

from __future__ import annotations

import heapq
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from gpu_autoscaler.models.labels import TAG_CLUSTER

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["BOOT_DELAY_SECONDS", "GONE_STATES", "LIVE_STATES", "STOPPED_STATES", "InstanceWatcher", "LaunchedInstance",
           "NodeSide"]

log = logging.getLogger(__name__)

BOOT_DELAY_SECONDS = 45.0
"""From RunInstances to a Ready node: a GPU AMI with the NVIDIA driver preloaded takes about this long."""
GONE_STATES = ("terminated",)
STOPPED_STATES = ("stopping", "stopped")
LIVE_STATES = ("pending", "running")


@dataclass(frozen=True)
class LaunchedInstance:
    """What a kubelet would know about its machine (instance metadata), from DescribeInstances."""

    instance_id: str
    instance_type: str
    zone: str
    state: str
    capacity_type: str
    """`spot`, `on-demand`, or `reserved` (in a capacity reservation)."""
    tags: dict[str, str]
    private_dns_name: str
    architecture: str
    launched_at: float

    @classmethod
    def from_description(cls, described: dict[str, Any]) -> LaunchedInstance:
        if described.get("InstanceLifecycle") == "spot":
            capacity = "spot"
        elif described.get("CapacityReservationId"):
            capacity = "reserved"
        else:
            capacity = "on-demand"
        launched = described.get("LaunchTime")
        return cls(
            instance_id=described["InstanceId"],
            instance_type=described["InstanceType"],
            zone=described.get("Placement", {}).get("AvailabilityZone", ""),
            state=described.get("State", {}).get("Name", ""),
            capacity_type=capacity,
            tags={t["Key"]: t["Value"] for t in described.get("Tags", [])},
            private_dns_name=described.get("PrivateDnsName", ""),
            architecture=described.get("Architecture", "x86_64"),
            launched_at=launched.timestamp() if launched is not None else time.time(),
        )


class NodeSide(Protocol):
    """The simulated kubelets: a Node registers once a launched instance has booted (or started again); its
    kubelet stops with the machine; the Node goes once the machine is terminated."""

    def boot(self, instance: LaunchedInstance) -> None: ...

    def stop(self, instance: LaunchedInstance) -> None: ...

    def shutdown(self, instance: LaunchedInstance) -> None: ...


@dataclass
class InstanceWatcher:
    ec2: Any
    events: Any
    cluster: str
    region: str
    account: str
    nodes: NodeSide | None
    boot_delay: float = BOOT_DELAY_SECONDS
    """Seconds of real time (already divided by the emulator's speed)."""
    interval: float = 0.25
    listeners: list[Callable[[LaunchedInstance, str | None], None]] = field(default_factory=list)
    """Called with each instance whose state changed, and its previous state (None: first seen)."""
    _states: dict[str, str] = field(default_factory=dict, init=False, repr=False)
    _instances: dict[str, LaunchedInstance] = field(default_factory=dict, init=False, repr=False)
    _boots: list[tuple[float, str]] = field(default_factory=list, init=False, repr=False)
    _booted: set[str] = field(default_factory=set, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.poll_once()
            except (BotoCoreError, ClientError) as error:
                if stop.is_set():
                    return
                log.warning("instance watcher: %s; retrying", error)
            stop.wait(self.interval)

    def instances(self) -> dict[str, LaunchedInstance]:
        with self._lock:
            return dict(self._instances)

    def booted(self) -> set[str]:
        """Instances handed to the node side (their Node registered or registering)."""
        with self._lock:
            return set(self._booted)

    def poll_once(self) -> None:
        for instance in self._describe():
            previous = self._states.get(instance.instance_id)
            if previous == instance.state:
                continue
            with self._lock:
                self._states[instance.instance_id] = instance.state
                self._instances[instance.instance_id] = instance
            self._on_change(instance, previous)
        self._boot_due()

    def _describe(self) -> list[LaunchedInstance]:
        found = []
        paginator = self.ec2.get_paginator("describe_instances")
        for page in paginator.paginate(Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [self.cluster]}]):
            for reservation in page["Reservations"]:
                found += [LaunchedInstance.from_description(i) for i in reservation["Instances"]]
        return found

    def _on_change(self, instance: LaunchedInstance, previous: str | None) -> None:
        if instance.state in LIVE_STATES and previous not in LIVE_STATES:
            with self._lock:
                heapq.heappush(self._boots, (time.monotonic() + self.boot_delay, instance.instance_id))
        if instance.state in STOPPED_STATES and previous not in STOPPED_STATES:
            with self._lock:
                booted = instance.instance_id in self._booted
            if booted and self.nodes is not None:
                self.nodes.stop(instance)
        if instance.state in GONE_STATES and previous not in GONE_STATES:
            with self._lock:
                booted = instance.instance_id in self._booted
                self._booted.discard(instance.instance_id)
            if booted and self.nodes is not None:
                self.nodes.shutdown(instance)
        if previous is not None or instance.state not in LIVE_STATES:
            self._announce(instance)
        for listener in list(self.listeners):
            listener(instance, previous)

    def _boot_due(self) -> None:
        now = time.monotonic()
        while True:
            with self._lock:
                if not self._boots or self._boots[0][0] > now:
                    return
                _, instance_id = heapq.heappop(self._boots)
                instance = self._instances[instance_id]
                if instance.state not in LIVE_STATES:
                    continue  # terminated before it finished booting: no node ever registers
                self._booted.add(instance_id)
            if self.nodes is None:
                continue
            try:
                self.nodes.boot(instance)
            except (BotoCoreError, ClientError):
                # The simulated kubelet reads what it boots from through the EC2 API, which may be throttled; a real
                # instance reads its user data from the metadata service and boots all the same: try again.
                with self._lock:
                    self._booted.discard(instance_id)
                    heapq.heappush(self._boots, (time.monotonic() + self.interval, instance_id))
                raise

    def _announce(self, instance: LaunchedInstance) -> None:
        """EventBridge's state-change notification, put on the default bus for the rules to route."""
        self.events.put_events(Entries=[{
            "Source": "aws.ec2",
            "DetailType": "EC2 Instance State-change Notification",
            "Detail": json.dumps({"instance-id": instance.instance_id, "state": instance.state}),
            "Resources": [f"arn:aws:ec2:{self.region}:{self.account}:instance/{instance.instance_id}"],
        }])
