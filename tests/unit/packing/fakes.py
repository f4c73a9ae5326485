"""In-memory stand-ins for the ports the packer service uses: they record calls and can be told to fail."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.errors import ClaimExists, StaleClaim
from gpu_autoscaler.models.claims import ALLOWED_TRANSITIONS, ClaimState, NodeClaim, StateTransition

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from datetime import datetime, timedelta

    from gpu_autoscaler.clock import Clock
    from gpu_autoscaler.models.boot import BootSample
    from gpu_autoscaler.models.messages import LaunchRequest
    from gpu_autoscaler.models.quotas import UsageReading


class Boom(RuntimeError):
    """A failure a test asked for (a crash halfway through)."""


@dataclass
class FakeStateStore:
    """`StateStore` over dicts, with the conditional semantics of the DynamoDB one."""

    clock: Clock
    claims: dict[str, NodeClaim] = field(default_factory=dict)
    pods: dict[str, tuple[str, datetime]] = field(default_factory=dict)
    unavailable: dict[tuple[str, str, str], datetime] = field(default_factory=dict)
    demand: dict[tuple[str, datetime], float] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    fail_next: dict[str, Exception] = field(default_factory=dict)
    refuse_next: set[str] = field(default_factory=set)
    """Claim ids whose next conditional update is refused, as if another writer had got in first."""

    def _call(self, name: str) -> None:
        self.calls.append(name)
        error = self.fail_next.pop(name, None)
        if error is not None:
            raise error

    def create_claim(self, claim: NodeClaim) -> None:
        self._call("create_claim")
        if claim.id in self.claims:
            raise ClaimExists(claim.id)
        self.claims[claim.id] = claim

    def create_claims(self, claims: Sequence[NodeClaim]) -> set[str]:
        existing = set()
        for claim in claims:  # through `create_claim`, so a test's failure or stand-in there applies to each
            try:
                self.create_claim(claim)
            except ClaimExists:
                existing.add(claim.id)
        return existing

    def get_claim(self, claim_id: str) -> NodeClaim | None:
        self._call("get_claim")
        return self.claims.get(claim_id)

    def get_claims(self, claim_ids: Iterable[str]) -> dict[str, NodeClaim]:
        self._call("get_claims")
        return {cid: self.claims[cid] for cid in claim_ids if cid in self.claims}

    def list_claims(self, states: Iterable[ClaimState] | None = None) -> list[NodeClaim]:
        self._call("list_claims")
        wanted = set(states) if states is not None else None
        return [c for c in self.claims.values() if wanted is None or c.state in wanted]

    def transition(self, claim: NodeClaim, to: ClaimState, reason: str = "", **changes: object) -> NodeClaim:
        self._call("transition")
        stored = self.claims.get(claim.id)
        if stored is None or stored.state != claim.state or to not in ALLOWED_TRANSITIONS[stored.state]:
            raise StaleClaim(claim.id)
        now = self.clock.now()
        updated = stored.model_copy(update={
            "state": to, "updated_at": now, "reason": reason or stored.reason,
            "history": (*stored.history, StateTransition(state=to, at=now, reason=reason)), **changes})
        self.claims[claim.id] = updated
        return updated

    def update_claim(self, claim: NodeClaim, **changes: object) -> NodeClaim:
        self._call("update_claim")
        stored = self.claims.get(claim.id)
        if stored is None or stored.state != claim.state:
            raise StaleClaim(claim.id)
        updated = stored.model_copy(update={"updated_at": self.clock.now(), **changes})
        self.claims[claim.id] = updated
        return updated

    def update_claims(self, updates: Sequence[tuple[NodeClaim, Mapping[str, object]]]) -> dict[str, NodeClaim]:
        self._call("update_claims")
        written = {}
        for claim, changes in updates:
            stored = self.claims.get(claim.id)
            if claim.id in self.refuse_next or stored is None or stored.state != claim.state:
                self.refuse_next.discard(claim.id)
                continue
            written[claim.id] = self.claims[claim.id] = stored.model_copy(
                update={"updated_at": self.clock.now(), **changes})
        return written

    def _live_owner(self, uid: str) -> str | None:
        found = self.pods.get(uid)
        if found is None or found[1] <= self.clock.now():
            return None
        claim = self.claims.get(found[0])
        return found[0] if claim is not None and claim.live else None

    def assign_pods(self, claim_id: str, pod_uids: Sequence[str], ttl: timedelta) -> list[str]:
        self._call("assign_pods")
        newly = []
        for uid in pod_uids:
            if self._live_owner(uid) is None:
                self.pods[uid] = (claim_id, self.clock.now() + ttl)
                newly.append(uid)
        return newly

    def assign_many(self, wanted: Mapping[str, Sequence[str]], ttl: timedelta) -> dict[str, list[str]]:
        newly = {claim_id: self.assign_pods(claim_id, list(uids), ttl) for claim_id, uids in wanted.items()}
        return {claim_id: uids for claim_id, uids in newly.items() if uids}

    def assignments(self, pod_uids: Sequence[str]) -> dict[str, str]:
        self._call("assignments")
        return {uid: owner for uid in pod_uids if (owner := self._live_owner(uid)) is not None}

    def release_pods(self, pod_uids: Sequence[str]) -> None:
        self._call("release_pods")
        for uid in pod_uids:
            self.pods.pop(uid, None)

    def mark_unavailable(self, offering: tuple[str, str, str], ttl: timedelta, reason: str) -> None:
        self._call("mark_unavailable")
        self.unavailable[offering] = self.clock.now() + ttl

    def unavailable_offerings(self) -> set[tuple[str, str, str]]:
        self._call("unavailable_offerings")
        return {key for key, until in self.unavailable.items() if until > self.clock.now()}

    def record_demand(self, pool: str, bucket: datetime, gpus: float, ttl: timedelta) -> None:
        self._call("record_demand")
        self.demand[(pool, bucket)] = max(self.demand.get((pool, bucket), 0.0), gpus)

    def demand_history(self, pool: str, since: datetime) -> list[tuple[datetime, float]]:
        return sorted((b, g) for (p, b), g in self.demand.items() if p == pool and b >= since)

    # Boot times and instance lookups belong to the reconcile, drain and interruption paths, not the packer's.
    def claim_for_instance(self, instance_id: str) -> NodeClaim | None:
        raise AssertionError("the packer never looks a claim up by its instance")

    def record_boot_time(self, sample: BootSample, ttl: timedelta) -> None:
        raise AssertionError("the packer never records boot times")

    def boot_times(self, pool: str, since: datetime) -> list[BootSample]:
        raise AssertionError("the packer never reads boot times")


@dataclass
class RecordingLaunchQueue:
    sent: list[LaunchRequest] = field(default_factory=list)

    def send(self, request: LaunchRequest) -> None:
        self.sent.append(request)


    def send_many(self, requests: Sequence[LaunchRequest]) -> None:
        self.sent.extend(requests)


@dataclass
class FixedQuotas:
    values: Mapping[str, int]
    usage: Mapping[str, UsageReading] = field(default_factory=dict)

    def vcpu_quotas(self) -> Mapping[str, int]:
        return self.values

    def vcpu_usage(self) -> Mapping[str, UsageReading]:
        return self.usage


@dataclass
class FakeServiceQuotasClient:
    """`get_service_quota` answering applied values from `values`, `get_aws_default_service_quota` default values
    from `defaults`; a code in neither raises NoSuchResource, a code in `reasons` comes back with that
    `ErrorReason` and no `Value`, and `error` fails every call."""

    values: dict[str, float]
    error: Exception | None = None
    defaults: dict[str, float] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    """A code's `UsageMetric` (MetricInfo), given in its answers."""
    calls: int = 0
    """GetServiceQuota calls."""
    default_calls: int = 0
    """GetAWSDefaultServiceQuota calls."""

    def get_service_quota(self, **kwargs: Any) -> dict[str, Any]:
        self.calls += 1
        return self._answer(kwargs["QuotaCode"], self.values, "GetServiceQuota")

    def get_aws_default_service_quota(self, **kwargs: Any) -> dict[str, Any]:
        self.default_calls += 1
        return self._answer(kwargs["QuotaCode"], self.defaults, "GetAWSDefaultServiceQuota")

    def _answer(self, code: str, table: dict[str, float], operation: str) -> dict[str, Any]:
        from botocore.exceptions import ClientError

        if self.error is not None:
            raise self.error
        if code in self.reasons:
            return {"Quota": {"QuotaCode": code, "ErrorReason": {"ErrorCode": self.reasons[code],
                                                                 "ErrorMessage": "could not read it"}}}
        if code not in table:
            raise ClientError({"Error": {"Code": "NoSuchResourceException", "Message": "no such quota"}}, operation)
        quota: dict[str, Any] = {"QuotaCode": code, "Value": table[code]}
        if code in self.metrics:
            quota["UsageMetric"] = self.metrics[code]
        return {"Quota": quota}
