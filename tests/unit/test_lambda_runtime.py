"""What a function does as Lambda's runtime runs it: its services' logs reach its log, a record that fails is
logged, records are started only while one stalled call still fits, its metrics go to its cluster's namespace.

Lambda's Python runtime puts one handler on the root logger before it imports `handler.py`, and sets the root
logger's level only from the function's application log level (advanced logging controls: `AWS_LAMBDA_LOG_LEVEL`);
without one the root stays at the standard library's WARNING. Powertools' Logger then adds a filter to that root
handler. The services and adapters log through the standard library (`gpu_autoscaler.services.fleet`, …), so
both decide whether a CloudWatch reader ever sees "CreateFleet refused" or a consolidation decision. Each case runs
in a fresh process set up as the runtime sets it up, with the log level and variables the stack configures.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpu_autoscaler.batch_failures import RECORD_RESERVE_SECONDS
from gpu_autoscaler.naming import FUNCTIONS, ResourceNames
from gpu_autoscaler.wiring import APPLICATION_LOG_LEVEL, FUNCTION_WIRING

ROOT = Path(__file__).resolve().parents[2]

RUNTIME = textwrap.dedent("""
    import importlib.util, io, logging, os, sys
    os.environ.update(TABLE_NAME="t", CONFIG_PARAMETER="/p", AWS_REGION="us-east-1", AWS_DEFAULT_REGION="us-east-1",
                      POWERTOOLS_TRACE_DISABLED="true", AWS_LAMBDA_LOG_LEVEL=sys.argv[2], AWS_LAMBDA_LOG_FORMAT="JSON",
                      POWERTOOLS_METRICS_NAMESPACE="GpuAutoscaler/ml-prod")
    # awslambdaric's bootstrap (_setup_logging): one handler on the root logger, the root's level only when
    # AWS_LAMBDA_LOG_LEVEL names a level.
    sink = io.StringIO()
    root = logging.getLogger()
    root.addHandler(logging.StreamHandler(sink))
    if sys.argv[2] in logging._nameToLevel:
        root.setLevel(sys.argv[2])
    spec = importlib.util.spec_from_file_location("handler", f"functions/{sys.argv[1]}/handler.py")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    logging.getLogger(f"gpu_autoscaler.services.{sys.argv[1]}").info("MARK from the service")
    print("SEEN" if "MARK from the service" in sink.getvalue() else "LOST")
""")


@pytest.mark.parametrize("function", FUNCTIONS)
def test_a_services_info_line_reaches_the_functions_log(function: str) -> None:
    """The service module of each function shares its name (`fleet` → `gpu_autoscaler.services.fleet`): Powertools'
    root-handler filter drops every record whose logger name contains the Logger's service name."""
    out = subprocess.run(
        [sys.executable, "-c", RUNTIME, function, APPLICATION_LOG_LEVEL],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": f"{ROOT / 'layers' / 'core'}:{ROOT}", "PATH": "/usr/bin:/bin"},
    )
    assert out.stdout.strip().splitlines()[-1:] == ["SEEN"], out.stderr[-2000:]


FAILING_RECORD = textwrap.dedent("""
    import importlib.util, json, os, sys
    os.environ.update(TABLE_NAME="t", CONFIG_PARAMETER="/p", AWS_REGION="us-east-1", AWS_DEFAULT_REGION="us-east-1",
                      POWERTOOLS_TRACE_DISABLED="true", AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="x",
                      POWERTOOLS_METRICS_NAMESPACE=sys.argv[3])
    from gpu_autoscaler.lambda_context import local_context
    function, sample = sys.argv[1:3]
    spec = importlib.util.spec_from_file_location("handler", f"functions/{function}/handler.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    class Broken:
        def __getattr__(self, name):
            raise KeyError(f"InstanceId missing from the answer ({name})")

    module.service = Broken
    event = json.load(open(f"events/{sample}.json"))
    for record in event["Records"]:
        record["attributes"]["ApproximateReceiveCount"] = "9"  # past the quick retries: no SQS call
    response = module.handler(event, local_context(function))
    print("RESPONSE", json.dumps(response))
""")


