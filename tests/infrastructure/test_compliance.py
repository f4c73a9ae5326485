"""cdk-nag AwsSolutions finds nothing unsuppressed; cfn-lint finds no error in the synthesized template."""

from __future__ import annotations

import csv
import json
from typing import TYPE_CHECKING

from cfnlint.api import lint

if TYPE_CHECKING:
    from tests.infrastructure.conftest import Synthesized


def test_cdk_nag_has_no_unsuppressed_findings(synthesized: Synthesized) -> None:
    findings = [m for m in synthesized.messages if m["level"] in ("error", "warning") and "AwsSolutions-" in m["text"]]
    assert findings == []


def test_cdk_nag_ran_and_every_suppression_has_a_reason(synthesized: Synthesized) -> None:
    [report] = synthesized.outdir.glob("AwsSolutions-*NagReport.csv")
    rows = list(csv.DictReader(report.open()))
    compliance = {row["Compliance"] for row in rows}
    assert compliance <= {"Compliant", "Suppressed"}
    assert any(row["Rule ID"] == "AwsSolutions-L1" for row in rows)  # the runtime check ran on the functions
    suppressed = [row for row in rows if row["Compliance"] == "Suppressed"]
    assert suppressed
    for row in suppressed:
        assert len(row["Exception Reason"]) > 40, row


def test_no_other_synth_errors_or_warnings(synthesized: Synthesized) -> None:
    assert [m for m in synthesized.messages if m["level"] in ("error", "warning")] == []


def test_cfn_lint_finds_no_errors(synthesized: Synthesized) -> None:
    template = json.dumps(synthesized.template.to_json())
    matches = lint(template, regions=[synthesized.config.region])
    errors = [f"{m.rule.id} {m.message} at {'/'.join(map(str, m.path))}" for m in matches if m.rule.id.startswith("E")]
    assert errors == []
