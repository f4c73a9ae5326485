"""`StateStore` over the stack's single DynamoDB table.

Items, all under the cluster's partition `CLUSTER#<cluster>`:

| sort key | holds |
| --- | --- |
| `CLAIM#<id>` | a live NodeClaim as JSON, its `state` and `version` (the condition of every write) |
| `ENDED#<id>` | a terminated NodeClaim, the same way, until `expiresAt` |
| `INSTANCE#<instance-id>` | the claim that launched it: interruption events name instances, not claims |
| `POD#<uid>` | the claim a pending pod is covered by, until `expiresAt` |
| `UNAVAILABLE#<type>#<zone>#<capacity type>` | an offering EC2 had no capacity for, until `expiresAt` (`*`: any) |
| `DEMAND#<pool>#<bucket ISO time>` | the peak GPU demand of one 5-minute bucket, until `expiresAt` |
| `BOOT#<pool>#<launch ISO time>#<claim id>` | one measured boot (`BootSample` JSON), until `expiresAt` |
| `LEASE#<function>` | the invocation running a scheduled function's tick, until `expiresAt` (`tick_leases`) |

A reservation's `UNAVAILABLE` item names the reservation id where the capacity type stands
(`domain.catalog.unavailable_key`). TTL deletion is lazy (up to days late), so every read also compares `expiresAt`
with the clock.
Terminated claims stay for `TERMINATED_RETENTION` so a claim's history can be looked up after the fact, under a
key prefix of their own: the claim's terminating write deletes `CLAIM#<id>` (on its condition) and puts
`ENDED#<id>` in one transaction. A filter does not lower what a Query reads (DynamoDB bills every item its key
condition reaches), so the live claims' read, made by every packer document and every tick, reaches only the
live claims, not a month of ended ones. A claim id is never stored twice: creating one checks both keys.
Tables written before this layout keep their terminated claims under `CLAIM#` until they expire; reads filter
them out as before.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from botocore.exceptions import ClientError

from gpu_autoscaler.adapters.memory.state_store import apply_transition, apply_update, check_version
from gpu_autoscaler.clock import Clock, SystemClock
from gpu_autoscaler.errors import ClaimExists, StaleClaim, StateStoreError
from gpu_autoscaler.models.boot import BootSample
from gpu_autoscaler.models.claims import ClaimState, NodeClaim
from gpu_autoscaler.naming import PARTITION_KEY, SORT_KEY, TTL_ATTRIBUTE

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

__all__ = ["TERMINATED_RETENTION", "DynamoStateStore"]

TERMINATED_RETENTION = timedelta(days=30)
_BATCH_GET = 100
_BATCH_WRITE = 25
"""BatchWriteItem takes up to 25 put or delete requests (DynamoDB API reference, BatchWriteItem)."""
_R = TypeVar("_R")
_UNPROCESSED_RETRIES = 5
"""BatchGetItem and BatchWriteItem may leave keys or requests unprocessed (a throttled partition, more than 1 MB
asked of one), and DynamoDB may cancel a transaction for throughput (`_THROTTLED_CODES`): they are sent again
after 50 ms, doubling each time (1.55 s in all), then given up (`_until_processed`)."""
_LIVE = "CLAIM#"
_ENDED = "ENDED#"
TRANSACT_ITEMS = 100
"""TransactWriteItems takes up to 100 actions, no two on one item, at most 4 MB in all (DynamoDB API reference,
TransactWriteItems). A claim is ~2 KB and a pod assignment ~100 bytes, so the count is the limit that binds."""
_CONFLICT_RETRIES = 5
"""A transaction cancelled only because another one held its items (`TransactionConflict`) is sent again."""
_RETRIED_CODES = frozenset({"None", "ConditionalCheckFailed", "TransactionConflict"})
_THROTTLED_CODES = frozenset({"ThrottlingError", "ProvisionedThroughputExceeded"})
"""Cancellation reasons of a transaction refused for throughput, not for its items (DynamoDB API reference,
TransactionCanceledException: `ThrottlingError` "Throughput exceeds the current capacity of your table or index.
DynamoDB is automatically scaling your table or index so please try again shortly", on an on-demand table;
`ProvisionedThroughputExceeded` on a provisioned one). botocore's retries leave a TransactionCanceledException
alone (`botocore/retries/standard.py`, not a throttling code), so `_transact` sends it again itself: every item is
under the cluster's one partition key, and a document's hundreds of pod puts can go past a partition's limit."""
_FREE = "attribute_not_exists(#sk) OR #exp <= :now"


