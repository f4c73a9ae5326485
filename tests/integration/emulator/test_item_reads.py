"""Items read back from the emulator's DynamoDB: exactly what was written ("Data types", DynamoDB Developer Guide:
B is base64 on the wire, N a string, sets and documents nested), page by page, at a cost that does not grow with
the shape walk of each attribute. moto's response serializer walked the API's output shape for every attribute
value of every item: two thirds of a 750-claim Query's time, the emulator-only cost that made the packer's
per-document read grow with the claims kept."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpu_autoscaler.naming import PARTITION_KEY, SORT_KEY

if TYPE_CHECKING:
    import pytest

    from gpu_autoscaler.emulator.aws import EmbeddedAws

EVERY_TYPE: dict[str, Any] = {
    "s": {"S": "text ≥ ünïcode"}, "empty": {"S": ""}, "n": {"N": "-12.50"}, "b": {"B": b"\x00\xffbinary"},
    "ss": {"SS": ["a", "b"]}, "ns": {"NS": ["1", "2.5"]}, "bs": {"BS": [b"\x01", b"\x02"]},
    "null": {"NULL": True}, "yes": {"BOOL": True}, "no": {"BOOL": False},
    "m": {"M": {"inner": {"L": [{"S": "x"}, {"N": "3"}, {"B": b"\x03"}, {"M": {}}, {"L": []}]}}},
}


def _key(partition: str, name: str) -> dict[str, dict[str, str]]:
    return {PARTITION_KEY: {"S": partition}, SORT_KEY: {"S": name}}


def _query(db: Any, table: str, partition: str, **more: Any) -> list[dict[str, Any]]:
    kwargs = {"TableName": table, "KeyConditionExpression": "#pk = :pk AND begins_with(#sk, :p)",
              "ExpressionAttributeNames": {"#pk": PARTITION_KEY, "#sk": SORT_KEY},
              "ExpressionAttributeValues": {":pk": {"S": partition}, ":p": {"S": "ITEM#"}}, **more}
    items: list[dict[str, Any]] = []
    while True:
        page = db.query(**kwargs)
        items += page["Items"]
        if "LastEvaluatedKey" not in page:
            return items
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def test_query_scan_and_batch_get_give_back_every_type_as_written(aws: EmbeddedAws) -> None:
    db, table = aws.clients.client("dynamodb"), aws.table_name
    item = _key("TYPES", "ITEM#1") | EVERY_TYPE
    db.put_item(TableName=table, Item=item)
    db.put_item(TableName=table, Item=_key("TYPES", "OTHER#1") | {"s": {"S": "not an ITEM#"}})

    def normal(found: dict[str, Any]) -> dict[str, Any]:  # sets are unordered
        return {k: ({t: sorted(v) for t, v in found[k].items()} if k in ("ss", "ns", "bs") else v)
                for k, v in found.items()}

    assert [normal(i) for i in _query(db, table, "TYPES")] == [normal(item)]
    scanned = db.scan(TableName=table, FilterExpression="#pk = :pk", ExpressionAttributeNames={"#pk": PARTITION_KEY},
                      ExpressionAttributeValues={":pk": {"S": "TYPES"}})["Items"]
    assert sorted(i[SORT_KEY]["S"] for i in scanned) == ["ITEM#1", "OTHER#1"]
    assert normal(next(i for i in scanned if i[SORT_KEY]["S"] == "ITEM#1")) == normal(item)
    got = db.batch_get_item(RequestItems={table: {"Keys": [_key("TYPES", "ITEM#1"), _key("TYPES", "ITEM#9")]}})
    assert [normal(i) for i in got["Responses"][table]] == [normal(item)]
    assert db.get_item(TableName=table, Key=_key("TYPES", "ITEM#1"))["Item"]["b"] == {"B": b"\x00\xffbinary"}


def test_pages_filters_and_projections_as_dynamodb_answers_them(aws: EmbeddedAws) -> None:
    db, table = aws.clients.client("dynamodb"), aws.table_name
    text = "x" * 4000  # ~300 items make more than one 1 MB page
    for n in range(300):
        db.put_item(TableName=table, Item=_key("PAGES", f"ITEM#{n:04d}") | {"n": {"N": str(n)}, "t": {"S": text}})
    assert [int(i["n"]["N"]) for i in _query(db, table, "PAGES")] == list(range(300))
    assert db.query(TableName=table, KeyConditionExpression="#pk = :pk",
                    ExpressionAttributeNames={"#pk": PARTITION_KEY},
                    ExpressionAttributeValues={":pk": {"S": "PAGES"}}).get("LastEvaluatedKey")
    odd = _query(db, table, "PAGES", FilterExpression="n > :k", ProjectionExpression="n",
                 ExpressionAttributeValues={":pk": {"S": "PAGES"}, ":p": {"S": "ITEM#"}, ":k": {"N": "296"}})
    assert odd == [{"n": {"N": "297"}}, {"n": {"N": "298"}}, {"n": {"N": "299"}}]
    counted = db.query(TableName=table, KeyConditionExpression="#pk = :pk", Select="COUNT", Limit=5,
                       ExpressionAttributeNames={"#pk": PARTITION_KEY},
                       ExpressionAttributeValues={":pk": {"S": "PAGES"}})
    assert counted["Count"] == 5 and "Items" not in counted


def test_a_query_answer_is_not_walked_attribute_by_attribute(aws: EmbeddedAws,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from moto.core import serialize

    db, table = aws.clients.client("dynamodb"), aws.table_name
    for n in range(40):
        db.put_item(TableName=table, Item=_key("WALK", f"ITEM#{n:04d}") | EVERY_TYPE)
    walked: list[int] = []
    original = serialize.JSONSerializer._serialize_type_map

    def counted(self: Any, *args: Any) -> None:
        walked.append(1)
        original(self, *args)

    monkeypatch.setattr(serialize.JSONSerializer, "_serialize_type_map", counted)

    def walks(call: Any, *args: Any) -> int:
        walked.clear()
        call(*args)
        return len(walked)

    def batch(n: int) -> None:
        keys = [_key("WALK", f"ITEM#{i:04d}") for i in range(n)]
        assert len(db.batch_get_item(RequestItems={table: {"Keys": keys}})["Responses"][table]) == n

    def query(prefix: str, n: int) -> None:
        assert len(_query(db, table, "WALK", ExpressionAttributeValues={
            ":pk": {"S": "WALK"}, ":p": {"S": prefix}})) == n

    assert walks(query, "ITEM#", 40) == walks(query, "ITEM#0001", 1)
    assert walks(batch, 40) == walks(batch, 1)


def test_a_query_reads_its_key_range_in_order_either_way(aws: EmbeddedAws) -> None:
    db, table = aws.clients.client("dynamodb"), aws.table_name
    for name in ("A#1", "B#1", "B#2", "B#3", "C#1"):
        db.put_item(TableName=table, Item=_key("RANGE", name))
    db.put_item(TableName=table, Item=_key("RANGE-OTHER", "B#4"))

    def keys(condition: str, values: dict[str, Any], forward: bool = True) -> list[str]:
        found = db.query(TableName=table, KeyConditionExpression=f"#pk = :pk{condition}", ScanIndexForward=forward,
                         ExpressionAttributeNames={"#pk": PARTITION_KEY, **({"#sk": SORT_KEY} if values else {})},
                         ExpressionAttributeValues={":pk": {"S": "RANGE"}, **values})["Items"]
        return [i[SORT_KEY]["S"] for i in found]

    assert keys("", {}) == ["A#1", "B#1", "B#2", "B#3", "C#1"]
    assert keys(" AND begins_with(#sk, :p)", {":p": {"S": "B#"}}, forward=False) == ["B#3", "B#2", "B#1"]
    assert keys(" AND #sk BETWEEN :a AND :b", {":a": {"S": "B#2"}, ":b": {"S": "C#1"}}) == ["B#2", "B#3", "C#1"]
    assert keys(" AND #sk > :a", {":a": {"S": "B#3"}}) == ["C#1"]
    assert keys(" AND begins_with(#sk, :p)", {":p": {"S": "D#"}}) == []


def test_a_query_does_not_look_at_sort_keys_outside_its_range(aws: EmbeddedAws,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """DynamoDB reads a Query's key range, so its cost does not grow with the other items of the partition (the
    packer's claims beside thousands of pod assignments)."""
    from moto.dynamodb.models.dynamo_type import DynamoType

    db, table = aws.clients.client("dynamodb"), aws.table_name
    for n in range(200):
        db.put_item(TableName=table, Item=_key("BESIDE", f"OTHER#{n:04d}"))
    for n in range(3):
        db.put_item(TableName=table, Item=_key("BESIDE", f"ITEM#{n:04d}"))
    compared: list[int] = []
    original = DynamoType.compare

    def counted(self: Any, *args: Any) -> bool:
        compared.append(1)
        return original(self, *args)

    monkeypatch.setattr(DynamoType, "compare", counted)
    assert len(_query(db, table, "BESIDE")) == 3
    assert len(compared) <= 3
