"""The ports the domain talks to. Adapters implement them for AWS, the emulator and the simulator.

Each is a Protocol over plain models, so the domain never imports boto3 or the Kubernetes client
and a test can hand it an in-memory fake.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from datetime import datetime, timedelta

    from gpu_autoscaler.models.boot import BootSample
    from gpu_autoscaler.models.catalog import InstanceType, Offering
    from gpu_autoscaler.models.claims import ClaimState, NodeClaim
    from gpu_autoscaler.models.cluster import ClusterNode, ClusterPod, EvictionOutcome, VolumeAttachment
    from gpu_autoscaler.models.fleet import FleetRequest, FleetResult, OwnedInstance
    from gpu_autoscaler.models.leases import Lease
    from gpu_autoscaler.models.messages import DrainRequest, LaunchRequest
    from gpu_autoscaler.models.quotas import UsageReading
    from gpu_autoscaler.models.taints import Taint

__all__ = [
    "CatalogSource",
    "ClusterAPI",
    "Compute",
    "DisruptionBudgets",
    "DrainQueue",
    "LaunchQueue",
    "OwnedInstances",
    "QuotaSource",
    "StackStatus",
    "StateStore",
    "TickLeases",
]


class CatalogSource(Protocol):
    """Instance types and offerings with current prices for one region."""

    def instance_types(self) -> Sequence[InstanceType]: ...

    def offerings(self) -> Sequence[Offering]: ...


class ClusterAPI(Protocol):
    """The few Kubernetes operations capacity management needs."""

    def list_nodes(self) -> list[ClusterNode]: ...

    def list_pods(self, node_name: str | None = None, *, volume_zones: bool = True) -> list[ClusterPod]:
        """Every pod not finished (Succeeded, Failed), or every pod bound to `node_name`, finished ones too. Without
        `volume_zones`, pods with claims carry no `volume_zones` (reading them costs two lists): for a caller that
        re-plans no pod, the drain."""
        ...

    def cordon(self, node_name: str, taint: Taint) -> None:
        """`spec.unschedulable`, `taint` and the load-balancer exclusion label (`domain.drain.LOAD_BALANCER_EXCLUSION`,
        unless the node has that label already), idempotently."""
        ...

    def taint(self, node_name: str, taint: Taint) -> None:
        """Add `taint` (once); the node stays schedulable for pods tolerating it."""
        ...

    def untaint(self, node_name: str, taint: Taint, *, unless_cordoned: bool = False) -> bool:
        """Remove `taint` (key and effect) if present, and the load-balancer exclusion label if its value is ours; a
        node already gone is not an error. `unless_cordoned`: not from a node `spec.unschedulable` on the read the
        removal is made against (a drain's, which owns the taint then). False when the taint was left so, else
        True."""
        ...

    def evict(self, pod: ClusterPod) -> EvictionOutcome: ...

    def delete_pod(self, pod: ClusterPod, grace_period_seconds: int | None = None) -> None:
        """Bypasses budgets; `grace_period_seconds` shortens the pod's own."""
        ...

    def volume_attachments(self, node_name: str) -> list[VolumeAttachment]:
        """The node's storage.k8s.io/v1 VolumeAttachments (each gone once its volume is detached)."""
        ...

    def delete_node(self, node_name: str) -> None: ...


class DisruptionBudgets(Protocol):
    """The cluster's PodDisruptionBudgets as they stand: which pods an eviction would be refused for now (429).
    Consolidation leaves their nodes alone rather than start a drain it cannot finish."""

    def blocked(self, pods: Sequence[ClusterPod]) -> set[str]:
        """Uids of those `pods` a PodDisruptionBudget allows no disruption of now."""
        ...


class StateStore(Protocol):
    """NodeClaims, pod assignments, unavailable offerings, demand history and measured boot times (one DynamoDB
    table in AWS)."""

    def create_claim(self, claim: NodeClaim) -> None:
        """Fails with `ClaimExists` if a claim with that id is already stored."""
        ...

    def create_claims(self, claims: Sequence[NodeClaim]) -> set[str]:
        """`create_claim` for many at once (a packed document's new claims: a few writes, not one per claim);
        returns the ids already stored, which are left as they are."""
        ...

    def get_claim(self, claim_id: str) -> NodeClaim | None: ...

    def get_claims(self, claim_ids: Iterable[str]) -> dict[str, NodeClaim]:
        """`get_claim` for many at once (strongly consistent, as each `get_claim` is); claims not stored are left
        out."""
        ...

    def claim_for_instance(self, instance_id: str) -> NodeClaim | None:
        """The claim that launched this instance, if it is ours (interruption events name instances)."""
        ...

    def list_claims(self, states: Iterable[ClaimState] | None = None) -> list[NodeClaim]: ...

    def transition(self, claim: NodeClaim, to: ClaimState, reason: str = "", **changes: object) -> NodeClaim:
        """Conditional on the stored claim still being `claim.state` at `claim.version` (nothing written since
        `claim` was read); raises `StaleClaim` otherwise. Returns the claim as stored, its version bumped."""
        ...

    def update_claim(self, claim: NodeClaim, **changes: object) -> NodeClaim:
        """Change fields of a claim, not its state: conditional like `transition` on `claim.state` and
        `claim.version`, raises `StaleClaim` otherwise (`services.claim_writes` says who retries and who gives up).
        The packer adds pods (and their requests) to claims in flight this way."""
        ...

    def update_claims(self, updates: Sequence[tuple[NodeClaim, Mapping[str, object]]]) -> dict[str, NodeClaim]:
        """`update_claim` for many claims at once, each on its own condition (its `state` and `version`), a few
        writes for a document's claims in flight, not one each; claim id → the claim as stored, for those
        written. A claim left out lost its condition (`StaleClaim` for `update_claim`): read it again or give up
        (`services.claim_writes.write_fresh_many`)."""
        ...

    def assign_pods(self, claim_id: str, pod_uids: Sequence[str], ttl: timedelta) -> list[str]:
        """Assign each pod not already covered by a live claim; returns the uids newly assigned."""
        ...

    def assign_many(self, wanted: Mapping[str, Sequence[str]], ttl: timedelta) -> dict[str, list[str]]:
        """`assign_pods` for several claims at once (claim id → pod uids; a pod named twice goes to the first);
        claim id → the uids newly assigned to it (claims that got none are left out)."""
        ...

    def assignments(self, pod_uids: Sequence[str]) -> dict[str, str]:
        """pod uid → claim id, for the pods covered by a live assignment."""
        ...

    def release_pods(self, pod_uids: Sequence[str]) -> None: ...

    def mark_unavailable(self, offering: tuple[str, str, str], ttl: timedelta, reason: str) -> None: ...

    def unavailable_offerings(self) -> set[tuple[str, str, str]]: ...

    def record_demand(self, pool: str, bucket: datetime, gpus: float, ttl: timedelta) -> None: ...

    def demand_history(self, pool: str, since: datetime) -> list[tuple[datetime, float]]: ...

    def record_boot_time(self, sample: BootSample, ttl: timedelta) -> None:
        """Keep one boot sample until now + `ttl`; one per claim (and launch): the first recorded stays, so a
        repeat (a claim whose `bootSeconds` mark a concurrent write lost) cannot move its times later."""
        ...

    def boot_times(self, pool: str, since: datetime) -> list[BootSample]:
        """The pool's unexpired samples launched at or after `since`, oldest first."""
        ...


class TickLeases(Protocol):
    """Each scheduled function's lease (one DynamoDB item in AWS): what keeps two of its ticks from running at
    once, since the functions reserve no concurrency (`services.tick_lease`)."""

    def take(self, lease: Lease, now: datetime) -> Lease | None:
        """Take `lease` in one conditional write: if no lease of its name is held, or the one held expired before
        `now`. None when taken; else the lease held, left as it is."""
        ...

    def release(self, lease: Lease) -> bool:
        """Remove `lease` if its holder still holds it (one conditional delete); False, nothing removed, when it
        is gone or another holder took it over after it expired."""
        ...


class Compute(Protocol):
    """EC2 capacity: one fleet request per claim (or gang), and termination of instances we own."""

    def create_fleet(self, request: FleetRequest) -> FleetResult: ...

    def terminate(self, instance_ids: Sequence[str], *, unknown_is_gone: bool = False) -> list[str]:
        """Terminate those carrying this cluster's ownership tag; returns the ids terminated, never others.
        `unknown_is_gone`: an id EC2 does not know is an instance long gone, not one too new to be known yet."""
        ...

    def instance_states(self, instance_ids: Sequence[str]) -> dict[str, str]:
        """EC2's state name of each of these instances it still shows (it forgets a terminated one about an hour
        after); an id missing is one EC2 does not know."""
        ...


class OwnedInstances(Protocol):
    """What EC2 lists of this cluster's instances: the garbage collector's view of the cloud."""

    def owned_instances(self) -> list[OwnedInstance]:
        """Every instance tagged `gpu-autoscaler/cluster = <cluster>`, terminated ones included while EC2 shows them."""
        ...


class StackStatus(Protocol):
    """CloudFormation's word on a stack: the deletion hook acts only while the stack itself goes away."""

    def status(self, stack_id: str) -> str:
        """The stack's StackStatus (`DELETE_IN_PROGRESS`, `UPDATE_ROLLBACK_IN_PROGRESS`, …)."""
        ...


class LaunchQueue(Protocol):
    """Where launch requests go: the launch SQS queue in AWS, read by the fleet function."""

    def send(self, request: LaunchRequest) -> None: ...

    def send_many(self, requests: Sequence[LaunchRequest]) -> None:
        """`send` for each, in as few calls as the queue takes (SQS: ten messages a call)."""
        ...


class DrainQueue(Protocol):
    """Where drain requests go: the drain SQS queue in AWS, read by the drain function (which also re-enqueues
    its own progress there, delayed, to continue a drain longer than one invocation)."""

    def send(self, request: DrainRequest, delay: timedelta | None = None) -> None:
        """`delay` up to 15 minutes (SQS DelaySeconds)."""
        ...


class QuotaSource(Protocol):
    """vCPU service quotas by `<group>/<capacity type>` (`g/spot`, `p/on-demand`), as far as they are known, and the
    account's use of them."""

    def vcpu_quotas(self) -> Mapping[str, int]: ...

    def vcpu_usage(self) -> Mapping[str, UsageReading]:
        """The vCPUs the whole account uses per quota key (every instance, this cluster's too), where known."""
        ...
