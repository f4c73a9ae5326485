"""`StateStore` over the stack's single DynamoDB table.

Items, all under the cluster's partition `CLUSTER#<cluster>`:

| sort key | holds |
| --- | --- |
| `CLAIM#<id>` | the NodeClaim as JSON, its `state` and `version` (the condition of every write) |
| `INSTANCE#<instance-id>` | the claim that launched it: interruption events name instances, not claims |
| `POD#<uid>` | the claim a pending pod is covered by, until `expiresAt` |
| `UNAVAILABLE#<type>#<zone>#<capacity type>` | an offering EC2 had no capacity for, until `expiresAt` |
| `DEMAND#<pool>#<bucket ISO time>` | the peak GPU demand of one 5-minute bucket, until `expiresAt` |
| `BOOT#<pool>#<launch ISO time>#<claim id>` | one measured boot (`BootSample` JSON), until `expiresAt` |

TTL deletion is lazy (up to days late), so every read also compares `expiresAt` with the clock.
Terminated claims stay for `TERMINATED_RETENTION` so a claim's history can be looked up after the fact.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from gpu_autoscaler.adapters.memory.state_store import apply_transition, apply_update, check_version
from gpu_autoscaler.clock import Clock, SystemClock
from gpu_autoscaler.errors import ClaimExists, StaleClaim, StateStoreError
from gpu_autoscaler.models.boot import BootSample
from gpu_autoscaler.models.claims import ClaimState, NodeClaim
from gpu_autoscaler.naming import PARTITION_KEY, SORT_KEY, TTL_ATTRIBUTE

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping, Sequence

__all__ = ["TERMINATED_RETENTION", "DynamoStateStore"]

TERMINATED_RETENTION = timedelta(days=30)
_BATCH_GET = 100
_BATCH_WRITE = 25
"""BatchWriteItem takes up to 25 put or delete requests (DynamoDB API reference, BatchWriteItem)."""
_UNPROCESSED_RETRIES = 5
"""BatchWriteItem may leave some requests unprocessed (throttled partitions): they are sent again, with backoff."""
TRANSACT_ITEMS = 100
"""TransactWriteItems takes up to 100 actions, no two on one item, at most 4 MB in all (DynamoDB API reference,
TransactWriteItems). A claim is ~2 KB and a pod assignment ~100 bytes, so the count is the limit that binds."""
_CONFLICT_RETRIES = 5
"""A transaction cancelled only because another one held its items (`TransactionConflict`) is sent again."""
_RETRIED_CODES = frozenset({"None", "ConditionalCheckFailed", "TransactionConflict"})
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
        """Each claim with a conditional put (no claim of that id yet), up to `TRANSACT_ITEMS` puts per call: a
        document's hundreds of new claims take a few calls, not one each. Returns the ids already stored (the
        claim of a redelivered message): those are not written."""
        writes = []
        for claim in {c.id: c for c in claims}.values():
            writes.append((claim.id, {"Put": {
                "TableName": self.table, "Item": self._claim_item(claim),
                "ConditionExpression": "attribute_not_exists(#sk)", "ExpressionAttributeNames": {"#sk": SORT_KEY}}}))
            if claim.instance_id:
                writes.append(("", {"Put": {"TableName": self.table, "Item": self._instance_item(claim)}}))
        refused = self._transact_each(writes)
        return {key for key, _ in refused}

    def get_claim(self, claim_id: str) -> NodeClaim | None:
        item = self._get(f"CLAIM#{claim_id}")
        return _claim(item) if item else None

    def get_claims(self, claim_ids: Iterable[str]) -> dict[str, NodeClaim]:
        """BatchGetItem, strongly consistent: one call per 100 claims."""
        return {c.id: c for c in (_claim(i) for i in self._batch_get([f"CLAIM#{c}" for c in dict.fromkeys(claim_ids)]))}

    def claim_for_instance(self, instance_id: str) -> NodeClaim | None:
        pointer = self._get(f"INSTANCE#{instance_id}")
        return self.get_claim(pointer["claimId"]["S"]) if pointer else None

    def list_claims(self, states: Iterable[ClaimState] | None = None) -> list[NodeClaim]:
        """Terminated claims share the live ones' key prefix and stay `TERMINATED_RETENTION`: the query reads
        them (read capacity grows with the history kept) but, asked for some states, DynamoDB filters the rest
        out before answering, so a function asking for the live claims is not sent, nor parses, a month of
        terminated ones."""
        wanted = set(states) if states is not None else None
        only = None
        if wanted is not None:
            values = {f":state{n}": {"S": state.value} for n, state in enumerate(sorted(wanted, key=str))}
            only = (f"#state IN ({', '.join(values)})", {"#state": "state"}, values) if values else None
        claims = (_claim(item) for item in self._query("CLAIM#", only=only))
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
            writes.append((claim.id, self._claim_put(updated, read=claim)))
            if updated.instance_id and updated.instance_id != claim.instance_id:
                writes.append(("", {"Put": {"TableName": self.table, "Item": self._instance_item(updated)}}))
        for key, _ in self._transact_each(writes):
            written.pop(key, None)
        return written

    def _claim_put(self, claim: NodeClaim, read: NodeClaim) -> dict[str, Any]:
        """The claim's put, conditional on the state and version it was `read` at (another writer between our
        read and this write makes it fail). An item written before claims had versions has no `version`
        attribute: it counts as version 0."""
        version = "#version = :version"
        if read.version == 0:
            version = f"(attribute_not_exists(#version) OR {version})"
        return {
            "Put": {
                "TableName": self.table,
                "Item": self._claim_item(claim),
                "ConditionExpression": f"#state = :expected AND {version}",
                "ExpressionAttributeNames": {"#state": "state", "#version": "version"},
                "ExpressionAttributeValues": {":expected": {"S": read.state.value},
                                              ":version": {"N": str(read.version)}},
            }
        }

    def _replace(self, claim: NodeClaim, read: NodeClaim) -> None:
        """One transaction: the claim, conditional on what it was `read` at (`_claim_put`), and its instance
        pointer with it."""
        writes: list[dict[str, Any]] = [self._claim_put(claim, read)]
        if claim.instance_id:
            writes.append({"Put": {"TableName": self.table, "Item": self._instance_item(claim)}})
        try:
            self._db.transact_write_items(TransactItems=writes)
        except ClientError as error:
            if _code(error) == "TransactionCanceledException":
                raise StaleClaim(f"claim {claim.id} changed since version {read.version} while we wrote it") from error
            raise

    def _claim_item(self, claim: NodeClaim) -> dict[str, Any]:
        item = self._key(f"CLAIM#{claim.id}") | {
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
        transaction on the same items (`TransactionConflict`) is sent again, a few times, after a short pause."""
        refused: list[tuple[str, dict[str, Any]]] = []
        for start in range(0, len(writes), TRANSACT_ITEMS):
            batch = list(writes[start:start + TRANSACT_ITEMS])
            conflicts = 0
            while batch:
                reasons = self._transact([action for _, action in batch])
                if reasons is None:
                    break
                codes = [str(r.get("Code") or "None") for r in reasons]
                if len(codes) != len(batch) or not set(codes) <= _RETRIED_CODES:
                    raise StateStoreError(f"transaction cancelled: {', '.join(codes)}")
                refused += [(key, r.get("Item", {})) for (key, _), r, code in zip(batch, reasons, codes, strict=True)
                            if code == "ConditionalCheckFailed"]
                if "TransactionConflict" in codes:
                    conflicts += 1
                    if conflicts > _CONFLICT_RETRIES:
                        raise StateStoreError("transaction kept conflicting with concurrent writes")
                    time.sleep(0.05 * conflicts)
                elif "ConditionalCheckFailed" not in codes:
                    raise StateStoreError(f"transaction cancelled with no reason given: {', '.join(codes)}")
                batch = [w for w, code in zip(batch, codes, strict=True) if code != "ConditionalCheckFailed"]
        return refused

    def _transact(self, actions: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        """None when written; the cancellation reasons (one per action, in order) when cancelled."""
        try:
            self._db.transact_write_items(TransactItems=actions)
        except ClientError as error:
            if _code(error) != "TransactionCanceledException":
                raise
            return [dict(r) for r in error.response.get("CancellationReasons") or []]
        return None

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
            for attempt in range(_UNPROCESSED_RETRIES + 1):
                answer = self._db.batch_write_item(RequestItems={self.table: requests})
                requests = (answer.get("UnprocessedItems") or {}).get(self.table) or []
                if not requests:
                    break
                if attempt == _UNPROCESSED_RETRIES:
                    raise StateStoreError(f"{len(requests)} pod release(s) left unprocessed by DynamoDB")
                time.sleep(0.05 * 2 ** attempt)

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
            while request:
                answer = self._db.batch_get_item(RequestItems=request)
                items.extend(answer.get("Responses", {}).get(self.table, []))
                request = answer.get("UnprocessedKeys") or {}
        return items


def _claim(item: dict[str, Any]) -> NodeClaim:
    return NodeClaim.model_validate_json(item["claim"]["S"])


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def _epoch(moment: datetime) -> dict[str, str]:
    return {"N": str(int(moment.timestamp()))}


def _iso(moment: datetime) -> str:
    """Fixed-width UTC, so sort keys order by time."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S+00:00")
