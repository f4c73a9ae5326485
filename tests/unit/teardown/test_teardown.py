"""The stack's deletion hook: on Delete, while CloudFormation deletes the stack, every instance the stack's
functions launched is terminated, and the hook completes only once EC2 shows none left; Create and Update do
nothing; a Delete that is no stack deletion (an update's rollback or cleanup) terminates nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from gpu_autoscaler.adapters.memory.compute import MemoryCompute, MemoryInstance
from gpu_autoscaler.errors import RequestThrottled
from gpu_autoscaler.models.labels import TAG_CLUSTER
from gpu_autoscaler.services.teardown import TeardownHook, TeardownRefused

if TYPE_CHECKING:
    from collections.abc import Sequence

CLUSTER = "ml-prod"
STACK = "arn:aws:cloudformation:us-east-1:111122223333:stack/ml-prod-gpu-autoscaler/5b918d10-cd98-11ea-90d5"
PHYSICAL_ID = f"{CLUSTER}-gpu-autoscaler-teardown"


class Stacks:
    def __init__(self, status: str) -> None:
        self.status_now = status
        self.asked: list[str] = []

    def status(self, stack_id: str) -> str:
        self.asked.append(stack_id)
        return self.status_now


class Protected(MemoryCompute):
    """EC2 refuses these (termination protection: `OperationNotPermitted`); the adapter reports them not done."""

    protected: frozenset[str] = frozenset()

    def terminate(self, instance_ids: Sequence[str], *, unknown_is_gone: bool = False) -> list[str]:
        return super().terminate([i for i in instance_ids if i not in self.protected], unknown_is_gone=unknown_is_gone)


def event(request: str, **extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"RequestType": request, "StackId": STACK, "RequestId": "r-1",
                            "LogicalResourceId": "TeardownInstances", "ResourceType": "Custom::TerminateInstances",
                            "ResourceProperties": {"ServiceToken": "arn:aws:lambda:…", "ClusterName": CLUSTER}}
    if request != "Create":
        base["PhysicalResourceId"] = PHYSICAL_ID
    return base | extra


def add(compute: MemoryCompute, instance_id: str, state: str = "running", cluster: str = CLUSTER) -> None:
    compute.instances[instance_id] = MemoryInstance(instance_id, "p5.48xlarge", "us-east-1a", "on-demand",
                                                    {TAG_CLUSTER: cluster}, state=state)


def hook(compute: MemoryCompute, status: str = "DELETE_IN_PROGRESS") -> TeardownHook:
    return TeardownHook(CLUSTER, inventory=compute, compute=compute, stacks=Stacks(status))


@pytest.mark.parametrize("request_type", ["Create", "Update"])
def test_create_and_update_terminate_nothing_and_keep_one_physical_id(request_type: str) -> None:
    """A new physical id on Update would make CloudFormation replace the resource and send the old one a Delete
    ("If the value returned is different, AWS CloudFormation recognizes the update as a replacement and sends a
    delete request to the old resource", custom resource Delete request reference)."""
    compute = MemoryCompute(CLUSTER)
    add(compute, "i-running")
    teardown = hook(compute)
    assert teardown.on_event(event(request_type)) == {"PhysicalResourceId": PHYSICAL_ID}
    assert teardown.is_complete(event(request_type)) == {"IsComplete": True}
    assert compute.terminations == []


def test_stack_deletion_terminates_every_live_owned_instance_and_waits_until_ec2_shows_none() -> None:
    compute = MemoryCompute(CLUSTER)
    for state in ("pending", "running", "stopping", "stopped"):
        add(compute, f"i-{state}", state)
    add(compute, "i-ending", "shutting-down")
    add(compute, "i-gone", "terminated")
    add(compute, "i-other", cluster="ml-dev")
    teardown = hook(compute)

    assert teardown.on_event(event("Delete")) == {"PhysicalResourceId": PHYSICAL_ID}
    assert compute.terminations == [["i-pending", "i-running", "i-stopping", "i-stopped"]]
    assert compute.instances["i-other"].state == "running"
    assert teardown.is_complete(event("Delete")) == {"IsComplete": False}  # i-ending still shutting down
    compute.instances["i-ending"].state = "terminated"
    assert teardown.is_complete(event("Delete")) == {"IsComplete": True}
    assert compute.terminations == [["i-pending", "i-running", "i-stopping", "i-stopped"]]


def test_an_instance_launched_meanwhile_is_terminated_while_waiting() -> None:
    """A launch in flight when its function was deleted can still land: each poll ends what it finds."""
    compute = MemoryCompute(CLUSTER)
    teardown = hook(compute)
    teardown.on_event(event("Delete"))
    add(compute, "i-late", "pending")
    assert teardown.is_complete(event("Delete")) == {"IsComplete": False}
    assert compute.terminations == [["i-late"]]
    assert teardown.is_complete(event("Delete")) == {"IsComplete": True}


def test_an_instance_ec2_will_not_terminate_fails_the_deletion_naming_it() -> None:
    compute = Protected(CLUSTER)
    compute.protected = frozenset({"i-protected"})
    add(compute, "i-protected")
    add(compute, "i-fine")
    with pytest.raises(TeardownRefused, match="i-protected") as raised:
        hook(compute).on_event(event("Delete"))
    assert "i-fine" not in str(raised.value) and "termination protection" in str(raised.value)
    assert compute.instances["i-fine"].state == "terminated"


@pytest.mark.parametrize("status", ["UPDATE_ROLLBACK_IN_PROGRESS", "UPDATE_COMPLETE_CLEANUP_IN_PROGRESS",
                                    "IMPORT_ROLLBACK_IN_PROGRESS"])
def test_a_delete_that_is_no_stack_deletion_terminates_nothing(status: str) -> None:
    """CloudFormation also sends Delete when an update that added the resource rolls back, or when an update
    removed or replaced it: the cluster's nodes stay."""
    compute = MemoryCompute(CLUSTER)
    add(compute, "i-running")
    teardown = hook(compute, status)
    teardown.on_event(event("Delete"))
    assert teardown.is_complete(event("Delete")) == {"IsComplete": True}
    assert compute.terminations == [] and compute.instances["i-running"].state == "running"


def test_a_failed_first_deploy_rolling_back_terminates_what_it_launched() -> None:
    compute = MemoryCompute(CLUSTER)
    add(compute, "i-running")
    hook(compute, "ROLLBACK_IN_PROGRESS").on_event(event("Delete"))
    assert compute.instances["i-running"].state == "terminated"


def test_throttled_termination_is_tried_again_at_the_next_poll() -> None:
    compute = MemoryCompute(CLUSTER)
    add(compute, "i-running")
    teardown = hook(compute)

    def throttled(instance_ids: Sequence[str], *, unknown_is_gone: bool = False) -> list[str]:
        raise RequestThrottled("TerminateInstances throttled: Request limit exceeded.")

    real = compute.terminate
    compute.terminate = throttled  # type: ignore[method-assign]
    assert teardown.on_event(event("Delete")) == {"PhysicalResourceId": PHYSICAL_ID}
    assert teardown.is_complete(event("Delete")) == {"IsComplete": False}
    compute.terminate = real  # type: ignore[method-assign]
    assert teardown.is_complete(event("Delete")) == {"IsComplete": False}
    assert teardown.is_complete(event("Delete")) == {"IsComplete": True}