@pytest.mark.parametrize("function, sample", [
    ("fleet", "fleet-launch-request"), ("drain", "drain-request"),
    ("interruption", "interruption-spot-warning"), ("packer", "packer-pending-pods"),
])
def test_a_record_that_fails_unexpectedly_is_logged_with_its_reason(function: str, sample: str) -> None:
    """A partial batch failure is no Lambda error: the record goes back to its queue, and after `maxReceiveCount`
    to its dead-letter queue. Its reason must be in the log, or nothing anywhere says why (a bug, a DynamoDB error,
    a configuration that fails every record). Its count (`RecordsFailed`) goes to the namespace the stack gives
    the function: its cluster's, so that two clusters in one account and region do not add up in one series."""
    namespace = ResourceNames("ml-staging").metrics_namespace
    out = subprocess.run(
        [sys.executable, "-c", FAILING_RECORD, function, sample, namespace],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": f"{ROOT / 'layers' / 'core'}:{ROOT}", "PATH": "/usr/bin:/bin"},
    )
    assert "RESPONSE" in out.stdout and '"batchItemFailures": [{' in out.stdout, out.stderr[-2000:]
    assert "InstanceId missing from the answer" in out.stdout + out.stderr
    documents = [json.loads(line) for line in out.stdout.splitlines() if line.startswith('{"_aws"')]
    assert documents and {d["_aws"]["CloudWatchMetrics"][0]["Namespace"] for d in documents} == {namespace}


OUT_OF_TIME = textwrap.dedent("""
    import copy, importlib.util, json, os, sys
    os.environ.update(TABLE_NAME="t", CONFIG_PARAMETER="/p", AWS_REGION="us-east-1", AWS_DEFAULT_REGION="us-east-1",
                      POWERTOOLS_TRACE_DISABLED="true", AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="x",
                      POWERTOOLS_METRICS_NAMESPACE="GpuAutoscaler/ml-prod")
    from gpu_autoscaler.lambda_context import local_context
    function, sample, timeout, step = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    spec = importlib.util.spec_from_file_location("handler", f"functions/{function}/handler.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    now, calls = [0.0], []

    class Slow:
        def __getattr__(self, name):
            calls.append(name)
            now[0] += step  # this record's calls took `step` seconds of the invocation
            raise KeyError("the service failed after a slow call")

    module.service = Slow
    event = json.load(open(f"events/{sample}.json"))
    first = event["Records"][0]
    event["Records"] = [dict(copy.deepcopy(first), messageId=f"m-{i}") for i in range(3)]
    for record in event["Records"]:
        record["attributes"]["ApproximateReceiveCount"] = "9"  # past the quick retries: no SQS call
    context = local_context(function, timeout_seconds=timeout, monotonic=lambda: now[0])
    response = module.handler(event, context)
    print("CALLS", len(calls))
    print("FAILED", len(response["batchItemFailures"]))
""")


