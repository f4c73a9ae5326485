"""The pipeline running locally: Lambda's part (pollers, schedules), EventBridge's (rules), EC2's (boots, events).

`PipelineRuntime` drives the functions over an embedded AWS exactly as the stack wires them in AWS:

- a `QueuePoller` per work queue whose function exists (batch size and window from `gpu_autoscaler.wiring`);
- the `ScheduleRunner` for the schedules read back from the endpoint (rates compressed by `speed`);
- EventBridge rules: moto routes `PutEvents` to the interruption queue by the rules `provision` created;
- the `InstanceWatcher`: instances boot into nodes (through `nodes`, the simulated kubelets) and every
  state change is put on the bus.

It starts and stops these threads; it does not own the embedded AWS or the Kubernetes side, which the
emulator command and the demo compose around it. A function whose handler is not written yet is reported
(`missing`) and its queue is left unconsumed, so its messages wait as they would for a disabled mapping.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.emulator.instances import BOOT_DELAY_SECONDS, InstanceWatcher
from gpu_autoscaler.emulator.lambdas import LambdaHost, concurrency
from gpu_autoscaler.emulator.pollers import QueuePoller
from gpu_autoscaler.emulator.resources import DLQ_SUFFIX, SCHEDULER_DLQ
from gpu_autoscaler.emulator.schedules import ScheduleRunner
from gpu_autoscaler.emulator.triggers import read_schedules
from gpu_autoscaler.lambda_context import DEFAULT_ACCOUNT
from gpu_autoscaler.wiring import QUEUES, consumer

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path
    from typing import TextIO

    from gpu_autoscaler.emulator.aws import EmbeddedAws
    from gpu_autoscaler.emulator.instances import NodeSide
    from gpu_autoscaler.emulator.lambdas import Invocation

__all__ = ["DeadLetter", "PipelineRuntime"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeadLetter:
    queue: str
    """The DLQ's logical name (`pending-pods-dlq`, …, `scheduler-dlq`)."""
    message_id: str
    body: str
    receive_count: int


class PipelineRuntime:
    def __init__(
        self,
        aws: EmbeddedAws,
        *,
        nodes: NodeSide | None = None,
        speed: float = 1.0,
        boot_delay: float = BOOT_DELAY_SECONDS,
        functions_dir: Path | None = None,
        log_stream: TextIO | None = None,
        poll_wait_seconds: int = 2,
        function_timeouts: Mapping[str, int] | None = None,
    ) -> None:
        """`nodes` boots instances into Nodes (None: no Kubernetes side) after `boot_delay` seconds of emulated
        time (divided by `speed`); `log_stream` takes the handlers' output; `function_timeouts` replaces the
        stack's timeout of some functions (`LambdaHost.timeouts`)."""
        if speed <= 0:
            raise ValueError(f"speed must be positive, got {speed}")
        self.aws = aws
        self.speed = speed
        self.host = LambdaHost(aws, functions_dir=functions_dir, log_stream=log_stream,
                               timeouts=dict(function_timeouts or {}))
        sqs = aws.clients.client("sqs")
        self._sqs = sqs
        self.pollers = {
            queue: QueuePoller(
                self.host, sqs, queue, aws.queue_url(queue), aws.queue_arn(queue), consumer(queue),
                wait_seconds=poll_wait_seconds, workers=concurrency(consumer(queue).name),
            )
            for queue in QUEUES
            if self.host.present(consumer(queue).name)
        }
        schedules = [s for s in read_schedules(aws.clients, aws.names) if self.host.present(s.function)]
        self.scheduler = ScheduleRunner(
            self.host, schedules, aws.clients.client("sqs"), aws.queue_url(SCHEDULER_DLQ), speed=speed
        )
        self.instances = InstanceWatcher(
            aws.clients.client("ec2"), aws.clients.client("events"), aws.config.cluster_name, aws.config.region,
            DEFAULT_ACCOUNT, nodes, boot_delay=boot_delay / speed,
        )
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # ---- lifecycle -----------------------------------------------------------------------------------------

    def start(self) -> PipelineRuntime:
        if self._threads:
            raise RuntimeError("the pipeline runtime is already started")
        self._stop.clear()
        targets: list[tuple[str, Callable[[threading.Event], None]]] = [
            (f"poller-{queue}-{n}", poller.run) for queue, poller in self.pollers.items() for n in range(poller.workers)
        ]
        targets += [("scheduler", self.scheduler.run), ("ec2-instances", self.instances.run)]
        for name, target in targets:
            thread = threading.Thread(target=target, args=(self._stop,), name=f"emulator-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self._threads = []

    def __enter__(self) -> PipelineRuntime:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- observing -----------------------------------------------------------------------------------------

    def on_invocation(self, listener: Callable[[Invocation], None]) -> None:
        self.host.listeners.append(listener)

    @property
    def missing(self) -> list[str]:
        """Functions of the stack whose handler is not written yet (their triggers are not driven)."""
        return self.host.missing()

    def queue_depths(self) -> dict[str, tuple[int, int, int]]:
        """Logical name → (visible, in flight, delayed), for every queue and DLQ."""
        depths = {}
        for logical, url in self.aws.queue_urls.items():
            attributes = self._sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
                "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
                "ApproximateNumberOfMessagesDelayed",
            ])["Attributes"]
            depths[logical] = (
                int(attributes.get("ApproximateNumberOfMessages", 0)),
                int(attributes.get("ApproximateNumberOfMessagesNotVisible", 0)),
                int(attributes.get("ApproximateNumberOfMessagesDelayed", 0)),
            )
        return depths

    def idle(self) -> bool:
        """No work queue holds a message (visible, in flight or delayed) and no poller is settling a batch."""
        depths = self.queue_depths()
        if any(sum(depths[q]) for q in QUEUES if q in self.pollers):
            return False
        return not any(p.busy for p in self.pollers.values())

    def wait_until(self, condition: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return True
            time.sleep(interval)
        return condition()

    def dead_letters(self) -> list[DeadLetter]:
        """Every message in a dead-letter queue, peeked (received with visibility 0, so it stays)."""
        letters = []
        for logical in [*(q + DLQ_SUFFIX for q in QUEUES), SCHEDULER_DLQ]:
            url = self.aws.queue_url(logical)
            seen: set[str] = set()
            for _ in range(10):
                messages = self._sqs.receive_message(
                    QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0, WaitTimeSeconds=0,
                    MessageSystemAttributeNames=["ApproximateReceiveCount"],
                ).get("Messages", [])
                fresh = [m for m in messages if m["MessageId"] not in seen]
                if not fresh:
                    break
                for message in fresh:
                    seen.add(message["MessageId"])
                    letters.append(DeadLetter(
                        logical, message["MessageId"], message["Body"],
                        int(message.get("Attributes", {}).get("ApproximateReceiveCount", 0)),
                    ))
        return letters

    def put_event(self, source: str, detail_type: str, detail: dict[str, Any], resources: list[str]) -> str:
        """Put one event on the default bus, as an AWS service would; the stack's rules route it."""
        result = self.aws.clients.client("events").put_events(Entries=[{
            "Source": source, "DetailType": detail_type, "Detail": json.dumps(detail), "Resources": resources,
        }])
        entry = result["Entries"][0]
        if "EventId" not in entry:
            raise ValueError(f"event rejected: {entry.get('ErrorCode')}: {entry.get('ErrorMessage')}")
        return str(entry["EventId"])
