"""cdk-nag AwsSolutions and checkov find nothing unsuppressed; cfn-lint finds no error in the synthesized template."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from cfnlint.api import lint

if TYPE_CHECKING:
    from tests.infrastructure.conftest import Synthesized

ROOT = Path(__file__).resolve().parents[2]


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


def checkov_executable() -> str | None:
    """checkov pins boto3 1.35 and older packaging, which this project's pins exclude, so it lives in its own
    environment: `$CHECKOV`, else `.venv-checkov/` (`make checkov`), else `checkov` on the PATH."""
    given = os.environ.get("CHECKOV")
    if given:
        return given
    beside = ROOT / ".venv-checkov" / "bin" / "checkov"
    return str(beside) if beside.is_file() else shutil.which("checkov")


def test_checkov_finds_nothing_unsuppressed_and_every_skip_has_a_reason(synthesized: Synthesized) -> None:
    """Issue 19: the independent scanner on the synthesized template. A skip lives in the template's own
    metadata (`checkov: skip: [{id, comment}]`), so the reason travels with the template."""
    checkov = checkov_executable()
    if checkov is None:
        pytest.skip("checkov is not installed: it cannot share this environment (it pins boto3 1.35); "
                    "`make checkov` installs it in .venv-checkov/ and runs it")
    [template] = synthesized.outdir.glob("*.template.json")
    result = subprocess.run([checkov, "-f", str(template), "--framework", "cloudformation", "-o", "json",
                             "--skip-download"], capture_output=True, text=True, timeout=300, check=False)
    report = json.loads(result.stdout)
    results = report["results"]
    failed = [f"{c['check_id']} {c['resource']}: {c['check_name']}" for c in results["failed_checks"]]
    assert failed == []
    assert results["passed_checks"], "checkov checked nothing"
    for check in results["skipped_checks"]:
        assert len(check.get("check_result", {}).get("suppress_comment", "")) > 40, check["check_id"]
