"""DynamoDB answers concurrent requests one at a time as far as a client can tell; moto does not: its
TransactWriteItems deep-copies the table while another request thread writes it, and answers HTTP 500
("dictionary changed size during iteration"). The functions run side by side in the emulator, so the emulator
hands moto one DynamoDB request at a time."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import boto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError

from gpu_autoscaler.naming import PARTITION_KEY, SORT_KEY

if TYPE_CHECKING:
    from gpu_autoscaler.emulator.aws import EmbeddedAws


def test_transactions_and_writes_from_many_threads_get_no_server_error(aws: EmbeddedAws) -> None:
    table = aws.table_name
    errors: list[str] = []

    def client() -> object:
        return boto3.client("dynamodb", endpoint_url=aws.endpoint_url, region_name=aws.config.region,
                            aws_access_key_id="testing", aws_secret_access_key="testing",
                            config=BotoConfig(retries={"max_attempts": 1, "mode": "standard"}))

    def item(key: str) -> dict[str, dict[str, str]]:
        return {PARTITION_KEY: {"S": "CLUSTER#race"}, SORT_KEY: {"S": key}, "blob": {"S": "x" * 200}}

    def writer(n: int) -> None:
        db = client()
        for i in range(150):
            try:
                if n % 2:
                    db.transact_write_items(TransactItems=[{"Put": {"TableName": table, "Item": item(f"T#{n}#{i}")}}])  # type: ignore[attr-defined]
                else:
                    db.put_item(TableName=table, Item=item(f"P#{n}#{i}"))  # type: ignore[attr-defined]
            except ClientError as error:
                errors.append(str(error))

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert not errors, errors[:3]
