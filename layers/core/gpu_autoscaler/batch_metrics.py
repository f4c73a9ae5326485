"""What every queue-fed handler counts of its batch, beside what its records did.

A partial batch failure is no Lambda error: Lambda retries the records the handler names and reports the
invocation as a success, so neither the function's `Errors` metric nor its alarm sees records going back to
their queue until one reaches the dead-letter queue. `RecordsFailed` is that count, published by every
invocation (so none publishes an empty metrics document).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_lambda_powertools.metrics import MetricUnit

if TYPE_CHECKING:
    from aws_lambda_powertools import Metrics
    from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse

__all__ = ["count_failed_records"]


def count_failed_records(metrics: Metrics, response: PartialItemFailureResponse) -> PartialItemFailureResponse:
    """`response` (a batch processor's), after adding its item failures to `metrics` as `RecordsFailed`."""
    metrics.add_metric(name="RecordsFailed", unit=MetricUnit.Count, value=len(response["batchItemFailures"]))
    return response