@pytest.mark.parametrize("function, sample", [
    ("fleet", "fleet-launch-request"), ("interruption", "interruption-spot-warning"),
])
def test_a_record_is_not_started_when_a_stalled_call_would_outlast_the_invocation(function: str, sample: str) -> None:
    """When Lambda stops an invocation at its timeout, every record of the batch goes back to the queue and comes
    again only after its visibility timeout: six minutes for the interruption function, whose Spot warnings give
    two. So a record is started only while one stalled call still fits; the others are handed back at once, and
    are visible again at once (`batch_failures.report_failures`)."""
    timeout = FUNCTION_WIRING[function].timeout_seconds
    step = timeout - RECORD_RESERVE_SECONDS + 1  # after the first record, less than the reserve is left
    out = subprocess.run(
        [sys.executable, "-c", OUT_OF_TIME, function, sample, str(timeout), str(step)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": f"{ROOT / 'layers' / 'core'}:{ROOT}", "PATH": "/usr/bin:/bin"},
    )
    assert "CALLS 1" in out.stdout.splitlines() and "FAILED 3" in out.stdout.splitlines(), out.stdout[-3000:]
    assert "not started" in out.stdout


NOT_STARTED = textwrap.dedent("""
    import copy, importlib.util, json, os, sys
    os.environ.update(TABLE_NAME="t", CONFIG_PARAMETER="/p", AWS_REGION="us-east-1", AWS_DEFAULT_REGION="us-east-1",
                      POWERTOOLS_TRACE_DISABLED="true", AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="x",
                      POWERTOOLS_METRICS_NAMESPACE="GpuAutoscaler/ml-prod")
    from gpu_autoscaler.lambda_context import local_context
    first_fails, step = sys.argv[1] == "fails", float(sys.argv[2])
    spec = importlib.util.spec_from_file_location("handler", "functions/packer/handler.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    now = [0.0]

    class Outcome:
        pods, created, unschedulable, price_per_hour, events_refused = 500, (), (), 0.0, 0
        def summary(self):
            return {}

    class Service:
        def handle(self, document, source="", time_left=None):
            now[0] += step  # one large document of a burst: `step` seconds of the invocation
            if first_fails:
                raise KeyError("the service failed after a slow call")
            return Outcome()

    module.service = lambda: Service()

    class Sqs:
        changes = []
        def get_queue_url(self, QueueName, QueueOwnerAWSAccountId):
            return {"QueueUrl": "https://sqs/q"}
        def get_queue_attributes(self, QueueUrl, AttributeNames):
            return {"Attributes": {"VisibilityTimeout": "360"}}
        def change_message_visibility(self, QueueUrl, ReceiptHandle, VisibilityTimeout):
            self.changes.append((ReceiptHandle, VisibilityTimeout))
    sqs = Sqs()
    original = module.report_failures  # with this SQS client: the handler's third argument as it is
    module.report_failures = lambda metrics, event, outcome: original(metrics, event, outcome, lambda: sqs)
    event = json.load(open("events/packer-pending-pods.json"))
    first = event["Records"][0]
    event["Records"] = [dict(copy.deepcopy(first), messageId=f"m-{i}", receiptHandle=f"h-{i}") for i in range(3)]
    for record in event["Records"]:
        record["attributes"]["ApproximateReceiveCount"] = "3"
    context = local_context("packer", timeout_seconds=60, monotonic=lambda: now[0])
    response = module.handler(event, context)
    print("FAILED", json.dumps(sorted(f["itemIdentifier"] for f in response["batchItemFailures"])))
    print("CHANGES", json.dumps(dict(sqs.changes), sort_keys=True))
""")


@pytest.mark.parametrize("first, failed, changes", [
    # The first document took more than the invocation can spare: the second is not started, the third is skipped
    # behind it in the cluster's FIFO group. Neither did any work: both go back at once, whatever their deliveries.
    ("packed", ["m-1", "m-2"], {"h-1": 0, "h-2": 0}),
    # The first document failed: it waits RETRY_AFTER (its third delivery), the two skipped behind it go back at
    # once and SQS holds them behind it in their group.
    ("fails", ["m-0", "m-1", "m-2"], {"h-0": 160, "h-1": 0, "h-2": 0}),
])
def test_a_packer_record_never_started_goes_back_to_its_queue_at_once(first: str, failed: list[str],
                                                                        changes: dict[str, int]) -> None:
    """Before, records that did no work were handed the failure backoff: in a burst of large documents the
    cluster's whole report group waited 40 s, 160 s, then the queue's 360 s, each delivery counting toward
    maxReceiveCount (r15 finding 2: `{'h-1': 160, 'h-2': 160}`)."""
    step = FUNCTION_WIRING["packer"].timeout_seconds - RECORD_RESERVE_SECONDS + 1
    out = subprocess.run(
        [sys.executable, "-c", NOT_STARTED, first, str(step)], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": f"{ROOT / 'layers' / 'core'}:{ROOT}", "PATH": "/usr/bin:/bin"},
    )
    lines = out.stdout.splitlines()
    assert f"FAILED {json.dumps(failed)}" in lines, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"CHANGES {json.dumps(changes, sort_keys=True)}" in lines, out.stdout[-3000:]
