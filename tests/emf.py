"""Reading the metrics a handler published: CloudWatch's embedded metric format, one JSON document per line.

The format (CloudWatch User Guide, "Specification: Embedded metric format",
docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Specification.html):
a root `_aws` object with `CloudWatchMetrics` directives naming each metric, and each metric's value (a number
or a list of numbers) as a root member of that name. Written from the specification, not from Powertools' code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["Emitted", "emitted", "metric_values"]


@dataclass(frozen=True)
class Emitted:
    """One metric of one EMF document, under one of its dimension sets: the series CloudWatch puts it in."""

    namespace: str
    name: str
    dimensions: frozenset[tuple[str, str]]
    value: float
    """The document's value, or the sum of its values (what a Sum statistic over the document sees)."""


def metric_values(text: str, name: str) -> list[float]:
    """Every value of metric `name` in the EMF documents among `text`'s lines (other lines are skipped)."""
    values: list[float] = []
    for document in _documents(text):
        directives = document.get("_aws", {}).get("CloudWatchMetrics", [])
        declared = {m.get("Name") for d in directives for m in d.get("Metrics", [])}
        if name in declared and name in document:
            value = document[name]
            values.extend(float(v) for v in (value if isinstance(value, list) else [value]))
    return values


def emitted(text: str) -> list[Emitted]:
    """Every metric in the EMF documents among `text`'s lines, once per dimension set its directive declares (each
    a series of its own: "DimensionSet", the same specification), the dimensions' values read from the root."""
    found: list[Emitted] = []
    for document in _documents(text):
        for directive in document.get("_aws", {}).get("CloudWatchMetrics", []):
            for dimension_set in directive.get("Dimensions", []):
                dimensions = frozenset((key, str(document[key])) for key in dimension_set)
                for metric in directive.get("Metrics", []):
                    value = document.get(metric.get("Name"))
                    if value is not None:
                        total = sum(value) if isinstance(value, list) else value
                        found.append(Emitted(directive["Namespace"], metric["Name"], dimensions, float(total)))
    return found


def _documents(text: str) -> Iterator[dict[str, Any]]:
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            document = json.loads(line)
        except ValueError:
            continue
        if isinstance(document, dict):
            yield document
