"""`gpu-autoscaler doctor`'s check of the account's default EBS key, which every node volume is encrypted with.

The launch templates set `Encrypted` with no `KmsKeyId`, so EC2 uses the account's default EBS key: a customer
managed one the launching principals may not use ends each instance right after launch.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from gpu_autoscaler.cli.doctor_checks import check_ebs_default_key
from gpu_autoscaler.cli.doctor_context import DoctorContext
from gpu_autoscaler.config import parse_config
from tests.conftest import example_config_data

CONFIG = parse_config(example_config_data())
KEY_ARN = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"


def _refused(operation: str) -> ClientError:
    return ClientError({"Error": {"Code": "AccessDeniedException", "Message": "no"}}, operation)


class _Account:
    """EC2's GetEbsDefaultKmsKeyId and KMS's DescribeKey of an account whose default EBS key is `key_id`."""

    def __init__(self, key_id: str, manager: str | None = "CUSTOMER") -> None:
        self.key_id, self.manager = key_id, manager

    def client(self, service: str) -> Any:
        account = self

        class Ec2:
            def get_ebs_default_kms_key_id(self) -> dict[str, Any]:
                return {"KmsKeyId": account.key_id}

        class Kms:
            def describe_key(self, KeyId: str) -> dict[str, Any]:  # noqa: N803 - boto3's argument name
                assert KeyId == account.key_id
                if account.manager is None:
                    raise _refused("DescribeKey")
                return {"KeyMetadata": {"Arn": KEY_ARN, "KeyManager": account.manager}}

        return {"ec2": Ec2, "kms": Kms}[service]()


def _check(account: _Account) -> Any:
    [check] = check_ebs_default_key(DoctorContext(CONFIG, account, None))  # type: ignore[arg-type]
    return check


def test_a_customer_managed_default_key_warns_naming_the_key_and_the_grants() -> None:
    check = _check(_Account(KEY_ARN))
    assert check.status == "warn"
    assert KEY_ARN in check.detail and "customer managed" in check.detail
    assert "terminate" in check.detail
    assert "fleet function's role" in check.fix and "AWSServiceRoleForEC2Spot" in check.fix  # the example has Spot
    assert "kms:CreateGrant" in check.fix and "kms:GenerateDataKeyWithoutPlaintext" in check.fix


def test_the_aws_managed_key_passes() -> None:
    assert _check(_Account("alias/aws/ebs")).status == "pass"
    assert _check(_Account(KEY_ARN, manager="AWS")).status == "pass"


def test_a_key_that_cannot_be_described_warns_with_its_id() -> None:
    check = _check(_Account(KEY_ARN, manager=None))
    assert check.status == "warn" and KEY_ARN in check.detail and "kms:DescribeKey" in check.fix
