"""`gpu-autoscaler doctor`'s Lambda concurrency check: the stack's reservations against what the account can reserve.

A reservation the account cannot give fails `cdk deploy` ("Specified ReservedConcurrentExecutions for function
decreases account's UnreservedConcurrentExecution below its minimum value of [10]"): doctor says so first.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from gpu_autoscaler.cli.doctor_checks import DoctorContext, check_lambda_concurrency
from gpu_autoscaler.config import parse_config
from gpu_autoscaler.naming import ResourceNames
from tests.conftest import example_config_data

CONFIG = parse_config(example_config_data())
NAMES = ResourceNames(CONFIG.cluster_name)


class _Lambda:
    """GetAccountSettings and GetFunctionConcurrency of an account (`deployed`: the reservations already held)."""

    def __init__(self, total: int, unreserved: int, deployed: dict[str, int] | None = None,
                 refused: bool = False) -> None:
        self.total, self.unreserved, self.deployed, self.refused = total, unreserved, deployed, refused

    def get_account_settings(self) -> dict[str, Any]:
        if self.refused:
            raise ClientError({"Error": {"Code": "AccessDeniedException", "Message": "no"}}, "GetAccountSettings")
        return {"AccountLimit": {"ConcurrentExecutions": self.total,
                                 "UnreservedConcurrentExecutions": self.unreserved}}

    def get_function_concurrency(self, FunctionName: str) -> dict[str, Any]:  # noqa: N803 - boto3's argument name
        if self.deployed is None:
            raise ClientError({"Error": {"Code": "ResourceNotFoundException", "Message": "Function not found"}},
                              "GetFunctionConcurrency")
        held = self.deployed.get(FunctionName)
        return {"ReservedConcurrentExecutions": held} if held is not None else {}


class _Clients:
    def __init__(self, lambda_: _Lambda) -> None:
        self.lambda_ = lambda_

    def client(self, service: str) -> Any:
        assert service == "lambda"
        return self.lambda_


def _check(lambda_: _Lambda) -> Any:
    [check] = check_lambda_concurrency(DoctorContext(CONFIG, _Clients(lambda_), None))  # type: ignore[arg-type]
    return check


def test_a_new_accounts_small_concurrency_fails_with_the_quota_increase_to_ask_for() -> None:
    check = _check(_Lambda(total=10, unreserved=10))
    assert check.status == "fail"
    assert "reserves 2" in check.detail and "prewarm 1" in check.detail and "consolidate 1" in check.detail
    assert "cdk deploy would fail" in check.detail
    assert "--service-code lambda --quota-code L-B99A9384 --desired-value 102" in check.fix


def test_other_functions_reservations_count_against_the_100_lambda_keeps_unreserved() -> None:
    check = _check(_Lambda(total=1000, unreserved=101))
    assert check.status == "fail" and "at most 1" in check.detail
    assert "--desired-value 1001" in check.fix
    assert _check(_Lambda(total=1000, unreserved=102)).status == "pass"


def test_an_account_with_room_passes() -> None:
    check = _check(_Lambda(total=1000, unreserved=1000))
    assert check.status == "pass" and "reserves 2 of 1000" in check.detail


def test_a_deployed_stacks_own_reservations_are_room_it_already_holds() -> None:
    held = {NAMES.function("prewarm"): 1, NAMES.function("consolidate"): 1}
    assert _check(_Lambda(total=1000, unreserved=100, deployed=held)).status == "pass"
    assert _check(_Lambda(total=1000, unreserved=100, deployed={})).status == "fail"


def test_settings_that_cannot_be_read_warn_with_the_permission_to_allow() -> None:
    check = _check(_Lambda(total=1000, unreserved=1000, refused=True))
    assert check.status == "warn" and "AccessDeniedException" in check.detail
    assert "lambda:GetAccountSettings" in check.fix