class DynamoStateStore:
    def __init__(self, dynamodb_client: Any, table_name: str, cluster: str, clock: Clock | None = None) -> None:
        self._db = dynamodb_client
        self.table = table_name
        self.cluster = cluster
        self.clock = clock or SystemClock()
        self._pk = f"CLUSTER#{cluster}"

    # NodeClaims

    def create_claim(self, claim: NodeClaim) -> None:
        if self.create_claims([claim]):
            raise ClaimExists(claim.id)

    def create_claims(self, claims: Sequence[NodeClaim]) -> set[str]:
        """Each claim with a conditional put (no claim of that id yet, live or ended), in transactions of up to
        `TRANSACT_ITEMS` actions: a document's hundreds of new claims take a few calls, not one each. Returns the
        ids already stored (the claim of a redelivered message, even one that has ended since): those are not
        written."""
        absent = {"ConditionExpression": "attribute_not_exists(#sk)", "ExpressionAttributeNames": {"#sk": SORT_KEY}}
        writes = []
        for claim in {c.id: c for c in claims}.values():
            writes.append((claim.id, {"Put": {"TableName": self.table, "Item": self._claim_item(claim), **absent}}))
            writes.append((claim.id, {"ConditionCheck": {"TableName": self.table,
                                                         "Key": self._key(f"{_ENDED}{claim.id}"), **absent}}))
            if claim.instance_id:
                writes.append((claim.id, {"Put": {"TableName": self.table, "Item": self._instance_item(claim)}}))
        refused = self._transact_each(writes)
        return {key for key, _ in refused}

    def get_claim(self, claim_id: str) -> NodeClaim | None:
        return self.get_claims([claim_id]).get(claim_id)

    def get_claims(self, claim_ids: Iterable[str]) -> dict[str, NodeClaim]:
        """BatchGetItem, strongly consistent, one call per 100 claims: the live items, then the ended ones of the
        ids not found live (the claims looked up are mostly live: every transition and update reads its claim)."""
        ids = list(dict.fromkeys(claim_ids))
        found = {c.id: c for c in map(_claim, self._batch_get([f"{_LIVE}{c}" for c in ids]))}
        rest = [c for c in ids if c not in found]
        if rest:
            found |= {c.id: c for c in map(_claim, self._batch_get([f"{_ENDED}{c}" for c in rest]))}
        return found

    def claim_for_instance(self, instance_id: str) -> NodeClaim | None:
        pointer = self._get(f"INSTANCE#{instance_id}")
        return self.get_claim(pointer["claimId"]["S"]) if pointer else None

    def list_claims(self, states: Iterable[ClaimState] | None = None) -> list[NodeClaim]:
        """The live claims are read under their own prefix, the ended ones (kept `TERMINATED_RETENTION`) only when
        asked for; asked for some states, DynamoDB filters the rest out before answering (what a table written
        before ended claims had their own prefix still holds under `CLAIM#` is read, but not sent)."""
        wanted = set(states) if states is not None else None
        only = None
        if wanted is not None:
            values = {f":state{n}": {"S": state.value} for n, state in enumerate(sorted(wanted, key=str))}
            only = (f"#state IN ({', '.join(values)})", {"#state": "state"}, values) if values else None
        prefixes = [_LIVE] + ([_ENDED] if wanted is None or ClaimState.TERMINATED in wanted else [])
        claims = (_claim(item) for prefix in prefixes for item in self._query(prefix, only=only))
        return [c for c in claims if wanted is None or c.state in wanted]

    def transition(self, claim: NodeClaim, to: ClaimState, reason: str = "", **changes: object) -> NodeClaim:
        stored = self.get_claim(claim.id)
        if stored is None:
            raise StaleClaim(f"claim {claim.id} is not stored")
        moved = apply_transition(stored, claim.state, to, self.clock.now(), reason, changes)
        check_version(stored, claim)
        self._replace(moved, read=claim)
        return moved

    def update_claim(self, claim: NodeClaim, **changes: object) -> NodeClaim:
        stored = self.get_claim(claim.id)
        if stored is None:
            raise StaleClaim(f"claim {claim.id} is not stored")
        updated = apply_update(stored, claim, self.clock.now(), changes)
        self._replace(updated, read=claim)
        return updated

    def update_claims(self, updates: Sequence[tuple[NodeClaim, Mapping[str, object]]]) -> dict[str, NodeClaim]:
        """Each claim's put conditional on the state and version it was read at (as `_replace`), up to
        `TRANSACT_ITEMS` per TransactWriteItems; no read first (the condition is the check `update_claim`'s read
        makes). A refused put is left out of the answer, the others are written (`_transact_each`). The instance
        pointer is written with its claim only where the update gives the claim an instance (a pointer never
        changes once written)."""
        now = self.clock.now()
        written: dict[str, NodeClaim] = {}
        writes: list[tuple[str, dict[str, Any]]] = []
        for claim, changes in {c.id: (c, ch) for c, ch in updates}.values():
            updated = apply_update(claim, claim, now, dict(changes))
            written[claim.id] = updated
            writes += [(claim.id, action) for action in self._claim_writes(updated, read=claim)]
            if updated.instance_id and updated.instance_id != claim.instance_id:
                writes.append((claim.id, {"Put": {"TableName": self.table, "Item": self._instance_item(updated)}}))
        for key, _ in self._transact_each(writes):
            written.pop(key, None)
        return written

    def _claim_writes(self, claim: NodeClaim, read: NodeClaim) -> list[dict[str, Any]]:
        """The claim's write, conditional on the state and version it was `read` at (another writer between our
        read and this write makes it fail): a put where it is; when it ends, the delete of its live item (on that
        condition) and the put of its ended one, to go in one transaction. An item written before claims had
        versions has no `version` attribute: it counts as version 0."""
        version = "#version = :version"
        if read.version == 0:
            version = f"(attribute_not_exists(#version) OR {version})"
        condition = {
            "ConditionExpression": f"#state = :expected AND {version}",
            "ExpressionAttributeNames": {"#state": "state", "#version": "version"},
            "ExpressionAttributeValues": {":expected": {"S": read.state.value}, ":version": {"N": str(read.version)}},
        }
        item = self._claim_item(claim)
        if read.state is ClaimState.TERMINATED or claim.state is not ClaimState.TERMINATED:
            return [{"Put": {"TableName": self.table, "Item": item, **condition}}]
        return [{"Delete": {"TableName": self.table, "Key": self._key(f"{_LIVE}{claim.id}"), **condition}},
                {"Put": {"TableName": self.table, "Item": item}}]

    def _replace(self, claim: NodeClaim, read: NodeClaim) -> None:
        """One transaction: the claim, conditional on what it was `read` at (`_claim_writes`), and its instance
        pointer with it."""
        writes: list[dict[str, Any]] = self._claim_writes(claim, read)
        if claim.instance_id:
            writes.append({"Put": {"TableName": self.table, "Item": self._instance_item(claim)}})
        reasons = self._transact(writes)
        if reasons is not None:
            codes = ", ".join(str(r.get("Code") or "None") for r in reasons)
            raise StaleClaim(f"claim {claim.id} changed since version {read.version} while we wrote it ({codes})")

    def _claim_item(self, claim: NodeClaim) -> dict[str, Any]:
        prefix = _ENDED if claim.state is ClaimState.TERMINATED else _LIVE
        item = self._key(f"{prefix}{claim.id}") | {
            "state": {"S": claim.state.value},
            "version": {"N": str(claim.version)},
            "pool": {"S": claim.pool},
            "claim": {"S": claim.model_dump_json()},
        }
        if claim.state is ClaimState.TERMINATED:
            item[TTL_ATTRIBUTE] = _epoch(self.clock.now() + TERMINATED_RETENTION)
        return item

    def _instance_item(self, claim: NodeClaim) -> dict[str, Any]:
        item = self._key(f"INSTANCE#{claim.instance_id}") | {"claimId": {"S": claim.id}}
        if claim.state is ClaimState.TERMINATED:
            item[TTL_ATTRIBUTE] = _epoch(self.clock.now() + TERMINATED_RETENTION)
        return item

    # Pod assignments

    def assign_pods(self, claim_id: str, pod_uids: Sequence[str], ttl: timedelta) -> list[str]:
        return self.assign_many({claim_id: pod_uids}, ttl).get(claim_id, [])

    def assign_many(self, wanted: Mapping[str, Sequence[str]], ttl: timedelta) -> dict[str, list[str]]:
        """Each pod is taken with a conditional put — free or expired; already ours (its expiry renewed, not
        new); or held by a claim that is no longer live (overwritten only if that owner is still the one read) —
        up to `TRANSACT_ITEMS` puts per call. A transaction is all or nothing, so one refused put cancels its
        call: the cancellation reasons say which (with the item as it was), the rest are sent again."""
        now = self.clock.now()
        owner_of: dict[str, str] = {}
        for claim_id, uids in wanted.items():
            for uid in uids:
                owner_of.setdefault(uid, claim_id)  # a pod named twice goes to the first claim, as in turn it would
        items = {uid: self._key(f"POD#{uid}") | {"claimId": {"S": claim}, TTL_ATTRIBUTE: _epoch(now + ttl)}
                 for uid, claim in owner_of.items()}
        free = {"ExpressionAttributeNames": {"#sk": SORT_KEY, "#exp": TTL_ATTRIBUTE},
                "ExpressionAttributeValues": {":now": _epoch(now)}}
        refused = self._transact_each([
            (uid, {"Put": {"TableName": self.table, "Item": item, "ConditionExpression": _FREE, **free,
                           "ReturnValuesOnConditionCheckFailure": "ALL_OLD"}})
            for uid, item in items.items()
        ])
        taken = set(owner_of) - {uid for uid, _ in refused}
        ours = [(uid, old) for uid, old in refused if old.get("claimId", {}).get("S") == owner_of[uid]]
        others = {uid: old["claimId"]["S"] for uid, old in refused if "claimId" in old and (uid, old) not in ours}
        self._transact_each([  # renew ours; a change of owner since (rare) leaves it to the new owner
            (uid, {"Put": {"TableName": self.table, "Item": items[uid], "ConditionExpression": "claimId = :claim",
                           "ExpressionAttributeValues": {":claim": {"S": owner_of[uid]}}}})
            for uid, _ in ours
        ])
        if others:
            live = {c.id for c in self.get_claims(set(others.values())).values() if c.live}
            dead = {uid: owner for uid, owner in others.items() if owner not in live}
            lost = self._transact_each([
                (uid, {"Put": {"TableName": self.table, "Item": items[uid], "ConditionExpression": "claimId = :owner",
                               "ExpressionAttributeValues": {":owner": {"S": owner}}}})
                for uid, owner in dead.items()
            ])
            taken |= set(dead) - {uid for uid, _ in lost}
        newly: dict[str, list[str]] = {}
        for uid, claim_id in owner_of.items():
            if uid in taken:
                newly.setdefault(claim_id, []).append(uid)
        return newly

    def _transact_each(self, writes: Sequence[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
        """Apply `(key, action)` writes, each on its own condition, in transactions of up to `TRANSACT_ITEMS`;
        returns `(key, item as it was)` for each refused on its condition (`{}` where there was none). A refusal
        cancels the rest of its transaction, which is sent again without it; one cancelled by a concurrent
        transaction on the same items (`TransactionConflict`) is sent again, a few times, after a short pause (one
        cancelled for throughput already was, in `_transact`)."""
        refused: list[tuple[str, dict[str, Any]]] = []
        for batch in _batches(writes):
            conflicts = 0
            while batch:
                reasons = self._transact([action for _, action in batch])
                if reasons is None:
                    break
                codes = [str(r.get("Code") or "None") for r in reasons]
                if len(codes) != len(batch) or not set(codes) <= _RETRIED_CODES:
                    raise StateStoreError(f"transaction cancelled: {', '.join(codes)}")
                refused_now = [(key, r.get("Item", {})) for (key, _), r, code in zip(batch, reasons, codes, strict=True)
                               if code == "ConditionalCheckFailed"]
                refused += [(key, item) for key, item in refused_now if key not in {k for k, _ in refused}]
                if "TransactionConflict" in codes:
                    conflicts += 1
                    if conflicts > _CONFLICT_RETRIES:
                        raise StateStoreError("transaction kept conflicting with concurrent writes")
                    time.sleep(0.05 * conflicts)
                elif "ConditionalCheckFailed" not in codes:
                    raise StateStoreError(f"transaction cancelled with no reason given: {', '.join(codes)}")
                # A refused write takes the other actions of its key with it (a claim's ended put with the
                # delete of its live item; the existence check beside a new claim; its instance pointer).
                dropped = {key for key, _ in refused_now if key}
                batch = [w for w, code in zip(batch, codes, strict=True)
                         if code != "ConditionalCheckFailed" and w[0] not in dropped]
        return refused

    def _transact(self, actions: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        """None when written; the cancellation reasons (one per action, in order) when cancelled. One cancelled for
        throughput (a reason in `_THROTTLED_CODES`) is sent again as unprocessed batch items are
        (`_until_processed`): all or nothing, nothing of it was written."""
        reasons: list[dict[str, Any]] | None = None

        def send(actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
            nonlocal reasons
            reasons = None
            try:
                self._db.transact_write_items(TransactItems=actions)
            except ClientError as error:
                if _code(error) != "TransactionCanceledException":
                    raise
                reasons = [dict(r) for r in error.response.get("CancellationReasons") or []]
                if any(str(r.get("Code")) in _THROTTLED_CODES for r in reasons):
                    return actions
            return []

        _until_processed(send, actions, lambda left: f"a transaction of {len(left)} action(s) throttled and")
        return reasons

    def assignments(self, pod_uids: Sequence[str]) -> dict[str, str]:
        now = _epoch(self.clock.now())["N"]
        owners = {
            item[SORT_KEY]["S"].removeprefix("POD#"): item["claimId"]["S"]
            for item in self._batch_get([f"POD#{uid}" for uid in dict.fromkeys(pod_uids)])
            if float(item.get(TTL_ATTRIBUTE, {"N": "inf"})["N"]) > float(now)
        }
        claims = self.get_claims(set(owners.values()))
        return {uid: owner for uid, owner in owners.items() if owner in claims and claims[owner].live}

    def release_pods(self, pod_uids: Sequence[str]) -> None:
        """BatchWriteItem, 25 deletes a call (its limit), what DynamoDB leaves unprocessed sent again: the packer
        releases a document's displaced pods and the fleet a failed request's, hundreds at a time, not a call each.
        A delete has no condition here, so nothing needs a transaction."""
        keys = [self._key(f"POD#{uid}") for uid in dict.fromkeys(pod_uids)]
        for start in range(0, len(keys), _BATCH_WRITE):
            requests = [{"DeleteRequest": {"Key": key}} for key in keys[start:start + _BATCH_WRITE]]

            def delete(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
                answer = self._db.batch_write_item(RequestItems={self.table: requests})
                return (answer.get("UnprocessedItems") or {}).get(self.table) or []

            _until_processed(delete, requests, lambda left: f"{len(left)} pod release(s)")

    # Unavailable offerings

    def mark_unavailable(self, offering: tuple[str, str, str], ttl: timedelta, reason: str) -> None:
        self._db.put_item(
            TableName=self.table,
            Item=self._key("UNAVAILABLE#" + "#".join(offering)) | {
                TTL_ATTRIBUTE: _epoch(self.clock.now() + ttl),
                "reason": {"S": reason or "unavailable"},
            },
        )

    def unavailable_offerings(self) -> set[tuple[str, str, str]]:
        now = self.clock.now().timestamp()
        out: set[tuple[str, str, str]] = set()
        for item in self._query("UNAVAILABLE#"):
            if float(item[TTL_ATTRIBUTE]["N"]) > now:
                instance_type, zone, capacity_type = item[SORT_KEY]["S"].removeprefix("UNAVAILABLE#").split("#")
                out.add((instance_type, zone, capacity_type))
        return out

    # Demand history

    def record_demand(self, pool: str, bucket: datetime, gpus: float, ttl: timedelta) -> None:
        """Keeps the bucket's peak: a lower report than the one stored loses its condition and changes nothing."""
        try:
            self._db.put_item(
                TableName=self.table,
                Item=self._key(f"DEMAND#{pool}#{_iso(bucket)}") | {
                    "gpus": {"N": repr(float(gpus))},
                    TTL_ATTRIBUTE: _epoch(bucket + ttl),
                },
                ConditionExpression="attribute_not_exists(gpus) OR gpus < :gpus",
                ExpressionAttributeValues={":gpus": {"N": repr(float(gpus))}},
            )
        except ClientError as error:
            if _code(error) != "ConditionalCheckFailedException":
                raise

    def demand_history(self, pool: str, since: datetime) -> list[tuple[datetime, float]]:
        prefix = f"DEMAND#{pool}#"
        items = self._query(prefix, start=prefix + _iso(since))
        return [
            (datetime.fromisoformat(i[SORT_KEY]["S"].removeprefix(prefix)), float(i["gpus"]["N"])) for i in items
        ]

    # Boot times

    def record_boot_time(self, sample: BootSample, ttl: timedelta) -> None:
        try:
            self._put_boot(sample, ttl)
        except ClientError as error:
            if _code(error) != "ConditionalCheckFailedException":
                raise

    def _put_boot(self, sample: BootSample, ttl: timedelta) -> None:
        self._db.put_item(
            TableName=self.table,
            Item=self._key(f"BOOT#{sample.pool}#{_iso(sample.launched_at)}#{sample.claim_id}") | {
                "sample": {"S": sample.model_dump_json(by_alias=True)},
                TTL_ATTRIBUTE: _epoch(self.clock.now() + ttl),
            },
            ConditionExpression="attribute_not_exists(#sk)",
            ExpressionAttributeNames={"#sk": SORT_KEY},
        )

    def boot_times(self, pool: str, since: datetime) -> list[BootSample]:
        """Launch time leads the sort key: the query reads from `since` on, in launch order."""
        now = self.clock.now().timestamp()
        prefix = f"BOOT#{pool}#"
        return [
            BootSample.model_validate_json(item["sample"]["S"])
            for item in self._query(prefix, start=prefix + _iso(since)) if float(item[TTL_ATTRIBUTE]["N"]) > now
        ]

    # Table access

    def _key(self, sort_key: str) -> dict[str, Any]:
        return {PARTITION_KEY: {"S": self._pk}, SORT_KEY: {"S": sort_key}}

    def _get(self, sort_key: str) -> dict[str, Any] | None:
        item: dict[str, Any] | None = self._db.get_item(
            TableName=self.table, Key=self._key(sort_key), ConsistentRead=True
        ).get("Item")
        return item

    def _query(self, prefix: str, start: str | None = None,
               only: tuple[str, dict[str, str], dict[str, Any]] | None = None) -> Iterator[dict[str, Any]]:
        """Every item whose sort key starts with `prefix` (from `start` on, when given), all pages; `only`: a
        filter expression with its names and values (DynamoDB drops what it refuses before answering)."""
        if start is None:
            condition = "#pk = :pk AND begins_with(#sk, :prefix)"
            values = {":pk": {"S": self._pk}, ":prefix": {"S": prefix}}
        else:
            condition = "#pk = :pk AND #sk BETWEEN :start AND :end"
            values = {":pk": {"S": self._pk}, ":start": {"S": start}, ":end": {"S": prefix + "\uffff"}}
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": condition,
            "ExpressionAttributeNames": {"#pk": PARTITION_KEY, "#sk": SORT_KEY},
            "ExpressionAttributeValues": values,
            "ConsistentRead": True,
        }
        if only is not None:
            kwargs["FilterExpression"] = only[0]
            kwargs["ExpressionAttributeNames"] |= only[1]
            kwargs["ExpressionAttributeValues"] = values | only[2]
        while True:
            page = self._db.query(**kwargs)
            yield from page.get("Items", [])
            if "LastEvaluatedKey" not in page:
                return
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def _batch_get(self, sort_keys: Sequence[str]) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        for start in range(0, len(sort_keys), _BATCH_GET):
            request: dict[str, Any] = {
                self.table: {"Keys": [self._key(k) for k in sort_keys[start:start + _BATCH_GET]],
                             "ConsistentRead": True}
            }

            def read(request: dict[str, Any]) -> dict[str, Any]:
                answer = self._db.batch_get_item(RequestItems=request)
                items.extend(answer.get("Responses", {}).get(self.table, []))
                return answer.get("UnprocessedKeys") or {}

            _until_processed(read, request, lambda left: f"{len(left[self.table]['Keys'])} read(s)")
        return items


def _until_processed(send: Callable[[_R], _R], request: _R, what: Callable[[_R], str]) -> None:
    """`request = send(request)` until DynamoDB leaves nothing unprocessed, pausing 50 ms before the first retry and
    twice as long before each next; `StateStoreError` after `_UNPROCESSED_RETRIES` retries. The batch calls'
    reference (BatchGetItem, BatchWriteItem): "If DynamoDB returns any unprocessed items, you should retry the batch
    operation on those items. However, we strongly recommend that you use an exponential backoff algorithm. If you
    retry the batch operation immediately, the underlying read or write requests can still fail due to throttling
    on the individual tables." Given up, the invocation fails and its message is retried by SQS, later still."""
    for attempt in range(_UNPROCESSED_RETRIES + 1):
        request = send(request)
        if not request:
            return
        if attempt == _UNPROCESSED_RETRIES:
            raise StateStoreError(f"{what(request)} left unprocessed by DynamoDB after {attempt + 1} tries")
        time.sleep(0.05 * 2 ** attempt)


def _batches(writes: Sequence[tuple[str, dict[str, Any]]]) -> list[list[tuple[str, dict[str, Any]]]]:
    """Writes in transactions of up to `TRANSACT_ITEMS` actions, the actions of one key (adjacent) never split
    over two: they stand or fall together."""
    batches: list[list[tuple[str, dict[str, Any]]]] = []
    current: list[tuple[str, dict[str, Any]]] = []
    at = 0
    while at < len(writes):
        end = at + 1
        while end < len(writes) and writes[end][0] and writes[end][0] == writes[at][0]:
            end += 1
        group = list(writes[at:end])
        if current and len(current) + len(group) > TRANSACT_ITEMS:
            batches.append(current)
            current = []
        current += group
        at = end
    if current:
        batches.append(current)
    return batches


def _claim(item: dict[str, Any]) -> NodeClaim:
    return NodeClaim.model_validate_json(item["claim"]["S"])


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def _epoch(moment: datetime) -> dict[str, str]:
    return {"N": str(int(moment.timestamp()))}


def _iso(moment: datetime) -> str:
    """Fixed-width UTC, so sort keys order by time."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S+00:00")
