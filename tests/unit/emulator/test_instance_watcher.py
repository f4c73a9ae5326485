"""The emulator's instance watcher hands each launched instance to the simulated kubelets once it has booted.

A real instance boots whatever the EC2 API answers meanwhile: its kubelet reads user data from the instance
metadata service, not from an API that throttles (EC2 User Guide, "Run commands when you launch an EC2
instance with user data input"). The simulated kubelet reads it through the API, so under the chaos suite's
throttling its read can be refused: the boot is tried again, never dropped (the 200-pod throttling soak left a
Launched claim whose node never registered, and two pods pending, after one such refusal)."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from gpu_autoscaler.emulator.instances import InstanceWatcher, LaunchedInstance
from gpu_autoscaler.models.labels import TAG_CLUSTER


class _Events:
    def put_events(self, **_: Any) -> None:
        return None


class _Kubelets:
    """Refuses its first boot as a throttled EC2 read would."""

    def __init__(self) -> None:
        self.tries: list[str] = []
        self.booted: list[str] = []

    def boot(self, instance: LaunchedInstance) -> None:
        self.tries.append(instance.instance_id)
        if len(self.tries) == 1:
            raise ClientError({"Error": {"Code": "RequestLimitExceeded", "Message": "Request limit exceeded."}},
                              "DescribeInstances")
        self.booted.append(instance.instance_id)

    def stop(self, instance: LaunchedInstance) -> None:
        raise AssertionError("not stopped")

    def shutdown(self, instance: LaunchedInstance) -> None:
        raise AssertionError("not terminated")


def test_a_boot_refused_by_a_throttled_read_is_tried_again() -> None:
    kubelets = _Kubelets()
    watcher = InstanceWatcher(_States(), _Events(), "ml-prod", "us-east-1", "123456789012", kubelets, boot_delay=0.0,
                              interval=0.0)
    for _ in range(3):
        try:
            watcher.poll_once()
        except ClientError:
            pass  # `run` logs it and polls again
    assert kubelets.booted == ["i-0abc"]
    assert watcher.booted() == {"i-0abc"}


class _States:
    """DescribeInstances answering the instance in each state it is set to."""

    def __init__(self) -> None:
        self.state = "running"

    def get_paginator(self, name: str) -> Any:
        assert name == "describe_instances"
        instance = {"InstanceId": "i-0abc", "InstanceType": "g6.xlarge", "State": {"Name": self.state},
                    "Placement": {"AvailabilityZone": "us-east-1a"},
                    "Tags": [{"Key": TAG_CLUSTER, "Value": "ml-prod"}]}

        class _Pages:
            def paginate(self, **_: Any) -> list[dict[str, Any]]:
                return [{"Reservations": [{"Instances": [instance]}]}]

        return _Pages()


class _Journal:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def boot(self, instance: LaunchedInstance) -> None:
        self.calls.append(f"boot {instance.state}")

    def stop(self, instance: LaunchedInstance) -> None:
        self.calls.append(f"stop {instance.state}")

    def shutdown(self, instance: LaunchedInstance) -> None:
        self.calls.append(f"shutdown {instance.state}")


def test_a_node_goes_with_a_terminated_instance_only_and_a_stopped_ones_kubelet_stops() -> None:
    """The cloud controller manager deletes a Node once its instance no longer exists (AWS: terminated); a
    stopping or stopped instance's Node stays (its kubelet down), and one shutting down keeps it until then."""
    ec2, journal = _States(), _Journal()
    watcher = InstanceWatcher(ec2, _Events(), "ml-prod", "us-east-1", "123456789012", journal, boot_delay=0.0,
                              interval=0.0)
    for state in ("running", "stopping", "stopped", "running", "shutting-down", "terminated"):
        ec2.state = state
        watcher.poll_once()
    assert journal.calls == ["boot running", "stop stopping", "boot running", "shutdown terminated"]
