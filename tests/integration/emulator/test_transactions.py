"""TransactWriteItems on the emulator: all or nothing, as DynamoDB's ("DynamoDB transactions"), at a cost that does
not grow with the table. moto deep-copied every table a transaction named to undo a failed one, so a burst of
conditional writes slowed down with the table's size; the emulator saves only the items a transaction names."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from botocore.exceptions import ClientError

from gpu_autoscaler.naming import PARTITION_KEY, SORT_KEY

if TYPE_CHECKING:
    from gpu_autoscaler.emulator.aws import EmbeddedAws


def _key(name: str) -> dict[str, dict[str, str]]:
    return {PARTITION_KEY: {"S": "CLUSTER#transactions"}, SORT_KEY: {"S": name}}


def test_a_cancelled_transaction_leaves_every_item_as_it_was(aws: EmbeddedAws) -> None:
    db, table = aws.clients.client("dynamodb"), aws.table_name
    db.put_item(TableName=table, Item=_key("kept") | {"n": {"N": "1"}})
    db.put_item(TableName=table, Item=_key("deleted") | {"n": {"N": "2"}})
    db.put_item(TableName=table, Item=_key("updated") | {"n": {"N": "3"}})
    with pytest.raises(ClientError) as cancelled:
        db.transact_write_items(TransactItems=[
            {"Put": {"TableName": table, "Item": _key("new") | {"n": {"N": "9"}}}},
            {"Put": {"TableName": table, "Item": _key("kept") | {"n": {"N": "9"}}}},
            {"Delete": {"TableName": table, "Key": _key("deleted")}},
            {"Update": {"TableName": table, "Key": _key("updated"), "UpdateExpression": "SET n = :n",
                        "ExpressionAttributeValues": {":n": {"N": "9"}}}},
            {"ConditionCheck": {"TableName": table, "Key": _key("missing"),
                                "ConditionExpression": "attribute_exists(n)"}},
        ])
    reasons = cancelled.value.response["CancellationReasons"]
    assert [r["Code"] for r in reasons] == ["None", "None", "None", "None", "ConditionalCheckFailed"]

    def value(name: str) -> Any:
        item = db.get_item(TableName=table, Key=_key(name), ConsistentRead=True).get("Item")
        return item and item["n"]["N"]

    assert (value("new"), value("kept"), value("deleted"), value("updated")) == (None, "1", "2", "3")


def test_a_transaction_does_not_copy_the_table(aws: EmbeddedAws, monkeypatch: pytest.MonkeyPatch) -> None:
    from moto.dynamodb.models.table import Table

    def refuse(self: Table, memo: object) -> Table:
        raise AssertionError("the whole table was copied for one transaction")

    monkeypatch.setattr(Table, "__deepcopy__", refuse, raising=False)
    db, table = aws.clients.client("dynamodb"), aws.table_name
    db.transact_write_items(TransactItems=[{"Put": {"TableName": table, "Item": _key("one")}}])
    with pytest.raises(ClientError, match="TransactionCanceled"):
        db.transact_write_items(TransactItems=[{"Put": {"TableName": table, "Item": _key("one"),
                                                        "ConditionExpression": "attribute_not_exists(#sk)",
                                                        "ExpressionAttributeNames": {"#sk": SORT_KEY}}}])
