"""Reading the metrics a handler published: CloudWatch's embedded metric format, one JSON document per line.

The format (CloudWatch User Guide, "Specification: Embedded metric format",
docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Specification.html):
a root `_aws` object with `CloudWatchMetrics` directives naming each metric, and each metric's value (a number
or a list of numbers) as a root member of that name. Written from the specification, not from Powertools' code.
"""

from __future__ import annotations

import json

__all__ = ["metric_values"]


def metric_values(text: str, name: str) -> list[float]:
    """Every value of metric `name` in the EMF documents among `text`'s lines (other lines are skipped)."""
    values: list[float] = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            document = json.loads(line)
        except ValueError:
            continue
        directives = document.get("_aws", {}).get("CloudWatchMetrics", []) if isinstance(document, dict) else []
        declared = {m.get("Name") for d in directives for m in d.get("Metrics", [])}
        if name in declared and name in document:
            value = document[name]
            values.extend(float(v) for v in (value if isinstance(value, list) else [value]))
    return values
