"""`TickLeases` as items of the stack's DynamoDB table: `LEASE#<function>` under the cluster's partition (beside
the `CLAIM#` and `ENDED#` items of `state_store`, never one of them), holding the holder's request id and the lease's
end in `expiresAt`, the table's TTL attribute, so DynamoDB also deletes a crashed holder's lease some time after.

Both writes are conditional, so each is one atomic step however many ticks race for the lease: DynamoDB's PutItem
"To prevent a new item from replacing an existing item, use a conditional expression that contains the
attribute_not_exists function with the name of the attribute being used as the partition key for the table. Since
every record must contain that attribute, the attribute_not_exists function will only succeed if no matching item
exists" (API reference, PutItem); a condition that does not hold fails the write with
`ConditionalCheckFailedException`. TTL deletion is lazy, so the condition compares `expiresAt` with the clock too.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any, cast

from botocore.exceptions import ClientError

from gpu_autoscaler.errors import StateStoreError
from gpu_autoscaler.models.leases import Lease
from gpu_autoscaler.naming import PARTITION_KEY, SORT_KEY, TTL_ATTRIBUTE

__all__ = ["DynamoTickLeases"]

_CONDITION_FAILED = "ConditionalCheckFailedException"


class DynamoTickLeases:
    def __init__(self, dynamodb_client: Any, table_name: str, cluster: str) -> None:
        self._db = dynamodb_client
        self.table = table_name
        self._pk = f"CLUSTER#{cluster}"

    def take(self, lease: Lease, now: datetime) -> Lease | None:
        """PutItem on `attribute_not_exists(PK) OR expiresAt < :now`; a refusal returns the item in the way
        (ReturnValuesOnConditionCheckFailure ALL_OLD: "returns the item attributes for a PutItem operation that
        failed a condition check", and "No read capacity units are consumed"), so the holder is named without
        a second read. The lease's end is stored rounded up to the second, `now` rounded down: a lease is never
        shorter than asked."""
        try:
            self._db.put_item(
                TableName=self.table,
                Item=self._key(lease.name) | {
                    "holder": {"S": lease.holder},
                    TTL_ATTRIBUTE: {"N": str(math.ceil(lease.expires_at.timestamp()))},
                },
                ConditionExpression="attribute_not_exists(#pk) OR #exp < :now",
                ExpressionAttributeNames={"#pk": PARTITION_KEY, "#exp": TTL_ATTRIBUTE},
                ExpressionAttributeValues={":now": {"N": str(math.floor(now.timestamp()))}},
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as error:
            if _code(error) != _CONDITION_FAILED:
                raise
            item = cast("dict[str, Any]", error.response.get("Item") or {})
            if not item:
                raise StateStoreError(f"lease {lease.name}: the put was refused, but DynamoDB returned no item "
                                      "in its way") from error
            return Lease(name=lease.name, holder=item["holder"]["S"],
                         expires_at=datetime.fromtimestamp(int(item[TTL_ATTRIBUTE]["N"]), UTC))
        return None

    def release(self, lease: Lease) -> bool:
        """DeleteItem on `holder = :holder`: the lease of a holder that outlived it and was taken over stays."""
        try:
            self._db.delete_item(
                TableName=self.table,
                Key=self._key(lease.name),
                ConditionExpression="#holder = :holder",
                ExpressionAttributeNames={"#holder": "holder"},
                ExpressionAttributeValues={":holder": {"S": lease.holder}},
            )
        except ClientError as error:
            if _code(error) != _CONDITION_FAILED:
                raise
            return False
        return True

    def _key(self, name: str) -> dict[str, Any]:
        return {PARTITION_KEY: {"S": self._pk}, SORT_KEY: {"S": f"LEASE#{name}"}}


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))
