"""Starting and stopping the embedded AWS: ports, clean state, one server per process."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

import pytest

from gpu_autoscaler.emulator.aws import EmbeddedAws, EmulatorError

if TYPE_CHECKING:
    from gpu_autoscaler.config import Config


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_given_port_is_used_and_every_start_begins_from_an_empty_account(example_config: Config) -> None:
    port = _free_port()
    with EmbeddedAws(example_config, port=port) as first:
        assert first.endpoint_url == f"http://127.0.0.1:{port}"
        sqs = first.clients.client("sqs")
        sqs.send_message(QueueUrl=first.queue_url("launch"), MessageBody="left behind")
    with EmbeddedAws(example_config) as second:
        sqs = second.clients.client("sqs")
        assert sqs.receive_message(QueueUrl=second.queue_url("launch")).get("Messages", []) == []
        vpcs = second.clients.client("ec2").describe_vpcs(Filters=[{"Name": "tag:Name", "Values": ["*"]}])["Vpcs"]
        assert [v["VpcId"] for v in vpcs] == [second.resources.vpc_id]


def test_a_taken_port_is_an_error_not_a_hang(example_config: Config) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(EmulatorError, match=f"127.0.0.1:{port}"):
            EmbeddedAws(example_config, port=port).start()
    # The failed start released the process's one slot.
    with EmbeddedAws(example_config) as embedded:
        assert embedded.owns_server


def test_visibility_timeout_override_applies_to_every_work_queue(example_config: Config) -> None:
    with EmbeddedAws(example_config, visibility_timeout=1) as embedded:
        sqs = embedded.clients.client("sqs")
        for logical in ("pending-pods", "interruption", "launch", "drain"):
            attributes = sqs.get_queue_attributes(QueueUrl=embedded.queue_url(logical), AttributeNames=["All"])
            assert attributes["Attributes"]["VisibilityTimeout"] == "1"


def test_properties_before_start_say_it_is_not_started(example_config: Config) -> None:
    embedded = EmbeddedAws(example_config)
    with pytest.raises(EmulatorError, match="not started"):
        _ = embedded.endpoint_url
    embedded.stop()  # stopping what never started is harmless
