"""`gpu-autoscaler plan` end to end: moto's EC2 data and the bundled prices, no AWS account."""

from __future__ import annotations

import gc
import json
from typing import TYPE_CHECKING, Any

import pytest
from typer.testing import CliRunner

from gpu_autoscaler.cli.main import app

if TYPE_CHECKING:
    from pathlib import Path

runner = CliRunner()
TOLERATE = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def pod(uid: str, **fields: Any) -> dict[str, Any]:
    return {"uid": uid, "namespace": "team-a", "name": uid, "tolerations": TOLERATE,
            "requests": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"}, **fields}


@pytest.fixture
def config_file(tmp_path: Path, config_data: dict[str, Any]) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config_data))
    return path


@pytest.fixture
def pods_file(tmp_path: Path) -> Path:
    document = {"schemaVersion": 1, "cluster": "ml-prod", "sentAt": "2026-11-22T10:00:00Z", "pods": [
        pod("infer-0"), pod("infer-1"),
        pod("shared-0", tolerations=[{"key": "gpu-autoscaler/shared", "operator": "Exists"}],
            requests={"cpu": "1", "memory": "4Gi", "nvidia.com/gpu": "1"}),
        *[pod(f"train-{i}", requests={"cpu": "90", "memory": "900Gi", "nvidia.com/gpu": "8"},
              podGroup={"name": "train", "minMember": 2}) for i in range(2)],
        pod("b300-1b", requests={"nvidia.com/gpu": "8"}, nodeSelector={  # B300s are not offered in us-east-1b
            "karpenter.k8s.aws/instance-gpu-name": "b300", "topology.kubernetes.io/zone": "us-east-1b"}),
        pod("no-toleration", tolerations=[]),
    ]}
    path = tmp_path / "pods.json"
    path.write_text(json.dumps(document))
    return path


def test_json_has_the_contract_keys_and_a_valid_plan(config_file: Path, pods_file: Path) -> None:
    result = runner.invoke(app, ["plan", "--pods", str(pods_file), "--config", str(config_file), "--format", "json"])
    plan = json.loads(result.stdout)
    assert result.exit_code == (3 if plan["unschedulable"] else 0), result.output  # 3: a pod cannot be placed
    assert set(plan) == {"claims", "unschedulable", "totalPricePerHour"}
    for claim in plan["claims"]:
        assert set(claim) == {"id", "pool", "capacityType", "zones", "instanceTypes", "pricePerHour", "pods"}
        assert 1 <= len(claim["instanceTypes"]) <= 60 and claim["zones"]
    placed = sorted(u for c in plan["claims"] for u in c["pods"])
    assert placed == ["infer-0", "infer-1", "shared-0", "train-0", "train-1"]
    assert {c["pool"] for c in plan["claims"] if "shared-0" in c["pods"]} == {"gpu-shared"}
    train = [c for c in plan["claims"] if set(c["pods"]) & {"train-0", "train-1"}]
    assert len({tuple(c["zones"]) for c in train}) == 1 and len(train[0]["zones"]) == 1
    reasons = {u["pod"]: u["reason"] for u in plan["unschedulable"]}
    assert set(reasons) == {"b300-1b", "no-toleration"}
    assert "no offering matches the pod's node constraints" in reasons["b300-1b"]
    assert "taint nvidia.com/gpu=true:NoSchedule not tolerated" in reasons["no-toleration"]
    assert plan["totalPricePerHour"] == pytest.approx(sum(c["pricePerHour"] for c in plan["claims"]), abs=1e-5)


def test_table_and_a_bare_list_of_pods(config_file: Path, tmp_path: Path) -> None:
    path = tmp_path / "list.json"
    path.write_text(json.dumps([pod("infer-0")]))
    result = runner.invoke(app, ["plan", "--pods", str(path), "--config", str(config_file)])
    assert result.exit_code == 0, result.output
    assert "1 new node claims" in result.stdout and "team-a/infer-0" in result.stdout
    assert gc.isenabled()  # paused while planning, back on after


def test_a_file_that_is_not_a_document_is_refused(config_file: Path, tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"schemaVersion": 1, "cluster": "ml-prod", "sentAt": "x", "pods": "none"}))
    result = runner.invoke(app, ["plan", "--pods", str(path), "--config", str(config_file)])
    assert result.exit_code == 2 and "not a pending-pods document" in result.output


def test_a_bare_list_names_pods_like_a_document_and_broken_json_says_so(config_file: Path, tmp_path: Path) -> None:
    path = tmp_path / "list.json"
    path.write_text(json.dumps([pod("infer-0"), pod("infer-1", requests={"cpu": "lots", "nvidia.com/gpu": "1"})]))
    result = runner.invoke(app, ["plan", "--pods", str(path), "--config", str(config_file)])
    assert result.exit_code == 2
    assert f"{path}: not a pending-pods document: pods[1].requests.cpu: 'lots' is not a Kubernetes quantity" in (
        result.output)
    path.write_text('{"schemaVersion": 1, "cluster": ')
    result = runner.invoke(app, ["plan", "--pods", str(path), "--config", str(config_file)])
    assert result.exit_code == 2 and f"{path}: not valid JSON (" in result.output
